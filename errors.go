package lastseen

import (
	"errors"

	"github.com/lastseen/lastseen/internal/dialect"
	"github.com/lastseen/lastseen/internal/idcodec"
)

// Errors returned by the plugin, to test with errors.Is. Every error the
// plugin returns starts with "lastseen:".
var (
	// ErrInvalidConfig wraps every configuration problem db.Use finds.
	ErrInvalidConfig = errors.New("lastseen: invalid config")
	// ErrInvalidUserID: an id that is not an integer, string or
	// fmt.Stringer (for an integer key also a whole float64 up to 2^53 or a
	// json.Number), is empty or zero, is longer than 128 bytes or the key
	// column's declared length, does not fit the primary key, or holds what
	// the column cannot (NUL on PostgreSQL and SQLite, invalid UTF-8 on
	// PostgreSQL and MySQL).
	ErrInvalidUserID = idcodec.ErrInvalid
	// ErrNotInitialized is returned by methods called before db.Use(p).
	ErrNotInitialized = errors.New("lastseen: plugin not initialized (call db.Use first)")
	// ErrClosed is returned by Flush and PurgeExpiredSessions after Close.
	ErrClosed = errors.New("lastseen: plugin closed")
	// ErrLocked: another instance holds the purge lock; the scheduler
	// skips the tick.
	ErrLocked = errors.New("lastseen: another instance holds the lock")
	// ErrInvalidTime: TouchAt got a zero time, a time before 1970, or one
	// more than MaxClockSkew ahead of the plugin's clock.
	ErrInvalidTime = errors.New("lastseen: invalid time")
	// ErrSchema (wrapped, naming the Config field to fix): a flush or purge
	// found its table missing or without a configured column; the touches
	// stay buffered. db.Use reports a table without the column as
	// ErrInvalidConfig and ErrSchema, and only logs a missing table.
	ErrSchema = errors.New("lastseen: schema does not fit the config")
	// ErrRefused (wrapped, with the count and the first database error):
	// the database refused some entries on their own (a constraint, a
	// trigger); the rest was written, the refused ones wait for the next
	// flush.
	ErrRefused = errors.New("lastseen: database refused entries")
	// ErrBuffered wraps a touch's error when Redis did not take it (down,
	// slow past Buffer.TouchTimeout, breaker open, caller's context ended)
	// and the timestamp went to the in-process backlog, which the next
	// flush writes: callers may ignore it. The cause is wrapped too.
	ErrBuffered = errors.New("lastseen: kept in the in-process backlog")
	// ErrDropped wraps a touch's error when neither Redis nor the backlog
	// (full at 100,000 users, or closed) took it: the timestamp is lost,
	// counted in Stats.BacklogDropped.
	ErrDropped = errors.New("lastseen: dropped: the backlog is full or closed")
	// ErrSystemic (wrapped, with the database's error): a refusal no single
	// row causes (read-only database, missing privilege, table or column;
	// judged by SQLSTATE, MySQL error number or SQLite code). The flush
	// keeps every entry; the purge stops.
	ErrSystemic = errors.New("lastseen: the database refuses every write")
	// ErrInvalidRange: an Online window shorter than Throttle or longer than
	// Presence.OnlineWindow, or an ActiveUsers range that ends before it
	// starts or starts before the days kept.
	ErrInvalidRange = errors.New("lastseen: invalid range")
	// ErrCountsDisabled: Online with a negative Presence.OnlineWindow, or
	// ActiveUsers with a negative Presence.ActiveUsersRetention.
	ErrCountsDisabled = errors.New("lastseen: presence counts are turned off")
	// ErrOnBatch wraps the error of Flush.OnBatch (errors.Is finds both).
	// The batch's transaction rolled back and its entries stay buffered,
	// not counted Failed; the hook runs for the whole batch again at the
	// next flush.
	ErrOnBatch = errors.New("lastseen: OnBatch failed")
	// ErrUncomparable (wrapped, with the count, column and first id): on
	// SQLite, a row's value could not be compared with the timestamp (text
	// in a Unix-time column, an integer in a timestamp column). Those
	// entries wait for the next flush (FlushResult.Uncomparable).
	ErrUncomparable = errors.New("lastseen: column value cannot be compared")
)

// Internal errors, never returned bare to callers.
var (
	// errLockLost: a flusher's shard lock expired or was taken over; the
	// shard's flush stops and the in-flight hash stays for the next flush.
	errLockLost = errors.New("lastseen: lost the shard lock to another flusher")
	// errNoTable is a missing users table or column: a statement error.
	errNoTable = dialect.ErrNoTable
	// errBatchTimeout is the cause of a purge batch's select or transaction
	// that ran past the 10s batch timeout.
	errBatchTimeout = errors.New("PurgeBatchTimeout")
	// errStatementTimeout is the cause of a flush statement that ran past
	// the 20s statement timeout: the shard's flush stops, the batch stays in Redis.
	errStatementTimeout = errors.New("StatementTimeout")
	// errCallerEnded marks a touch whose caller's context ended before Redis
	// answered: kept in the backlog, not counted by the circuit breaker.
	errCallerEnded = errors.New("the caller's context ended")
	// errPurgeLockLost: the purge lock expired or was taken over while the
	// purge ran (lockKeeper); the run stops between batches.
	errPurgeLockLost = errors.New("lastseen: purge: lost the purge lock")
)
