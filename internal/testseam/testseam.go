// Package testseam is the one seam between lastseen and its own black-box
// tests (the tests module of this repository): the knobs that apps have no
// reason to turn but that a test must shorten or lower to reach a case in
// reasonable time (a lock lost, an entry refused until dropped, an id over
// the length limit), the points where a test stops a flush, and what a test
// reads of a live plugin, which the plugin publishes here. A plugin reads
// and writes it only when its Config.Test.Seam is set; apps leave that nil,
// and the Go internal rule keeps this package out of reach of other
// modules.
package testseam

import (
	"context"
	"time"

	"github.com/lastseen/lastseen/internal/buffer"
	"github.com/robfig/cron/v3"
	"gorm.io/gorm"
)

// Seam holds a test's overrides, its flush hooks and what the plugin
// publishes. A zero override leaves the library's own value; every
// override is validated like a configured value. New keeps its own copy of
// the Seam (Published emptied), so plugins built from one Config never
// share one: set the overrides and hooks before New, and reach the
// plugin's copy, to change its hooks or read Published, through
// Plugin.Config().Test.Seam.
type Seam struct {
	// LockTTL is the time-to-live of the flush and purge locks (30s; at
	// least 1s, db.Use refuses less), refreshed every third of it while a
	// flush or purge works.
	LockTTL time.Duration
	// StatementTimeout bounds each SQL statement of a flush (20s, whatever
	// LockTTL: the lock is refreshed while the statement runs). A batch
	// whose statement runs past it is written in halves.
	StatementTimeout time.Duration
	// PurgeBatchTimeout bounds one purge batch (10s, whatever LockTTL).
	PurgeBatchTimeout time.Duration
	// PurgeTimeout is the deadline of a scheduled purge (30m).
	PurgeTimeout time.Duration
	// PurgePause is the pause between two purge batches (50ms; negative:
	// none).
	PurgePause time.Duration
	// BreakerCooldown is how long the breaker in front of Redis stays open
	// (5s).
	BreakerCooldown time.Duration
	// MaxRetries bounds the retries of a batch after a deadlock (3;
	// negative: none).
	MaxRetries int
	// MaxRefusals is how many flushes in a row may refuse an entry before
	// it is dropped (5; negative: never).
	MaxRefusals int
	// MaxIDLength is the longest id Touch accepts, in bytes (128, or the
	// key column's declared length).
	MaxIDLength int
	// BacklogSize caps the in-process backlog of touches Redis did not
	// take (100,000 users).
	BacklogSize int
	// FieldEncoding and SessionEncoding force the encoding of the tracked
	// and the session time columns (0: learned from the field; 1: time; 2:
	// Unix seconds; 3: Unix milliseconds), as a struct tag would.
	FieldEncoding, SessionEncoding int
	// NoPrevious runs Flush.OnBatch as before entries carried their
	// previous values: the plain bulk statement and the hook in one
	// transaction, each Seen with a zero Previous and Written false; for
	// the benchmark of what reading them costs.
	NoPrevious bool

	// Flush are the points where a test stops a flush; the plugin calls
	// them where they are set.
	Flush FlushHooks
	// Purge are the points where a test acts in the middle of a purge or
	// a rule's run.
	Purge PurgeHooks

	// Published is written by the plugin at db.Use (Initialize), once
	// its tracker and scheduler are started; zero before, and after a
	// db.Use that failed before them. Tests only read it.
	Published Published
}

// FlushHooks are called at fixed points of a flush, to stop a flusher
// exactly there (crash tests kill the process at these points). A nil
// field, or a nil *FlushHooks, is not called.
type FlushHooks struct {
	// AfterSwap: the shard's pending hash was just renamed to in-flight.
	AfterSwap func(shard int)
	// AfterCommit: batch number batch (from 1) of the shard committed in the
	// database; it is still in the in-flight hash.
	AfterCommit func(shard, batch int)
	// BeforeAck: the acknowledgement of batch number batch, committed, is
	// about to be sent, in a goroutine of its own: the flush goes on with
	// the next batch meanwhile (its statement may run and commit), and
	// waits for this acknowledgement before it starts the next one.
	BeforeAck func(shard, batch int)
	// AfterAck: the batch was removed from the in-flight hash, and the
	// flush has seen it: the next batch's statement has already run (it
	// committed, or failed) if there was one, and its acknowledgement has
	// not started.
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
	// BeforeWrite: the write statement of these entries (their ids as
	// stored in the buffer) is next, its table resolved; a retry calls it
	// again.
	BeforeWrite func(fields []string)
	// BeforeDelete: the purge's delete of these session ids is next; a
	// retry calls it again.
	BeforeDelete func(ids []any)
}

// PurgeHooks are called at fixed points of a purge or of a run of an
// inactivity rule. A nil field, or a nil *PurgeHooks, is not called.
type PurgeHooks struct {
	// AfterSelect: batch number batch (from 1) of the run selected ids
	// (primary keys, as GORM scanned them), and nothing was checked or
	// done with them yet: neither the buffer read nor the transaction.
	// rule is the rule's name, "" for the session purge.
	AfterSelect func(rule string, batch int, ids []any)
}

// Selected calls AfterSelect if set.
func (h *PurgeHooks) Selected(rule string, batch int, ids []any) {
	if h != nil && h.AfterSelect != nil {
		h.AfterSelect(rule, batch, ids)
	}
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

// Acking calls BeforeAck if set.
func (h *FlushHooks) Acking(shard, batch int) {
	if h != nil && h.BeforeAck != nil {
		h.BeforeAck(shard, batch)
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

// Writing calls BeforeWrite if set.
func (h *FlushHooks) Writing(fields []string) {
	if h != nil && h.BeforeWrite != nil {
		h.BeforeWrite(fields)
	}
}

// Deleting calls BeforeDelete if set.
func (h *FlushHooks) Deleting(ids []any) {
	if h != nil && h.BeforeDelete != nil {
		h.BeforeDelete(ids)
	}
}

// Refreshed calls LockRefreshed if set.
func (h *FlushHooks) Refreshed(key string) {
	if h != nil && h.LockRefreshed != nil {
		h.LockRefreshed(key)
	}
}

// Published is what a plugin hands its tests of itself at db.Use: plain
// values, and funcs bound to the plugin.
type Published struct {
	// Buffer is the plugin's buffer, a *memory.Buffer or a
	// *redisbuf.Buffer (the internal/buffer packages); its tracker runs
	// when it is set.
	Buffer buffer.Buffer
	// StopTracker stops the request path (and closes the buffer) of a
	// plugin that is not closed; it returns the buffer's Close error.
	StopTracker func() error
	// Scheduler runs the scheduled flushes, purges and rules, nil when
	// none is scheduled. Its entry IDs follow the order added: one per
	// flush spec from 1, then one per purge spec, then one per spec of
	// each scheduled rule, in the order of Config.Rules.
	Scheduler *cron.Cron
	// JobsContext is the scheduled runs' context, canceled by Close; nil
	// without Scheduler.
	JobsContext context.Context
	// FlushJob and PurgeJob are what the scheduler runs, without its
	// timeout: they log their outcome and return nothing.
	FlushJob, PurgeJob func(ctx context.Context)
	// RuleJobs are the scheduled job of each inactivity rule, by name, as
	// FlushJob (whether scheduled or not).
	RuleJobs map[string]func(ctx context.Context)
	// Closing is closed when Close begins.
	Closing <-chan struct{}
	// Handle returns the plugin's own database handle, or
	// lastseen.ErrClosed after Close.
	Handle func() (*gorm.DB, error)
	// WriteTarget resolves, once the table exists, the table and columns
	// a flush writes and what the dialect reads of them in the catalogue
	// (the lookup the first flush would make).
	WriteTarget func(ctx context.Context) error
	// SetMaxParams lowers (or raises) the dialect's limit of bind
	// parameters per statement, for this plugin, from the next statement.
	SetMaxParams func(n int)
	// SchedulesPurge reports whether this plugin runs the scheduled purge
	// of its session table, among the plugins on its *gorm.DB now.
	SchedulesPurge func() bool
	// UsersEncoding is the encoding of the tracked time column (1: time;
	// 2: Unix seconds; 3: Unix milliseconds); UsersNaive reports a time
	// column without a time zone.
	UsersEncoding int
	UsersNaive    bool
	// TracksActive reports that the sessions' ActiveField is in use.
	TracksActive bool
}
