package memory

import (
	"context"
	"strconv"
	"sync"

	"github.com/lastseen/lastseen/internal/buffer"
)

// The buffer's side of the flush and the purge: in-process locks
// (sync.Mutex.TryLock: a second flusher of a shard, a second purge, or a
// second run of one rule is refused, as with the Redis locks) and the
// operations of the Redis buffer's swap, ack and fail scripts on the
// shard's maps. The locks never expire, so they are never lost.

// Active lists the shards with a pending or an in-flight entry.
func (b *Buffer) Active(context.Context) ([]int, error) {
	var out []int
	for i, s := range b.shards {
		s.mu.Lock()
		if len(s.pending.m) > 0 || len(s.inflight.m) > 0 {
			out = append(out, i)
		}
		s.mu.Unlock()
	}
	return out, nil
}

// LockPurge takes the purge's mutex, or returns buffer.ErrNotObtained.
func (b *Buffer) LockPurge(context.Context) (buffer.Lease, error) {
	if !b.purge.TryLock() {
		return nil, buffer.ErrNotObtained
	}
	return &lease{mu: &b.purge}, nil
}

// LockRule takes rule name's mutex, or returns buffer.ErrNotObtained.
func (b *Buffer) LockRule(_ context.Context, name string) (buffer.Lease, error) {
	b.rulesMu.Lock()
	mu := b.rules[name]
	if mu == nil {
		if b.rules == nil {
			b.rules = map[string]*sync.Mutex{}
		}
		mu = &sync.Mutex{}
		b.rules[name] = mu
	}
	b.rulesMu.Unlock()
	if !mu.TryLock() {
		return nil, buffer.ErrNotObtained
	}
	return &lease{mu: mu}, nil
}

// LockShard takes shard n's flush mutex, or returns buffer.ErrNotObtained.
func (b *Buffer) LockShard(_ context.Context, n int) (buffer.ShardLease, error) {
	s := b.shards[n]
	if !s.flush.TryLock() {
		return nil, buffer.ErrNotObtained
	}
	return &shardLease{lease: lease{mu: &s.flush}, b: b, s: s}, nil
}

// lease is a held in-process lock.
type lease struct {
	mu   *sync.Mutex
	once sync.Once
}

func (l *lease) Refresh(context.Context) error { return nil }
func (l *lease) Release(context.Context)       { l.once.Do(l.mu.Unlock) }

// Keep: an in-process lock never expires, so there is nothing to refresh.
func (l *lease) Keep(ctx context.Context, _ error) (context.Context, func()) {
	return ctx, func() {}
}

// shardLease is a shard's flush lock with the shard's operations. Scan
// walks a copy of the in-flight set taken at cursor 0: only the lease's
// holder changes the in-flight set.
type shardLease struct {
	lease
	b    *Buffer
	s    *shard
	snap []string // the in-flight set as field, value, ... (Scan)
}

// Swap also sweeps the shard's expired markers.
func (l *shardLease) Swap(context.Context) (int, error) {
	s := l.s
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sweep(l.b.now())
	switch {
	case len(s.inflight.m) > 0:
		return 0, buffer.ErrLeftOver
	case len(s.pending.m) == 0:
		return 0, nil
	}
	s.clearing(func() { s.pending.moveTo(&s.inflight) })
	return len(s.inflight.m), nil
}

func (l *shardLease) Scan(_ context.Context, cursor uint64, n int) ([]string, []int, uint64, error) {
	if cursor == 0 {
		l.s.mu.Lock()
		l.snap = appendEntries(make([]string, 0, 2*len(l.s.inflight.m)), l.s.inflight.m, len(l.s.inflight.m))
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

func (l *shardLease) Ack(_ context.Context, fields []buffer.Held, final bool) error {
	s := l.s
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, f := range fields {
		delete(s.inflight.m, f.Field)
		delete(s.refusals, f.Field)
	}
	if final {
		s.clearing(s.inflight.reset)
		l.snap = nil
	}
	return nil
}

func (l *shardLease) Requeue(_ context.Context, refused []buffer.Refused, ceiling int64, limit int) ([]string, error) {
	s := l.s
	s.mu.Lock()
	defer s.mu.Unlock()
	var dropped []string
	for _, r := range refused {
		if _, held := s.inflight.m[r.Field]; !held {
			continue // no longer in flight: not this flush's entry
		}
		delete(s.inflight.m, r.Field)
		s.refusals[r.Field]++
		if limit > 0 && s.refusals[r.Field] >= limit {
			delete(s.refusals, r.Field)
			dropped = append(dropped, r.Field)
			continue
		}
		ts, err := strconv.ParseInt(r.Value, 10, 64)
		if err != nil {
			continue // never: the value came from this buffer
		}
		if cur, ok := s.pending.m[r.Field]; !ok || cur < ts || cur > ceiling {
			s.pending.put(r.Field, ts)
		}
	}
	return dropped, nil
}
