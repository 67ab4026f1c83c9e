// Package lastseen is a GORM plugin that records when each user was last
// seen without turning the users table into a write hotspot, and purges
// expired sessions in small batches.
//
// A request records "user X seen at T" at most once per throttle window in
// a buffer (Redis, shared by the app's instances, or in process without
// it); a scheduled flush writes them into the table in bulk, only forward.
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
	"sync"
	"sync/atomic"
	"time"

	"github.com/lastseen/lastseen/internal/buffer"
	"github.com/lastseen/lastseen/internal/buffer/memory"
	"github.com/lastseen/lastseen/internal/buffer/redisbuf"
	"github.com/lastseen/lastseen/internal/dialect"
	"github.com/lastseen/lastseen/internal/testseam"
	"gorm.io/gorm"
)

// Plugin is the GORM plugin. Create it with New, register it with db.Use,
// stop it with Close. All methods are safe for concurrent use.
type Plugin struct {
	cfg       settings
	name      string // the identity, Name() once accepted: pluginName(Model, Field)
	key       string // Name() until db.Use accepted the plugin: name + "#" + this value's address
	accepted  atomic.Bool
	useErr    atomic.Pointer[refusedError] // db.Use's last refusal; nil once accepted
	log       *slog.Logger
	now       func() time.Time
	realClock bool // Config.Now was left unset: the local cache may use the monotonic clock
	idLenSet  bool // Config.MaxIDLength was set: a key column shorter than it is an error, not a lower default
	// throttleSet and onlineSet: Throttle and Presence.OnlineWindow were
	// set, not defaults a DATE column changes (dayPrecision).
	throttleSet, onlineSet bool

	mu           sync.Mutex // guards db during Initialize and closed
	db           *gorm.DB
	closed       bool
	closeErr     error
	closeDone    chan struct{} // closed when the first Close returns
	touchClosed  atomic.Bool   // set by Close after its final flush without Redis: touches get ErrClosed
	closingFlush atomic.Bool   // Close's final flush of the in-process buffer runs: what it leaves is lost (keeps)

	users    *userTarget
	sessions *sessionTarget
	rules    []*ruleTarget // Config.Rules resolved (rule.go)
	dialect  *dialect.Dialect

	tracker   *tracker     // the request path; tracker.buf is the buffer (openBuffer)
	reads     overlayReads // the read overlay's key layout and working slices (overlay.go)
	sched     *scheduler
	runs      sync.WaitGroup  // flushes and purges running now; Close waits for them (startRun)
	running   atomic.Int64    // how many: Close with an ended context waits for none when 0
	closing   context.Context // canceled by Close: running purges stop after their batch
	closeRuns context.CancelFunc
	stats     counters
	obs       observers      // AddObserver (observe.go)
	limited   rateLimitedLog // per-entry warnings of flushes (logs.go)
	schema    schemaState    // tables found to fit the config; schema log limits (schema.go)

	probes atomic.Uint64 // rotates the entry (or session) a refused batch is probed with
	sizer  batchSizer    // the flush's working batch size (batchsize.go)

	hooks      *testseam.FlushHooks // the test seam's flush hooks; nil without Config.Test.Seam
	purgeHooks *testseam.PurgeHooks // its purge and rule hooks; nil without it

	// What the buffer belongs to and how Redis keeps it (manifest_check.go).
	manifestMu     sync.Mutex              // guards target and identityOK after Initialize (recheckRedis)
	target         dialect.Identity        // the database server and database
	identityOK     bool                    // target was read
	manifestOK     atomic.Bool             // the manifest was found to agree (or created)
	manifestWarned map[string]bool         // "field=value" of mismatches already logged (warnedManifest), under manifestMu
	rbuf           *redisbuf.Buffer        // the Redis buffer (nil without Redis): its manifest
	eviction       *redisbuf.EvictionWatch // its eviction watch (nil without Redis)
}

var _ gorm.Plugin = (*Plugin)(nil)

// New returns a plugin for c with the defaults filled in. It does no I/O
// and never fails; db.Use (Initialize) checks the configuration.
func New(c Config) *Plugin {
	s := c.settings()
	if s.seam != nil { // the plugin's own copy: it publishes into it
		own := *s.seam
		own.Published = testseam.Published{}
		s.seam = &own
	}
	realClock, idLenSet := s.Now == nil, s.MaxIDLength != 0
	cfg := withDefaults(s)
	name := pluginName(cfg.Model, cfg.Field)
	p := &Plugin{cfg: cfg, name: name, log: cfg.Logger.With("plugin", "lastseen", "tracks", name[len(namePrefix):]),
		now: cfg.Now, realClock: realClock, idLenSet: idLenSet, throttleSet: s.Throttle != 0, onlineSet: s.OnlineWindow != 0}
	p.key = fmt.Sprintf("%s#%p", name, p)
	if cfg.seam != nil {
		p.hooks, p.purgeHooks = &cfg.seam.Flush, &cfg.seam.Purge
	}
	p.closing, p.closeRuns = context.WithCancel(context.Background())
	p.closeDone = make(chan struct{})
	p.sizer.max, p.sizer.bound = cfg.BatchSize, cfg.StatementTimeout
	return p
}

// Name is the key GORM registers the plugin under. Once db.Use accepted
// the plugin it is "lastseen:" + the tracked model's Go type + "." + the Go
// field name, the same whether Field names the field or its column:
// "lastseen:github.com/lastseen/lastseen.User.LastSeenAt" for the default.
// Before, it also ends in "#" and a token of this plugin value, so that
// db.Use always asks the plugin, which refuses a second plugin for one
// column with an error wrapping gorm.ErrRegistered that names the first.
func (p *Plugin) Name() string {
	if p.accepted.Load() {
		return p.name
	}
	return p.key
}

// Config returns the configuration with defaults filled in; after db.Use
// Buffer.Prefix is the one in use, derived when it was empty.
func (p *Plugin) Config() Config {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cfg.public()
}

// Initialize is called by db.Use. It checks the Config against the
// dialect, the models and the buffer in Redis, returning an error wrapping
// ErrInvalidConfig that names the first problem (a model without one
// primary key, a field that is not a time, a bad cron spec, a buffer
// written with other Shards or key type, an evicting Redis under
// Buffer.RequireNoEviction, ...) and also ErrSchema for a missing column;
// a missing table and an unreachable Redis are only logged. It then starts
// the scheduled jobs. After a refusal every method returns an error
// wrapping it, until a later db.Use succeeds. A second call does nothing
// (on the same *gorm.DB: gorm.ErrRegistered).
func (p *Plugin) Initialize(db *gorm.DB) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.db != nil {
		return p.registeredAgain(db)
	}
	if err := p.initialize(db); err != nil {
		p.useErr.Store(&refusedError{cause: err})
		return err
	}
	p.useErr.Store(nil)
	p.accepted.Store(true)
	return nil
}

// initialize is Initialize's work, under p.mu: nothing of a refused
// plugin is left running, and p.tracker and p.db stay nil.
func (p *Plugin) initialize(db *gorm.DB) error {
	if err := p.validate(db); err != nil {
		return err
	}
	if err := p.columnTaken(db); err != nil { // the same column, whichever way Field is spelled
		return err
	}
	if err := p.ruleTaken(db); err != nil { // rule names are unique on db (the Inactive scope)
		return err
	}
	if err := p.resolvePrefix(db); err != nil {
		return err
	}
	p.log = p.cfg.Logger.With("plugin", p.name, "table", p.users.model.table, "prefix", p.cfg.Prefix) // every line names the tracked table
	if p.realClock && db.Config.NowFunc != nil {                                                      // one clock with the Expired scope (Config.Now)
		p.cfg.Now = db.Config.NowFunc
		p.now = p.cfg.Now
	}
	buf := p.openBuffer() // the one choice between Redis and memory; after the clock is final
	if o := p.prefixTaken(db, buf); o != nil {
		_ = buf.Close()
		return invalid("Buffer.Prefix %q is already the buffer of %s on this *gorm.DB: give each tracked model its own Buffer.Prefix", p.cfg.Prefix, o.name)
	}
	if err := p.checkRedis(buf); err != nil {
		_ = buf.Close()
		return err
	}
	t, err := newTracker(p.cfg, buf, p.realClock, p.users.ids, p.users.model.enc, p.log, &p.stats)
	if err != nil {
		_ = buf.Close()
		return fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	sched, err := p.jobs()
	if err == nil && p.cfg.Overlay {
		if err = p.registerOverlay(db); err != nil { // overlay.go
			err = fmt.Errorf("%w: overlay callback: %v", ErrInvalidConfig, err)
		}
	}
	if err != nil {
		_ = t.close()
		return err
	}
	p.tracker, p.sched = t, sched
	if p.cfg.seam != nil {
		p.publish(p.cfg.seam)
	}
	// NewDB without Initialized: every statement on p.db starts a fresh chain,
	// so no Model or condition of one statement leaks into the next.
	p.db = unprepared(db.Session(&gorm.Session{NewDB: true, Context: context.Background()}))
	if sched != nil {
		sched.start()
	}
	return nil
}

// jobs returns the scheduler of the flush, purge and rule jobs (not
// started), or nil when none is scheduled.
func (p *Plugin) jobs() (*scheduler, error) {
	purge := p.cfg.purgeScheduled()
	var rules []*ruleTarget
	for _, r := range p.rules {
		if r.cfg.Schedule != scheduleOff {
			rules = append(rules, r)
		}
	}
	if p.cfg.DisableFlush && !purge && len(rules) == 0 {
		return nil, nil
	}
	sched := newScheduler(p.log)
	if !p.cfg.DisableFlush {
		if err := sched.add("flush", p.cfg.FlushSchedule, p.cfg.FlushTimeout, p.flushJob); err != nil {
			return nil, err
		}
	}
	if purge {
		if err := sched.add("purge", p.cfg.PurgeSchedule, p.cfg.PurgeTimeout, p.purgeJob); err != nil {
			return nil, err
		}
	}
	for _, r := range rules {
		if err := sched.add(r.opt, r.cfg.Schedule, p.cfg.PurgeTimeout, p.ruleJob(r)); err != nil {
			return nil, err
		}
	}
	return sched, nil
}

// refusedError is what a plugin db.Use refused answers every call with.
// It wraps the refusal and ErrNotInitialized.
type refusedError struct{ cause error }

func (e *refusedError) Error() string {
	return "lastseen: db.Use refused this plugin: " + e.cause.Error()
}

func (e *refusedError) Unwrap() []error { return []error{e.cause, ErrNotInitialized} }

// notReady is the error of a call that needs db.Use to have accepted p:
// db.Use's refusal, or ErrNotInitialized when db.Use was never called.
func (p *Plugin) notReady() error {
	if r := p.useErr.Load(); r != nil {
		return r
	}
	return ErrNotInitialized
}

// validate fills p.dialect, p.users and p.sessions or returns the first
// configuration problem: the dialect, the values (checkConfig), then the
// models (resolveTargets).
func (p *Plugin) validate(db *gorm.DB) error {
	d := dialect.Lookup(db.Dialector.Name())
	if d == nil {
		return invalid("dialect %q is not supported (want postgres, mysql or sqlite)", db.Dialector.Name())
	}
	p.dialect = d
	if err := checkConfig(p.cfg, d); err != nil {
		return err
	}
	if err := p.resolveTargets(db, d); err != nil {
		return err
	}
	if err := p.inspectSchema(db); err != nil {
		return err
	}
	return p.dayPrecision() // dates.go
}

// ready returns the database handle, or notReady / ErrClosed.
func (p *Plugin) ready() (*gorm.DB, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.db == nil:
		return nil, p.notReady()
	case p.closed:
		return nil, ErrClosed
	}
	return p.db, nil
}

// startRun registers a flush or purge with Close, which waits for it, or returns
// notReady / ErrClosed. Call done when the run returns.
func (p *Plugin) startRun() (db *gorm.DB, done func(), err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.db == nil:
		return nil, nil, p.notReady()
	case p.closed:
		return nil, nil, ErrClosed
	}
	p.runs.Add(1) // under mu, before closed is set: Close's Wait comes after
	p.running.Add(1)
	return p.db, func() { p.running.Add(-1); p.runs.Done() }, nil
}

// waitRuns waits for the flushes and purges running now, or for ctx to end.
func (p *Plugin) waitRuns(ctx context.Context) error {
	if p.running.Load() == 0 { // none, and none can start once closed is set
		return nil
	}
	done := make(chan struct{})
	go func() {
		p.runs.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("lastseen: close: waiting for a running flush or purge: %w", ctx.Err())
	}
}

// Close stops the scheduler, waits for running runs (a purge finishes its
// batch) and flushes once more, within Flush.Timeout when ctx has no
// deadline; it returns that flush's error or ctx's, and later calls the
// same. Touches left in the backlog are dropped (Stats.BacklogDropped);
// without Redis, those the flush could not write are lost, counted in
// Stats.Dropped, and the error says how many. Touches after Close still
// reach Redis; without Redis they return ErrClosed (false and no error
// inside a throttle window the local cache knows). Flush and
// PurgeExpiredSessions return ErrClosed. Before db.Use it returns nil;
// after db.Use refused the plugin, the refusal.
func (p *Plugin) Close(ctx context.Context) error {
	p.mu.Lock()
	if p.db == nil {
		p.mu.Unlock()
		if r := p.useErr.Load(); r != nil {
			return r
		}
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
		fctx, cancel := ctx, context.CancelFunc(func() {})
		if _, ok := ctx.Deadline(); !ok {
			fctx, cancel = context.WithTimeout(ctx, p.cfg.FlushTimeout)
		}
		err := p.finalFlush(fctx)
		cancel()
		if err != nil {
			errs = append(errs, err)
		}
	}
	if !hasRedis(p.cfg) { // nothing would flush an in-process touch any more
		p.touchClosed.Store(true)
	}
	if err := p.tracker.close(); err != nil {
		errs = append(errs, fmt.Errorf("lastseen: close: %w", err))
	}
	err := errors.Join(errs...)
	p.mu.Lock()
	p.closeErr = err
	p.mu.Unlock()
	return err
}

// openBuffer returns the plugin's buffer: Redis when Config.Redis holds a
// client, else in process. It is the one place that chooses, and that
// hands the buffer what it needs of the plugin: the settings, the clock,
// the logger, the counters and the test seam's hooks.
func (p *Plugin) openBuffer() buffer.Buffer {
	presence := buffer.Presence{OnlineWindow: p.cfg.OnlineWindow, ActiveRetention: p.cfg.ActiveUsersRetention}
	if !hasRedis(p.cfg) {
		return memory.New(memory.Options{Prefix: p.cfg.Prefix, Shards: p.cfg.Shards, Presence: presence, Now: p.cfg.Now})
	}
	var drops rateLimitedLog // one line per reason per interval (logs.go)
	log := p.log
	var hooks redisbuf.Hooks
	if h := p.hooks; h != nil {
		hooks = redisbuf.Hooks{BacklogTaken: h.BacklogTaken, LockRefreshed: h.Refreshed}
	}
	return redisbuf.New(redisbuf.Options{
		Client:            p.cfg.Redis,
		Prefix:            p.cfg.Prefix,
		Shards:            p.cfg.Shards,
		Throttle:          p.cfg.Throttle,
		TouchTimeout:      p.cfg.TouchTimeout,
		LockTTL:           p.cfg.LockTTL,
		BacklogSize:       p.cfg.BacklogSize,
		BreakerCooldown:   p.cfg.BreakerCooldown,
		RequireNoEviction: p.cfg.RequireNoEviction,
		Presence:          presence,
		Now:               p.cfg.Now,
		Logger:            log,
		LogLimited:        func(level slog.Level, msg string, args ...any) { drops.log(log, level, msg, args...) },
		Counters: redisbuf.Counters{RedisErrors: &p.stats.redisErrors, Canceled: &p.stats.canceled,
			Backlogged: &p.stats.backlogged, BacklogDropped: &p.stats.backlogDropped, Evictions: &p.stats.evictions},
		Hooks: hooks,
	})
}

// unprepared makes db, a session of its own (its Statement cloned), run
// its statements without GORM's prepared-statement cache
// (gorm.Config.PrepareStmt): a flush's statements list each batch's values,
// so nearly every batch size is a statement text of its own, which the
// cache would keep (24 hours and no size limit by default) and the server
// hold prepared on each connection that ran it (MySQL refuses every
// prepare past max_prepared_stmt_count, the app's own included). The app's
// handle keeps its cache.
func unprepared(db *gorm.DB) *gorm.DB {
	if ps, ok := db.Statement.ConnPool.(*gorm.PreparedStmtDB); ok {
		db.Statement.ConnPool, db.Config.ConnPool, db.Config.PrepareStmt = ps.ConnPool, ps.ConnPool, false
	}
	return db
}
