package lastseen

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/lastseen/lastseen/internal/buffer"
	"github.com/lastseen/lastseen/internal/clip"
)

// entry is one pending timestamp as stored in Redis and as bound for SQL,
// with the bucket the flush read it from (buffer.Held).
type entry struct {
	field, value string
	id           any
	at           time.Time
	bucket       int
}

// shardRun is one flush of one shard under the shard's lock (see Flush): run
// swaps the pending hash to in-flight and drains it, HSCAN page by page,
// writing a batch at a time and acknowledging each batch once committed.
// The acknowledgement of a batch runs in a goroutine while the next batch
// is read and written (ackAsync); at most one is in flight, and it is
// awaited (settle) before the next one starts, before the final one, and
// before the run returns. Its state lives in fields; res is what it did.
type shardRun struct {
	p     *Plugin
	shard int
	lease buffer.ShardLease // the shard's lock and the buffer's operations under it
	res   FlushResult       // what this run did, merged into the flush's result

	// The drain of one in-flight hash (reset by drain).
	now          time.Time           // the clock when the drain started, for buffer.ParseMicros
	batch        []entry             // readable entries not yet written
	seen         map[string]struct{} // fields taken from the current page, and those not acknowledged when it was fetched
	prev         map[string]struct{} // fields taken from the previous page (see nextPage)
	rejected     []buffer.Held       // unreadable fields, acknowledged with the next batch
	acked        []buffer.Held       // the fields of the batch being acknowledged (writeOut), reused once it settled
	inflight     *ackCall            // the acknowledgement in flight, or nil
	batchNo      int                 // batches committed, from 1
	failed       int                 // entries the database refused, back in pending or dropped
	dropped      int                 // of those, dropped after MaxRefusals refusals
	firstRefusal error               // the database's error for the first refused entry
	uncomparable int                 // entries the guard could not compare, back in pending
	firstUncomp  error               // the error of the first of them
}

// flushShard takes shard n's lock, or counts the shard Skipped when another
// instance holds it, and runs the shard's flush while the lease keeps the
// lock alive (ShardLease.Keep: with Redis a refresh every LockTTL/3). When
// the lock is lost meanwhile, the run stops and returns an error wrapping
// buffer.ErrLockLost.
func (p *Plugin) flushShard(ctx context.Context, n int) (FlushResult, error) {
	lease, err := p.tracker.buf.LockShard(ctx, n)
	if errors.Is(err, buffer.ErrNotObtained) {
		return FlushResult{Skipped: 1}, nil
	}
	if err != nil {
		return FlushResult{}, fmt.Errorf("lock: %w", err)
	}
	defer lease.Release(ctx)
	run, stop := lease.Keep(ctx, buffer.ErrLockLost)
	r := &shardRun{p: p, shard: n, lease: lease, res: FlushResult{Shards: 1}}
	err = r.run(run)
	lost := errors.Is(context.Cause(run), buffer.ErrLockLost)
	stop()
	if lost && !errors.Is(err, buffer.ErrLockLost) {
		err = fmt.Errorf("%w: %w", buffer.ErrLockLost, err)
	}
	return r.res, err
}

// run swaps the pending hash to in-flight and drains it; an in-flight hash
// left by an earlier flush is drained first.
func (r *shardRun) run(ctx context.Context) error {
	for {
		moved, err := r.lease.Swap(ctx)
		switch {
		case errors.Is(err, buffer.ErrLeftOver): // an earlier flush left an in-flight hash: finish it first
			if err := r.drain(ctx); err != nil {
				return err
			}
		case err != nil:
			return fmt.Errorf("swap: %w", err)
		case moved == 0:
			return nil
		default:
			r.p.hooks.Swapped(r.shard)
			return r.drain(ctx)
		}
	}
}

// drain streams the in-flight hash with HSCAN in pages of BatchSize (the
// next page fetched while the current one is written), writes it batch by
// batch, then unlinks it. It returns ErrRefused (wrapped) when
// the database refused entries, which went back to pending.
func (r *shardRun) drain(ctx context.Context) error {
	bs := r.p.cfg.BatchSize
	r.now = r.p.now()
	r.batch, r.seen, r.prev, r.rejected = make([]entry, 0, bs), make(map[string]struct{}, bs), make(map[string]struct{}, bs), nil
	r.batchNo, r.failed, r.dropped, r.firstRefusal = 0, 0, 0, nil
	r.uncomparable, r.firstUncomp = 0, nil
	pages := r.prefetch(ctx, 0)
	for pages != nil {
		pg := <-pages
		if pg.err != nil {
			return r.settleAfter(fmt.Errorf("hscan: %w", pg.err))
		}
		pages = nil
		if pg.next != 0 { // fetch the next page while this one is written
			pages = r.prefetch(ctx, pg.next)
		}
		r.nextPage()
		if err := r.take(ctx, pg.kv, pg.buckets); err != nil {
			if pages != nil {
				<-pages // the fetch ends with ctx or its reply; wait for it
			}
			return r.settleAfter(err)
		}
	}
	if err := r.writeOut(ctx); err != nil {
		return r.settleAfter(err)
	}
	if err := r.settle(); err != nil { // the last batch's acknowledgement
		return err
	}
	if len(r.rejected) > 0 { // only rejected entries were left
		r.res.Drained += len(r.rejected)
		r.res.Rejected += len(r.rejected)
	}
	r.p.hooks.Unlinking(r.shard)
	if err := r.ack(ctx, r.rejected, true); err != nil {
		return err
	}
	switch {
	case r.dropped > 0:
		return fmt.Errorf("%w: %d entries, %d dropped after %d refusals%s: %v",
			ErrRefused, r.failed, r.dropped, r.p.cfg.MaxRefusals, r.p.keeps(", the rest back in pending for the next flush"), r.firstRefusal)
	case r.failed > 0:
		return fmt.Errorf("%w: %d entries%s: %v", ErrRefused, r.failed, r.p.keeps(", back in pending for the next flush"), r.firstRefusal)
	}
	if r.uncomparable > 0 {
		return fmt.Errorf("%d entries%s: %w", r.uncomparable, r.p.keeps(", back in pending for the next flush"), r.firstUncomp)
	}
	return nil
}

// hscanPage is one HSCAN reply of the in-flight hash.
type hscanPage struct {
	kv      []string // field, value, field, value, ...
	buckets []int    // the bucket of each field (ShardLease.Scan), or nil
	next    uint64   // the cursor of the next page; 0 after the last
	err     error
}

// prefetch starts the scan of the in-flight set at cursor (HSCAN on Redis,
// ShardLease.Scan), BatchSize entries a page, in a goroutine, so that the round trip overlaps the statement of
// the batch being written. The channel gets the one reply. HSCAN
// guarantees every field present for the whole scan is returned at least
// once, whatever the acknowledgements remove in between (Redis SCAN
// guarantees), as the sequential scan did.
func (r *shardRun) prefetch(ctx context.Context, cursor uint64) <-chan hscanPage {
	ch := make(chan hscanPage, 1)
	go func() {
		kv, buckets, next, err := r.lease.Scan(ctx, cursor, r.p.cfg.BatchSize)
		ch <- hscanPage{kv, buckets, next, err}
	}()
	return ch
}

// nextPage moves the duplicate check to the next page. HSCAN may return a
// field twice, and with the prefetch a page is fetched while the previous
// page's batches are written and acknowledged: a field still in the hash
// when the page was fetched can come back. Those are the fields taken from
// the previous page (prev, batches written or not) and the fields not yet
// acknowledged when the previous page began (the unwritten batch, the
// rejected fields and the acknowledgement then in flight, kept in seen);
// every other field was acknowledged, so removed from the hash, before the
// page's HSCAN ran. Both sets hold at most about three pages.
func (r *shardRun) nextPage() {
	r.prev, r.seen = r.seen, r.prev
	clear(r.seen)
	for _, e := range r.batch {
		r.seen[e.field] = struct{}{}
	}
	for _, f := range r.rejected {
		r.seen[f.Field] = struct{}{}
	}
	if r.inflight != nil {
		for _, f := range r.inflight.fields {
			r.seen[f.Field] = struct{}{}
		}
	}
}

// take adds one HSCAN page (field, value, field, value, ...; buckets: the
// bucket of each field, or nil) to the batch, writing out every batch that
// reaches the working batch size (batchSizer). Unreadable entries are rejected.
func (r *shardRun) take(ctx context.Context, kv []string, buckets []int) error {
	for i := 0; i+1 < len(kv); i += 2 {
		field, value := kv[i], kv[i+1]
		bucket := -1
		if i/2 < len(buckets) {
			bucket = buckets[i/2]
		}
		if value == "" { // a throttle window's mark of an entry moved earlier, never a timestamp
			continue
		}
		if _, dup := r.seen[field]; dup {
			continue
		}
		if _, dup := r.prev[field]; dup {
			continue
		}
		r.seen[field] = struct{}{}
		id, errID := r.p.users.ids.Parse(field)
		at, okTime := buffer.ParseMicros(value, r.now)
		if errID != nil || !okTime {
			r.rejected = append(r.rejected, buffer.Held{Field: field, Bucket: bucket})
			r.p.limited.log(r.p.log, slog.LevelWarn, "lastseen: dropping unreadable pending entry", "shard", r.shard, "field", clip.Text(field), "value", clip.Text(value))
			continue
		}
		r.batch = append(r.batch, entry{field: field, value: value, id: id, at: at, bucket: bucket})
		if len(r.batch) >= r.p.sizer.size() { // Flush.BatchSize, or less after a statement timed out
			if err := r.writeOut(ctx); err != nil {
				return err
			}
		}
	}
	return nil
}

// writeOut writes the batch (while the previous batch's acknowledgement
// may still be in flight), waits for that acknowledgement (settle), moves
// the entries the database refused back to pending, and starts the
// acknowledgement of the batch and the rejected entries (ackAsync): an
// entry leaves the in-flight set only after the statement that wrote it
// committed. The caller settles the last one.
func (r *shardRun) writeOut(ctx context.Context) error {
	if len(r.batch) == 0 {
		return nil
	}
	br, refused, err := r.p.writeBatch(ctx, r.batch)
	r.res.add(br)
	if err != nil {
		return err
	}
	r.batchNo++
	r.p.hooks.Committed(r.shard, r.batchNo)
	if err := r.settle(); err != nil {
		return err
	}
	fields := r.ackable(refused)
	if len(refused) > 0 {
		if err := r.requeue(ctx, refused, max(r.p.cfg.MaxRefusals, 0)); err != nil {
			return err
		}
	}
	// Uncomparable entries go back to pending whatever MaxRefusals; the ack
	// below clears the refusal count fail.lua gave them.
	uncomp := r.p.takeUncomparable(r.batch, br.uncomparable)
	if len(uncomp) > 0 {
		if err := r.requeue(ctx, uncomp, 0); err != nil {
			return err
		}
	}
	r.countSetAside(refused, uncomp)
	r.ackAsync(ctx, fields, len(r.batch)+len(r.rejected), len(r.rejected))
	r.batch, r.rejected = r.batch[:0], r.rejected[:0]
	return nil
}

// settleAfter settles the acknowledgement in flight after the drain failed
// with err, and returns err joined with the acknowledgement's error, if
// any: neither is lost.
func (r *shardRun) settleAfter(err error) error {
	if ackErr := r.settle(); ackErr != nil {
		return errors.Join(err, ackErr)
	}
	return err
}

// ackCall is a batch's acknowledgement in flight (ackAsync): the fields
// it removes, the batch's number, and the counts it adds to the result
// once it succeeded.
type ackCall struct {
	fields            []buffer.Held
	batch             int
	drained, rejected int
	done              chan error
}

// ackAsync starts the acknowledgement of batch number r.batchNo, whose
// statement committed, in a goroutine: the next batch is read and written
// meanwhile. fields must stay untouched until settle returns; drained
// and rejected are the entries it takes out of the buffer and, of those,
// the unreadable ones.
func (r *shardRun) ackAsync(ctx context.Context, fields []buffer.Held, drained, rejected int) {
	c := &ackCall{fields: fields, batch: r.batchNo, drained: drained, rejected: rejected, done: make(chan error, 1)}
	r.inflight = c
	go func() {
		r.p.hooks.Acking(r.shard, c.batch)
		c.done <- r.ack(ctx, c.fields, false)
	}()
}

// settle waits for the acknowledgement in flight, if any, and counts its
// entries Drained (and Rejected) when it succeeded. Its error is returned,
// never dropped: an entry it did not remove stays in flight and is written
// again, forward-only, by the next flush.
func (r *shardRun) settle() error {
	c := r.inflight
	if c == nil {
		return nil
	}
	r.inflight = nil
	if err := <-c.done; err != nil {
		return err
	}
	r.p.hooks.Acked(r.shard, c.batch)
	r.res.Drained += c.drained
	r.res.Rejected += c.rejected
	return nil
}

// ackable returns the fields the batch's ack removes: the batch's but those
// the database refused (fail.lua takes them out of the in-flight hash
// itself, and the ack must not clear the refusal counts it just raised),
// and the rejected ones. It reuses r.acked.
func (r *shardRun) ackable(refused []refusal) []buffer.Held {
	var skip map[string]bool
	if len(refused) > 0 {
		skip = make(map[string]bool, len(refused))
		for _, f := range refused {
			skip[f.field] = true
		}
	}
	fields := r.acked[:0]
	for _, e := range r.batch {
		if !skip[e.field] {
			fields = append(fields, buffer.Held{Field: e.field, Bucket: e.bucket})
		}
	}
	r.acked = append(fields, r.rejected...)
	return r.acked
}

// countSetAside counts the batch's entries that went back to pending: those
// the database refused and those the guard could not compare, keeping the
// first error of each kind for the shard's result.
func (r *shardRun) countSetAside(refused, uncomp []refusal) {
	if len(refused) > 0 {
		r.res.Failed += len(refused)
		r.failed += len(refused)
		if r.firstRefusal == nil {
			r.firstRefusal = refused[0].err
		}
	}
	if len(uncomp) > 0 {
		r.res.Uncomparable += len(uncomp)
		r.uncomparable += len(uncomp)
		if r.firstUncomp == nil {
			r.firstUncomp = uncomp[0].err
			r.p.limited.log(r.p.log, slog.LevelError, "lastseen: column value cannot be compared; the entry goes back to pending", "err", r.firstUncomp)
		}
	}
}

// ack removes fields from the in-flight hash and refreshes the lock; with
// final it also unlinks the in-flight hash (ShardLease.Ack).
func (r *shardRun) ack(ctx context.Context, fields []buffer.Held, final bool) error {
	if err := r.lease.Ack(ctx, fields, final); err != nil {
		return fmt.Errorf("ack: %w", err)
	}
	return nil
}

// requeue moves refused entries back to pending and drops those refused
// limit times (MaxRefusals; 0 never), each with a log line naming it
// (ShardLease.Requeue).
func (r *shardRun) requeue(ctx context.Context, refused []refusal, limit int) error {
	entries := make([]buffer.Refused, len(refused))
	byField := make(map[string]refusal, len(refused))
	for i, f := range refused {
		entries[i] = buffer.Refused{Field: f.field, Value: f.value, Bucket: f.bucket}
		byField[f.field] = f
	}
	dropped, err := r.lease.Requeue(ctx, entries, buffer.Ceiling(r.p.now()), limit)
	if err != nil {
		return fmt.Errorf("requeue: %w", err)
	}
	for _, field := range dropped {
		f := byField[field]
		r.p.log.Error("lastseen: dropping a pending entry the database refused too often", "id", field, "value", f.value,
			"refusals", r.p.cfg.MaxRefusals, "err", f.err)
		r.dropped++
		r.res.Dropped++
	}
	return nil
}
