package lastseen

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/bsm/redislock"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// sessionTarget is the resolved session model.
type sessionTarget struct {
	model *model
}

// PurgeResult counts what one purge did.
type PurgeResult struct {
	Deleted  int           // session rows deleted
	Batches  int           // delete transactions committed
	Cutoff   time.Time     // sessions expiring at or before this were purged (UTC)
	Stopped  bool          // the run ended early: context ended or an error
	Duration time.Duration // wall time
}

// PurgeExpiredSessions deletes the sessions that expired at or before the
// plugin's clock at the start of the run (the cutoff is frozen, so the run
// ends even while sessions keep expiring). It walks the expired rows with
// GORM's FindInBatches, loading only primary keys, PurgeBatchSize at a time,
// and deletes each batch by primary key (and expiry, so a session extended
// meanwhile survives) in its own transaction: an interrupted purge keeps
// every committed batch and running it again is harmless. The delete is
// real (Unscoped) on models with gorm.DeletedAt, skips model hooks, and
// retries deadlocks and serialization failures up to MaxRetries times.
//
// It holds the purge lock in Redis for the whole run, so only one instance
// purges at a time; when another instance holds it, it returns ErrLocked.
// Other errors stop the run and name the batch they happened in; a context
// that ends stops it between batches with ctx.Err(). Stopped reports both.
func (p *Plugin) PurgeExpiredSessions(ctx context.Context) (PurgeResult, error) {
	db, err := p.ready()
	if err != nil {
		return PurgeResult{}, err
	}
	return p.purgeLocked(ctx, db)
}

func (p *Plugin) purgeLockKey() string { return p.cfg.Prefix + ":purge:lock" }

func (p *Plugin) purgeLocked(ctx context.Context, db *gorm.DB) (PurgeResult, error) {
	lock, err := p.locker.Obtain(ctx, p.purgeLockKey(), p.cfg.LockTTL, nil)
	if errors.Is(err, redislock.ErrNotObtained) {
		return PurgeResult{}, ErrLocked
	}
	if err != nil {
		return PurgeResult{}, fmt.Errorf("lastseen: purge lock: %w", err)
	}
	defer lock.Release(context.WithoutCancel(ctx))
	res, err := p.purge(ctx, db, lock)
	p.stats.purges.Add(1)
	p.stats.sessionsDeleted.Add(int64(res.Deleted))
	if err != nil {
		p.stats.purgeErrors.Add(1)
	}
	return res, err
}

func (p *Plugin) purge(ctx context.Context, db *gorm.DB, lock *redislock.Lock) (PurgeResult, error) {
	start := time.Now()
	m := p.sessions.model
	res := PurgeResult{Cutoff: p.now().UTC()}
	pk := clause.Column{Table: clause.CurrentTable, Name: m.pk.DBName}
	expired := expiredAt(db, m.time.DBName, res.Cutoff)
	dest := reflect.New(reflect.SliceOf(m.typ))
	ids := make([]any, 0, p.cfg.PurgeBatchSize)
	var stop error

	q := db.WithContext(ctx).Unscoped().Model(reflect.New(m.typ).Interface()).Select("?", pk).Where(expired)
	err := q.FindInBatches(dest.Interface(), p.cfg.PurgeBatchSize, func(_ *gorm.DB, batch int) error {
		rows := dest.Elem()
		ids = ids[:0]
		for i := range rows.Len() {
			v, zero := m.pk.ValueOf(ctx, rows.Index(i))
			if !zero {
				ids = append(ids, v)
			}
		}
		n, err := p.deleteBatch(ctx, db, ids, expired)
		if err != nil {
			return fmt.Errorf("lastseen: purge batch %d: %w", batch, err)
		}
		res.Deleted += n
		res.Batches++
		if err := lock.Refresh(ctx, p.cfg.LockTTL, nil); err != nil {
			return fmt.Errorf("lastseen: purge batch %d: refresh lock: %w", batch, err)
		}
		if p.cfg.PurgePause > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(p.cfg.PurgePause):
			}
		}
		if err := ctx.Err(); err != nil {
			stop = err
			return err
		}
		return nil
	}).Error
	res.Duration = time.Since(start)
	if err != nil {
		res.Stopped = true
		if stop != nil {
			return res, stop
		}
		return res, err
	}
	return res, nil
}

// deleteBatch deletes one batch in its own transaction under the batch
// timeout, retrying deadlocks and serialization failures.
func (p *Plugin) deleteBatch(ctx context.Context, db *gorm.DB, ids []any, expired clause.Expr) (int, error) {
	m := p.sessions.model
	pk := clause.Column{Table: clause.CurrentTable, Name: m.pk.DBName}
	delay := 10 * time.Millisecond
	for attempt := 0; ; attempt++ {
		bctx, cancel := context.WithTimeout(ctx, p.cfg.PurgeBatchTimeout)
		var n int64
		err := db.WithContext(bctx).Transaction(func(tx *gorm.DB) error {
			r := tx.Session(&gorm.Session{SkipHooks: true}).Unscoped().
				Where(clause.IN{Column: pk, Values: ids}).Where(expired).
				Delete(reflect.New(m.typ).Interface())
			n = r.RowsAffected
			return r.Error
		})
		cancel()
		if err == nil || attempt >= p.cfg.MaxRetries || !p.dialect.retryable(err) {
			return int(n), err
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(delay):
		}
		delay *= 4
	}
}

// purgeJob is the scheduled purge: it skips the tick when another instance
// holds the lock, and logs one structured line per run.
func (p *Plugin) purgeJob(ctx context.Context) {
	res, err := p.purgeLocked(ctx, p.db)
	attrs := []any{"deleted", res.Deleted, "batches", res.Batches, "cutoff", res.Cutoff, "duration", res.Duration}
	switch {
	case errors.Is(err, ErrLocked):
		p.stats.purgeSkipped.Add(1)
		p.log.Info("lastseen: purge skipped, another instance is purging")
	case err != nil:
		p.log.Error("lastseen: purge stopped", append(attrs, "err", err)...)
	default:
		p.log.Info("lastseen: purge", attrs...)
	}
}
