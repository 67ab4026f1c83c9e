// Package lastseen is a GORM plugin that records when each user was last
// seen without turning the users table into a write hotspot, and purges
// expired sessions in small batches.
//
// A request records "user X seen at T" in Redis at most once per user per
// throttle window; a scheduled flush moves the pending timestamps into the
// users table in bulk, one statement per batch, only forward in time.
//
//	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
//	p := lastseen.New(lastseen.Config{Redis: rdb})
//	if err := db.Use(p); err != nil { ... }
//	defer p.Close(context.Background())
//	http.ListenAndServe(":8080", p.Middleware(userIDFromRequest)(mux))
package lastseen

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/bsm/redislock"
	"github.com/redis/go-redis/v9"
	"github.com/robfig/cron/v3"
	"gorm.io/gorm"
	"gorm.io/gorm/schema"
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
	DefaultPrefix            = "lastseen"
	DefaultShards            = 16
	DefaultThrottle          = 5 * time.Minute
	DefaultLocalCacheSize    = 100_000
	DefaultTouchTimeout      = 20 * time.Millisecond
	DefaultBatchSize         = 1000
	DefaultFlushConcurrency  = 2
	DefaultLastSeenField     = "LastSeenAt"
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
)

// Config configures the plugin. The zero value of every field but Redis means
// "use the default" given in its comment; New fills those in, Initialize
// validates the result against the database.
type Config struct {
	// Redis holds the pending timestamps and the locks. Required. Any
	// redis.UniversalClient works: *redis.Client, a Sentinel failover client
	// or *redis.ClusterClient.
	Redis redis.UniversalClient
	// Prefix starts every Redis key the plugin writes. Default "lastseen".
	Prefix string
	// Shards is the number of pending hashes the buffer is split over, each
	// with its own hash tag so that a Redis Cluster spreads them over its
	// masters. Default 16; at most 1024. Every instance sharing a Prefix must
	// use the same value.
	Shards int
	// Throttle is the throttle window: a user is recorded at most once per
	// window. Default 5m; at least 1ms (Redis PX resolution).
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
	// one touch probes Redis and closes the breaker if it succeeds
	// (sony/gobreaker's Timeout). Default 5s.
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
	// UserModel is the app's user model, a pointer to a struct GORM can
	// parse with exactly one primary key. Default &User{}.
	UserModel any
	// LastSeenField names the last-seen field of UserModel, by Go field name
	// or column name. It must be a time.Time or *time.Time. Default
	// "LastSeenAt".
	LastSeenField string
	// FlushSchedule is when the scheduler flushes, as robfig/cron specs
	// (standard five fields or descriptors such as "@every 1m"), several
	// separated by ";". Default "@every 1m".
	FlushSchedule string
	// LockTTL is the time-to-live of the Redis locks that keep flushes and
	// purges of different instances apart; they are refreshed after each
	// batch. Default 30s.
	LockTTL time.Duration
	// MaxRetries bounds how often one batch is retried after a deadlock or
	// serialization failure. Default 3; negative means no retry.
	MaxRetries int

	// SessionModel is the session model purged by PurgeExpiredSessions, a
	// pointer to a struct with exactly one primary key. Default &Session{}.
	SessionModel any
	// ExpiresField names the expiry field of SessionModel, by Go field name
	// or column name; a time.Time or *time.Time. Default "ExpiresAt".
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
	// PurgeBatchTimeout bounds one purge batch (select and delete). Default 10s.
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
	// Now is the clock; tests set it. Default time.Now.
	Now func() time.Time
}

// Errors returned by the plugin. Every error it returns starts with
// "lastseen:"; test for these with errors.Is.
var (
	// ErrInvalidConfig wraps every configuration problem Initialize finds.
	ErrInvalidConfig = errors.New("lastseen: invalid config")
	// ErrInvalidUserID is returned for a user id that is not an integer,
	// string or fmt.Stringer, is empty or zero, is longer than 128 bytes, or
	// does not fit the user model's primary key.
	ErrInvalidUserID = errors.New("lastseen: invalid user id")
	// ErrNotInitialized is returned by methods called before db.Use(p).
	ErrNotInitialized = errors.New("lastseen: plugin not initialized (call db.Use first)")
	// ErrClosed is returned by Flush and PurgeExpiredSessions after Close.
	ErrClosed = errors.New("lastseen: plugin closed")
	// ErrLocked is returned when another instance holds the Redis lock of a
	// purge; the scheduled job treats it as "skip this tick".
	ErrLocked = errors.New("lastseen: another instance holds the lock")
)

// Plugin is the GORM plugin. Create it with New, register it with db.Use,
// stop it with Close. All methods are safe for concurrent use.
type Plugin struct {
	cfg       Config
	log       *slog.Logger
	now       func() time.Time
	realClock bool // Config.Now was left unset: the local cache may use the monotonic clock

	mu        sync.Mutex // guards db during Initialize and closed
	db        *gorm.DB
	closed    bool
	closeErr  error
	closeDone chan struct{} // closed when the first Close returns

	users    *userTarget
	sessions *sessionTarget
	dialect  *dialect

	tracker   *tracker
	locker    *redislock.Client
	sched     *scheduler
	runs      sync.WaitGroup  // purges running now; Close waits for them (session.go)
	closing   context.Context // canceled by Close: running purges stop after their batch
	closeRuns context.CancelFunc
	stats     counters
	obs       observers      // AddObserver (observe.go)
	limited   rateLimitedLog // per-entry warnings of flushes (logs.go)

	hooks *flushHooks // test hooks at fixed points of a flush (flush.go); nil in production
}

var _ gorm.Plugin = (*Plugin)(nil)

// New returns a plugin with the defaults filled into cfg. It does no I/O and
// never fails; Initialize (called by db.Use) validates the configuration.
func New(cfg Config) *Plugin {
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	setDefault(&cfg.Shards, DefaultShards)
	setDefault(&cfg.Throttle, DefaultThrottle)
	setDefault(&cfg.LocalCacheSize, DefaultLocalCacheSize)
	setDefault(&cfg.TouchTimeout, DefaultTouchTimeout)
	setDefault(&cfg.BacklogSize, DefaultBacklogSize)
	setDefault(&cfg.BreakerCooldown, DefaultBreakerCooldown)
	setDefault(&cfg.BatchSize, DefaultBatchSize)
	if cfg.FlushConcurrency == 0 { // never more than there are shards: Shards 1 alone must stay valid
		cfg.FlushConcurrency = max(1, min(DefaultFlushConcurrency, cfg.Shards))
	}
	setDefault(&cfg.LockTTL, DefaultLockTTL)
	setDefault(&cfg.MaxRetries, DefaultMaxRetries)
	setDefault(&cfg.PurgeBatchSize, DefaultPurgeBatchSize)
	setDefault(&cfg.PurgePause, DefaultPurgePause)
	setDefault(&cfg.PurgeBatchTimeout, DefaultPurgeBatchTimeout)
	if cfg.UserModel == nil {
		cfg.UserModel = &User{}
	}
	if cfg.LastSeenField == "" {
		cfg.LastSeenField = DefaultLastSeenField
	}
	if cfg.FlushSchedule == "" {
		cfg.FlushSchedule = DefaultFlushSchedule
	}
	if cfg.SessionModel == nil {
		cfg.SessionModel = &Session{}
	}
	if cfg.ExpiresField == "" {
		cfg.ExpiresField = DefaultExpiresField
	}
	if cfg.PurgeSchedule == "" {
		cfg.PurgeSchedule = DefaultPurgeSchedule
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	realClock := cfg.Now == nil
	if realClock {
		cfg.Now = time.Now
	}
	p := &Plugin{cfg: cfg, log: cfg.Logger.With("plugin", "lastseen"), now: cfg.Now, realClock: realClock}
	p.closing, p.closeRuns = context.WithCancel(context.Background())
	p.closeDone = make(chan struct{})
	return p
}

func setDefault[T int | time.Duration](v *T, def T) {
	if *v == 0 {
		*v = def
	}
}

// Name returns "lastseen", the name GORM registers the plugin under.
func (p *Plugin) Name() string { return "lastseen" }

// Config returns the configuration with defaults filled in.
func (p *Plugin) Config() Config { return p.cfg }

// Initialize is called by db.Use. It validates the configuration against the
// database's dialect and the models, and returns an error wrapping
// ErrInvalidConfig that names the first problem: no Redis client, an
// unsupported dialect, a batch size over the dialect's bind-parameter limit,
// a model GORM cannot parse or without exactly one primary key, a missing or
// non-time last-seen or expiry field, a cron spec that does not parse. A
// Redis that is configured but unreachable is logged, not an error: presence
// is best effort. Unless DisableScheduler is set it starts the flush and
// purge jobs. Calling it again after it succeeded does nothing.
func (p *Plugin) Initialize(db *gorm.DB) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.db != nil {
		return nil
	}
	if err := p.validate(db); err != nil {
		return err
	}
	p.log = p.cfg.Logger.With("plugin", "lastseen", "table", p.users.model.table, "prefix", p.cfg.Prefix) // every line names the tracked table
	t, err := newTracker(p.cfg, p.realClock, p.users.ids, p.log, &p.stats)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	p.tracker = t
	p.locker = redislock.New(p.cfg.Redis)
	// NewDB without Initialized: every statement on p.db starts a fresh chain,
	// so no Model or condition of one statement leaks into the next.
	p.db = db.Session(&gorm.Session{NewDB: true})

	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	if err := p.cfg.Redis.Ping(ctx).Err(); err != nil {
		p.log.Warn("lastseen: redis unreachable at start; touches are kept in memory until it is back", "err", err)
	}
	cancel()

	if !p.cfg.DisableScheduler {
		p.sched = newScheduler(p.log)
		if err := p.sched.add("flush", p.cfg.FlushSchedule, p.flushJob); err != nil {
			return err
		}
		if !p.cfg.DisablePurge {
			if err := p.sched.add("purge", p.cfg.PurgeSchedule, p.purgeJob); err != nil {
				return err
			}
		}
		p.sched.start()
	}
	return nil
}

// validate fills p.dialect, p.users and p.sessions or returns the first
// configuration problem.
func (p *Plugin) validate(db *gorm.DB) error {
	c := p.cfg
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
	}
	if c.Redis == nil || (reflect.ValueOf(c.Redis).Kind() == reflect.Pointer && reflect.ValueOf(c.Redis).IsNil()) {
		return bad("Config.Redis is required")
	}
	d, ok := dialects[db.Dialector.Name()]
	if !ok {
		return bad("dialect %q is not supported (want postgres, mysql or sqlite)", db.Dialector.Name())
	}
	p.dialect = d
	switch {
	case strings.ContainsAny(c.Prefix, "{}"):
		return bad("Prefix %q must not contain '{' or '}' (they are Redis Cluster hash tags)", c.Prefix)
	case c.Shards < 1 || c.Shards > 1024:
		return bad("Shards is %d, want 1 to 1024", c.Shards)
	case c.Throttle < time.Millisecond:
		return bad("Throttle is %v, want at least 1ms", c.Throttle)
	case c.TouchTimeout < time.Millisecond:
		return bad("TouchTimeout is %v, want at least 1ms", c.TouchTimeout)
	case c.BacklogSize < 0:
		return bad("BacklogSize is %d, want a positive number", c.BacklogSize)
	case c.BreakerCooldown < 0:
		return bad("BreakerCooldown is %v, want a positive duration", c.BreakerCooldown)
	case c.BatchSize < 1:
		return bad("BatchSize is %d, want 1 to %d", c.BatchSize, d.maxBatch())
	case c.BatchSize > d.maxBatch():
		return bad("BatchSize %d exceeds the %s limit of %d users per statement (%d bind parameters, 2 per user)",
			c.BatchSize, d.name, d.maxBatch(), d.maxParams)
	case c.FlushConcurrency < 1 || c.FlushConcurrency > c.Shards:
		return bad("FlushConcurrency is %d, want 1 to Shards (%d)", c.FlushConcurrency, c.Shards)
	case c.WriteMode != Update && c.WriteMode != Upsert:
		return bad("WriteMode %v is not Update or Upsert", c.WriteMode)
	case c.LockTTL < 10*time.Millisecond:
		return bad("LockTTL is %v, want at least 10ms", c.LockTTL)
	case c.PurgeBatchSize < 1:
		return bad("PurgeBatchSize is %d, want 1 to %d", c.PurgeBatchSize, d.maxParams-1)
	case c.PurgeBatchSize > d.maxParams-1:
		return bad("PurgeBatchSize %d exceeds the %s limit of %d sessions per delete (%d bind parameters, 1 per session and 1 for the cutoff)",
			c.PurgeBatchSize, d.name, d.maxParams-1, d.maxParams)
	case c.PurgeBatchTimeout < 0:
		return bad("PurgeBatchTimeout is %v, want a positive duration", c.PurgeBatchTimeout)
	}
	for _, s := range []struct{ name, spec string }{{"FlushSchedule", c.FlushSchedule}, {"PurgeSchedule", c.PurgeSchedule}} {
		specs := splitSpecs(s.spec)
		if len(specs) == 0 {
			return bad("%s %q has no cron spec", s.name, s.spec)
		}
		for _, spec := range specs {
			if _, err := cron.ParseStandard(spec); err != nil {
				return bad("%s %q: %v", s.name, spec, err)
			}
			// robfig/cron silently rounds "@every 0s", "@every -1m" or
			// "@every 500ms" up to one second.
			if d, err := time.ParseDuration(strings.TrimSpace(strings.TrimPrefix(spec, "@every"))); strings.HasPrefix(spec, "@every") && err == nil && d < time.Second {
				return bad("%s %q: the interval must be at least 1s", s.name, spec)
			}
		}
	}
	users, err := resolveModel(db, c.UserModel, c.LastSeenField, "UserModel", "LastSeenField")
	if err != nil {
		return bad("%v", err)
	}
	ids, err := newIDCodec(users.pk)
	if err != nil {
		return bad("UserModel %s: %v", users.schema.Name, err)
	}
	if ids.kind == idUnsigned {
		ids.max = d.maxUnsigned
	}
	p.users = &userTarget{model: users, ids: ids}
	sessions, err := resolveModel(db, c.SessionModel, c.ExpiresField, "SessionModel", "ExpiresField")
	if err != nil {
		return bad("%v", err)
	}
	p.sessions = &sessionTarget{model: sessions}
	return nil
}

// model is a parsed GORM model: its table, single primary key and one time
// column (last seen or expiry).
type model struct {
	schema *schema.Schema
	typ    reflect.Type // struct type
	table  string
	pk     *schema.Field
	time   *schema.Field
}

var timeType = reflect.TypeOf(time.Time{})

// resolveModel parses m with db's naming strategy and checks that it has one
// primary key and that field is a time.Time or *time.Time.
func resolveModel(db *gorm.DB, m any, field, modelOpt, fieldOpt string) (*model, error) {
	stmt := &gorm.Statement{DB: db}
	if err := stmt.Parse(m); err != nil {
		return nil, fmt.Errorf("%s %T: %v", modelOpt, m, err)
	}
	s := stmt.Schema
	if len(s.PrimaryFields) != 1 {
		names := make([]string, len(s.PrimaryFields))
		for i, f := range s.PrimaryFields {
			names[i] = f.Name
		}
		return nil, fmt.Errorf("%s %s has %d primary key fields %v, want exactly one", modelOpt, s.Name, len(s.PrimaryFields), names)
	}
	f := s.LookUpField(field)
	if f == nil || f.DBName == "" {
		return nil, fmt.Errorf("%s %q: %s has no such field or column", fieldOpt, field, s.Name)
	}
	ft := f.FieldType
	if ft.Kind() == reflect.Pointer {
		ft = ft.Elem()
	}
	if ft != timeType {
		return nil, fmt.Errorf("%s %q: %s.%s is a %s, want time.Time or *time.Time", fieldOpt, field, s.Name, f.Name, f.FieldType)
	}
	return &model{schema: s, typ: s.ModelType, table: s.Table, pk: s.PrimaryFields[0], time: f}, nil
}

func splitSpecs(s string) []string {
	var specs []string
	for _, spec := range strings.Split(s, ";") {
		if spec = strings.TrimSpace(spec); spec != "" {
			specs = append(specs, spec)
		}
	}
	return specs
}

// ready returns the database handle, or ErrNotInitialized / ErrClosed.
func (p *Plugin) ready() (*gorm.DB, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.db == nil:
		return nil, ErrNotInitialized
	case p.closed:
		return nil, ErrClosed
	}
	return p.db, nil
}

// Close stops the scheduler, waits for running flushes (scheduled or called
// by the app) and for running purges to finish their current batch, then
// runs a final flush so that every touch recorded before Close reaches the
// database. It returns when that is done or ctx ends, with the final flush's
// error or ctx's. Calling it again, also while the first call runs, returns
// the first call's result once it is known. Touch keeps working after Close (into Redis); Flush
// and PurgeExpiredSessions return ErrClosed.
func (p *Plugin) Close(ctx context.Context) error {
	p.mu.Lock()
	if p.db == nil {
		p.mu.Unlock()
		return nil
	}
	if p.closed { // another Close runs or ran: wait for its result
		p.mu.Unlock()
		select {
		case <-p.closeDone:
		case <-ctx.Done():
			return fmt.Errorf("lastseen: close: waiting for the first Close: %w", ctx.Err())
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.closeErr
	}
	p.closed = true
	p.mu.Unlock()
	defer close(p.closeDone)
	p.closeRuns() // running purges stop after their current batch

	var errs []error
	if p.sched != nil {
		if err := p.sched.stop(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 {
		if err := p.waitRuns(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 {
		if _, err := p.flush(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	p.tracker.close()
	err := errors.Join(errs...)
	p.mu.Lock()
	p.closeErr = err
	p.mu.Unlock()
	return err
}
