// Package testseam is the one seam between lastseen and its own black-box
// tests (the tests module of this repository): the knobs that apps have no
// reason to turn but that a test must shorten or lower to reach a case in
// reasonable time (a lock lost, an entry refused until dropped, an id over
// the length limit), and the points where a test stops a flush. A plugin
// reads it only when its Config.Test.Seam is set; apps leave that nil, and
// the Go internal rule keeps this package out of reach of other modules.
package testseam

import "time"

// Seam holds a test's overrides. A zero field leaves the library's own
// value; every override is validated like a configured value.
type Seam struct {
	// LockTTL is the time-to-live of the flush and purge locks (30s).
	LockTTL time.Duration
	// StatementTimeout bounds each SQL statement of a flush (20s, or two
	// thirds of LockTTL when that is shorter).
	StatementTimeout time.Duration
	// PurgeBatchTimeout bounds one purge batch (10s, or two thirds of
	// LockTTL when that is shorter).
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
}
