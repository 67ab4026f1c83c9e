package lastseen

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/lastseen/lastseen/internal/testhooks"
	"github.com/redis/go-redis/v9"
	"github.com/robfig/cron/v3"
	"github.com/sony/gobreaker/v2"
	"gorm.io/gorm"
)

// The internals the black-box tests (the tests module) reach, registered
// once: see internal/testhooks. Nothing here runs unless a test calls it.
func init() {
	pl := func(p any) *Plugin { return p.(*Plugin) }
	testhooks.Register(testhooks.Internals{
		SetFlushHooks: func(p any, h *testhooks.FlushHooks) { pl(p).hooks = h },
		RunScheduled: func(p any, purge bool) {
			if purge {
				pl(p).sched.job(pl(p).cfg.PurgeTimeout, pl(p).purgeJob).Run()
				return
			}
			pl(p).sched.job(pl(p).cfg.FlushTimeout, pl(p).flushJob).Run()
		},
		UsersColumn: func(p any) (int, bool) {
			enc := pl(p).users.model.enc
			return int(enc.Encoding()), enc.Naive()
		},
		IsCallerEnded: func(err error) bool { return errors.Is(err, errCallerEnded) },
		FlushJob:      func(p any, ctx context.Context) { pl(p).flushJob(ctx) },
		PurgeJob:      func(p any, ctx context.Context) { pl(p).purgeJob(ctx) },
		Scheduler: func(p any) *cron.Cron {
			if s := pl(p).sched; s != nil {
				return s.cron
			}
			return nil
		},
		JobsContext:    func(p any) context.Context { return pl(p).sched.ctx },
		Tracking:       func(p any) bool { return pl(p).tracker != nil },
		StopTracker:    func(p any) { pl(p).tracker.close() },
		Closing:        func(p any) <-chan struct{} { return pl(p).closing.Done() },
		Handle:         func(p any) (*gorm.DB, error) { return pl(p).ready() },
		WriteTarget:    func(p any, ctx context.Context) error { _, err := pl(p).writeTarget(ctx); return err },
		SetMaxParams:   func(p any, n int) { pl(p).dialect = pl(p).dialect.WithMaxParams(n) },
		TracksActive:   func(p any) bool { return pl(p).sessions.active != nil },
		SchedulesPurge: func(p any) bool { return pl(p).schedulesPurge() },
		Buffer:         func(p any) testhooks.Buffer { return testBuffer{pl(p)} },
		PluginsOn:      func(db *gorm.DB) int { return len(pluginsOn(db)) },
		IsLockLost:     func(err error) bool { return errors.Is(err, errLockLost) },
		LoadTouch:      func(ctx context.Context, c redis.Scripter) error { return touchScript.Load(ctx, c).Err() },
	})
}

// testBuffer is testhooks.Buffer on a plugin's buffer.
type testBuffer struct{ p *Plugin }

func (t testBuffer) Memory() bool { _, ok := t.p.tracker.buf.(*memoryBuffer); return ok }

func (t testBuffer) StateKeys(now time.Time) []string {
	b, ok := t.p.tracker.buf.(*memoryBuffer)
	if !ok {
		return nil
	}
	var out []string
	for n, s := range b.shards {
		tag := ":{" + strconv.Itoa(n) + "}:"
		s.mu.Lock()
		for name, size := range map[string]int{"pending": len(s.pending), "inflight": len(s.inflight), "refusals": len(s.refusals)} {
			if size > 0 {
				out = append(out, tag+name)
			}
		}
		for uid, end := range s.markers {
			if now.Before(end) {
				out = append(out, tag+"seen:"+uid)
			}
		}
		s.mu.Unlock()
	}
	return out
}

func (t testBuffer) LeaveInFlight(ctx context.Context, n int) error {
	l, err := t.p.tracker.buf.lockShard(ctx, n)
	if err != nil {
		return err
	}
	defer l.release(ctx)
	_, err = l.swap(ctx)
	return err
}

func (t testBuffer) InFlightLen(ctx context.Context, n int) (int64, error) {
	sizes, err := t.p.tracker.buf.sizes(ctx)
	if err != nil {
		return 0, err
	}
	return sizes[n].inflight, nil
}

func (t testBuffer) PutInFlight(ctx context.Context, uid string, at time.Time) error {
	switch b := t.p.tracker.buf.(type) {
	case *redisBuffer:
		k, bucket := b.locate(uid)
		return b.rdb.Load().HSet(ctx, k.inflight[bucket], uid, micros(at)).Err()
	case *memoryBuffer:
		s := b.shard(uid)
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.inflight == nil {
			s.inflight = map[string]int64{}
		}
		s.inflight[uid] = micros(at)
	}
	return nil
}

func (t testBuffer) PutBacklog(ctx context.Context, uid string, at time.Time) error {
	switch b := t.p.tracker.buf.(type) {
	case *redisBuffer:
		b.backlog.add(uid, micros(at))
	case *memoryBuffer:
		_, _, err := b.touch(ctx, uid, at, t.p.now(), t.p.cfg.Throttle)
		return err
	}
	return nil
}

func (t testBuffer) Backlog(uid string) (int64, bool) {
	if b, ok := t.p.tracker.buf.(*redisBuffer); ok {
		return b.backlog.get(uid)
	}
	return 0, false
}

func (t testBuffer) Breaker() gobreaker.State {
	if b, ok := t.p.tracker.buf.(*redisBuffer); ok {
		return b.cb.State()
	}
	return gobreaker.StateClosed
}

func (t testBuffer) Refusals(ctx context.Context, uid string) (int, error) {
	switch b := t.p.tracker.buf.(type) {
	case *redisBuffer:
		k, _ := b.locate(uid)
		return b.rdb.Load().HGet(ctx, k.refusals, uid).Int()
	case *memoryBuffer:
		s := b.shard(uid)
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.refusals[uid], nil
	}
	return 0, nil
}

func (t testBuffer) Markers(n int) int {
	if b, ok := t.p.tracker.buf.(*memoryBuffer); ok {
		s := b.shards[n]
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.markers)
	}
	return 0
}

func (t testBuffer) LockShard(ctx context.Context, n int) (func(context.Context), error) {
	l, err := t.p.tracker.buf.lockShard(ctx, n)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) { l.release(ctx) }, nil
}

func (t testBuffer) LockPurge(ctx context.Context) (func(context.Context), error) {
	l, err := t.p.tracker.buf.lockPurge(ctx)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) { l.release(ctx) }, nil
}

func (t testBuffer) BreakerCounts() gobreaker.Counts {
	if b, ok := t.p.tracker.buf.(*redisBuffer); ok {
		return b.cb.Counts()
	}
	return gobreaker.Counts{}
}

func (t testBuffer) SetTouchTimeout(d time.Duration) {
	if b, ok := t.p.tracker.buf.(*redisBuffer); ok {
		b.timeout = d
	}
}

func (t testBuffer) Client() (redis.UniversalClient, bool, bool) {
	if b, ok := t.p.tracker.buf.(*redisBuffer); ok {
		c := b.rdb.Load()
		return c.UniversalClient, c.own, c.deadlines
	}
	return nil, false, false
}
