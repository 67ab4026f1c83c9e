package lastseen

import (
	"context"
	"sync/atomic"
)

// Observer watches the plugin's flushes and purges, span style: each Start
// method is called when a run (or one of its shards or batches) begins and
// returns the context the run continues with (an OpenTelemetry observer
// puts its span in it, so the database calls below nest under it) and a
// function the plugin calls exactly once when that part ends, with its
// result and error. The touch path never calls an Observer: touches are
// counted in Stats.
//
// The nested modules github.com/lastseen/lastseen/extra/lastseenprom
// (Prometheus) and .../extra/lastseenotel (OpenTelemetry) implement it; an
// app's own Observer should embed NopObserver so that methods added later
// do not break it. Methods are called from the flushing or purging
// goroutine, concurrently for shards flushed at the same time
// (Config.FlushConcurrency); they must be safe for concurrent use and
// return quickly.
type Observer interface {
	// StartFlush begins one flush run (Flush, a scheduled flush or the
	// final flush of Close). end gets the run's FlushResult and its error
	// (nil, or every shard's error joined).
	StartFlush(ctx context.Context) (context.Context, func(FlushResult, error))
	// StartFlushShard begins the flush of shard (0 to Config.Shards-1)
	// within a run, on a shard that had a pending or in-flight hash. end
	// gets that shard's part of the counts (Shards is 1 when it was
	// flushed, Skipped is 1 when another instance held its lock) and its
	// error.
	StartFlushShard(ctx context.Context, shard int) (context.Context, func(FlushResult, error))
	// StartPurge begins one PurgeExpiredSessions run (scheduled or called by
	// the app). end gets the run's PurgeResult and error: ErrLocked when
	// another instance held the purge lock (nothing ran), ErrClosed or the
	// context's cause when the run was stopped.
	StartPurge(ctx context.Context) (context.Context, func(PurgeResult, error))
	// StartPurgeBatch begins the delete transaction of purge batch (from 1,
	// GORM FindInBatches' numbering). end gets the rows it deleted and its
	// error; batches that found no row to delete are not observed.
	StartPurgeBatch(ctx context.Context, batch int) (context.Context, func(deleted int, err error))
}

// NopObserver is an Observer that does nothing; embed it in an Observer
// that implements only some of the methods.
type NopObserver struct{}

// StartFlush returns ctx and a no-op end function.
func (NopObserver) StartFlush(ctx context.Context) (context.Context, func(FlushResult, error)) {
	return ctx, endNop[FlushResult]
}

// StartFlushShard returns ctx and a no-op end function.
func (NopObserver) StartFlushShard(ctx context.Context, _ int) (context.Context, func(FlushResult, error)) {
	return ctx, endNop[FlushResult]
}

// StartPurge returns ctx and a no-op end function.
func (NopObserver) StartPurge(ctx context.Context) (context.Context, func(PurgeResult, error)) {
	return ctx, endNop[PurgeResult]
}

// StartPurgeBatch returns ctx and a no-op end function.
func (NopObserver) StartPurgeBatch(ctx context.Context, _ int) (context.Context, func(int, error)) {
	return ctx, endNop[int]
}

// endNop is the end function of a run no observer watches.
func endNop[R any](R, error) {}

// observers is the plugin's list of observers, replaced whole on
// AddObserver so that runs read it without a lock.
type observers struct {
	list atomic.Pointer[[]Observer]
}

// AddObserver makes o watch every flush and purge that starts from now on,
// after the observers added before it. It is safe to call at any time, also
// while runs go on; there is no way to remove an observer. A nil o is
// ignored.
func (p *Plugin) AddObserver(o Observer) {
	if o == nil {
		return
	}
	for {
		old := p.obs.list.Load()
		var next []Observer
		if old != nil {
			next = append(next, *old...)
		}
		next = append(next, o)
		if p.obs.list.CompareAndSwap(old, &next) {
			return
		}
	}
}

// observeFlush starts a flush run on every observer; with none it returns
// ctx and a no-op without allocating.
func (p *Plugin) observeFlush(ctx context.Context) (context.Context, func(FlushResult, error)) {
	return observeAll(ctx, &p.obs, endNop[FlushResult], Observer.StartFlush)
}

// observeFlushShard is observeFlush for one shard.
func (p *Plugin) observeFlushShard(ctx context.Context, shard int) (context.Context, func(FlushResult, error)) {
	return observeAll(ctx, &p.obs, endNop[FlushResult], func(o Observer, ctx context.Context) (context.Context, func(FlushResult, error)) {
		return o.StartFlushShard(ctx, shard)
	})
}

// observePurge starts a purge run on every observer.
func (p *Plugin) observePurge(ctx context.Context) (context.Context, func(PurgeResult, error)) {
	return observeAll(ctx, &p.obs, endNop[PurgeResult], Observer.StartPurge)
}

// observePurgeBatch starts one purge batch on every observer.
func (p *Plugin) observePurgeBatch(ctx context.Context, batch int) (context.Context, func(int, error)) {
	return observeAll(ctx, &p.obs, endNop[int], func(o Observer, ctx context.Context) (context.Context, func(int, error)) {
		return o.StartPurgeBatch(ctx, batch)
	})
}

// observeAll calls start on every observer in obs, in the order they were
// added, each with the context the one before returned, and returns the
// last context and an end function that ends them in reverse order (the
// last started ends first, as nested spans do). With no observer it returns
// ctx and nop, a static no-op, so that nothing is allocated.
func observeAll[R any](ctx context.Context, obs *observers, nop func(R, error), start func(Observer, context.Context) (context.Context, func(R, error))) (context.Context, func(R, error)) {
	list := obs.list.Load()
	if list == nil {
		return ctx, nop
	}
	ends := make([]func(R, error), len(*list))
	for i, o := range *list {
		ctx, ends[i] = start(o, ctx)
	}
	return ctx, func(r R, err error) {
		for i := len(ends) - 1; i >= 0; i-- {
			ends[i](r, err)
		}
	}
}

// Target names what the plugin writes to, for labels and span attributes.
type Target struct {
	// Dialect is the GORM dialector's name: "postgres", "mysql" (also for
	// MariaDB) or "sqlite".
	Dialect string
	// Table is the users table a flush writes (the user model's table).
	Table string
	// SessionTable is the sessions table a purge deletes from.
	SessionTable string
	// Prefix is Config.Prefix, the start of every Redis key.
	Prefix string
}

// Target returns what the plugin writes to. Before db.Use only Prefix is
// set and the error is ErrNotInitialized.
func (p *Plugin) Target() (Target, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	t := Target{Prefix: p.cfg.Prefix}
	if p.db == nil {
		return t, ErrNotInitialized
	}
	t.Dialect, t.Table, t.SessionTable = p.dialect.Name(), p.users.model.table, p.sessions.model.table
	return t, nil
}
