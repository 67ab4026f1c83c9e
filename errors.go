package lastseen

import (
	"errors"

	"github.com/lastseen/lastseen/internal/dialect"
	"github.com/lastseen/lastseen/internal/idcodec"
)

// Errors returned by the plugin. Every error it returns starts with
// "lastseen:"; test for these with errors.Is.
var (
	// ErrInvalidConfig wraps every configuration problem Initialize finds.
	ErrInvalidConfig = errors.New("lastseen: invalid config")
	// ErrInvalidUserID is returned for a user id that is not an integer,
	// string or fmt.Stringer (or, for an integer key, a whole float64 of
	// magnitude at most 2^53 or a json.Number), is empty or zero, is longer
	// than the id length limit (128 bytes, or the key column's declared length), does not fit the user model's primary
	// key, or is a string the key column can never hold: a NUL byte on
	// PostgreSQL and SQLite, invalid UTF-8 on PostgreSQL and MySQL/MariaDB
	// (utf8mb4).
	ErrInvalidUserID = idcodec.ErrInvalid
	// ErrNotInitialized is returned by methods called before db.Use(p).
	ErrNotInitialized = errors.New("lastseen: plugin not initialized (call db.Use first)")
	// ErrClosed is returned by Flush and PurgeExpiredSessions after Close.
	ErrClosed = errors.New("lastseen: plugin closed")
	// ErrLocked is returned when another instance holds the Redis lock of a
	// purge; the scheduled job treats it as "skip this tick".
	ErrLocked = errors.New("lastseen: another instance holds the lock")
	// ErrInvalidTime is returned by TouchAt for a zero time, a time before
	// 1970, or one more than MaxClockSkew ahead of the plugin's clock.
	ErrInvalidTime = errors.New("lastseen: invalid time")
	// ErrSchema is returned (wrapped, naming the Config field to fix) by a
	// flush or purge whose table is missing or lacks a column the config
	// names; the pending touches stay buffered. Initialize reports a
	// present table without the column as ErrInvalidConfig and ErrSchema
	// both, and a missing table as a warning (apps often AutoMigrate after
	// db.Use).
	ErrSchema = errors.New("lastseen: schema does not fit the config")
	// ErrRefused is returned (wrapped, with the count and the first database
	// error) by a flush in which the database refused some entries on their
	// own, for example through a constraint or trigger. The rest of their
	// batches was written; the refused entries went back to pending for the
	// next flush.
	ErrRefused = errors.New("lastseen: database refused entries")
	// ErrBuffered wraps a touch's error when Redis did not take the touch
	// (down, slow past TouchTimeout, the breaker open, the caller's context
	// ended) and the timestamp was kept in the in-process backlog instead:
	// the next flush writes it, so a caller may ignore this error
	// (errors.Is(err, ErrBuffered)); the cause is wrapped too.
	ErrBuffered = errors.New("lastseen: kept in the in-process backlog")
	// ErrDropped wraps a touch's error when Redis did not take the touch and
	// the backlog could not keep it either (full at BacklogSize, or after
	// Close): the timestamp is lost, counted in Stats.BacklogDropped.
	ErrDropped = errors.New("lastseen: dropped: the backlog is full or closed")
	// ErrSystemic is returned (wrapped, with the database's error) by a
	// flush or purge that met a refusal no single row can cause: the whole
	// batch, one entry alone and a write touching no row all failed with
	// the same kind of error (same SQLSTATE, MySQL error number or SQLite
	// result code), as a read-only database, a missing privilege, table or
	// column do. The flush keeps every entry in Redis; the purge stops.
	ErrSystemic = errors.New("lastseen: the database refuses every write")
	// ErrInvalidRange is returned by Online for a window shorter than the
	// throttle window or longer than OnlineWindow, and by ActiveUsers for a
	// range that ends before it starts or starts before the days kept
	// (ActiveUsersRetention).
	ErrInvalidRange = errors.New("lastseen: invalid range")
	// ErrCountsDisabled is returned by Online when OnlineWindow is negative
	// and by ActiveUsers when ActiveUsersRetention is negative.
	ErrCountsDisabled = errors.New("lastseen: presence counts are turned off")
	// ErrOnBatch wraps the error Config.OnBatch returned (errors.Is finds both
	// it and the hook's own error). The batch's transaction rolled back, the
	// batch's last-seen values included, and its entries stay in Redis (the
	// in-flight hash) for the next flush; they are not counted in
	// FlushResult.Failed. A hook failure is never split to isolate an entry,
	// as a refusal of the bulk statement is: the hook runs for the whole batch
	// again at the next flush, and a hook that must tolerate one bad row does
	// so itself.
	ErrOnBatch = errors.New("lastseen: OnBatch failed")
	// ErrUncomparable is returned (wrapped, with the count, the column, its
	// encoding and the first id) by a flush in which the forward-only guard
	// could not compare a row's value with the entry's timestamp: on SQLite,
	// text in a Unix-time INTEGER column, or an integer in a timestamp
	// column. Those entries are neither written nor Stale: they go back to
	// pending for the next flush and count in FlushResult.Uncomparable and
	// Stats.Uncomparable (see uncomparable.go).
	ErrUncomparable = errors.New("lastseen: column value cannot be compared")
)

// Internal errors, never returned bare to callers.
var (
	// errNoTable is a missing users table or column: a statement error.
	errNoTable = dialect.ErrNoTable
	// errBatchTimeout is the cause of a purge batch's select or transaction
	// that ran past PurgeBatchTimeout.
	errBatchTimeout = errors.New("PurgeBatchTimeout")
	// errStatementTimeout is the cause of a flush statement that ran past
	// StatementTimeout: the shard's flush stops, the batch stays in Redis.
	errStatementTimeout = errors.New("StatementTimeout")
	// errPurgeLockLost: the purge lock expired or was taken over while the
	// purge ran (Lease.Keep); the run stops between batches.
	errPurgeLockLost = errors.New("lastseen: purge: lost the purge lock")
)
