package lastseen

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/lastseen/lastseen/internal/buffer"
	"github.com/lastseen/lastseen/internal/dialect"
	"github.com/lastseen/lastseen/internal/timecol"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// Session is the default Sessions.Model, table "sessions": one row per
// login session. LastActiveAt has no index, as User.LastSeenAt: its
// flushed rows stay HOT updates on PostgreSQL, and the idle rule's purge
// reads it in primary-key order.
type Session struct {
	ID           string     `gorm:"primaryKey;size:64"` // the session token's id, at most 64 bytes
	UserID       uint64     `gorm:"index;not null"`     // the user the session belongs to
	ExpiresAt    time.Time  `gorm:"index;not null"`     // expired at and after this instant
	CreatedAt    time.Time  // set by GORM on create
	LastActiveAt *time.Time // last activity (UTC), NULL until set; read by Sessions.IdleTimeout
}

// Expired reports whether the session is expired at now by the rule of
// the Expired scope: ExpiresAt at or before now, or, with idle > 0
// (Sessions.IdleTimeout), a non-nil LastActiveAt at or before now - idle.
func (s Session) Expired(now time.Time, idle time.Duration) bool {
	if !now.Before(s.ExpiresAt) {
		return true
	}
	return idle > 0 && s.LastActiveAt != nil && !now.Add(-idle).Before(*s.LastActiveAt)
}

// ExpiredCount is what a purge started now would do (Plugin.ExpiredSessions).
type ExpiredCount struct {
	Expired int64     // rows the purge would delete (soft-deleted included)
	Kept    int64     // rows the rule selects that the purge keeps: newer activity still buffered
	Oldest  time.Time // earliest expiry among Expired and Kept (UTC; zero if none)
	Cutoff  time.Time // the instant the rule was applied at (UTC)
}

// ExpiredSessions counts what a purge started now would delete, with the
// purge's own checks: the Expired rule, then, when a plugin tracks the
// sessions' activity, its buffer in batches of Sessions.BatchSize (a
// session idle in the column whose newer activity is buffered is Kept).
// Errors: ErrNotInitialized, ErrClosed, or the database's.
func (p *Plugin) ExpiredSessions(ctx context.Context) (ExpiredCount, error) {
	db, err := p.ready()
	if err != nil {
		return ExpiredCount{}, err
	}
	m := p.sessions.model
	res := ExpiredCount{Cutoff: p.now().UTC()}
	expired := p.expired(db, res.Cutoff)
	q := func() *gorm.DB {
		return fresh(ctx, db).Unscoped().Model(reflect.New(m.typ).Interface()).Where(expired)
	}
	var all int64
	if err := q().Count(&all).Error; err != nil {
		return ExpiredCount{}, fmt.Errorf("lastseen: count expired sessions: %w", err)
	}
	if all == 0 {
		return res, nil
	}
	if res.Expired, err = p.deletable(ctx, db, q(), res.Cutoff, all); err != nil {
		return ExpiredCount{}, err
	}
	res.Kept = all - res.Expired
	col := clause.Column{Table: clause.CurrentTable, Name: m.time.DBName}
	at := timecol.Scan{Codec: m.enc} // the column's encoding; SQLite may return text
	err = scanOne(q().Select("?", col).Order(sortTime(db, m.enc, col)).Limit(1), &at)
	switch {
	case errors.Is(err, sql.ErrNoRows): // purged between the queries
		return res, nil
	case err != nil:
		return ExpiredCount{}, fmt.Errorf("lastseen: oldest expired session: %w", err)
	}
	res.Oldest = at.Time.UTC()
	return res, nil
}

// deletable counts the rows of the expired query q that a purge at cutoff
// would delete: all of them without an activity tracker, else, batch by
// batch of primary keys, the rows matching the purge's own condition
// (purgeCondition), which reads the tracker's buffer.
func (p *Plugin) deletable(ctx context.Context, db *gorm.DB, q *gorm.DB, cutoff time.Time, all int64) (int64, error) {
	if p.activityTracker() == nil {
		return all, nil
	}
	m := p.sessions.model
	pk := clause.Column{Table: clause.CurrentTable, Name: m.pk.DBName}
	var n int64
	err := eachBatch(ctx, q.Select("?", pk), m, p.cfg.PurgeBatchSize, func(ids []any) error { // rule_run.go
		var c int64
		err := fresh(ctx, db).Unscoped().Model(reflect.New(m.typ).Interface()).
			Where(p.purgeCondition(ctx, db, ids, cutoff)).Count(&c).Error
		n += c
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("lastseen: count the expired sessions a purge would delete: %w", err)
	}
	return n, nil
}

// Sessions that expire by inactivity. With Config.IdleTimeout > 0 a session
// is expired at t when its expiry is at or before t, or its last-active
// column (ActiveField) is at or before t - IdleTimeout; a NULL last-active
// column is never idle (the session then expires by its expiry alone). The
// Expired scope, ExpiredSessions, the purge and Session.Expired share the
// rule.

// checkIdle checks the idle settings: no negative timeout, and a purge
// batch whose delete fits the bind-parameter limit (one parameter per
// session and three cutoffs).
func checkIdle(c settings, d *dialect.Dialect) error {
	switch {
	case c.IdleTimeout < 0:
		return invalid("Sessions.IdleTimeout is %v, want 0 (off) or a positive duration", c.IdleTimeout)
	case c.IdleTimeout > 0 && c.PurgeBatchSize > d.MaxParams()-3:
		return invalid("Sessions.BatchSize %d exceeds the %s limit of %d sessions per delete with Sessions.IdleTimeout (%d bind parameters, 1 per session and 3 for the cutoffs)",
			c.PurgeBatchSize, d.Name(), d.MaxParams()-3, d.MaxParams())
	}
	return nil
}

// timeCol is a time column by name, with its encoding (nil: a timestamp).
type timeCol struct {
	name string
	enc  *timecol.Codec
}

// expiryRule is the WHERE condition of sessions expired at t: the expires
// column at or before t, or, with idle > 0, the active column at or before
// t - idle. Columns are qualified with the current table and compared as
// instants in their encodings (see compareTime).
func expiryRule(db *gorm.DB, expires, active timeCol, idle time.Duration, t time.Time) clause.Expr {
	abs := compareTime(db, expires.enc, clause.Column{Table: clause.CurrentTable, Name: expires.name}, "<=", t.UTC())
	if idle <= 0 || active.name == "" {
		return abs
	}
	idleExpr := compareTime(db, active.enc, clause.Column{Table: clause.CurrentTable, Name: active.name}, "<=", t.UTC().Add(-idle))
	return clause.Expr{SQL: "(? OR ?)", Vars: []any{abs, idleExpr}}
}

// expired is p's rule for its SessionModel at t.
func (p *Plugin) expired(db *gorm.DB, t time.Time) clause.Expr {
	s := p.sessions
	expires := timeCol{s.model.time.DBName, s.model.enc}
	if s.active == nil {
		return expiryRule(db, expires, timeCol{}, 0, t)
	}
	return expiryRule(db, expires, timeCol{s.active.DBName, s.activeEnc}, p.cfg.IdleTimeout, t)
}

// activityTracker returns the plugin on p's database that tracks the
// sessions' last-active column (p itself when its Model is the session
// model and Field the ActiveField), or nil: then the purge has no buffer to
// check and trusts the column.
func (p *Plugin) activityTracker() *Plugin {
	s := p.sessions
	if s.active == nil {
		return nil
	}
	return trackerOfColumn(p.db, s.model.table, s.active.DBName)
}

// busy reports, for each candidate of a purge batch, whether the tracker's
// buffer holds activity after since (the idle cutoff) that is not in the
// column yet: a pending or in-flight entry, or with Redis the in-process
// backlog (Buffer.Newest: one pipeline of HMGET of the pending and the
// in-flight hash of each shard holding candidates). When Redis cannot be
// read, every candidate counts as busy (the purge then deletes only
// sessions past their expiry) and the error is returned for the log.
func (tr *Plugin) busy(ctx context.Context, ids []any, since time.Time) ([]bool, error) {
	t := tr.tracker
	out := make([]bool, len(ids))
	uids := make([]string, 0, len(ids))
	idx := make([]int, 0, len(ids))
	for i, id := range ids {
		uid, err := t.ids.Normalize(id)
		if err != nil {
			continue // not an id the tracker could have buffered
		}
		uids = append(uids, uid)
		idx = append(idx, i)
	}
	if len(uids) == 0 {
		return out, nil
	}
	got := make([]time.Time, len(uids))
	if err := t.buf.Newest(ctx, uids, got, t.now(), false); err != nil {
		for i := range out {
			out[i] = true
		}
		return out, err
	}
	for j, at := range got {
		out[idx[j]] = at.After(since)
	}
	return out, nil
}

// purgeCondition is the delete condition of one purge batch at cutoff: the
// batch's ids that are expired by p's rule, except those whose newer
// activity is still buffered (see busy), which go only when past their
// expiry:
//
//	(pk IN (free ids) AND <expired>) OR (pk IN (busy ids) AND expires <= cutoff)
func (p *Plugin) purgeCondition(ctx context.Context, db *gorm.DB, ids []any, cutoff time.Time) clause.Expression {
	pk := clause.Column{Table: clause.CurrentTable, Name: p.sessions.model.pk.DBName}
	expired := p.expired(db, cutoff)
	tr := p.activityTracker()
	if tr == nil {
		return clause.And(clause.IN{Column: pk, Values: ids}, expired)
	}
	isBusy, err := tr.busy(ctx, ids, cutoff.Add(-p.cfg.IdleTimeout))
	if err != nil {
		p.log.Warn("lastseen: purge: cannot read the activity buffer; idle sessions are kept this time", "err", err)
	}
	var free, held []any
	for i, id := range ids {
		if isBusy[i] {
			held = append(held, id)
		} else {
			free = append(free, id)
		}
	}
	abs := expiryRule(db, timeCol{p.sessions.model.time.DBName, p.sessions.model.enc}, timeCol{}, 0, cutoff)
	switch {
	case len(held) == 0:
		return clause.And(clause.IN{Column: pk, Values: free}, expired)
	case len(free) == 0:
		return clause.And(clause.IN{Column: pk, Values: held}, abs)
	}
	return clause.Or(
		clause.And(clause.IN{Column: pk, Values: free}, expired),
		clause.And(clause.IN{Column: pk, Values: held}, abs),
	)
}

// PurgeResult counts what one purge did.
type PurgeResult struct {
	Deleted      int           // session rows deleted
	Batches      int           // delete transactions committed
	Retries      int           // transactions repeated after a deadlock, a serialization failure or a connection failure
	Cutoff       time.Time     // sessions expiring at or before this were purged (UTC)
	Stopped      bool          // the run ended early: context ended, Close, or an error
	Duration     time.Duration // wall time
	Refused      int           // expired sessions the database refused to delete (a RESTRICT key, a trigger), skipped
	FirstRefusal error         // the first refusal, naming its id
	// Kept counts, in a rule run, the inactive rows left because their
	// newer activity was still buffered (or the buffer could not be read);
	// 0 in a purge, whose buffered sessions go at their absolute expiry.
	Kept int
}

// PurgeExpiredSessions deletes the sessions expired (the Expired rule) at
// the run's start, Sessions.BatchSize per transaction in primary-key order,
// by key and expiry so a session extended meanwhile survives; the delete
// is real (soft-deleted rows too), skips hooks, and retries a deadlock up
// to 3 times. One instance purges at a time (ErrLocked). A refused session
// is skipped (Refused); ErrSystemic and other errors, prefixed "lastseen:
// purge batch N:", stop the run, as do ctx (ctx.Err()) and Close
// (ErrClosed), between batches.
func (p *Plugin) PurgeExpiredSessions(ctx context.Context) (PurgeResult, error) {
	db, done, err := p.startRun()
	if err != nil {
		return PurgeResult{}, err
	}
	defer done()
	ctx, observed := p.observePurge(ctx)
	if err := p.checkTable(ctx, "purge", p.sessionsCheck(), &p.schema.sessionsOK); err != nil {
		p.stats.purges.Add(1)
		p.stats.purgeErrors.Add(1)
		res := PurgeResult{Stopped: true}
		observed(res, err)
		return res, err
	}
	res, err := p.purgeLocked(ctx, db, p.sessionSweep())
	if schemaMayBeGone(err) { // the next purge checks the table again
		p.schema.sessionsOK.Store(false)
	}
	observed(res, err)
	return res, err
}

// fresh returns a handle on db's connection pool and callbacks whose next
// statement starts empty: nothing a caller left on db (a Model, Where
// clauses) leaks into the purge's statements.
func fresh(ctx context.Context, db *gorm.DB) *gorm.DB {
	return db.Session(&gorm.Session{NewDB: true, Context: ctx})
}

// sweep is what one batched run acts on: the session purge
// (sessionSweep) or an inactivity rule (ruleSweep). Both run the same way,
// under their lock, at a frozen cutoff, by primary key in batches, each in
// a transaction of its own, rows refused on their own passed over
// (purgeLocked).
type sweep struct {
	rule  string // the rule's name; "" for the session purge
	what  string // how errors and logs name the run: "purge" or `rule "warn"`
	noun  string // one of its rows, in refusals: "session" or "row"
	model *model
	size  int // rows per batch
	lock  func(context.Context) (buffer.Lease, error)
	lost  error // the cause that stops a run whose lock was lost
	// cond is the condition of the rows the run selects at cutoff; unscoped
	// selects soft-deleted rows too.
	cond     func(db *gorm.DB, cutoff time.Time) clause.Expression
	unscoped bool
	// prepare does a batch's work outside its transaction (reading the
	// buffer for ids) and returns the work inside it, run again on a retry:
	// act on those of ids that still qualify, returning how many it acted
	// on; nil when there is nothing to act on (no transaction is opened).
	// kept is the number of ids left because their activity is buffered.
	prepare func(ctx context.Context, db *gorm.DB, ids []any, cutoff time.Time) (act func(tx *gorm.DB) (int, error), kept int)
	// observeBatch starts the Observer's batch (StartPurgeBatch or
	// StartRuleBatch).
	observeBatch func(ctx context.Context, batch int) (context.Context, func(int, error))
	counted      func(res PurgeResult, err error) // adds a run that took the lock to Stats
	skipped      func()                           // counts a run another holder of the lock kept off
}

// sessionSweep is the session purge as a sweep: the sessions expired by
// p's rule (expired), deleted by key and by the rule again (purgeCondition),
// soft-deleted ones too, hooks skipped.
func (p *Plugin) sessionSweep() *sweep {
	m := p.sessions.model
	return &sweep{
		what: "purge", noun: "session", model: m, size: p.cfg.PurgeBatchSize,
		lock: p.tracker.buf.LockPurge, lost: errPurgeLockLost,
		cond: func(db *gorm.DB, cutoff time.Time) clause.Expression { return p.expired(db, cutoff) }, unscoped: true,
		prepare: func(ctx context.Context, db *gorm.DB, ids []any, cutoff time.Time) (func(tx *gorm.DB) (int, error), int) {
			cond := p.purgeCondition(ctx, db, ids, cutoff)
			return func(tx *gorm.DB) (int, error) {
				r := tx.Session(&gorm.Session{SkipHooks: true}).Unscoped().Where(cond).Delete(reflect.New(m.typ).Interface())
				return int(r.RowsAffected), r.Error
			}, 0
		},
		observeBatch: p.observePurgeBatch,
		counted: func(res PurgeResult, err error) {
			p.stats.purges.Add(1)
			p.stats.sessionsDeleted.Add(int64(res.Deleted))
			p.stats.purgeRefused.Add(int64(res.Refused))
			if err != nil {
				p.stats.purgeErrors.Add(1)
			}
		},
		skipped: func() { p.stats.purgeSkipped.Add(1) },
	}
}

// purgeLocked runs sw under its lock (ErrLocked when another instance
// holds it).
func (p *Plugin) purgeLocked(ctx context.Context, db *gorm.DB, sw *sweep) (PurgeResult, error) {
	lock, err := sw.lock(ctx)
	if errors.Is(err, buffer.ErrNotObtained) {
		sw.skipped()
		return PurgeResult{}, ErrLocked
	}
	if err != nil {
		err = fmt.Errorf("lastseen: %s lock: %w", sw.what, err)
		sw.counted(PurgeResult{Stopped: true}, err)
		return PurgeResult{}, err
	}
	defer lock.Release(ctx)

	// The run stops when ctx ends, Close is called or the lock is lost
	// (keepLock), whichever comes first.
	kept, stop := lock.Keep(ctx, sw.lost)
	defer stop()
	run, cancel := context.WithCancelCause(kept)
	defer cancel(nil)
	defer context.AfterFunc(p.closing, func() { cancel(ErrClosed) })()

	res, err := p.purge(run, db, sw, lock)
	sw.counted(res, err)
	return res, err
}

// purge is one run of sw under its lock. ctx ending (with its cause) stops
// the run between batches.
func (p *Plugin) purge(ctx context.Context, db *gorm.DB, sw *sweep, lock buffer.Lease) (PurgeResult, error) {
	start := time.Now()
	m := sw.model
	res := PurgeResult{Cutoff: p.now().UTC()}
	pk := clause.Column{Table: clause.CurrentTable, Name: m.pk.DBName}
	dest := reflect.New(reflect.SliceOf(m.typ))

	// Every select gets PurgeBatchTimeout: the timer runs while FindInBatches
	// selects and is stopped while a batch is deleted.
	sel, cancelSel := context.WithCancelCause(ctx)
	defer cancelSel(nil)
	timer := time.AfterFunc(p.cfg.PurgeBatchTimeout, func() { cancelSel(errBatchTimeout) })
	defer timer.Stop()

	var fail error // the callback's error, final as it is
	q := fresh(sel, db)
	if sw.unscoped {
		q = q.Unscoped()
	}
	q = q.Model(reflect.New(m.typ).Interface()).Select("?", pk).Where(sw.cond(db, res.Cutoff))
	err := q.FindInBatches(dest.Interface(), sw.size, func(_ *gorm.DB, batch int) error {
		timer.Stop()
		if fail = p.purgeBatch(ctx, db, sw, lock, &res, batch, keysOf(ctx, m, dest)); fail != nil {
			return fail
		}
		timer.Reset(p.cfg.PurgeBatchTimeout)
		return nil
	}).Error
	res.Duration = time.Since(start)
	switch {
	case err == nil:
		return res, nil
	case fail != nil:
		err = fail
	case context.Cause(ctx) != nil:
		err = context.Cause(ctx)
	case context.Cause(sel) == errBatchTimeout:
		err = fmt.Errorf("lastseen: %s batch %d: select: timed out after %v (%w): %w",
			sw.what, res.Batches+1, p.cfg.PurgeBatchTimeout, errBatchTimeout, err)
	default:
		err = fmt.Errorf("lastseen: %s batch %d: select: %w", sw.what, res.Batches+1, err)
	}
	res.Stopped = true
	return res, err
}

// purgeBatch acts on one batch of ids, then refreshes the lock and pauses.
// It returns ctx's cause when the run must stop.
func (p *Plugin) purgeBatch(ctx context.Context, db *gorm.DB, sw *sweep, lock buffer.Lease, res *PurgeResult, batch int, ids []any) error {
	if stop := context.Cause(ctx); stop != nil {
		return stop
	}
	if len(ids) > 0 {
		p.purgeHooks.Selected(sw.rule, batch, ids)
		bctx, end := sw.observeBatch(ctx, batch)
		pp := &purgeParts{p: p, db: db, sw: sw, res: res}
		n, err := pp.delete(bctx, ids)
		if err != nil && !errors.Is(err, context.Cause(ctx)) {
			n, err = pp.isolate(bctx, ids, err) // rows refused on their own are passed over
		}
		end(n, err)
		res.Deleted += n
		if err != nil {
			if stop := context.Cause(ctx); stop != nil && errors.Is(err, stop) {
				return stop
			}
			return fmt.Errorf("lastseen: %s batch %d: %w", sw.what, batch, err)
		}
	}
	if stop := context.Cause(ctx); stop != nil {
		return stop
	}
	if err := lock.Refresh(ctx); err != nil {
		switch stop := context.Cause(ctx); {
		case stop != nil:
			return stop
		case errors.Is(err, buffer.ErrLockLost):
			return fmt.Errorf("lastseen: %s batch %d: lost the %s lock", sw.what, batch, sw.what)
		}
		return fmt.Errorf("lastseen: %s batch %d: refresh lock: %w", sw.what, batch, err)
	}
	if p.cfg.PurgePause > 0 {
		t := time.NewTimer(p.cfg.PurgePause)
		defer t.Stop()
		select {
		case <-ctx.Done():
		case <-t.C:
		}
	}
	return context.Cause(ctx)
}

// deleteBatch runs one batch's work (act: a sweep's prepare, on ids) in
// its own transaction under the batch timeout, retrying deadlocks,
// serialization failures and errors of the connection or the server's
// state (Dialect.Transient). The transaction ignores ctx ending (a batch
// is never cut short); the waits between attempts do not, and then return
// ctx's cause.
func (p *Plugin) deleteBatch(ctx context.Context, db *gorm.DB, ids []any, act func(tx *gorm.DB) (int, error)) (n, retries int, err error) {
	retryable := func(err error) bool {
		return !errors.Is(err, errBatchTimeout) && (p.dialect.Retryable(err) || p.dialect.Transient(err))
	}
	retries, err = retry(ctx, p.cfg.MaxRetries, retryable, func() error {
		p.hooks.Deleting(ids)
		bctx, cancel := context.WithTimeoutCause(context.WithoutCancel(ctx), p.cfg.PurgeBatchTimeout, errBatchTimeout)
		defer cancel()
		err := fresh(bctx, db).Transaction(func(tx *gorm.DB) (err error) {
			n, err = act(tx)
			return err
		})
		if err != nil && context.Cause(bctx) == errBatchTimeout {
			return fmt.Errorf("timed out after %v (%w): %w", p.cfg.PurgeBatchTimeout, errBatchTimeout, err)
		}
		return err
	})
	if err != nil {
		return 0, retries, err
	}
	return n, retries, nil
}

// purgeJob is the scheduled purge: it skips the tick when another instance
// holds the lock, and logs one structured line per run, at Debug when it
// deleted nothing or was skipped.
func (p *Plugin) purgeJob(ctx context.Context) {
	if !p.schedulesPurge() {
		p.log.Debug("lastseen: purge left to another plugin of the same session table")
		return
	}
	res, err := p.PurgeExpiredSessions(ctx)
	p.logRun("lastseen: purge", "lastseen: purge: nothing expired", &p.schema.purgeLog, res, err,
		"session_table", p.sessions.model.table, "deleted", res.Deleted)
}

// logRun logs one scheduled run of a sweep, msg "lastseen: purge" or
// "lastseen: rule": Info with its counts (attrs first), Debug when it
// acted on nothing (the message nothing) or was skipped, Error when it
// failed (schema errors through lim).
func (p *Plugin) logRun(msg, nothing string, lim *logLimiter, res PurgeResult, err error, attrs ...any) {
	attrs = append(attrs, "batches", res.Batches, "retries", res.Retries, "cutoff", res.Cutoff, "stopped", res.Stopped, "duration", res.Duration)
	if res.Refused > 0 {
		attrs = append(attrs, "refused", res.Refused, "first_refusal", res.FirstRefusal.Error())
	}
	switch {
	case err == nil && res.Deleted == 0:
		p.log.Debug(nothing, attrs...)
	case err == nil:
		p.log.Info(msg, attrs...)
	case errors.Is(err, ErrLocked):
		p.log.Debug(msg+" skipped: another instance holds the lock", attrs...)
	case errors.Is(err, ErrClosed), errors.Is(err, context.Canceled):
		p.log.Info(msg+" stopped", append(attrs, "err", err)...)
	case errors.Is(err, ErrSchema):
		p.logSchemaError(lim, msg+" failed", err, attrs...)
	default:
		p.log.Error(msg+" failed", append(attrs, "err", err)...)
	}
}

// purgeParts deletes the parts of one purge batch that fail together. It
// is the purge's counterpart of probeBatch and isolateRefused.
type purgeParts struct {
	p   *Plugin
	db  *gorm.DB
	sw  *sweep
	res *PurgeResult
}

// isolate handles a batch whose delete failed with batchErr. An error
// without a kind, one of the connection or the server's state
// (Dialect.Transient), a timeout or a lasting deadlock stops the run as
// before: none of those is a session's refusal. Otherwise one session of the batch is deleted alone
// (the probe); refused with the same kind of error, a delete that touches
// no row witnesses. Refused the same way too, the refusal is systemic
// (ErrSystemic, the run stops after this batch). Else the batch is halved
// until the refused sessions stand alone, the rest is deleted, and the
// refused ones are counted in PurgeResult.Refused and logged, each with its
// id; the run goes on past them, as will the next one. It returns the rows
// deleted.
func (pp *purgeParts) isolate(ctx context.Context, ids []any, batchErr error) (int, error) {
	p := pp.p
	kind := p.dialect.ErrorKind(batchErr)
	if kind == "" || errors.Is(batchErr, errBatchTimeout) || p.dialect.Retryable(batchErr) || p.dialect.Transient(batchErr) {
		return 0, batchErr
	}
	if p.dialect.Exhausted(kind) {
		return 0, fmt.Errorf("%w (error kind %s: the server is out of a resource): %w", ErrSystemic, kind, batchErr)
	}
	n := len(ids)
	probe, rest := pickProbe(&p.probes, ids)
	var deleted int
	err := batchErr
	if n > 1 {
		deleted, err = pp.delete(ctx, probe)
	}
	if err != nil && p.sameKind(ctx, err, kind) {
		werr := pp.deleteNothing(ctx)
		if p.dialect.Transient(werr) { // no answer: not the session's refusal
			return deleted, werr
		}
		if p.sameKind(ctx, werr, kind) {
			return deleted, fmt.Errorf("%w (error kind %s): %w", ErrSystemic, kind, batchErr)
		}
		if n == 1 {
			return pp.split(ctx, ids) // once more: the error may have been the connection's
		}
	}
	if err != nil {
		if err = pp.refuse(ctx, probe[0], err); err != nil {
			return deleted, err
		}
	}
	d, err := pp.split(ctx, rest)
	return deleted + d, err
}

// split deletes ids whole, or else in halves until the refused sessions
// stand alone.
func (pp *purgeParts) split(ctx context.Context, ids []any) (int, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	deleted, err := pp.delete(ctx, ids)
	switch {
	case err == nil:
		return deleted, nil
	case len(ids) == 1:
		return 0, pp.refuse(ctx, ids[0], err)
	}
	if stop := context.Cause(ctx); stop != nil {
		return 0, stop
	}
	a, err := pp.split(ctx, ids[:len(ids)/2])
	if err != nil {
		return a, err
	}
	b, err := pp.split(ctx, ids[len(ids)/2:])
	return a + b, err
}

// delete is deleteBatch of the sweep's work on ids, counting its retries,
// its commit and the ids kept; with nothing to act on it opens no
// transaction and counts no batch. The work's buffer read ignores ctx ending, as the
// transaction does (a batch is never cut short), within the batch timeout.
func (pp *purgeParts) delete(ctx context.Context, ids []any) (int, error) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), pp.p.cfg.PurgeBatchTimeout)
	defer cancel()
	act, kept := pp.sw.prepare(rctx, pp.db, ids, pp.res.Cutoff)
	if act == nil {
		pp.res.Kept += kept
		return 0, nil
	}
	n, retries, err := pp.p.deleteBatch(ctx, pp.db, ids, act)
	pp.res.Retries += retries
	if err == nil {
		pp.res.Batches++
		pp.res.Kept += kept
	}
	return n, err
}

// refuse records one session the database refused to delete on its own, or
// returns err when it is not such a refusal (no kind, the connection's or
// the server's state, a timeout, ctx ended).
func (pp *purgeParts) refuse(ctx context.Context, id any, err error) error {
	p := pp.p
	if context.Cause(ctx) != nil || p.dialect.ErrorKind(err) == "" || p.dialect.Transient(err) || errors.Is(err, errBatchTimeout) {
		return err
	}
	pp.res.Refused++
	if pp.res.FirstRefusal == nil {
		pp.res.FirstRefusal = fmt.Errorf("lastseen: %s %v: %w", pp.sw.noun, id, err)
	}
	if pp.sw.rule != "" {
		p.log.Warn("lastseen: rule: the database refused the rule's action on a row; skipped", "rule", pp.sw.rule, "id", fmt.Sprint(id), "err", err)
		return nil
	}
	p.log.Warn("lastseen: purge: the database refused to delete an expired session; skipped", "id", fmt.Sprint(id), "err", err)
	return nil
}

// deleteNothing is the witness of isolate: a delete from the sweep's table
// that touches no row ("DELETE FROM sessions WHERE 1 = 0").
func (pp *purgeParts) deleteNothing(ctx context.Context) error {
	m := pp.sw.model
	return fresh(ctx, pp.db).Session(&gorm.Session{SkipHooks: true}).Unscoped().
		Where("1 = 0").Delete(reflect.New(m.typ).Interface()).Error
}
