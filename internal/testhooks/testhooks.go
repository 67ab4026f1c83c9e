// Package testhooks is the one seam between the lastseen package and its
// black-box tests in the nested tests module: the points where a test stops
// a flush (FlushHooks), and the few internals a test reads or calls directly
// (Internals: the plugin's buffer, the scheduler, the jobs the scheduler
// runs). The tests reach the buffer's own state through the exported names
// of the internal/buffer packages. The lastseen package registers its Internals once, at
// init; nothing here is part of the library's API, and the Go internal rule
// keeps it out of reach of other modules.
package testhooks

import (
	"context"

	"github.com/lastseen/lastseen/internal/buffer"
	"github.com/robfig/cron/v3"
	"gorm.io/gorm"
)

// FlushHooks are called at fixed points of a flush, to stop a flusher
// exactly there (crash tests kill the process at these points). A plugin's
// hooks are nil in production; every method is a no-op then.
type FlushHooks struct {
	// AfterSwap: the shard's pending hash was just renamed to in-flight.
	AfterSwap func(shard int)
	// AfterCommit: batch number batch (from 1) of the shard committed in the
	// database; it is still in the in-flight hash.
	AfterCommit func(shard, batch int)
	// AfterAck: the batch was removed from the in-flight hash; the next
	// batch has not started.
	AfterAck func(shard, batch int)
	// BeforeUnlink: every batch is written and acknowledged; the final
	// acknowledgement, which unlinks the in-flight hash, comes next.
	BeforeUnlink func(shard int)
	// AfterBacklogTake: a flush took n entries out of the backlog to replay
	// them into Redis; touches that fail now find an empty backlog.
	AfterBacklogTake func(n int)
	// LockRefreshed: the lock under key was refreshed by its keeper, while
	// the flush or purge holding it runs.
	LockRefreshed func(key string)
}

// Swapped calls AfterSwap if set.
func (h *FlushHooks) Swapped(shard int) {
	if h != nil && h.AfterSwap != nil {
		h.AfterSwap(shard)
	}
}

// Committed calls AfterCommit if set.
func (h *FlushHooks) Committed(shard, batch int) {
	if h != nil && h.AfterCommit != nil {
		h.AfterCommit(shard, batch)
	}
}

// Acked calls AfterAck if set.
func (h *FlushHooks) Acked(shard, batch int) {
	if h != nil && h.AfterAck != nil {
		h.AfterAck(shard, batch)
	}
}

// Unlinking calls BeforeUnlink if set.
func (h *FlushHooks) Unlinking(shard int) {
	if h != nil && h.BeforeUnlink != nil {
		h.BeforeUnlink(shard)
	}
}

// BacklogTaken calls AfterBacklogTake if set.
func (h *FlushHooks) BacklogTaken(n int) {
	if h != nil && h.AfterBacklogTake != nil {
		h.AfterBacklogTake(n)
	}
}

// Refreshed calls LockRefreshed if set.
func (h *FlushHooks) Refreshed(key string) {
	if h != nil && h.LockRefreshed != nil {
		h.LockRefreshed(key)
	}
}

// Internals are the lastseen package's internals its tests reach. Every
// func takes the *lastseen.Plugin as p.
type Internals struct {
	SetFlushHooks  func(p any, h *FlushHooks)
	RunScheduled   func(p any, purge bool)                // the flush (purge) job as the scheduler runs it, with its timeout
	UsersColumn    func(p any) (encoding int, naive bool) // the tracked column's Encoding, and whether it is naive
	FlushJob       func(p any, ctx context.Context)       // the scheduler's flush run
	PurgeJob       func(p any, ctx context.Context)       // the scheduler's purge run
	Scheduler      func(p any) *cron.Cron                 // nil when no scheduler runs
	JobsContext    func(p any) context.Context            // the scheduled jobs' context, canceled by Close
	Tracking       func(p any) bool                       // the request path (tracker) was started
	StopTracker    func(p any)                            // stops the tracker of a plugin not closed
	Closing        func(p any) <-chan struct{}            // closed when Close begins
	Handle         func(p any) (*gorm.DB, error)          // the plugin's own handle
	WriteTarget    func(p any, ctx context.Context) error
	SetMaxParams   func(p any, n int) // the dialect's bind-parameter limit, for this plugin
	TracksActive   func(p any) bool   // sessions have an ActiveField in use
	SchedulesPurge func(p any) bool
	// Buffer is the plugin's buffer: a *memory.Buffer or a
	// *redisbuf.Buffer (the internal/buffer packages), nil before
	// Initialize.
	Buffer    func(p any) buffer.Buffer
	PluginsOn func(db *gorm.DB) int
}

var internals *Internals

// Register is called once, by the lastseen package's init.
func Register(in Internals) {
	if internals != nil {
		panic("testhooks: registered twice")
	}
	internals = &in
}

// Get returns the registered Internals.
func Get() *Internals { return internals }
