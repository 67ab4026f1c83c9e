package lastseen

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/robfig/cron/v3"
)

// panicsOnce returns a job body that panics on its first run and counts
// every run that got past the panic point.
func panicsOnce() (fn func(context.Context), runs *atomic.Int64, completed *atomic.Int64) {
	runs, completed = &atomic.Int64{}, &atomic.Int64{}
	return func(context.Context) {
		if runs.Add(1) == 1 {
			panic("boom")
		}
		completed.Add(1)
	}, runs, completed
}

// TestSchedulerRecoversPanic: a job that panicked is recovered, logged, and
// runs again on the next tick.
func TestSchedulerRecoversPanic(t *testing.T) {
	var logs logBuffer
	s := newScheduler(debugLogger(&logs))
	fn, runs, completed := panicsOnce()
	j := s.job(time.Minute, fn)
	for range 3 {
		j.Run() // must not panic
	}
	equal(t, "runs", runs.Load(), 3)
	equal(t, "completed runs", completed.Load(), 2)
	equal(t, "panics logged", logs.count("lastseen: cron: panic"), 1)
	equal(t, "skips logged", logs.count("lastseen: cron: skip"), 0)
}

// TestSchedulerV301ReverseChainStaysStuck shows the robfig/cron v3.0.1 bug
// the scheduler guards against: with Recover outside SkipIfStillRunning, a
// panic never gives back SkipIfStillRunning's token, so every later run is
// skipped. If an upgraded cron fixes it, this test fails and the comment in
// cron.go can go.
func TestSchedulerV301ReverseChainStaysStuck(t *testing.T) {
	var logs logBuffer
	l := cronLogger{debugLogger(&logs)}
	fn, runs, completed := panicsOnce()
	j := cron.NewChain(cron.Recover(l), cron.SkipIfStillRunning(l)).Then(cron.FuncJob(func() { fn(context.Background()) }))
	for range 3 {
		j.Run()
	}
	equal(t, "runs", runs.Load(), 1)
	equal(t, "completed runs", completed.Load(), 0)
	equal(t, "skips logged", logs.count("lastseen: cron: skip"), 2)
}

// TestSchedulerSkipsOverlappingRuns: a run that comes while the previous
// one still runs is skipped, also between the entries of several specs of
// one job; the next run after it ended goes ahead.
func TestSchedulerSkipsOverlappingRuns(t *testing.T) {
	var logs logBuffer
	s := newScheduler(debugLogger(&logs))
	started, release := make(chan struct{}), make(chan struct{})
	var runs atomic.Int64
	must(t, s.add("flush", "@every 1m; 0 3 * * *", time.Minute, func(context.Context) {
		if runs.Add(1) == 1 {
			close(started)
			<-release
		}
	}))
	entries := s.cron.Entries()
	equal(t, "entries", len(entries), 2)

	first := make(chan struct{})
	go func() {
		defer close(first)
		entries[0].Job.Run()
	}()
	<-started
	entries[0].Job.Run() // same entry while the first run blocks
	entries[1].Job.Run() // the job's other spec
	equal(t, "runs while the first blocks", runs.Load(), 1)
	equal(t, "skips logged", logs.count("lastseen: cron: skip"), 2)
	close(release)
	<-first
	entries[1].Job.Run()
	equal(t, "runs after the first ended", runs.Load(), 2)
}
