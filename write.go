package lastseen

import (
	"context"
	"errors"
	"fmt"
	"time"

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
// of a flush, and a check that wraps a statement's error with
// errStatementTimeout when that bound (not ctx) ended it.
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

// statementError reports an error no single entry can cause (a missing
// table, a statement that ran past StatementTimeout; see also
// dialect.statementError).
func (p *Plugin) statementError(err error) bool {
	return errors.Is(err, errNoTable) || errors.Is(err, errStatementTimeout) || p.dialect.statementError(err)
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
		p.log.Error("lastseen: database refused a pending entry; it goes back to pending", "id", batch[0].field, "err", err)
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

// writeOnce runs the batch's statement and counts the result; each
// statement (the column-type lookup, the write, the row count) gets
// StatementTimeout.
func (p *Plugin) writeOnce(ctx context.Context, batch []entry) (batchResult, error) {
	tctx, cancel, check := p.statement(ctx)
	t, err := p.writeTarget(tctx)
	cancel()
	if err != nil {
		return batchResult{}, check(err)
	}
	ids := make([]any, len(batch))
	ts := make([]time.Time, len(batch))
	for i, e := range batch {
		ids[i], ts[i] = e.id, e.at
	}
	if p.cfg.WriteMode == Upsert {
		br, err := p.upsert(ctx, t, ids, ts)
		return br, err
	}
	sctx, cancel, check := p.statement(ctx)
	tx := p.db.WithContext(sctx).Exec("?", p.dialect.update(t, ids, ts))
	cancel()
	if tx.Error != nil {
		return batchResult{}, check(tx.Error)
	}
	n := len(batch)
	br := batchResult{written: int(tx.RowsAffected), batches: 1}
	if br.written < n {
		existing, err := p.countExisting(ctx, t, ids)
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

// countExisting counts the ids that have a row, in one statement bounded by
// StatementTimeout.
func (p *Plugin) countExisting(ctx context.Context, t *writeTarget, ids []any) (int, error) {
	sctx, cancel, check := p.statement(ctx)
	defer cancel()
	db := p.db.WithContext(sctx)
	var existing int64
	if p.dialect.count != nil {
		err := db.Raw("?", p.dialect.count(t, ids)).Scan(&existing).Error
		return int(existing), check(err)
	}
	err := db.Table("?", clause.Table{Name: t.table}).Where(clause.IN{Column: clause.Column{Name: t.pk}, Values: ids}).Count(&existing).Error
	return int(existing), check(err)
}

// upsert writes the batch with INSERT ... ON CONFLICT (or ON DUPLICATE
// KEY) UPDATE, each statement bounded by StatementTimeout.
func (p *Plugin) upsert(ctx context.Context, t *writeTarget, ids []any, ts []time.Time) (batchResult, error) {
	n := len(ids)
	existing := 0
	if p.dialect.upsertDoubleCounts {
		var err error
		if existing, err = p.countExisting(ctx, t, ids); err != nil {
			return batchResult{}, err
		}
	}
	sctx, cancel, check := p.statement(ctx)
	defer cancel()
	db := p.db.WithContext(sctx)
	rows := make([]map[string]any, n)
	for i := range ids {
		rows[i] = map[string]any{t.pk: ids[i], t.col: ts[i]}
	}
	table := clause.Table{Name: t.table}
	tx := db.Table("?", table).Clauses(clause.Insert{Table: table}, p.dialect.onConflict(t)).Create(&rows)
	if tx.Error != nil {
		return batchResult{}, check(tx.Error)
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
