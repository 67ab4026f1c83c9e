package lastseen

import (
	"context"
	"sync/atomic"
)

// Observer watches flushes, purges and inactivity rule runs, span style: each Start method gets
// the context when a run, shard or batch begins and returns the context to
// continue with (holding a span) and an end function called once with the
// result and error. Touches are not observed. Methods run concurrently
// (Flush.Concurrency) and must be quick. extra/lastseenprom and
// extra/lastseenotel implement it; embed NopObserver in your own.
type Observer interface {
	// StartFlush begins a flush run (Flush, scheduled, or Close's); end
	// gets its FlushResult and the shards' errors joined.
	StartFlush(ctx context.Context) (context.Context, func(FlushResult, error))
	// StartFlushShard begins one shard (0 to Buffer.Shards-1) that had
	// work; end gets that shard's counts (Shards or Skipped is 1).
	StartFlushShard(ctx context.Context, shard int) (context.Context, func(FlushResult, error))
	// StartPurge begins a purge run; end gets its PurgeResult and error
	// (ErrLocked when nothing ran, ErrClosed or ctx's when stopped).
	StartPurge(ctx context.Context) (context.Context, func(PurgeResult, error))
	// StartPurgeBatch begins the delete transaction of batch (from 1), if
	// it has rows; end gets the rows deleted.
	StartPurgeBatch(ctx context.Context, batch int) (context.Context, func(deleted int, err error))
	// StartRule begins a run of the inactivity rule named rule (RunRule,
	// scheduled); end gets its PurgeResult (Deleted: the rows acted on)
	// and error (ErrLocked when nothing ran, ErrClosed or ctx's when
	// stopped). A run of a name the plugin has no rule of is not observed.
	StartRule(ctx context.Context, rule string) (context.Context, func(PurgeResult, error))
	// StartRuleBatch begins batch (from 1, in selection order) of a rule
	// run, the reading of the buffer for its rows and its transaction; end
	// gets the rows acted on (0 and no transaction when every row's newer
	// activity was still buffered).
	StartRuleBatch(ctx context.Context, rule string, batch int) (context.Context, func(acted int, err error))
}

// NopObserver is an Observer that does nothing, to embed.
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

// StartRule returns ctx and a no-op end function.
func (NopObserver) StartRule(ctx context.Context, _ string) (context.Context, func(PurgeResult, error)) {
	return ctx, endNop[PurgeResult]
}

// StartRuleBatch returns ctx and a no-op end function.
func (NopObserver) StartRuleBatch(ctx context.Context, _ string, _ int) (context.Context, func(int, error)) {
	return ctx, endNop[int]
}

// endNop is the end function of a run no observer watches.
func endNop[R any](R, error) {}

// observers is the plugin's list of observers, replaced whole on
// AddObserver so that runs read it without a lock.
type observers struct {
	list atomic.Pointer[[]Observer]
}

// AddObserver makes o watch every run started from now on, after earlier
// observers; safe at any time, never undone, nil ignored.
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

// observeRule starts a run of rule on every observer.
func (p *Plugin) observeRule(ctx context.Context, rule string) (context.Context, func(PurgeResult, error)) {
	return observeAll(ctx, &p.obs, endNop[PurgeResult], func(o Observer, ctx context.Context) (context.Context, func(PurgeResult, error)) {
		return o.StartRule(ctx, rule)
	})
}

// observeRuleBatch starts one batch of a run of rule on every observer.
func (p *Plugin) observeRuleBatch(ctx context.Context, rule string, batch int) (context.Context, func(int, error)) {
	return observeAll(ctx, &p.obs, endNop[int], func(o Observer, ctx context.Context) (context.Context, func(int, error)) {
		return o.StartRuleBatch(ctx, rule, batch)
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
	Dialect      string // "postgres", "mysql" (also MariaDB) or "sqlite"
	Table        string // the table a flush writes (Model's)
	SessionTable string // the table a purge deletes from (Sessions.Model's)
	Prefix       string // Buffer.Prefix, the start of every Redis key
}

// Target returns what the plugin writes to. Before db.Use only Prefix is
// set and the error is ErrNotInitialized.
func (p *Plugin) Target() (Target, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	t := Target{Prefix: p.cfg.Prefix}
	if p.db == nil {
		return t, p.notReady()
	}
	t.Dialect, t.Table, t.SessionTable = p.dialect.Name(), p.users.model.table, p.sessions.model.table
	return t, nil
}
