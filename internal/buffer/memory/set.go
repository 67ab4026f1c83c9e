package memory

import (
	"sync/atomic"

	"github.com/lastseen/lastseen/internal/keys"
)

// set is a shard's pending or in-flight set: user id -> Unix µs, and a
// Bloom filter of one hash over the ids it has held since it was last
// emptied. Newest asks the filters first, without the shard's mutex
// (absent): a query's own work evicts the maps from the CPU's caches
// between two reads, and clear bits answer "not here" from 1 KB per set
// instead. Ids join only through put, which sets their bit before the map
// holds them; bits are cleared only when a whole set is emptied (reset,
// moveTo, inside the shard's clearing seqlock), never when one id leaves,
// so a set bit may be stale ("maybe": the maps answer, under the mutex) but
// a clear one read with no clearing in between never is. The map is read
// and written under the shard's mutex; the filter's words are atomic.
type set struct {
	m     map[string]int64
	bloom [filterBits / 64]atomic.Uint64
}

// filterBits is the size of a set's filter: at 625 ids a set (10,000 users
// pending over 16 shards) about one absent id in 13 finds its bit set.
const filterBits = 8192

// bit is the filter bit of an id whose keys.Hash is h: its top 13 bits
// (the low ones pick the shard).
func bit(h uint32) uint32 { return h >> (32 - 13) }

// maybe reports whether the id whose keys.Hash is h may be in the set;
// false means it is not. Safe without the shard's mutex.
func (s *set) maybe(h uint32) bool {
	b := bit(h)
	return s.bloom[b/64].Load()&(1<<(b%64)) != 0
}

// put sets uid's value. Under the shard's mutex.
func (s *set) put(uid string, ts int64) {
	b := bit(keys.Hash(uid))
	s.bloom[b/64].Or(1 << (b % 64))
	if s.m == nil {
		s.m = map[string]int64{}
	}
	s.m[uid] = ts
}

// reset empties the set. Under the shard's mutex, inside clearing.
func (s *set) reset() {
	s.m = nil
	for i := range s.bloom {
		s.bloom[i].Store(0)
	}
}

// moveTo moves the set into dst, replacing what dst held, and empties it.
// Under the shard's mutex, inside clearing.
func (s *set) moveTo(dst *set) {
	for i := range s.bloom {
		dst.bloom[i].Store(s.bloom[i].Load())
	}
	dst.m = s.m
	s.reset()
}

// clearing runs fn, which clears filter bits of the shard's sets, inside
// the shard's seqlock: the count is odd while it runs and moves on by two.
// Under the shard's mutex.
func (s *shard) clearing(fn func()) {
	s.clears.Add(1)
	fn()
	s.clears.Add(1)
}

// absent reports that neither of the shard's sets holds the id whose
// keys.Hash is h, without the mutex: both bits were clear and no clearing
// ran while they were read. false means the maps must be asked.
func (s *shard) absent(h uint32) bool {
	before := s.clears.Load()
	if before%2 == 1 || s.pending.maybe(h) || s.inflight.maybe(h) {
		return false
	}
	return s.clears.Load() == before
}
