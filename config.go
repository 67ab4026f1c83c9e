package lastseen

import (
	"cmp"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/lastseen/lastseen/internal/testseam"
	"github.com/lastseen/lastseen/internal/timecol"
	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"
)

// Defaults that New fills into zero Config fields. The other defaults are
// given in each field's doc.
const (
	DefaultPrefix        = "lastseen" // first part of a derived Buffer.Prefix
	DefaultThrottle      = 5 * time.Minute
	DefaultShards        = 16
	DefaultBatchSize     = 1000
	DefaultFlushSchedule = "@every 1m"
	DefaultPurgeSchedule = "@every 1h"
)

// Fixed values: knobs no app has had a reason to turn. The tests shorten
// some of them through Config.Test.Seam.
const (
	defaultLocalCacheSize       = 100_000
	defaultTouchTimeout         = 20 * time.Millisecond
	defaultFlushConcurrency     = 2
	defaultField                = "LastSeenAt"
	defaultLockTTL              = 30 * time.Second
	defaultMaxRetries           = 3
	defaultBacklogSize          = 100_000
	defaultBreakerCooldown      = 5 * time.Second
	defaultExpiresField         = "ExpiresAt"
	defaultPurgeBatchSize       = 1000
	defaultPurgePause           = 50 * time.Millisecond
	defaultPurgeBatchTimeout    = 10 * time.Second
	defaultOnlineWindow         = time.Hour
	defaultActiveUsersRetention = 35 * 24 * time.Hour
	defaultActiveField          = "LastActiveAt"
	defaultMaxIDLength          = 128
	defaultMaxRefusals          = 5
	defaultFlushTimeout         = 5 * time.Minute
	defaultPurgeTimeout         = 30 * time.Minute
	defaultStatementTimeout     = 20 * time.Second
	// minLockTTL is the shortest LockTTL the test seam may set: the keeper
	// refreshes a lock every third of its TTL, and a refresh (a Redis round
	// trip, with the retries of one that failed) must fit in that.
	minLockTTL = time.Second
)

// Off as a Flush.Schedule, Sessions.Schedule or Rule.Schedule leaves that
// job out of the scheduler; Flush, PurgeExpiredSessions and RunRule still
// work when called.
const scheduleOff = "off"

// maxThrottle is the longest throttle window: Redis's scripts compute
// window ends in microseconds as Lua numbers (doubles), exact to 2^53.
const maxThrottle = 31 * 24 * time.Hour

// maxIDLengthLimit is the largest MaxIDLength: ids are Redis key suffixes
// and bound parameters of every batch, so they stay small.
const maxIDLengthLimit = 4096

// Config configures the plugin. Every zero field means its default; New
// fills them in, and db.Use (Initialize) checks the result against the
// database. Most apps set Redis and, when the tracked model is not User,
// Model and Field.
type Config struct {
	// Redis holds the buffer and the locks, shared by every instance of the
	// app: a *redis.Client, a Sentinel failover client or a
	// *redis.ClusterClient. Nil (the default) keeps them in process, for an
	// app that runs as one instance; a crash then loses what was not
	// flushed yet.
	Redis redis.UniversalClient
	// Model is the tracked model: a pointer to the app's struct (users,
	// sessions, API tokens, devices) with exactly one primary key, whose
	// values are the ids given to Touch. Default &User{}.
	Model any
	// Field names Model's last-seen field, by Go field name or column name:
	// a time.Time, *time.Time, sql.NullTime, named time type, or an int64
	// of Unix seconds or milliseconds (tag it `lastseen:"unix"` or
	// `lastseen:"unixmilli"`, or use GORM's autoUpdateTime tag). Default
	// "LastSeenAt".
	Field string
	// Throttle is the throttle window: a user is recorded at most once per
	// window, so the column lags the truth by at most Throttle plus the
	// flush interval. Raise it to write less, lower it for fresher values.
	// Default 5m; 1ms to 31 days. On a DATE column each window ends at the
	// next midnight in the column's location: the default is then 25h and
	// a shorter Throttle is refused.
	Throttle time.Duration
	// Logger gets one line per job run and rate-limited warnings. Default
	// slog.Default().
	Logger *slog.Logger

	Buffer   BufferConfig   // where pending timestamps wait
	Flush    FlushConfig    // how and when they reach the table
	Sessions SessionConfig  // expired sessions and their purge
	Rules    []Rule         // inactivity rules: rows unused too long, acted on in batches
	Presence PresenceConfig // online counts and fresh reads
	Test     TestConfig     // for tests only
}

// BufferConfig tunes the buffer. Its defaults fit apps up to millions of
// users.
type BufferConfig struct {
	// Prefix starts every Redis key. Default: derived from the database
	// server, database, table and column, "lastseen:<table>:<8 hex
	// digits>", so two apps on one Redis never share a buffer by accident.
	// Set the same Prefix on instances that must share one; instances whose
	// Shards, database, table, column or key type differ are refused.
	Prefix string
	// Shards splits the buffer into parts flushed under their own locks
	// and, on a Redis Cluster, spread over its masters. Raise it when one
	// shard's flush is too long or a cluster has more masters than shards.
	// Every instance sharing a Prefix uses the same value. Default 16; at
	// most 1024.
	Shards int
	// LocalCacheSize bounds the in-process cache of users known to be
	// throttled, which answers most touches without Redis. Raise it when
	// Stats.CacheHits is far below Stats.Throttled on a busy app. Default
	// 100,000 entries; negative turns it off.
	LocalCacheSize int
	// TouchTimeout is the most a touch waits for Redis before keeping the
	// timestamp in process (Stats.Backlogged). Raise it when Redis is far
	// from the app. Default 20ms.
	TouchTimeout time.Duration
	// RequireNoEviction makes db.Use refuse a Redis whose maxmemory-policy
	// can evict keys (anything but noeviction), which would lose pending
	// timestamps. Default false: such a policy is logged and shown in
	// Status.
	RequireNoEviction bool
}

// FlushConfig tunes the flush, which writes the buffer into the table.
type FlushConfig struct {
	// Schedule is when the scheduler flushes: robfig/cron specs (five
	// fields, or descriptors such as "@every 1m"), several separated by
	// ";", or "off" to call Flush yourself. Default "@every 1m".
	Schedule string
	// BatchSize is the number of rows one statement writes (two bind
	// parameters each; halved while statements run past their 20s bound).
	// Lower it when a statement holds row locks too long. Default 1000.
	BatchSize int
	// Concurrency is how many shards one flush writes at once, each on its
	// own connection. Raise it when a flush cannot keep up. Default 2 (1
	// with one shard); at most Buffer.Shards.
	Concurrency int
	// Timeout is the deadline of one scheduled flush and of the final
	// flush in Close. Default 5m.
	Timeout time.Duration
	// Upsert writes with INSERT ... ON CONFLICT DO UPDATE (MySQL: ON
	// DUPLICATE KEY UPDATE), creating rows for unknown ids: only for a
	// dedicated presence table. Default false: UPDATE, which never creates
	// a row.
	Upsert bool
	// OnBatch, when set, runs in each batch's transaction after its write,
	// with the batch's entries, each with the value the column held before
	// (Seen); an error rolls the batch back and keeps it buffered (the
	// flush returns ErrOnBatch). Use it to keep derived rows (daily visits,
	// an audit log) in step with the column. Batches of different shards
	// are written concurrently (up to Concurrency at a time), so a hook
	// that shares state outside tx guards it.
	OnBatch func(tx *gorm.DB, batch []Seen) error
	// ColumnLocation is the time zone of the wall times in a column without
	// one (PostgreSQL timestamp, MySQL DATETIME). Set it when the app's own
	// reads assume another. Default nil: on PostgreSQL the zone of GORM's
	// NowFunc (pgx writes the app's times in their own zone), on MySQL the
	// DSN's loc.
	ColumnLocation *time.Location
}

// SessionConfig describes the session model and the purge of its expired
// rows.
type SessionConfig struct {
	// Model is the session model, a pointer to a struct with exactly one
	// primary key. Default &Session{}.
	Model any
	// ExpiresField names Model's expiry field, by Go field name or column
	// name; any type Config.Field takes. Default "ExpiresAt".
	ExpiresField string
	// IdleTimeout, when positive, also expires a session idle that long:
	// its ActiveField at or before now - IdleTimeout (NULL is never idle).
	// Default 0: off.
	IdleTimeout time.Duration
	// ActiveField names Model's last-active field, read when IdleTimeout is
	// positive. Default "LastActiveAt".
	ActiveField string
	// Schedule is when the scheduler purges expired sessions (specs as for
	// Flush.Schedule), or "off" to call PurgeExpiredSessions yourself.
	// Default "@every 1h".
	Schedule string
	// BatchSize is the number of sessions deleted per transaction. Lower
	// it when a delete holds locks too long. Default 1000.
	BatchSize int
	// Disabled leaves sessions out, for an app without a sessions table or
	// that purges it elsewhere: db.Use does not check the table and nothing
	// is scheduled; PurgeExpiredSessions still works when called.
	Disabled bool
}

// PresenceConfig tunes the counts of users online and active, and the
// fresh values in loaded rows. They need Redis for instances to agree.
type PresenceConfig struct {
	// OnlineWindow is the longest window Online answers for. Each minute
	// with a touch keeps one HyperLogLog per shard (at most 12 KB) that
	// long, written by the flush (with Redis, Online counts the touches up
	// to the last flush). Default 1h, at least Throttle (off on a DATE column); negative
	// turns Online off.
	OnlineWindow time.Duration
	// ActiveUsersRetention is how long the daily HyperLogLogs ActiveUsers
	// counts are kept after their UTC day. Default 35 days; negative turns
	// ActiveUsers off.
	ActiveUsersRetention time.Duration
	// Overlay makes every GORM query that loads Model (First, Take, Last,
	// Find) put the buffered value into the last-seen field where it is
	// newer than the column, with one Redis round trip per query (one
	// script call on a single server, one per shard on a cluster) and no
	// cache: each query reads what the buffer holds then. With nothing
	// buffered for the rows it adds about 2% to a 100-row Find's CPU and
	// one allocation with the in-process buffer (the benchmarks page of the
	// docs has the figures). Default off.
	Overlay bool
}

// TestConfig is for tests.
type TestConfig struct {
	// Now is the plugin's clock. Default GORM's NowFunc, so the Expired
	// scope and the purge agree on the time.
	Now func() time.Time
	// Seam is for this module's own tests; apps leave it nil.
	Seam *testseam.Seam
}

// writeMode selects the SQL a flush uses to write timestamps.
type writeMode int

const (
	// update writes with one bulk UPDATE joined to the batch's values.
	update writeMode = iota
	// upsert writes with INSERT ... ON CONFLICT (primary key) DO UPDATE.
	upsert
)

// String returns "update" or "upsert".
func (m writeMode) String() string {
	if m == upsert {
		return "upsert"
	}
	return "update"
}

// settings is Config resolved: the flat set of values the plugin runs on,
// with every default and fixed value filled in.
type settings struct {
	Redis                redis.UniversalClient
	Prefix               string
	Shards               int
	Throttle             time.Duration
	LocalCacheSize       int
	TouchTimeout         time.Duration
	BacklogSize          int
	BreakerCooldown      time.Duration
	BatchSize            int
	FlushConcurrency     int
	WriteMode            writeMode
	Model                any
	Field                string
	FlushSchedule        string
	LockTTL              time.Duration
	MaxRetries           int
	SessionModel         any
	ExpiresField         string
	PurgeSchedule        string
	PurgeBatchSize       int
	PurgePause           time.Duration
	PurgeBatchTimeout    time.Duration
	DisableFlush         bool // Flush.Schedule "off"
	UnscheduledPurge     bool // Sessions.Schedule "off"
	DisablePurge         bool // Sessions.Disabled
	Logger               *slog.Logger
	Now                  func() time.Time
	OnlineWindow         time.Duration
	ActiveUsersRetention time.Duration
	Overlay              bool
	FlushTimeout         time.Duration
	PurgeTimeout         time.Duration
	StatementTimeout     time.Duration
	OnBatch              func(tx *gorm.DB, batch []Seen) error
	IdleTimeout          time.Duration
	ActiveField          string
	MaxIDLength          int
	MaxRefusals          int
	FieldEncoding        timecol.Encoding
	SessionEncoding      timecol.Encoding
	ColumnLocation       *time.Location
	RequireNoEviction    bool
	Rules                []Rule
	seam                 *testseam.Seam
}

// settings flattens c and applies the test seam's overrides; withDefaults
// fills in the rest.
func (c Config) settings() settings {
	s := settings{
		Redis: c.Redis, Model: c.Model, Field: c.Field, Throttle: c.Throttle, Logger: c.Logger,
		Prefix: c.Buffer.Prefix, Shards: c.Buffer.Shards, LocalCacheSize: c.Buffer.LocalCacheSize,
		TouchTimeout: c.Buffer.TouchTimeout, RequireNoEviction: c.Buffer.RequireNoEviction,
		FlushSchedule: c.Flush.Schedule, BatchSize: c.Flush.BatchSize, FlushConcurrency: c.Flush.Concurrency,
		FlushTimeout: c.Flush.Timeout, OnBatch: c.Flush.OnBatch, ColumnLocation: c.Flush.ColumnLocation,
		SessionModel: c.Sessions.Model, ExpiresField: c.Sessions.ExpiresField, IdleTimeout: c.Sessions.IdleTimeout,
		ActiveField: c.Sessions.ActiveField, PurgeSchedule: c.Sessions.Schedule, PurgeBatchSize: c.Sessions.BatchSize,
		OnlineWindow: c.Presence.OnlineWindow, ActiveUsersRetention: c.Presence.ActiveUsersRetention,
		Overlay: c.Presence.Overlay, Now: c.Test.Now, seam: c.Test.Seam,
		Rules: slices.Clone(c.Rules),
	}
	if c.Flush.Upsert {
		s.WriteMode = upsert
	}
	s.DisableFlush = strings.TrimSpace(s.FlushSchedule) == scheduleOff
	s.UnscheduledPurge = strings.TrimSpace(s.PurgeSchedule) == scheduleOff
	s.DisablePurge = c.Sessions.Disabled
	if m := c.Test.Seam; m != nil {
		s.LockTTL, s.StatementTimeout, s.PurgeBatchTimeout = m.LockTTL, m.StatementTimeout, m.PurgeBatchTimeout
		s.PurgeTimeout, s.PurgePause, s.BreakerCooldown = m.PurgeTimeout, m.PurgePause, m.BreakerCooldown
		s.MaxRetries, s.MaxRefusals, s.MaxIDLength, s.BacklogSize = m.MaxRetries, m.MaxRefusals, m.MaxIDLength, m.BacklogSize
		s.FieldEncoding, s.SessionEncoding = timecol.Encoding(m.FieldEncoding), timecol.Encoding(m.SessionEncoding)
	}
	return s
}

// purgeScheduled reports whether the scheduler runs the purge: sessions in
// use and a schedule that is not "off".
func (s settings) purgeScheduled() bool { return !s.DisablePurge && !s.UnscheduledPurge }

// public returns s as a Config (Plugin.Config).
func (s settings) public() Config {
	c := Config{Redis: s.Redis, Model: s.Model, Field: s.Field, Throttle: s.Throttle, Logger: s.Logger}
	c.Buffer = BufferConfig{Prefix: s.Prefix, Shards: s.Shards, LocalCacheSize: s.LocalCacheSize,
		TouchTimeout: s.TouchTimeout, RequireNoEviction: s.RequireNoEviction}
	c.Flush = FlushConfig{Schedule: s.FlushSchedule, BatchSize: s.BatchSize, Concurrency: s.FlushConcurrency,
		Timeout: s.FlushTimeout, Upsert: s.WriteMode == upsert, OnBatch: s.OnBatch, ColumnLocation: s.ColumnLocation}
	c.Sessions = SessionConfig{Model: s.SessionModel, ExpiresField: s.ExpiresField, IdleTimeout: s.IdleTimeout,
		ActiveField: s.ActiveField, Schedule: s.PurgeSchedule, BatchSize: s.PurgeBatchSize, Disabled: s.DisablePurge}
	c.Rules = slices.Clone(s.Rules)
	c.Presence = PresenceConfig{OnlineWindow: s.OnlineWindow, ActiveUsersRetention: s.ActiveUsersRetention, Overlay: s.Overlay}
	c.Test = TestConfig{Now: s.Now, Seam: s.seam}
	return c
}

// withDefaults returns cfg with the defaults filled into its zero fields
// (New).
func withDefaults(cfg settings) settings {
	cfg.Shards = cmp.Or(cfg.Shards, DefaultShards)
	cfg.Throttle = cmp.Or(cfg.Throttle, DefaultThrottle)
	cfg.LocalCacheSize = cmp.Or(cfg.LocalCacheSize, defaultLocalCacheSize)
	cfg.TouchTimeout = cmp.Or(cfg.TouchTimeout, defaultTouchTimeout)
	cfg.BacklogSize = cmp.Or(cfg.BacklogSize, defaultBacklogSize)
	cfg.BreakerCooldown = cmp.Or(cfg.BreakerCooldown, defaultBreakerCooldown)
	cfg.BatchSize = cmp.Or(cfg.BatchSize, DefaultBatchSize)
	// Never more than there are shards: Shards 1 alone must stay valid.
	cfg.FlushConcurrency = cmp.Or(cfg.FlushConcurrency, max(1, min(defaultFlushConcurrency, cfg.Shards)))
	cfg.MaxRetries = cmp.Or(cfg.MaxRetries, defaultMaxRetries)
	cfg.PurgeBatchSize = cmp.Or(cfg.PurgeBatchSize, defaultPurgeBatchSize)
	cfg.PurgePause = cmp.Or(cfg.PurgePause, defaultPurgePause)
	cfg.LockTTL = cmp.Or(cfg.LockTTL, defaultLockTTL)
	// Neither bound depends on the lock's TTL: the lock's keeper refreshes
	// it while a statement runs and cancels the run's context (and so the
	// flush's statement in flight) once the lock is lost, so a statement may
	// outlive one TTL of a lock that is still held. A purge batch runs to
	// its bound even then (its delete is by key and expiry: a second purger
	// deletes nothing twice).
	cfg.PurgeBatchTimeout = cmp.Or(cfg.PurgeBatchTimeout, defaultPurgeBatchTimeout)
	cfg.StatementTimeout = cmp.Or(cfg.StatementTimeout, defaultStatementTimeout)
	cfg.FlushTimeout = cmp.Or(cfg.FlushTimeout, defaultFlushTimeout)
	cfg.PurgeTimeout = cmp.Or(cfg.PurgeTimeout, defaultPurgeTimeout)
	cfg.Field = cmp.Or(cfg.Field, defaultField)
	cfg.MaxRefusals = cmp.Or(cfg.MaxRefusals, defaultMaxRefusals)
	cfg.FlushSchedule = cmp.Or(cfg.FlushSchedule, DefaultFlushSchedule)
	cfg.ExpiresField = cmp.Or(cfg.ExpiresField, defaultExpiresField)
	cfg.PurgeSchedule = cmp.Or(cfg.PurgeSchedule, DefaultPurgeSchedule)
	cfg.OnlineWindow = cmp.Or(cfg.OnlineWindow, max(defaultOnlineWindow, cfg.Throttle))
	cfg.ActiveUsersRetention = cmp.Or(cfg.ActiveUsersRetention, defaultActiveUsersRetention)
	cfg.ActiveField = cmp.Or(cfg.ActiveField, defaultActiveField)
	cfg.MaxIDLength = cmp.Or(cfg.MaxIDLength, defaultMaxIDLength)
	if cfg.Model == nil {
		cfg.Model = &User{}
	}
	for i := range cfg.Rules { // after Model and Field
		r := &cfg.Rules[i]
		if r.Model == nil {
			r.Model = cfg.Model
		}
		r.Field = cmp.Or(r.Field, cfg.Field)
		r.Schedule = cmp.Or(r.Schedule, DefaultPurgeSchedule)
		r.BatchSize = cmp.Or(r.BatchSize, defaultPurgeBatchSize)
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
