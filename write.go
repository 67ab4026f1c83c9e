package lastseen

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// batchResult counts one written batch.
type batchResult struct {
	written, unknown, stale, batches int
}

// refusal is an entry the database refused on its own, with its error.
type refusal struct {
	entry
	err error
}

// writeBatch writes one batch. It retries deadlocks and serialization
// failures up to MaxRetries times. When the database is reachable but the
// batch failed, it tries the whole batch once more (the error may have been
// the connection's: killed, failed over; the pool has replaced it by then),
// then splits the batch in halves until the refused entries stand alone,
// writes the rest, and returns the refused entries with a nil error; any
// other error (database unreachable, context ended) is returned, and then
// nothing of the batch has committed.
func (p *Plugin) writeBatch(ctx context.Context, batch []entry) (batchResult, []refusal, error) {
	br, err := p.writeWithRetry(ctx, batch)
	if err == nil {
		return br, nil, nil
	}
	if ctx.Err() != nil || p.statementError(err) || !p.databaseUp(ctx) {
		return batchResult{}, nil, err
	}
	return p.isolateRefused(ctx, batch)
}

// statement returns ctx bounded by StatementTimeout, for one SQL statement
// of a flush (or the transaction of a write and OnBatch), and a check that
// wraps a statement's error with errStatementTimeout when that bound (not
// ctx) ended it.
func (p *Plugin) statement(ctx context.Context) (context.Context, context.CancelFunc, func(error) error) {
	sctx, cancel := context.WithTimeoutCause(ctx, p.cfg.StatementTimeout, errStatementTimeout)
	check := func(err error) error {
		if err != nil && ctx.Err() == nil && context.Cause(sctx) == errStatementTimeout {
			return fmt.Errorf("timed out after %v (%w): %w", p.cfg.StatementTimeout, errStatementTimeout, err)
		}
		return err
	}
	return sctx, cancel, check
}

// statementError reports an error no single entry can cause (see
// dialect.statementError), or one treated so: an OnBatch failure is never
// split (ErrOnBatch), nor is a statement that ran past StatementTimeout.
func (p *Plugin) statementError(err error) bool {
	return errors.Is(err, errNoTable) || errors.Is(err, ErrOnBatch) || errors.Is(err, errStatementTimeout) ||
		p.dialect.statementError(err)
}

// isolateRefused writes a batch the reachable database failed once: whole,
// then, if refused again, in halves, recursively.
func (p *Plugin) isolateRefused(ctx context.Context, batch []entry) (batchResult, []refusal, error) {
	br, err := p.writeWithRetry(ctx, batch)
	if err == nil {
		return br, nil, nil
	}
	if ctx.Err() != nil || p.statementError(err) || !p.databaseUp(ctx) {
		return batchResult{}, nil, err
	}
	if len(batch) == 1 {
		p.limited.log(p.log, slog.LevelError, "lastseen: database refused a pending entry; it goes back to pending", "id", batch[0].field, "err", err)
		return batchResult{}, []refusal{{batch[0], err}}, nil
	}
	half := len(batch) / 2
	a, ra, err := p.isolateRefused(ctx, batch[:half])
	if err != nil {
		return a, nil, err
	}
	b, rb, err := p.isolateRefused(ctx, batch[half:])
	a.written += b.written
	a.unknown += b.unknown
	a.stale += b.stale
	a.batches += b.batches
	if err != nil {
		return a, nil, err
	}
	return a, append(ra, rb...), nil
}

// databaseUp tells a refused batch from an unreachable database with a
// SELECT 1 through the same GORM handle the writes use.
func (p *Plugin) databaseUp(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, min(5*time.Second, p.cfg.StatementTimeout))
	defer cancel()
	return p.db.WithContext(ctx).Exec("SELECT 1").Error == nil
}

// writeWithRetry writes the batch, retrying deadlocks and serialization
// failures up to MaxRetries times (retry), with a warning per retry.
func (p *Plugin) writeWithRetry(ctx context.Context, batch []entry) (br batchResult, err error) {
	attempt := 0
	retryable := func(err error) bool {
		if !p.dialect.retryable(err) {
			return false
		}
		attempt++
		p.log.Warn("lastseen: retrying batch", "attempt", attempt, "err", err)
		return true
	}
	_, err = retry(ctx, p.cfg.MaxRetries, retryable, func() error {
		br, err = p.writeOnce(ctx, batch)
		return err
	})
	return br, err
}

// writeOnce runs the batch's one statement, with Config.OnBatch in the same
// transaction when set (withHook), and counts the result. The column-type
// lookup, the write (with OnBatch) and the row count each get
// StatementTimeout.
func (p *Plugin) writeOnce(ctx context.Context, batch []entry) (batchResult, error) {
	tctx, cancel, check := p.statement(ctx)
	t, err := p.writeTarget(tctx)
	cancel()
	if err != nil {
		return batchResult{}, check(err)
	}
	sctx, cancel, check := p.statement(ctx)
	defer cancel()
	db := p.db.WithContext(sctx)
	ids := make([]any, len(batch))
	ts := make([]time.Time, len(batch))
	for i, e := range batch {
		ids[i], ts[i] = e.id, e.at
	}
	n := len(batch)
	if p.cfg.WriteMode == Upsert {
		br, err := p.withHook(db, batch, func(tx *gorm.DB) (batchResult, error) { return p.upsert(tx, t, ids, ts) })
		return br, check(err)
	}
	br, err := p.withHook(db, batch, func(tx *gorm.DB) (batchResult, error) {
		tx = tx.Exec("?", p.dialect.update(t, ids, ts))
		return batchResult{written: int(tx.RowsAffected), batches: 1}, tx.Error
	})
	if err != nil {
		return batchResult{}, check(err)
	}
	if br.written < n {
		cctx, cancel, _ := p.statement(ctx)
		defer cancel()
		existing, err := p.countExisting(p.db.WithContext(cctx), t, ids)
		if err != nil {
			// The write committed; only the split of the rest is unknown.
			br.stale = n - br.written
			return br, nil
		}
		br.unknown = n - existing
		br.stale = existing - br.written
	}
	return br, nil
}

func (p *Plugin) countExisting(db *gorm.DB, t *writeTarget, ids []any) (int, error) {
	var existing int64
	if p.dialect.count != nil {
		err := db.Raw("?", p.dialect.count(t, ids)).Scan(&existing).Error
		return int(existing), err
	}
	err := db.Table("?", clause.Table{Name: t.table}).Where(clause.IN{Column: clause.Column{Name: t.pk}, Values: ids}).Count(&existing).Error
	return int(existing), err
}

func (p *Plugin) upsert(db *gorm.DB, t *writeTarget, ids []any, ts []time.Time) (batchResult, error) {
	n := len(ids)
	existing := 0
	if p.dialect.upsertDoubleCounts {
		var err error
		if existing, err = p.countExisting(db, t, ids); err != nil {
			return batchResult{}, err
		}
	}
	rows := make([]map[string]any, n)
	for i := range ids {
		rows[i] = map[string]any{t.pk: ids[i], t.col: ts[i]}
	}
	table := clause.Table{Name: t.table}
	tx := db.Table("?", table).Clauses(clause.Insert{Table: table}, p.dialect.onConflict(t)).Create(&rows)
	if tx.Error != nil {
		return batchResult{}, tx.Error
	}
	affected := int(tx.RowsAffected)
	written := affected
	if p.dialect.upsertDoubleCounts {
		// MySQL: 1 per inserted row, 2 per updated row, 0 per unchanged row.
		inserted := n - existing
		written = inserted + (affected-inserted)/2
	}
	return batchResult{written: written, stale: n - written, batches: 1}, nil
}
