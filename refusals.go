package lastseen

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync/atomic"

	"github.com/lastseen/lastseen/internal/clip"
	"github.com/lastseen/lastseen/internal/dialect"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// probeBatch handles a batch the server refused with an error of kind kind
// (Dialect.ErrorKind). It tells a refusal no row can cause from rows
// refused on their own by behaviour, not by a list of codes:
//
//  1. the probe: one entry of the batch alone (for a batch of one, the
//     batch was that probe). Written, or refused with another kind: rows
//     are refused on their own.
//  2. refused with the same kind, the witness: a write to the same table
//     that touches no row (writeNothing), which no row's constraint or
//     trigger can refuse. Refused with the same kind too, the failure is
//     systemic (read-only, permission denied, a missing table or column):
//     the whole batch stays in Redis and ErrSystemic wraps the batch's
//     error, after three statements.
//
// A kind that names a resource running out (Dialect.Exhausted: a full disk,
// which may still accept the witness and even a one-row probe) is systemic
// wherever a write meets it (writeBatch, isolateRefused): never a row's
// refusal, never counted toward MaxRefusals.
//
// Otherwise the probe is a refused entry (a batch of one is tried once more
// first: the error may have been the connection's) and the rest of the
// batch is isolated as usual (isolateRefused). The probe's position rotates
// from one call to the next. An error of the connection or the server's
// state (Dialect.Transient) on the probe or the witness refuses nothing:
// the whole batch stays buffered.
func (p *Plugin) probeBatch(ctx context.Context, batch []entry, batchErr error, kind string) (batchResult, []refusal, error) {
	n := len(batch)
	probe, rest := pickProbe(&p.probes, batch)
	var res batchResult
	err := batchErr
	if n > 1 {
		res, err = p.writeWithRetry(ctx, probe)
	}
	var refused []refusal
	switch {
	case err == nil:
	case ctx.Err() != nil || errors.Is(err, ErrOnBatch):
		return res, nil, err
	case p.dialect.Transient(err): // the connection's, not the probe's
		return res, nil, p.transientError(n, err)
	case p.dialect.ErrorKind(err) != kind:
		if p.dialect.ErrorKind(err) == "" && !p.databaseUp(ctx) {
			return res, nil, err
		}
		refused = append(refused, p.refused(probe[0], err))
	default: // refused the same way as the whole batch: the entry, or the database?
		werr := p.writeNothing(ctx)
		if p.dialect.Transient(werr) && ctx.Err() == nil { // no answer: keep the batch
			return res, nil, p.transientError(n, werr)
		}
		if p.sameKind(ctx, werr, kind) {
			return res, nil, fmt.Errorf("%w (error kind %s%s): %w", ErrSystemic, kind, p.keeps(fmt.Sprintf(", %d entries kept", n)), batchErr)
		}
		if ctx.Err() != nil {
			return res, nil, ctx.Err()
		}
		if n == 1 {
			return p.isolateRefused(ctx, batch)
		}
		refused = append(refused, p.refused(probe[0], err))
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
	return err != nil && ctx.Err() == nil && p.dialect.ErrorKind(err) == kind
}

// writeNothing is the witness of probeBatch: a write to the users table
// that touches no row,
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
	col := clause.Column{Name: t.Column}
	return p.db.WithContext(ctx).Exec("UPDATE ? SET ? = ? WHERE 1 = 0", clause.Table{Name: t.Table}, col, col).Error
}

// schemaMayBeGone reports an error after which the table is checked again:
// a missing table or column, or any refusal of every write (ErrSystemic),
// of which a table dropped while the app runs is one.
func schemaMayBeGone(err error) bool {
	return errors.Is(err, ErrSystemic) || errors.Is(err, errNoTable)
}

// exhaustedError is the ErrSystemic of a write refused because the server
// ran out of a resource (Dialect.Exhausted): n entries stay in Redis.
func (p *Plugin) exhaustedError(kind string, n int, err error) error {
	return fmt.Errorf("%w (error kind %s: the server is out of a resource%s): %w", ErrSystemic, kind, p.keeps(fmt.Sprintf("; %d entries kept", n)), err)
}

// pickProbe splits a refused batch into the element that is written (or
// deleted) alone, the probe, and the rest: the flush's probeBatch and the
// purge's isolate both probe this way. The probe's position rotates from
// one call to the next; calls counts the calls. probe is a one-element
// subslice of batch, rest the other elements in their order in a new slice
// (empty for a batch of one). batch must not be empty.
func pickProbe[T any](calls *atomic.Uint64, batch []T) (probe, rest []T) {
	i := int(calls.Add(1) % uint64(len(batch)))
	rest = make([]T, 0, len(batch)-1)
	rest = append(append(rest, batch[:i]...), batch[i+1:]...)
	return batch[i : i+1], rest
}

// A comparison that cannot be made is never "stale". Where a column may hold
// values the forward-only guard cannot compare (Dialect.Uncomparable:
// SQLite, where an INTEGER column can hold text and a DATETIME column an
// integer), the guard's key is NULL for them, so the row is neither written
// nor older. After a batch that left rows unwritten, the flush asks for
// those rows of the batch ("column IS NOT NULL AND key(column) IS NULL"):
// their entries are not Stale but Uncomparable, go back to pending like a
// refused entry, and the flush returns ErrUncomparable naming the column,
// the encoding and the first id. Initialize refuses a declared column type
// that does not fit the field (checkColumnTypes); this catches the values.

// findUncomparable returns the batch's ids (as their canonical text, the
// entries' fields) whose row holds a value the guard cannot compare; nil
// when the dialect's columns cannot hold one.
func (p *Plugin) findUncomparable(db *gorm.DB, t *dialect.Target, ids []any) ([]string, error) {
	q := p.dialect.Uncomparable(db, t, ids)
	if q == nil {
		return nil, nil
	}
	codec := p.users.ids
	rows, err := queryRows(q)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		id := reflect.New(codec.Type)
		if err := rows.Scan(id.Interface()); err != nil {
			return nil, err
		}
		if uid, err := codec.Normalize(id.Elem().Interface()); err == nil {
			out = append(out, uid)
		}
	}
	return out, rows.Err()
}

// uncomparableError is the error of one entry whose row's value cannot be
// compared.
func (p *Plugin) uncomparableError(field string) error {
	m := p.users.model
	what := "an integer"
	if !m.enc.Integer() {
		what = "a timestamp SQLite's julianday reads"
	}
	return fmt.Errorf("%w: %s.%s of id %s is not %s (Field encoding %v); the entry stays pending",
		ErrUncomparable, m.table, m.time.DBName, clip.Text(field), what, m.enc.Encoding())
}

// takeUncomparable moves the entries of batch whose fields are in
// uncomparable out of the written ones, as refusals with their error.
func (p *Plugin) takeUncomparable(batch []entry, uncomparable []string) []refusal {
	if len(uncomparable) == 0 {
		return nil
	}
	set := make(map[string]struct{}, len(uncomparable))
	for _, f := range uncomparable {
		set[f] = struct{}{}
	}
	var out []refusal
	for _, e := range batch {
		if _, ok := set[e.field]; ok {
			out = append(out, refusal{e, p.uncomparableError(e.field)})
		}
	}
	return out
}
