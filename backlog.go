package lastseen

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// backlog keeps the newest timestamp per user for touches that could not
// reach Redis, up to max users.
type backlog struct {
	mu  sync.Mutex
	max int
	m   map[string]int64
}

// add keeps ts if it is newer than what the backlog has for uid; it reports
// false when uid is new and the backlog is full.
func (b *backlog) add(uid string, ts int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	cur, ok := b.m[uid]
	if !ok && len(b.m) >= b.max {
		return false
	}
	if !ok || ts > cur {
		b.m[uid] = ts
	}
	return true
}

func (b *backlog) get(uid string) (int64, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	ts, ok := b.m[uid]
	return ts, ok
}

func (b *backlog) len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.m)
}

func (b *backlog) take() map[string]int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	m := b.m
	b.m = make(map[string]int64, min(len(m), 1024))
	return m
}

// replayBacklog writes the backlog of touches that could not reach Redis
// into the pending hashes, one script call per shard. What it cannot write
// goes back into the backlog.
func (b *redisBuffer) replayBacklog(ctx context.Context) (int, error) {
	m := b.backlog.take()
	if len(m) == 0 {
		return 0, nil
	}
	byShard := map[string][]any{}
	top := ceiling(b.now())
	for uid, ts := range m {
		k := b.shard(uid).pending
		if byShard[k] == nil {
			byShard[k] = []any{top}
		}
		byShard[k] = append(byShard[k], uid, ts)
	}
	written := 0
	var errs []error
	for key, args := range byShard {
		if err := mergeScript.Run(ctx, b.rdb, []string{key}, args...).Err(); err != nil {
			for i := 1; i < len(args); i += 2 {
				b.backlog.add(args[i].(string), args[i+1].(int64))
			}
			errs = append(errs, err)
			continue
		}
		written += (len(args) - 1) / 2
	}
	if err := errors.Join(errs...); err != nil {
		return written, fmt.Errorf("lastseen: replay backlog: %w", err)
	}
	return written, nil
}
