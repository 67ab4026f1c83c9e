package lastseen

import (
	"context"
	"fmt"

	"gorm.io/gorm/clause"
)

// probeBatch handles a batch the server refused with an error of kind kind
// (dialect.errorKind). It tells a refusal no row can cause from rows
// refused on their own by behaviour, not by a list of codes:
//
//  1. the probe: one entry of the batch alone (for a batch of one, the
//     batch was that probe). Written, or refused with another kind: rows
//     are refused on their own.
//  2. refused with the same kind, the witness: another entry alone, or for
//     a batch of one a write that touches no row (writeNothing). Refused
//     with the same kind too: no single row explains it (read-only,
//     permission denied, disk full, a missing column); the failure is
//     systemic and the whole batch stays in Redis: ErrSystemic wrapping the
//     batch's error, after three statements at most.
//
// Otherwise the probes that failed are refused entries and the rest of the
// batch is isolated as usual (isolateRefused). The probe's position rotates
// from one call to the next, so a batch whose probe and witness were both
// refused rows of the same kind is probed elsewhere by the next flush.
func (p *Plugin) probeBatch(ctx context.Context, batch []entry, batchErr error, kind string) (batchResult, []refusal, error) {
	n := len(batch)
	if n == 1 { // the batch was the probe
		if werr := p.writeNothing(ctx); p.sameKind(ctx, werr, kind) {
			return batchResult{}, nil, p.systemic(kind, n, batchErr)
		}
		return p.isolateRefused(ctx, batch) // once more: the error may have been the connection's
	}
	i := int(p.probes.Add(1) % uint64(n))
	used := map[int]bool{i: true}
	var refused []refusal
	res, err := p.writeWithRetry(ctx, batch[i:i+1])
	switch {
	case err == nil:
	case ctx.Err() != nil:
		return res, nil, err
	case p.dialect.errorKind(err) != kind:
		if p.dialect.errorKind(err) == "" && !p.databaseUp(ctx) {
			return res, nil, err
		}
		refused = append(refused, p.refused(batch[i], err))
	default: // refused the same way as the whole batch: the entry, or the database?
		j := (i + n/2) % n
		used[j] = true
		wbr, werr := p.writeWithRetry(ctx, batch[j:j+1])
		if p.sameKind(ctx, werr, kind) {
			return res, nil, p.systemic(kind, n, batchErr)
		}
		switch {
		case ctx.Err() != nil:
			return res, nil, ctx.Err()
		case werr == nil:
			res.merge(wbr)
		case p.dialect.errorKind(werr) == "" && !p.databaseUp(ctx):
			return res, nil, werr
		default:
			refused = append(refused, p.refused(batch[j], werr))
		}
		refused = append(refused, p.refused(batch[i], err))
	}
	rest := make([]entry, 0, n-len(used))
	for k, e := range batch {
		if !used[k] {
			rest = append(rest, e)
		}
	}
	rb, rr, err := p.isolateRefused(ctx, rest)
	res.merge(rb)
	if err != nil {
		return res, nil, err
	}
	return res, append(refused, rr...), nil
}

// sameKind reports whether a witness failed with the batch's kind of error
// while ctx still runs.
func (p *Plugin) sameKind(ctx context.Context, err error, kind string) bool {
	return err != nil && ctx.Err() == nil && p.dialect.errorKind(err) == kind
}

// systemic is the error of a batch of n entries kept whole in Redis.
func (p *Plugin) systemic(kind string, n int, err error) error {
	return fmt.Errorf("%w (error kind %s, %d entries kept): %w", ErrSystemic, kind, n, err)
}

// writeNothing is the witness for a batch of one: a write to the users
// table that touches no row,
//
//	UPDATE "users" SET "last_seen_at" = "last_seen_at" WHERE 1 = 0
//
// which no row's constraint or trigger can refuse, but a read-only
// database, a missing privilege, table or column does.
func (p *Plugin) writeNothing(ctx context.Context) error {
	t, err := p.writeTarget(ctx)
	if err != nil {
		return err
	}
	col := clause.Column{Name: t.col}
	return p.db.WithContext(ctx).Exec("UPDATE ? SET ? = ? WHERE 1 = 0", clause.Table{Name: t.table}, col, col).Error
}
