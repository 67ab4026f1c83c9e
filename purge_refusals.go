package lastseen

import (
	"context"
	"errors"
	"fmt"
	"reflect"

	"gorm.io/gorm"
)

// purgeParts deletes the parts of one purge batch that fail together. It
// is the purge's counterpart of probeBatch and isolateRefused.
type purgeParts struct {
	p   *Plugin
	db  *gorm.DB
	res *PurgeResult
}

// isolate handles a batch whose delete failed with batchErr. An error
// without a kind (the connection's), a timeout or a lasting deadlock stops
// the run as before. Otherwise one session of the batch is deleted alone
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
	if kind == "" || errors.Is(batchErr, errBatchTimeout) || p.dialect.Retryable(batchErr) {
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
		if werr := pp.deleteNothing(ctx); p.sameKind(ctx, werr, kind) {
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

// delete is deleteBatch, counting its retries and its commit.
func (pp *purgeParts) delete(ctx context.Context, ids []any) (int, error) {
	n, retries, err := pp.p.deleteBatch(ctx, pp.db, pp.p.purgeCondition(ctx, pp.db, ids, pp.res.Cutoff))
	pp.res.Retries += retries
	if err == nil {
		pp.res.Batches++
	}
	return n, err
}

// refuse records one session the database refused to delete on its own, or
// returns err when it is not such a refusal (no kind, a timeout, ctx ended).
func (pp *purgeParts) refuse(ctx context.Context, id any, err error) error {
	p := pp.p
	if context.Cause(ctx) != nil || p.dialect.ErrorKind(err) == "" || errors.Is(err, errBatchTimeout) {
		return err
	}
	pp.res.Refused++
	if pp.res.FirstRefusal == nil {
		pp.res.FirstRefusal = fmt.Errorf("lastseen: session %v: %w", id, err)
	}
	p.log.Warn("lastseen: purge: the database refused to delete an expired session; skipped", "id", fmt.Sprint(id), "err", err)
	return nil
}

// deleteNothing is the witness of isolate: a delete from the sessions table
// that touches no row ("DELETE FROM sessions WHERE 1 = 0").
func (pp *purgeParts) deleteNothing(ctx context.Context) error {
	m := pp.p.sessions.model
	return fresh(ctx, pp.db).Session(&gorm.Session{SkipHooks: true}).Unscoped().
		Where("1 = 0").Delete(reflect.New(m.typ).Interface()).Error
}
