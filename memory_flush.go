package lastseen

import (
	"context"
	"strconv"
	"sync"
)

// The memory buffer's side of the flush and the purge: in-process locks
// (sync.Mutex.TryLock: a second flusher of a shard, or a second purge, is
// skipped, as with the Redis locks) and the operations of lua/swap.lua,
// ack.lua and fail.lua on the shard's maps. The locks never expire, so they
// are never lost.

func (b *memoryBuffer) active(context.Context) ([]int, error) {
	var out []int
	for i, s := range b.shards {
		s.mu.Lock()
		if len(s.pending) > 0 || len(s.inflight) > 0 {
			out = append(out, i)
		}
		s.mu.Unlock()
	}
	return out, nil
}

func (b *memoryBuffer) lockPurge(context.Context) (lease, error) {
	if !b.purge.TryLock() {
		return nil, errNotObtained
	}
	return &memLease{mu: &b.purge}, nil
}

func (b *memoryBuffer) lockShard(_ context.Context, n int) (shardLease, error) {
	s := b.shards[n]
	if !s.flush.TryLock() {
		return nil, errNotObtained
	}
	return &memShardLease{memLease: memLease{mu: &s.flush}, b: b, s: s}, nil
}

// memLease is a held in-process lock.
type memLease struct {
	mu   *sync.Mutex
	once sync.Once
}

func (l *memLease) refresh(context.Context) error { return nil }
func (l *memLease) release(context.Context)       { l.once.Do(l.mu.Unlock) }

// keep: an in-process lock never expires, so there is nothing to refresh.
func (l *memLease) keep(ctx context.Context, _ error) (context.Context, func()) {
	return ctx, func() {}
}

// memShardLease is a shard's flush lock with the shard's operations. scan
// walks a copy of the in-flight set taken at cursor 0: only the lease's
// holder changes the in-flight set.
type memShardLease struct {
	memLease
	b    *memoryBuffer
	s    *memShard
	snap []string // the in-flight set as field, value, ... (scan)
}

// swap: lua/swap.lua. It also sweeps the shard's expired markers.
func (l *memShardLease) swap(context.Context) (int, error) {
	s := l.s
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sweep(l.b.now())
	switch {
	case len(s.inflight) > 0:
		return swapLeftOver, nil
	case len(s.pending) == 0:
		return 0, nil
	}
	s.inflight, s.pending = s.pending, map[string]int64{}
	return len(s.inflight), nil
}

func (l *memShardLease) scan(_ context.Context, cursor uint64, n int) ([]string, []int, uint64, error) {
	if cursor == 0 {
		l.s.mu.Lock()
		l.snap = appendEntries(make([]string, 0, 2*len(l.s.inflight)), l.s.inflight, len(l.s.inflight))
		l.s.mu.Unlock()
	}
	from := min(int(cursor)*2, len(l.snap))
	to := min(from+2*max(n, 1), len(l.snap))
	next := uint64(to / 2)
	if to == len(l.snap) {
		next = 0
	}
	return l.snap[from:to], nil, next, nil
}

// ack: lua/ack.lua.
func (l *memShardLease) ack(_ context.Context, fields []heldField, final bool) error {
	s := l.s
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, f := range fields {
		delete(s.inflight, f.field)
		delete(s.refusals, f.field)
	}
	if final {
		s.inflight = nil
		l.snap = nil
	}
	return nil
}

// requeue: lua/fail.lua.
func (l *memShardLease) requeue(_ context.Context, refused []refusal, ceiling int64, limit int) ([]string, error) {
	s := l.s
	s.mu.Lock()
	defer s.mu.Unlock()
	var dropped []string
	for _, r := range refused {
		delete(s.inflight, r.field)
		s.refusals[r.field]++
		if limit > 0 && s.refusals[r.field] >= limit {
			delete(s.refusals, r.field)
			dropped = append(dropped, r.field)
			continue
		}
		ts, err := strconv.ParseInt(r.value, 10, 64)
		if err != nil {
			continue // never: the value came from this buffer
		}
		if cur, ok := s.pending[r.field]; !ok || cur < ts || cur > ceiling {
			s.pending[r.field] = ts
		}
	}
	return dropped, nil
}
