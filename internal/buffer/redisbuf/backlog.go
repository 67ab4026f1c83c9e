package redisbuf

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/lastseen/lastseen/internal/buffer"
	"github.com/lastseen/lastseen/internal/keys"
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

// rename copies oldUID's entry to newUID (newest wins) and returns it; ok
// is false when oldUID had none or the copy did not fit (newUID new, the
// backlog full). oldUID's entry stays.
func (b *backlog) rename(oldUID, newUID string) (ts int64, ok bool) {
	b.mu.Lock()
	ts, ok = b.m[oldUID]
	b.mu.Unlock()
	if !ok {
		return 0, false
	}
	return ts, b.add(newUID, ts)
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

// Why a touch that never reached Redis was dropped, as logged (dropLog).
const (
	dropFull    = "backlog full"                                  // a touch found the backlog full
	dropReplay  = "backlog full when a failed replay put it back" // new touches refilled it meanwhile
	dropClosed  = "redis unreachable after Close"                 // nothing flushes the backlog any more
	dropAtClose = "backlog not written to redis by Close"         // the final flush could not replay it
)

// dropLog counts touches that never reached Redis and were dropped, in
// Counters.BacklogDropped, and logs them through Options.LogLimited (the
// plugin's: at most one line per reason per 10s, with the number dropped,
// the running total and the lines held back), so a loss is never silent
// and never floods the log. (Unreadable entries a flush drops are counted
// and logged by the flush.)
type dropLog struct {
	log     func(level slog.Level, msg string, args ...any)
	dropped *atomic.Int64
}

// backlog counts n touches dropped for reason and logs it.
func (d *dropLog) backlog(n int, reason string) {
	if n <= 0 {
		return
	}
	total := d.dropped.Add(int64(n))
	d.log(slog.LevelWarn, "lastseen: dropped touches that never reached redis: "+reason,
		"dropped", n, "backlog_dropped_total", total)
}

// keep puts a touch that did not reach Redis into the backlog, counted in
// Backlogged, or drops it, counted in BacklogDropped: when the backlog is
// full, or after Close, when nothing will flush it.
func (b *Buffer) keep(uid string, ts int64) (kept bool) {
	switch {
	case b.closed.Load():
		b.drops.backlog(1, dropClosed)
	case b.backlog.add(uid, ts):
		b.stats.Backlogged.Add(1)
		return true
	default:
		b.drops.backlog(1, dropFull)
	}
	return false
}

// putBack returns entries of a replay that failed to the backlog, newest
// per user (touches made meanwhile may be newer), and returns how many no
// longer fit.
func (b *Buffer) putBack(args []any) (dropped int) {
	for i := 1; i+2 < len(args); i += 3 {
		if !b.backlog.add(args[i+1].(string), args[i+2].(int64)) {
			dropped++
		}
	}
	return dropped
}

// replayBacklog writes the backlog of touches that could not reach Redis
// into the pending hashes, one script call per shard. What it cannot write
// goes back into the backlog (putBack). After a call that timed out (Redis
// did not answer, or ctx's deadline passed) it tries no other shard: their
// entries go back too, for the next flush, instead of each waiting out its
// own timeout.
func (b *Buffer) replayBacklog(ctx context.Context) (int, error) {
	m := b.backlog.take()
	if len(m) == 0 {
		return 0, nil
	}
	if h := b.hooks.BacklogTaken; h != nil {
		h(len(m))
	}
	top := buffer.Ceiling(b.now())
	byShard := map[int]*mergeCall{}
	for uid, ts := range m {
		n, bucket := keys.Locate(uid, len(b.shards))
		c := byShard[n]
		if c == nil {
			c = &mergeCall{index: map[int]int{}, args: []any{top}}
			byShard[n] = c
		}
		c.add(b.shards[n].pending[bucket], bucket, uid, ts)
	}
	written, dropped := 0, 0
	var errs []error
	var timedOut error // Redis did not answer: the other shards wait for the next flush
	for _, c := range byShard {
		err := timedOut
		if err == nil {
			err = b.redis(ctx, func(ctx context.Context, rdb *client) error {
				return mergeScript.Run(ctx, rdb, c.keys, c.args...).Err()
			})
			if isTimeout(err) {
				timedOut = err
			}
		}
		if err != nil {
			dropped += b.putBack(c.args)
			if err != timedOut || len(errs) == 0 || errs[len(errs)-1] != timedOut {
				errs = append(errs, err) // a timeout once, not once per shard
			}
			continue
		}
		written += (len(c.args) - 1) / 3
	}
	b.drops.backlog(dropped, dropReplay) // counted in BacklogDropped, logged
	if err := errors.Join(errs...); err != nil {
		return written, fmt.Errorf("lastseen: replay backlog: %w", err)
	}
	return written, nil
}

// mergeCall is one shard's call of the merge script: its pending hashes as
// KEYS and, after the ceiling, a key index, user id and Unix microseconds
// per entry.
type mergeCall struct {
	keys  []string
	index map[int]int // bucket -> index in keys, from 1
	args  []any
}

func (c *mergeCall) add(key string, bucket int, uid string, ts int64) {
	i, ok := c.index[bucket]
	if !ok {
		c.keys = append(c.keys, key)
		i = len(c.keys)
		c.index[bucket] = i
	}
	c.args = append(c.args, i, uid, ts)
}

// TakeBacklog empties the backlog and returns it: user id -> Unix
// microseconds (buffer.Backlog).
func (b *Buffer) TakeBacklog() map[string]int64 { return b.backlog.take() }

// ReturnBacklog puts entries back, newest per user, counting and logging
// those that no longer fit (buffer.Backlog).
func (b *Buffer) ReturnBacklog(m map[string]int64) {
	dropped := 0
	for uid, ts := range m {
		if !b.backlog.add(uid, ts) {
			dropped++
		}
	}
	b.drops.backlog(dropped, dropReplay)
}

// InBacklog returns uid's Unix microseconds in b's backlog (for tests: a
// function, so that a binary that never calls it leaves it out).
func InBacklog(b *Buffer, uid string) (int64, bool) { return b.backlog.get(uid) }
