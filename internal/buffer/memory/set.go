package memory

import "github.com/lastseen/lastseen/internal/keys"

// set is a shard's pending or in-flight set: user id -> Unix µs, and a
// Bloom filter of one hash over the ids it has held since it was last
// emptied. Newest asks the filter first: a query's own work evicts the maps
// from the CPU's caches between two reads, and a clear bit answers "not
// here" from 1 KB per set instead. Ids join only through put, which sets
// their bit; a bit is cleared only when the whole set is (reset), never when
// one id leaves, so a set bit may be stale ("maybe", then the map answers)
// but a clear one never is: Newest never misses a value.
type set struct {
	m     map[string]int64
	bloom [filterBits / 64]uint64
}

// filterBits is the size of a set's filter: at 625 ids a set (10,000 users
// pending over 16 shards) about one absent id in 13 finds its bit set.
const filterBits = 8192

// bit is the filter bit of an id whose keys.Hash is h: its top 13 bits
// (the low ones pick the shard).
func bit(h uint32) uint32 { return h >> (32 - 13) }

// get returns the value of uid, whose keys.Hash is h; 0 when none.
func (s *set) get(uid string, h uint32) int64 {
	if s.m == nil { // empty since its reset: no filter to read either
		return 0
	}
	if b := bit(h); s.bloom[b/64]&(1<<(b%64)) == 0 {
		return 0
	}
	return s.m[uid]
}

// put sets uid's value.
func (s *set) put(uid string, ts int64) {
	b := bit(keys.Hash(uid))
	s.bloom[b/64] |= 1 << (b % 64)
	if s.m == nil {
		s.m = map[string]int64{}
	}
	s.m[uid] = ts
}

// reset empties the set.
func (s *set) reset() { *s = set{} }
