package lastseen

import (
	"context"
	"maps"
	"strconv"
	"sync"
	"time"

	"github.com/lastseen/lastseen/internal/keys"
)

// memoryBuffer is the buffer in process (Config.Redis nil), for an app that
// runs as one instance: the Redis buffer's shards, with each shard's
// pending and in-flight sets as maps under the shard's mutex, throttle
// markers as deadlines on the plugin's clock, and in-process locks for the
// shards' flushes and the purge. It never fails, so it has no circuit
// breaker and no backlog. What it holds is lost when the process dies
// (README, "Without Redis").
type memoryBuffer struct {
	cfg      settings // OnlineWindow, ActiveUsersRetention (presenceArgs)
	throttle time.Duration
	now      func() time.Time
	shards   []*memShard
	purge    sync.Mutex // the purge lock (TryLock)
}

// memShard is one shard. The user ids are shared with the Redis layout
// (internal/keys.ShardOf), so a shard holds the same users in both.
type memShard struct {
	mu       sync.Mutex
	pending  map[string]int64     // user id -> Unix µs; empty: no pending set
	inflight map[string]int64     // the pending set a flush is writing; empty: none
	markers  map[string]time.Time // user id -> end of the throttle window (plugin's clock)
	refusals map[string]int       // user id -> flushes in a row the database refused its entry
	swept    int                  // len(markers) after the last sweep
	flush    sync.Mutex           // the shard's flush lock (TryLock)
	keys     shardKeys            // the Redis names of the shard's keys: presence sets are kept by them
	presence map[string]*presenceSet
}

// presenceSet is the in-process counterpart of one presence HyperLogLog
// (presence.go): the exact set of users, kept until end.
type presenceSet struct {
	users map[string]struct{}
	end   time.Time
}

// minSweep is the number of markers below which a shard never sweeps on a
// touch: expired markers are then removed by the flush's swap alone.
const minSweep = 1024

var _ buffer = (*memoryBuffer)(nil)

func newMemoryBuffer(cfg settings) *memoryBuffer {
	b := &memoryBuffer{cfg: cfg, throttle: cfg.Throttle, now: cfg.Now}
	for n := range cfg.Shards {
		b.shards = append(b.shards, &memShard{pending: map[string]int64{}, markers: map[string]time.Time{}, refusals: map[string]int{},
			keys: newShardKeys(cfg.Prefix, n, cfg.Shards), presence: map[string]*presenceSet{}})
	}
	return b
}

func (b *memoryBuffer) shard(uid string) *memShard {
	return b.shards[keys.ShardOf(uid, len(b.shards))]
}

// touch is lua/touch.lua on maps: a marker whose deadline is after now
// throttles; otherwise the marker is set to now + window, the pending
// value raised to at, and the user added to the presence sets.
func (b *memoryBuffer) touch(_ context.Context, uid string, at, now time.Time, window time.Duration) (bool, time.Duration, error) {
	s := b.shard(uid)
	s.mu.Lock()
	defer s.mu.Unlock()
	if end, ok := s.markers[uid]; ok && now.Before(end) {
		return false, end.Sub(now), nil
	}
	s.markers[uid] = now.Add(window)
	if ts := micros(at); ts > s.pending[uid] {
		s.pending[uid] = ts
	}
	keys, ttls := presenceArgs(&b.cfg, s.keys, at, now)
	for i, k := range keys {
		if ttl := ttls[i].(int64); ttl > 0 { // 0: its period ended longer ago than it is kept
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
	return true, window, nil
}

// sweep drops the markers whose window ended at now, and the presence sets
// past their end (the Redis keys' expiry). Under s.mu. Amortized: a touch
// sweeps when the markers doubled since the last sweep; each swap sweeps.
func (s *memShard) sweep(now time.Time) {
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

// count is exact: the size of the union, per shard, of the sets keysOf
// names that have not ended.
func (b *memoryBuffer) count(_ context.Context, keysOf func(shardKeys) []string) (int64, error) {
	now := b.now()
	var sum int64
	for _, s := range b.shards {
		s.mu.Lock()
		var union map[string]struct{}
		var only *presenceSet // the one live set, counted without a union
		live := 0
		for _, k := range keysOf(s.keys) {
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

// newest reads each uid's pending and in-flight values under its shard's
// mutex.
func (b *memoryBuffer) newest(_ context.Context, uids []string, _ time.Time, _ bool) ([]time.Time, error) {
	out := make([]time.Time, len(uids))
	for i, uid := range uids {
		s := b.shard(uid)
		s.mu.Lock()
		ts := max(s.pending[uid], s.inflight[uid])
		s.mu.Unlock()
		if ts > 0 {
			out[i] = time.UnixMicro(ts).UTC()
		}
	}
	return out, nil
}

func (b *memoryBuffer) sizes(context.Context) ([]shardSizes, error) {
	out := make([]shardSizes, len(b.shards))
	for i, s := range b.shards {
		s.mu.Lock()
		out[i] = shardSizes{pending: int64(len(s.pending)), inflight: int64(len(s.inflight))}
		s.mu.Unlock()
	}
	return out, nil
}

// walk copies the set under the shard's mutex, then calls fn page by page.
func (b *memoryBuffer) walk(_ context.Context, n int, inflight bool, page int, fn func(kv []string)) error {
	s := b.shards[n]
	s.mu.Lock()
	m := s.pending
	if inflight {
		m = s.inflight
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

// sample takes up to perHash entries of each set in map iteration order
// (which Go randomizes per iteration), the counterpart of HRANDFIELD.
func (b *memoryBuffer) sample(_ context.Context, perHash int) ([]shardSizes, []string, error) {
	sizes := make([]shardSizes, len(b.shards))
	var values []string
	for i, s := range b.shards {
		s.mu.Lock()
		sizes[i] = shardSizes{pending: int64(len(s.pending)), inflight: int64(len(s.inflight))}
		for _, m := range []map[string]int64{s.pending, s.inflight} {
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

func (b *memoryBuffer) replay(context.Context) error { return nil }
func (b *memoryBuffer) ping(context.Context) error   { return nil }
func (b *memoryBuffer) shared() string               { return "" }
func (b *memoryBuffer) backlogLen() int              { return 0 }
func (b *memoryBuffer) breaker() BreakerState        { return BreakerClosed }
func (b *memoryBuffer) close() error                 { return nil }
