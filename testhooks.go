package lastseen

import (
	"context"

	"github.com/lastseen/lastseen/internal/buffer"
	"github.com/lastseen/lastseen/internal/testhooks"
	"github.com/robfig/cron/v3"
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
		FlushJob: func(p any, ctx context.Context) { pl(p).flushJob(ctx) },
		PurgeJob: func(p any, ctx context.Context) { pl(p).purgeJob(ctx) },
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
		Buffer: func(p any) buffer.Buffer {
			if t := pl(p).tracker; t != nil {
				return t.buf
			}
			return nil
		},
		PluginsOn: func(db *gorm.DB) int { return len(pluginsOn(db)) },
	})
}
