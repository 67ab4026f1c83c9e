package lastseen

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/lastseen/lastseen/internal/buffer"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// PurgeResult counts what one purge did.
type PurgeResult struct {
	Deleted      int           // session rows deleted
	Batches      int           // delete transactions committed
	Retries      int           // transactions repeated after a deadlock or serialization failure
	Cutoff       time.Time     // sessions expiring at or before this were purged (UTC)
	Stopped      bool          // the run ended early: context ended, Close, or an error
	Duration     time.Duration // wall time
	Refused      int           // expired sessions the database refused to delete (a RESTRICT key, a trigger), skipped
	FirstRefusal error         // the first refusal, naming its id
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
	res, err := p.purgeLocked(ctx, db)
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

func (p *Plugin) purgeLocked(ctx context.Context, db *gorm.DB) (PurgeResult, error) {
	lock, err := p.tracker.buf.LockPurge(ctx)
	if errors.Is(err, buffer.ErrNotObtained) {
		p.stats.purgeSkipped.Add(1)
		return PurgeResult{}, ErrLocked
	}
	if err != nil {
		p.stats.purges.Add(1)
		p.stats.purgeErrors.Add(1)
		return PurgeResult{}, fmt.Errorf("lastseen: purge lock: %w", err)
	}
	defer lock.Release(ctx)

	// The run stops when ctx ends, Close is called or the lock is lost
	// (keepLock), whichever comes first.
	kept, stop := lock.Keep(ctx, errPurgeLockLost)
	defer stop()
	run, cancel := context.WithCancelCause(kept)
	defer cancel(nil)
	defer context.AfterFunc(p.closing, func() { cancel(ErrClosed) })()

	res, err := p.purge(run, db, lock)
	p.stats.purges.Add(1)
	p.stats.sessionsDeleted.Add(int64(res.Deleted))
	p.stats.purgeRefused.Add(int64(res.Refused))
	if err != nil {
		p.stats.purgeErrors.Add(1)
	}
	return res, err
}

// purge is one run under the lock. ctx ending (with its cause) stops the run
// between batches.
func (p *Plugin) purge(ctx context.Context, db *gorm.DB, lock buffer.Lease) (PurgeResult, error) {
	start := time.Now()
	m := p.sessions.model
	res := PurgeResult{Cutoff: p.now().UTC()}
	pk := clause.Column{Table: clause.CurrentTable, Name: m.pk.DBName}
	expired := p.expired(db, res.Cutoff) // idle.go
	dest := reflect.New(reflect.SliceOf(m.typ))
	ids := make([]any, 0, p.cfg.PurgeBatchSize)

	// Every select gets PurgeBatchTimeout: the timer runs while FindInBatches
	// selects and is stopped while a batch is deleted.
	sel, cancelSel := context.WithCancelCause(ctx)
	defer cancelSel(nil)
	timer := time.AfterFunc(p.cfg.PurgeBatchTimeout, func() { cancelSel(errBatchTimeout) })
	defer timer.Stop()

	var fail error // the callback's error, final as it is
	q := fresh(sel, db).Unscoped().Model(reflect.New(m.typ).Interface()).Select("?", pk).Where(expired)
	err := q.FindInBatches(dest.Interface(), p.cfg.PurgeBatchSize, func(_ *gorm.DB, batch int) error {
		timer.Stop()
		rows := dest.Elem()
		ids = ids[:0]
		for i := range rows.Len() {
			if v, zero := m.pk.ValueOf(ctx, rows.Index(i)); !zero {
				ids = append(ids, v)
			}
		}
		if fail = p.purgeBatch(ctx, db, lock, &res, batch, ids); fail != nil {
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
		err = fmt.Errorf("lastseen: purge batch %d: select: timed out after %v (%w): %w",
			res.Batches+1, p.cfg.PurgeBatchTimeout, errBatchTimeout, err)
	default:
		err = fmt.Errorf("lastseen: purge batch %d: select: %w", res.Batches+1, err)
	}
	res.Stopped = true
	return res, err
}

// purgeBatch deletes one batch of ids, then refreshes the lock and pauses.
// It returns ctx's cause when the run must stop.
func (p *Plugin) purgeBatch(ctx context.Context, db *gorm.DB, lock buffer.Lease, res *PurgeResult, batch int, ids []any) error {
	if stop := context.Cause(ctx); stop != nil {
		return stop
	}
	if len(ids) > 0 {
		bctx, end := p.observePurgeBatch(ctx, batch)
		pp := &purgeParts{p: p, db: db, res: res}
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
			return fmt.Errorf("lastseen: purge batch %d: %w", batch, err)
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
			return fmt.Errorf("lastseen: purge batch %d: lost the purge lock", batch)
		}
		return fmt.Errorf("lastseen: purge batch %d: refresh lock: %w", batch, err)
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

// deleteBatch deletes one batch, the rows matching cond (purgeCondition),
// in its own transaction under the batch timeout, retrying deadlocks and
// serialization failures. The transaction ignores ctx ending (a batch is
// never cut short); the waits between attempts do not, and then return
// ctx's cause.
func (p *Plugin) deleteBatch(ctx context.Context, db *gorm.DB, cond clause.Expression) (n, retries int, err error) {
	m := p.sessions.model
	retryable := func(err error) bool { return !errors.Is(err, errBatchTimeout) && p.dialect.Retryable(err) }
	retries, err = retry(ctx, p.cfg.MaxRetries, retryable, func() error {
		bctx, cancel := context.WithTimeoutCause(context.WithoutCancel(ctx), p.cfg.PurgeBatchTimeout, errBatchTimeout)
		defer cancel()
		err := fresh(bctx, db).Transaction(func(tx *gorm.DB) error {
			r := tx.Session(&gorm.Session{SkipHooks: true}).Unscoped().
				Where(cond).
				Delete(reflect.New(m.typ).Interface())
			n = int(r.RowsAffected)
			return r.Error
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
	attrs := []any{"session_table", p.sessions.model.table, "deleted", res.Deleted, "batches", res.Batches,
		"retries", res.Retries, "cutoff", res.Cutoff, "stopped", res.Stopped, "duration", res.Duration}
	if res.Refused > 0 {
		attrs = append(attrs, "refused", res.Refused, "first_refusal", res.FirstRefusal.Error())
	}
	switch {
	case err == nil && res.Deleted == 0:
		p.log.Debug("lastseen: purge: nothing expired", attrs...)
	case err == nil:
		p.log.Info("lastseen: purge", attrs...)
	case errors.Is(err, ErrLocked):
		p.log.Debug("lastseen: purge skipped: another instance holds the lock", attrs...)
	case errors.Is(err, ErrClosed), errors.Is(err, context.Canceled):
		p.log.Info("lastseen: purge stopped", append(attrs, "err", err)...)
	case errors.Is(err, ErrSchema):
		p.logSchemaError(&p.schema.purgeLog, "lastseen: purge failed", err, attrs...)
	default:
		p.log.Error("lastseen: purge failed", append(attrs, "err", err)...)
	}
}
