package lastseen

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/robfig/cron/v3"
)

// scheduler runs the flush and purge jobs on robfig/cron. Each job is
// wrapped as SkipIfStillRunning(Recover(job)): a run that is still going
// when the next tick comes makes that tick a no-op, and a panic is recovered
// inside the skip guard. (The other order, which cron.Recover first would
// give, leaves v3.0.1's SkipIfStillRunning holding its token forever after
// a panic, so the job never runs again.)
type scheduler struct {
	cron    *cron.Cron
	chain   cron.Chain
	ctx     context.Context // canceled by stop: jobs end between batches
	cancel  context.CancelFunc
	running atomic.Int64 // jobs running now: stop waits for none when 0
}

func newScheduler(log *slog.Logger) *scheduler {
	l := cronLogger{log}
	ctx, cancel := context.WithCancel(context.Background())
	return &scheduler{
		cron:   cron.New(cron.WithLogger(l)),
		chain:  cron.NewChain(cron.SkipIfStillRunning(l), cron.Recover(l)),
		ctx:    ctx,
		cancel: cancel,
	}
}

// job wraps fn for the cron: fn gets the scheduler's context with a
// deadline of timeout from the start of the run (FlushTimeout,
// PurgeTimeout), so a run never outlives it, even when Redis never answers.
func (s *scheduler) job(timeout time.Duration, fn func(context.Context)) cron.Job {
	return s.chain.Then(cron.FuncJob(func() {
		s.running.Add(1)
		defer s.running.Add(-1)
		ctx, cancel := context.WithTimeout(s.ctx, timeout)
		defer cancel()
		fn(ctx)
	}))
}

// add schedules fn for every spec in specs (";"-separated), each run with a
// deadline of timeout.
func (s *scheduler) add(name, specs string, timeout time.Duration, fn func(context.Context)) error {
	j := s.job(timeout, fn)
	for _, spec := range splitSpecs(specs) {
		if _, err := s.cron.AddJob(spec, j); err != nil {
			return fmt.Errorf("%w: %s schedule %q: %v", ErrInvalidConfig, name, spec, err)
		}
	}
	return nil
}

func (s *scheduler) start() { s.cron.Start() }

// stop stops new runs, cancels the jobs' context and waits for running jobs
// to return, or for ctx to end.
func (s *scheduler) stop(ctx context.Context) error {
	done := s.cron.Stop()
	s.cancel()
	if s.running.Load() == 0 { // a job starting after this runs on the canceled context and stops at once
		return nil
	}
	select {
	case <-done.Done():
		return nil
	case <-ctx.Done():
		return fmt.Errorf("lastseen: close: waiting for running jobs: %w", ctx.Err())
	}
}

// cronLogger adapts slog to cron.Logger.
type cronLogger struct{ log *slog.Logger }

// Info logs cron's routine messages (start, schedule, skip) at Debug level.
func (l cronLogger) Info(msg string, kv ...any) { l.log.Debug("lastseen: cron: "+msg, kv...) }

// Error logs cron's errors, among them recovered panics, at Error level.
func (l cronLogger) Error(err error, msg string, kv ...any) {
	l.log.Error("lastseen: cron: "+msg, append(kv, "err", err)...)
}
