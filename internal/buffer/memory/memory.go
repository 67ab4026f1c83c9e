// Package memory is the in-process buffer of lastseen, for an app that runs
// as one instance (no Redis): the Redis buffer's shards, with each shard's
// pending and in-flight sets as maps under the shard's mutex, throttle
// markers as the end of the window each user was recorded in, and in-process locks for the
// shards' flushes and the purge. It never fails, so it has no circuit
// breaker and no backlog. What it holds is lost when the process dies.
//
// It keeps the contract of package buffer, checked by package buffertest.
package memory

import (
	"context"
	"maps"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lastseen/lastseen/internal/buffer"
	"github.com/lastseen/lastseen/internal/keys"
)

// Options configure a Buffer.
type Options struct {
	// Prefix names the presence sets as the Redis buffer's keys do
	// (keys.ForPresence); it is not shared with anything.
	Prefix string
	// Shards is the number of shards, 1 to keys.MaxShards. Default 16.
	Shards int
	// Presence is which presence sets a recorded touch joins.
	Presence buffer.Presence
	// Now is the plugin's clock: the swap sweeps the throttle markers ended
	// by it, and Count leaves out the presence sets it has ended. (A touch
	// reads its own now.) Default time.Now.
	Now func() time.Time
}

// Buffer is the in-process buffer. Create it with New.
type Buffer struct {
	presence buffer.Presence
	names    keys.Presence // the presence sets' names (the Redis buffer's keys)
	now      func() time.Time
	shards   []*shard
	purge    sync.Mutex // the purge lock (TryLock)

	rulesMu sync.Mutex
	rules   map[string]*sync.Mutex // each rule's lock (TryLock), made on first use
}

// shard is one shard. The user ids are shared with the Redis layout
// (keys.ShardOf), so a shard holds the same users in both.
type shard struct {
	mu       sync.Mutex
	pending  set                     // user id -> Unix µs; empty: no pending set
	inflight set                     // the pending set a flush is writing; empty: none
	clears   atomic.Uint64           // the seqlock of clearing the sets' filters (set.go)
	markers  map[string]time.Time    // user id -> end of the throttle window it was recorded in
	refusals map[string]int          // user id -> flushes in a row the database refused its entry
	swept    int                     // len(markers) after the last sweep
	flush    sync.Mutex              // the shard's flush lock (TryLock)
	presence map[string]*presenceSet // the shard's users of each presence set, by its name
}

// presenceSet is the shard's part of the in-process counterpart of one
// presence HyperLogLog: the exact set of the shard's users in it, kept
// until end. The whole set is the union of the shards' parts, which hold
// disjoint users; keeping each part under its shard's mutex keeps the
// touches of different shards apart.
type presenceSet struct {
	users map[string]struct{}
	end   time.Time
}

// minSweep is the number of markers below which a shard never sweeps on a
// touch: expired markers are then removed by the flush's swap alone.
const minSweep = 1024

var _ buffer.Buffer = (*Buffer)(nil)

// New returns an empty buffer.
func New(o Options) *Buffer {
	if o.Shards <= 0 {
		o.Shards = 16
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	b := &Buffer{presence: o.Presence, names: keys.ForPresence(o.Prefix), now: o.Now}
	for range o.Shards {
		b.shards = append(b.shards, &shard{markers: map[string]time.Time{}, refusals: map[string]int{},
			presence: map[string]*presenceSet{}})
	}
	return b
}

func (b *Buffer) shard(uid string) *shard {
	return b.shards[keys.ShardOf(uid, len(b.shards))]
}

// Touch is the Redis buffer's touch on maps: a user whose marker is end
// (the window end was recorded in) is throttled; otherwise the marker is
// set to end, the pending value raised to at, and the user added to the
// presence sets. A late touch (end not after now) raises the pending value
// and sets no marker. It never fails.
func (b *Buffer) Touch(_ context.Context, uid string, at, now, end time.Time) (bool, time.Duration, error) {
	s := b.shard(uid)
	s.mu.Lock()
	defer s.mu.Unlock()
	ttl := max(0, end.Sub(now))
	if ttl > 0 {
		if e, ok := s.markers[uid]; ok && e.Equal(end) {
			return false, ttl, nil
		}
		s.markers[uid] = end
	}
	if ts := buffer.Micros(at); ts > s.pending.m[uid] {
		s.pending.put(uid, ts)
	}
	names, ttls := b.presence.Sets(b.names, at, now)
	for i, k := range names {
		if ttl := ttls[i]; ttl > 0 { // 0: its period ended longer ago than it is kept
			ps := s.presence[k]
			if ps == nil {
				ps = &presenceSet{users: map[string]struct{}{}}
				s.presence[k] = ps
			}
			ps.users[uid] = struct{}{}
			ps.end = now.Add(time.Duration(ttl) * time.Second) // EXPIRE
		}
	}
	if len(s.markers) >= 2*max(s.swept, minSweep) {
		s.sweep(now)
	}
	return true, ttl, nil
}

// sweep drops the markers whose window ended at now, and the presence sets
// past their end (the Redis keys' expiry). Under s.mu. Amortized: a touch
// sweeps when the markers doubled since the last sweep; each swap sweeps.
func (s *shard) sweep(now time.Time) {
	for uid, end := range s.markers {
		if !now.Before(end) {
			delete(s.markers, uid)
		}
	}
	s.swept = len(s.markers)
	for k, ps := range s.presence {
		if !now.Before(ps.end) {
			delete(s.presence, k)
		}
	}
}

// Count is exact: the size of the union of the sets named that have not
// ended on the clock, summed over the shards' parts of them (disjoint
// users).
func (b *Buffer) Count(_ context.Context, names []string) (int64, error) {
	now := b.now()
	var sum int64
	for _, s := range b.shards {
		s.mu.Lock()
		var union map[string]struct{}
		var only *presenceSet // the one live set, counted without a union
		live := 0
		for _, k := range names {
			ps := s.presence[k]
			if ps == nil || !now.Before(ps.end) {
				continue
			}
			if live++; live == 1 {
				only = ps
				continue
			}
			if union == nil {
				union = maps.Clone(only.users)
			}
			maps.Copy(union, ps.users)
		}
		switch {
		case union != nil:
			sum += int64(len(union))
		case only != nil:
			sum += int64(len(only.users))
		}
		s.mu.Unlock()
	}
	return sum, nil
}

// Newest reads each uid's pending and in-flight values under its shard's
// mutex, unless the sets' filters say without it that neither holds the
// uid (shard.absent). It never fails.
func (b *Buffer) Newest(_ context.Context, uids []string, out []time.Time, _ time.Time, _ bool) error {
	for i, uid := range uids {
		out[i] = time.Time{}
		h := keys.Hash(uid)
		s := b.shards[h%uint32(len(b.shards))] // keys.ShardOf
		if s.absent(h) {
			continue
		}
		s.mu.Lock()
		ts := max(s.pending.m[uid], s.inflight.m[uid])
		s.mu.Unlock()
		if ts > 0 {
			out[i] = time.UnixMicro(ts).UTC()
		}
	}
	return nil
}

// Sizes counts each shard's maps under its mutex.
func (b *Buffer) Sizes(context.Context) ([]buffer.Sizes, error) {
	out := make([]buffer.Sizes, len(b.shards))
	for i, s := range b.shards {
		s.mu.Lock()
		out[i] = buffer.Sizes{Pending: int64(len(s.pending.m)), InFlight: int64(len(s.inflight.m))}
		s.mu.Unlock()
	}
	return out, nil
}

// Walk copies the set under the shard's mutex, then calls fn page by page.
func (b *Buffer) Walk(_ context.Context, n int, inflight bool, page int, fn func(kv []string)) error {
	s := b.shards[n]
	s.mu.Lock()
	m := s.pending.m
	if inflight {
		m = s.inflight.m
	}
	kv := appendEntries(make([]string, 0, 2*len(m)), m, len(m))
	s.mu.Unlock()
	for len(kv) > 0 {
		k := min(len(kv), 2*max(page, 1))
		fn(kv[:k])
		kv = kv[k:]
	}
	return nil
}

// Sample takes up to perHash entries of each set in map iteration order
// (which Go randomizes per iteration), the counterpart of HRANDFIELD.
func (b *Buffer) Sample(_ context.Context, perHash int) ([]buffer.Sizes, []string, error) {
	sizes := make([]buffer.Sizes, len(b.shards))
	var values []string
	for i, s := range b.shards {
		s.mu.Lock()
		sizes[i] = buffer.Sizes{Pending: int64(len(s.pending.m)), InFlight: int64(len(s.inflight.m))}
		for _, m := range []map[string]int64{s.pending.m, s.inflight.m} {
			k := 0
			for _, ts := range m {
				if k == perHash {
					break
				}
				values = append(values, strconv.FormatInt(ts, 10))
				k++
			}
		}
		s.mu.Unlock()
	}
	return sizes, values, nil
}

// appendEntries appends up to n entries of m to kv as field, value, ...
// in the stored decimal form.
func appendEntries(kv []string, m map[string]int64, n int) []string {
	for uid, ts := range m {
		if n == 0 {
			break
		}
		kv = append(kv, uid, strconv.FormatInt(ts, 10))
		n--
	}
	return kv
}

// Replay does nothing: nothing is kept aside.
func (b *Buffer) Replay(context.Context) error { return nil }

// Ping does nothing: the buffer always answers.
func (b *Buffer) Ping(context.Context) error { return nil }

// Shared returns "": the buffer is its plugin's own.
func (b *Buffer) Shared() string { return "" }

// BacklogLen returns 0: there is no backlog.
func (b *Buffer) BacklogLen() int { return 0 }

// Breaker returns "closed": there is no circuit breaker.
func (b *Buffer) Breaker() string { return "closed" }

// Close does nothing: the buffer keeps working, and nothing flushes it any
// more.
func (b *Buffer) Close() error { return nil }
