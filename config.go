package lastseen

import (
	"cmp"
	"fmt"
	"log/slog"
	"time"

	"github.com/lastseen/lastseen/internal/timecol"
	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"
)

// WriteMode selects the SQL a flush uses to write timestamps.
type WriteMode int

const (
	// Update (the default) writes with one bulk UPDATE joined to the batch's
	// values. It changes existing rows only: it never creates a row for a
	// deleted or unknown user, and it works on tables with other NOT NULL
	// columns that have no default.
	Update WriteMode = iota
	// Upsert writes with INSERT ... ON CONFLICT (primary key) DO UPDATE (ON
	// DUPLICATE KEY UPDATE on MySQL). Use it only for a dedicated presence
	// table where a row of (id, last_seen_at) alone is valid: it creates rows
	// for ids it has not seen before.
	Upsert
)

// String returns "update" or "upsert".
func (m WriteMode) String() string {
	switch m {
	case Update:
		return "update"
	case Upsert:
		return "upsert"
	}
	return fmt.Sprintf("WriteMode(%d)", int(m))
}

// Default values that New fills into a zero Config field.
const (
	DefaultPrefix            = "lastseen" // first part of the derived Prefix
	DefaultShards            = 16
	DefaultThrottle          = 5 * time.Minute
	DefaultLocalCacheSize    = 100_000
	DefaultTouchTimeout      = 20 * time.Millisecond
	DefaultBatchSize         = 1000
	DefaultFlushConcurrency  = 2
	DefaultField             = "LastSeenAt"
	DefaultFlushSchedule     = "@every 1m"
	DefaultLockTTL           = 30 * time.Second
	DefaultMaxRetries        = 3
	DefaultBacklogSize       = 100_000
	DefaultBreakerCooldown   = 5 * time.Second
	DefaultExpiresField      = "ExpiresAt"
	DefaultPurgeSchedule     = "@every 1h"
	DefaultPurgeBatchSize    = 1000
	DefaultPurgePause        = 50 * time.Millisecond
	DefaultPurgeBatchTimeout = 10 * time.Second
	// DefaultOnlineWindow is the longest window Online answers for.
	DefaultOnlineWindow = time.Hour
	// DefaultActiveUsersRetention is how many whole UTC days before today
	// ActiveUsers can count.
	DefaultActiveUsersRetention = 35 * 24 * time.Hour
	DefaultActiveField          = "LastActiveAt"
	DefaultMaxIDLength          = 128
	DefaultMaxRefusals          = 5
	DefaultFlushTimeout         = 5 * time.Minute
	DefaultPurgeTimeout         = 30 * time.Minute
	DefaultStatementTimeout     = 20 * time.Second
)

// maxIDLengthLimit is the largest MaxIDLength: ids are Redis key suffixes
// and bound parameters of every batch, so they stay small.
const maxIDLengthLimit = 4096

// Config configures the plugin. The zero value of every field means "use
// the default" given in its comment; New fills those in, Initialize
// validates the result against the database.
type Config struct {
	// Redis holds the pending timestamps and the locks, shared by every
	// instance of the app. Any redis.UniversalClient works: *redis.Client,
	// a Sentinel failover client or *redis.ClusterClient. Default nil: the
	// buffer and the locks are in process (memoryBuffer), for an app that
	// runs as one instance; what a crash loses is in the README ("Without
	// Redis"). TouchTimeout, BacklogSize, BreakerCooldown and LockTTL apply
	// to Redis only.
	//
	// Every call honours its context's deadline: a *redis.Client or
	// *redis.ClusterClient without ContextTimeoutEnabled (the go-redis
	// default) is not used directly; Initialize opens the plugin's own
	// client from a copy of its options with ContextTimeoutEnabled set
	// (hooks added with AddHook are not copied), and Close closes it. Other
	// clients are used as they are, each call on a goroutine bounded by its
	// context (see redisclient.go).
	Redis redis.UniversalClient
	// Prefix starts every Redis key the plugin writes. Default: derived at
	// Initialize from the target, "lastseen:<table>:<8 hex digits>", the
	// digits from the database server's identity, the database, the table
	// and the column (manifest.go), so that two apps on one Redis never
	// share a buffer by accident; Plugin.Config returns it. Set the same
	// Prefix on instances that must share a buffer on purpose: the buffer's
	// manifest then makes Initialize refuse an instance whose Shards,
	// dialect, database, table, column or key type differ.
	Prefix string
	// Shards is the number of parts the buffer is split over, each with its
	// own hash tag so that a Redis Cluster spreads them over its masters,
	// and each flushed under its own lock. Inside a shard the Redis buffer
	// spreads users over 4096/Shards small hashes (buckets), so that Redis
	// keeps each in its compact listpack encoding. Default 16; at most 1024.
	// Every instance sharing a Prefix must use the same value.
	Shards int
	// Throttle is the throttle window: a user is recorded at most once per
	// window, a sliding window that starts when the user is recorded and
	// ends on the plugin's clock (Now). Default 5m; at least 1ms.
	Throttle time.Duration
	// LocalCacheSize bounds the in-process cache of users known to be
	// throttled (entries). Default 100,000; negative disables the cache.
	LocalCacheSize int
	// TouchTimeout is the most a Touch waits for Redis before giving up and
	// keeping the timestamp in the in-process backlog. Default 20ms.
	TouchTimeout time.Duration
	// BacklogSize caps the in-process backlog of timestamps that could not
	// reach Redis (users, newest timestamp each). Default 100,000; past the
	// cap new users are dropped and counted in Stats.BacklogDropped.
	BacklogSize int
	// BreakerCooldown is how long the circuit breaker in front of Redis
	// stays open after 5 touches in a row failed or timed out: meanwhile
	// touches go straight to the backlog without calling Redis; after it,
	// up to 64 touches probe Redis, and as many successes in a row close
	// the breaker, one failure opens it again (sony/gobreaker's Timeout and
	// MaxRequests). Default 5s.
	BreakerCooldown time.Duration
	// BatchSize is the number of users written by one SQL statement.
	// Default 1000. Initialize rejects a value whose statement would exceed
	// the dialect's bind-parameter limit (two parameters per user).
	BatchSize int
	// FlushConcurrency is how many shards one flush writes at the same time,
	// each on its own database connection. Shards hold disjoint users, so
	// they never contend for a row. Default 2, or Shards when that is 1;
	// 1 flushes shard by shard; more than Shards is refused.
	FlushConcurrency int
	// WriteMode is Update (default) or Upsert.
	WriteMode WriteMode
	// Model is the tracked model: the app's users, sessions, API tokens or
	// devices, a pointer to a struct GORM can parse with exactly one primary
	// key; the ids given to Touch are its primary key values. Default
	// &User{}.
	Model any
	// Field names the tracked model's last-seen field, by Go field name or
	// column name: a time.Time, *time.Time, sql.NullTime, named time type,
	// driver.Valuer over a time, or integer Unix time (FieldEncoding;
	// coltype.go). Default "LastSeenAt".
	Field string
	// FlushSchedule is when the scheduler flushes, as robfig/cron specs
	// (standard five fields or descriptors such as "@every 1m"), several
	// separated by ";". Default "@every 1m".
	FlushSchedule string
	// LockTTL is the time-to-live of the Redis locks that keep flushes and
	// purges of different instances apart. While a flush or purge runs, its
	// lock is refreshed (redislock Refresh, PEXPIRE) every LockTTL/3 and
	// after each batch; a run whose lock could not be refreshed for LockTTL
	// stops. It must be longer than StatementTimeout and PurgeBatchTimeout,
	// so that a statement never outlives a lock that stopped being
	// refreshed. Default 30s; at least 10ms.
	LockTTL time.Duration
	// MaxRetries bounds how often one batch is retried after a deadlock or
	// serialization failure. Default 3; negative means no retry.
	MaxRetries int

	// SessionModel is the session model purged by PurgeExpiredSessions, a
	// pointer to a struct with exactly one primary key. Default &Session{}.
	SessionModel any
	// ExpiresField names the expiry field of SessionModel, by Go field name
	// or column name; any type Field takes (SessionEncoding). Default
	// "ExpiresAt".
	ExpiresField string
	// PurgeSchedule is when the scheduler purges expired sessions, robfig/cron
	// specs separated by ";" (for example "@every 1h;0 3 * * *"). Default
	// "@every 1h".
	PurgeSchedule string
	// PurgeBatchSize is the number of sessions deleted per transaction.
	// Default 1000.
	PurgeBatchSize int
	// PurgePause is the pause between two purge batches. Default 50ms;
	// negative means no pause.
	PurgePause time.Duration
	// PurgeBatchTimeout bounds one purge batch (select and delete). Default
	// 10s, or two thirds of LockTTL when that is shorter; it must be
	// shorter than LockTTL.
	PurgeBatchTimeout time.Duration

	// DisablePurge leaves the purge job out of the scheduler, for apps that
	// keep no sessions table or purge it elsewhere; PurgeExpiredSessions
	// still works when called.
	DisablePurge bool
	// DisableScheduler turns off the built-in cron; call Flush and
	// PurgeExpiredSessions yourself.
	DisableScheduler bool
	// Logger receives one line per job run and rate-limited warnings.
	// Default slog.Default().
	Logger *slog.Logger
	// Now is the clock; tests set it. Default: the GORM handle's NowFunc
	// (gorm.Config.NowFunc, itself time.Now by default), so the Expired
	// scope and the purge agree on "now". The local cache's deadlines run on
	// the monotonic clock whenever Now is unset.
	Now func() time.Time

	// Presence reads (presence.go, overlay.go).

	// OnlineWindow is the longest window d that Online(ctx, d) answers for:
	// how long the per-minute HyperLogLog buckets are kept after their
	// minute. Default 1h, or Throttle when that is longer; at least
	// Throttle; negative turns the buckets off (no PFADD on the touch path;
	// Online returns ErrCountsDisabled). Memory: per shard, one key per
	// minute with a touch in it, OnlineWindow/1m+1 at most, each at most
	// 12 KB (Redis's dense HyperLogLog) and at most 3,000 bytes while
	// sparse (Redis's hll-sparse-max-bytes).
	OnlineWindow time.Duration
	// ActiveUsersRetention is how long the per-day HyperLogLogs that
	// ActiveUsers counts are kept after their UTC day ends. Default 35 days
	// (a month's active users for a few days more); it is rounded down to
	// whole days; negative turns them off (no PFADD on the touch path;
	// ActiveUsers returns ErrCountsDisabled). Memory: per shard, one key per
	// day kept, each at most 12 KB (dense) and 3,000 bytes while sparse.
	ActiveUsersRetention time.Duration
	// Overlay makes every GORM query that loads the tracked model (First,
	// Take, Last, Find into a struct or a slice of structs or pointers; not
	// Scan, Row or Rows, which bypass GORM's query callbacks) put the
	// freshest buffered value into its last-seen field where it is newer
	// than the column: one pipelined Redis round trip per query, bounded by
	// TouchTimeout and the touch path's circuit breaker; on failure the
	// query keeps the column's values. Default off.
	Overlay bool

	// Deadlines: every call bounded, even when Redis never answers.

	// FlushTimeout is the deadline of a scheduled flush, and of Close's final
	// flush when Close's context has no deadline of its own: the run stops
	// then, with every batch committed so far acknowledged. Default 5m.
	FlushTimeout time.Duration
	// PurgeTimeout is the deadline of a scheduled purge: the run stops
	// between batches then (PurgeExpiredSessions). Default 30m.
	PurgeTimeout time.Duration
	// StatementTimeout bounds each SQL statement of a flush (a batch's
	// UPDATE or upsert, its row count, the column-type lookup, the SELECT 1
	// probe). It must be shorter than LockTTL, so that a statement never
	// outlives a shard lock that stopped being refreshed. Default 20s, or
	// two thirds of LockTTL when that is shorter.
	StatementTimeout time.Duration

	// Derived columns (onbatch.go).

	// OnBatch, when set, runs inside the transaction of each batch's write,
	// after the one bulk statement, with the batch's entries (Seen: primary
	// key value, new timestamp). Its statements commit or roll back with
	// that write; an error rolls the whole batch back and keeps it in Redis
	// (the flush returns it wrapped in ErrOnBatch). Default nil: no
	// transaction, the write is one statement.
	OnBatch func(tx *gorm.DB, batch []Seen) error

	// Sessions that expire by inactivity (idle.go).

	// IdleTimeout, when positive, also expires a session that was idle that
	// long: its ActiveField is at or before now - IdleTimeout. A NULL
	// ActiveField never counts as idle. The Expired scope,
	// ExpiredSessions and the purge use the rule. Default 0: off.
	IdleTimeout time.Duration
	// ActiveField names SessionModel's last-active field, by Go field name
	// or column name; any type Field takes (SessionEncoding). Read only when
	// IdleTimeout is positive. Default "LastActiveAt".
	ActiveField string
	// Ids.

	// MaxIDLength is the longest id Touch accepts, in bytes once written as
	// text (an integer in decimal, a UUID in its canonical form): longer
	// ids are ErrInvalidUserID. Default 128, or, for a string key whose
	// column already exists with a declared length under 128 (varchar(64)),
	// that length. 1 to 4096 (maxIDLengthLimit); Initialize refuses a value
	// over the declared length of an existing string key column, which
	// would refuse or (MySQL without strict mode) truncate longer ids at
	// the flush.
	MaxIDLength int

	// Refusals.

	// MaxRefusals is how many flushes in a row the database may refuse one
	// pending entry on its own (a constraint, a trigger) before the entry
	// is dropped from Redis, counted in FlushResult.Dropped and
	// Stats.Dropped and logged with its id. The count lives in Redis
	// (<prefix>:{N}:refusals), so it spans flushes and instances; a write
	// of the entry clears it. Default 5; negative never drops.
	MaxRefusals int

	// Column types (README "Column types").

	// FieldEncoding is how Field's column stores an instant. Default: the
	// encoding learned from the field's Go type and tags (the `lastseen`
	// struct tag, GORM's autoUpdateTime on an integer).
	FieldEncoding timecol.Encoding
	// SessionEncoding is FieldEncoding for SessionModel's ExpiresField and
	// ActiveField. Default: learned from the fields.
	SessionEncoding timecol.Encoding
	// ColumnLocation is the time zone of the wall times in naive timestamp
	// columns (PostgreSQL timestamp without time zone, MySQL/MariaDB
	// DATETIME): when set, the flush writes and the scopes compare the wall
	// time in it (as a literal cast to the column's type), and reads take
	// the column's wall time in it, whatever location the driver uses. Set
	// it to the location the app's own reads assume (time.Local for an app
	// on MySQL with loc=Local whose plugin handle has another loc, or for
	// PostgreSQL timestamp columns written in local time). Columns that
	// hold instants (timestamptz, MySQL TIMESTAMP, SQLite text with an
	// offset) and integer columns ignore it. Default nil: the driver's
	// location, which is UTC unless the DSN sets another (pgx writes and
	// reads timestamp as UTC; go-sql-driver/mysql uses its loc parameter).
	ColumnLocation *time.Location

	// Eviction (eviction.go).

	// RequireNoEviction makes Initialize refuse (ErrInvalidConfig) a Redis
	// whose maxmemory-policy can evict keys, anything but "noeviction" on
	// any master. A policy that cannot be read (CONFIG and INFO refused) is
	// accepted with a warning. Default false: such a policy is logged as a
	// warning once and shown in Status. Without Redis it has no effect.
	RequireNoEviction bool
}

// withDefaults returns cfg with the Default* values filled into its zero
// fields (New).
func withDefaults(cfg Config) Config {
	cfg.Shards = cmp.Or(cfg.Shards, DefaultShards)
	cfg.Throttle = cmp.Or(cfg.Throttle, DefaultThrottle)
	cfg.LocalCacheSize = cmp.Or(cfg.LocalCacheSize, DefaultLocalCacheSize)
	cfg.TouchTimeout = cmp.Or(cfg.TouchTimeout, DefaultTouchTimeout)
	cfg.BacklogSize = cmp.Or(cfg.BacklogSize, DefaultBacklogSize)
	cfg.BreakerCooldown = cmp.Or(cfg.BreakerCooldown, DefaultBreakerCooldown)
	cfg.BatchSize = cmp.Or(cfg.BatchSize, DefaultBatchSize)
	// Never more than there are shards: Shards 1 alone must stay valid.
	cfg.FlushConcurrency = cmp.Or(cfg.FlushConcurrency, max(1, min(DefaultFlushConcurrency, cfg.Shards)))
	cfg.MaxRetries = cmp.Or(cfg.MaxRetries, DefaultMaxRetries)
	cfg.PurgeBatchSize = cmp.Or(cfg.PurgeBatchSize, DefaultPurgeBatchSize)
	cfg.PurgePause = cmp.Or(cfg.PurgePause, DefaultPurgePause)
	cfg.LockTTL = cmp.Or(cfg.LockTTL, DefaultLockTTL) // before the timeouts that follow it
	cfg.PurgeBatchTimeout = cmp.Or(cfg.PurgeBatchTimeout, min(DefaultPurgeBatchTimeout, cfg.LockTTL*2/3))
	cfg.StatementTimeout = cmp.Or(cfg.StatementTimeout, min(DefaultStatementTimeout, cfg.LockTTL*2/3))
	cfg.FlushTimeout = cmp.Or(cfg.FlushTimeout, DefaultFlushTimeout)
	cfg.PurgeTimeout = cmp.Or(cfg.PurgeTimeout, DefaultPurgeTimeout)
	cfg.Field = cmp.Or(cfg.Field, DefaultField)
	cfg.MaxRefusals = cmp.Or(cfg.MaxRefusals, DefaultMaxRefusals)
	cfg.FlushSchedule = cmp.Or(cfg.FlushSchedule, DefaultFlushSchedule)
	cfg.ExpiresField = cmp.Or(cfg.ExpiresField, DefaultExpiresField)
	cfg.PurgeSchedule = cmp.Or(cfg.PurgeSchedule, DefaultPurgeSchedule)
	cfg.OnlineWindow = cmp.Or(cfg.OnlineWindow, max(DefaultOnlineWindow, cfg.Throttle))
	cfg.ActiveUsersRetention = cmp.Or(cfg.ActiveUsersRetention, DefaultActiveUsersRetention)
	cfg.ActiveField = cmp.Or(cfg.ActiveField, DefaultActiveField)
	cfg.MaxIDLength = cmp.Or(cfg.MaxIDLength, DefaultMaxIDLength)
	if cfg.Model == nil {
		cfg.Model = &User{}
	}
	if cfg.SessionModel == nil {
		cfg.SessionModel = &Session{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return cfg
}
