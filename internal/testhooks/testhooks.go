// Package testhooks is the one seam between the lastseen package and its
// black-box tests in the nested tests module: the points where a test stops
// a flush (FlushHooks), and the few internals a test reads or calls directly
// (Internals: the buffer's state, the breaker, the scheduler, the jobs the
// scheduler runs). The lastseen package registers its Internals once, at
// init; nothing here is part of the library's API, and the Go internal rule
// keeps it out of reach of other modules.
package testhooks

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/robfig/cron/v3"
	"github.com/sony/gobreaker/v2"
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
	// LockRefreshed: the lock under key was refreshed by its keeper
	// (lockKeeper), while the flush or purge holding it runs.
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

// Buffer is what tests read and write in a plugin's buffer, in the terms
// of the Redis key layout (internal/keys) whatever the buffer kind.
type Buffer interface {
	// Memory reports the in-process buffer (no Redis).
	Memory() bool
	// StateKeys lists, unsorted, the Redis keys (prefix cut off) that would
	// hold the in-process buffer's state at now: ":{N}:pending",
	// ":{N}:inflight", ":{N}:refusals" for non-empty sets, ":{N}:seen:<id>"
	// for throttle windows still open; nil for the Redis buffer.
	StateKeys(now time.Time) []string
	// LeaveInFlight swaps shard n's pending set to in-flight under the
	// shard's lock, as a flush that failed after its swap leaves it.
	LeaveInFlight(ctx context.Context, n int) error
	// InFlightLen is the number of entries in shard n's in-flight set.
	InFlightLen(ctx context.Context, n int) (int64, error)
	// PutInFlight stores uid's timestamp at in its shard's in-flight set.
	PutInFlight(ctx context.Context, uid string, at time.Time) error
	// PutBacklog keeps uid's timestamp in the Redis buffer's backlog, as
	// a touch during an outage does; in memory (no backlog) it touches.
	PutBacklog(ctx context.Context, uid string, at time.Time) error
	// Backlog returns uid's Unix microseconds in the backlog.
	Backlog(uid string) (int64, bool)
	// Breaker is the Redis buffer's circuit breaker state.
	Breaker() gobreaker.State
	// BreakerCounts are the Redis buffer's breaker counts.
	BreakerCounts() gobreaker.Counts
	// SetTouchTimeout changes the Redis buffer's TouchTimeout.
	SetTouchTimeout(d time.Duration)
	// Client is the Redis buffer's client: own when the plugin opened it,
	// deadlines when it enforces context deadlines on its sockets.
	Client() (c redis.UniversalClient, own, deadlines bool)
	// Refusals is the number of flushes in a row that refused uid's entry.
	Refusals(ctx context.Context, uid string) (int, error)
	// LockShard takes shard n's flush lock (as a flusher would) and returns
	// its release.
	LockShard(ctx context.Context, n int) (release func(context.Context), err error)
	// LockPurge takes the purge lock and returns its release.
	LockPurge(ctx context.Context) (release func(context.Context), err error)
	// Markers is the number of throttle markers the in-process buffer keeps
	// for shard n, expired ones not yet swept included.
	Markers(n int) int
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
	Buffer         func(p any) Buffer
	PluginsOn      func(db *gorm.DB) int
	IsLockLost     func(err error) bool
	IsCallerEnded  func(err error) bool                              // a Redis call ended by its caller's context
	LoadTouch      func(ctx context.Context, c redis.Scripter) error // SCRIPT LOAD of the touch script
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
