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
	// fmt.Stringer, is empty or zero, does not fit the key (an integer key
	// refuses leading or trailing spaces), is longer than its column's
	// declared length (characters, or bytes for a binary string column;
	// else 128 bytes), or holds what the column
	// cannot (NUL on PostgreSQL and SQLite, invalid UTF-8 on PostgreSQL
	// and MySQL).
	ErrInvalidUserID = idcodec.ErrInvalid
	// ErrNotInitialized: a method called before db.Use(p); after db.Use
	// refused p, wrapped with db.Use's error.
	ErrNotInitialized = errors.New("lastseen: plugin not initialized (call db.Use first)")
	// ErrClosed is returned after Close by Flush, PurgeExpiredSessions and,
	// without Redis, by touches.
	ErrClosed = errors.New("lastseen: plugin closed")
	// ErrLocked: another instance holds the purge lock (PurgeExpiredSessions)
	// or the rule's lock (RunRule).
	ErrLocked = errors.New("lastseen: another instance holds the lock")
	// ErrInvalidTime: a zero time, one before 1970-01-01T00:00:01Z (the
	// earliest MySQL's TIMESTAMP stores, so every column type takes every
	// accepted time) or more than an hour ahead of the plugin's clock, or an
	// Online window or ActiveUsers range out of bounds.
	ErrInvalidTime = errors.New("lastseen: invalid time")
	// ErrSchema (wrapped, naming the Config field to fix): the table is
	// missing or lacks a configured column; touches stay buffered.
	ErrSchema = errors.New("lastseen: schema does not fit the config")
	// ErrRefused (wrapped, with the count and first error): the database
	// refused some entries on their own; they wait for the next flush.
	ErrRefused = errors.New("lastseen: database refused entries")
	// ErrBuffered wraps a touch's error when Redis did not take it and the
	// backlog did: the next flush writes it, callers may ignore it.
	ErrBuffered = errors.New("lastseen: kept in the in-process backlog")
	// ErrDropped wraps a touch's error when neither Redis nor the backlog
	// (full at 100,000 users, or closed) took it: the timestamp is lost.
	ErrDropped = errors.New("lastseen: dropped: the backlog is full or closed")
	// ErrSystemic (wrapped): a refusal no row causes (read-only database,
	// missing privilege); the flush keeps every entry, the purge stops.
	ErrSystemic = errors.New("lastseen: the database refuses every write")
	// ErrCountsDisabled: Online or ActiveUsers turned off by a negative
	// Presence setting.
	ErrCountsDisabled = errors.New("lastseen: presence counts are turned off")
	// ErrOnBatch wraps Flush.OnBatch's error: the batch rolled back and
	// stays buffered, and the hook runs for it again at the next flush.
	ErrOnBatch = errors.New("lastseen: OnBatch failed")
	// ErrUncomparable (wrapped, with the count, column and first id): on
	// SQLite, a row's value has the wrong type to compare (text in a
	// Unix-time column, an integer in a timestamp column); kept buffered.
	ErrUncomparable = errors.New("lastseen: column value cannot be compared")
)

// Internal errors, never returned bare to callers.
var (
	// errNoTable is a missing users table or column: a statement error.
	errNoTable = dialect.ErrNoTable
	// errBatchTimeout is the cause of a purge batch's select or transaction
	// that ran past the 10s batch timeout.
	errBatchTimeout = errors.New("PurgeBatchTimeout")
	// errStatementTimeout is the cause of a flush statement that ran past
	// the 20s statement timeout: the batch is written in halves
	// (splitTimedOut).
	errStatementTimeout = errors.New("StatementTimeout")
	// errPurgeLockLost: the purge lock expired or was taken over while the
	// purge ran (Lease.Keep); the run stops between batches.
	errPurgeLockLost = errors.New("lastseen: purge: lost the purge lock")
)
