package lastseen

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/lastseen/lastseen/internal/buffer"
	"golang.org/x/sync/errgroup"
)

// FlushResult counts what one Flush did. Drained = Written + Unknown +
// Stale + Rejected + Failed + Uncomparable + Ambiguous.
type FlushResult struct {
	Drained      int           // entries taken from the buffer
	Written      int           // rows whose last-seen column moved forward (or inserted, Flush.Upsert)
	Unknown      int           // ids without a row, skipped (UPDATE mode)
	Stale        int           // rows whose column was already as new or newer
	Rejected     int           // entries with an unreadable id or timestamp, dropped
	Failed       int           // entries the database refused on their own, kept for the next flush
	Dropped      int           // of Failed, those refused for the 5th time: removed and logged
	Uncomparable int           // entries the column could not be compared with (ErrUncomparable), kept
	Ambiguous    int           // entries in an hour a DST fall-back repeats, left unwritten where the dialect cannot tell the column's wall time's instant (MySQL): logged
	Batches      int           // statements committed
	Shards       int           // shards that had work
	Skipped      int           // shards another instance was flushing
	Evicted      int           // keys Redis evicted since the previous flush (INFO evicted_keys): timestamps may be lost
	Duration     time.Duration // wall time
}

func (r *FlushResult) merge(o FlushResult) {
	r.Dropped += o.Dropped
	r.Drained += o.Drained
	r.Written += o.Written
	r.Unknown += o.Unknown
	r.Stale += o.Stale
	r.Rejected += o.Rejected
	r.Failed += o.Failed
	r.Batches += o.Batches
	r.Shards += o.Shards
	r.Skipped += o.Skipped
	r.Uncomparable += o.Uncomparable
	r.Ambiguous += o.Ambiguous
}

func (r *FlushResult) add(o batchResult) {
	r.Written += o.written
	r.Unknown += o.unknown
	r.Stale += o.stale
	r.Batches += o.batches
	r.Ambiguous += o.ambiguous
}

// Flush writes every buffered timestamp into the table, shard by shard
// under a lock per shard (30s time-to-live; shards another instance holds
// are skipped), Flush.BatchSize rows per statement, only moving the column
// forward; entries leave the buffer once their batch committed. Refused
// entries are isolated and kept (Failed, ErrRefused). It returns the counts
// and the shards' errors joined, each prefixed "lastseen: flush shard N:"
// (ErrNotInitialized, ErrClosed).
func (p *Plugin) Flush(ctx context.Context) (FlushResult, error) {
	_, done, err := p.startRun() // Close waits for this flush before its own
	if err != nil {
		return FlushResult{}, err
	}
	defer done()
	return p.flush(ctx)
}

// flush is Flush without registering as a run: Close calls it after waiting
// for the runs. It replays the Redis buffer's backlog first (Buffer.Replay;
// when Redis does not take it, it is written to the table directly,
// writeBacklog), then flushes the active shards,
// FlushConcurrency at a time.
func (p *Plugin) flush(ctx context.Context) (FlushResult, error) {
	start := time.Now()
	ctx, observed := p.observeFlush(ctx)
	res := FlushResult{}
	if err := p.recheckRedis(ctx); err != nil {
		if errors.Is(err, ErrInvalidConfig) { // a buffer of another layout: write nothing
			p.stats.flushes.Add(1)
			p.stats.flushErrors.Add(1)
			return res, err
		}
		// Redis did not answer whether the buffer is this layout's: this
		// process's own backlog still goes to the table, as in an outage.
		errs := append([]error{err}, p.backlogToTable(ctx, &res)...)
		res.Duration = time.Since(start)
		err = errors.Join(errs...)
		p.countFlush(res, err)
		observed(res, err)
		return res, err
	}
	errs := p.replay(ctx, &res)
	active, err := p.tracker.buf.Active(ctx)
	res.Evicted = int(p.eviction.TakeEvicted()) // Active read evicted_keys
	if err != nil {
		errs = append(errs, fmt.Errorf("lastseen: flush: %w", err))
	} else if err := p.restoreManifest(ctx); err != nil { // Redis lost its data, and another layout claimed the prefix
		errs, active = append(errs, err), nil
	}
	if len(active) > 0 { // a table is needed only with something to write
		if err := p.checkTable(ctx, "flush", p.usersCheck(), &p.schema.usersOK); err != nil {
			errs, active = append(errs, err), nil
		}
	}
	errs = append(errs, p.flushShards(ctx, active, &res)...)
	res.Duration = time.Since(start)
	err = errors.Join(errs...)
	p.countFlush(res, err)
	observed(res, err)
	return res, err
}

// replay moves the buffer's backlog into its shards (Buffer.Replay). When
// Redis does not take it, the backlog is written to the table directly
// (writeBacklog: forward-only, so as safe as through Redis), so that
// presence reaches the database, and survives Close, while Redis is down.
func (p *Plugin) replay(ctx context.Context, res *FlushResult) []error {
	err := p.tracker.buf.Replay(ctx)
	if err == nil {
		return nil
	}
	return append([]error{err}, p.backlogToTable(ctx, res)...)
}

// backlogToTable writes the Redis buffer's backlog to the table directly
// (writeBacklog), while Redis does not answer.
func (p *Plugin) backlogToTable(ctx context.Context, res *FlushResult) []error {
	h, ok := p.tracker.buf.(buffer.Backlog)
	if !ok || ctx.Err() != nil {
		return nil
	}
	r, err := p.writeBacklog(ctx, h)
	res.merge(r)
	if err != nil {
		return []error{err}
	}
	return nil
}

// flushShards flushes the active shards, FlushConcurrency at a time, into
// res, and returns their errors in the order of active (shard order).
// Shards hold disjoint users, so concurrent shard flushes never touch the
// same row and cannot deadlock one another.
func (p *Plugin) flushShards(ctx context.Context, active []int, res *FlushResult) []error {
	var mu sync.Mutex
	byShard := make([]error, len(active))
	var g errgroup.Group
	g.SetLimit(p.cfg.FlushConcurrency)
	for i, n := range active {
		g.Go(func() error {
			sctx, end := p.observeFlushShard(ctx, n)
			r, err := p.flushShard(sctx, n)
			end(r, err)
			mu.Lock()
			defer mu.Unlock()
			res.merge(r)
			if err != nil {
				byShard[i] = fmt.Errorf("lastseen: flush shard %d: %w", n, err)
				if schemaMayBeGone(err) { // the next flush checks the table again
					p.schema.usersOK.Store(false)
				}
			}
			return nil
		})
	}
	_ = g.Wait() // the goroutines report through byShard
	var errs []error
	for _, err := range byShard {
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// countFlush adds a flush run's result to Stats.
func (p *Plugin) countFlush(res FlushResult, err error) {
	p.stats.flushes.Add(1)
	p.stats.drained.Add(int64(res.Drained))
	p.stats.written.Add(int64(res.Written))
	p.stats.unknown.Add(int64(res.Unknown))
	p.stats.stale.Add(int64(res.Stale))
	p.stats.rejected.Add(int64(res.Rejected))
	p.stats.flushSkipped.Add(int64(res.Skipped))
	p.stats.dropped.Add(int64(res.Dropped))
	p.stats.failed.Add(int64(res.Failed))
	p.stats.uncomparable.Add(int64(res.Uncomparable))
	p.stats.ambiguous.Add(int64(res.Ambiguous))
	if err != nil {
		p.stats.flushErrors.Add(1)
	} else {
		p.stats.lastFlush.Store(p.now().UnixNano())
	}
}

// flushJob is the scheduled flush: one structured log line per run, at
// Debug when it found nothing to write.
func (p *Plugin) flushJob(ctx context.Context) {
	res, err := p.flush(ctx)
	p.logFlush("lastseen: flush", res, err)
	// The purge runs hourly by default: its table is checked on the
	// flush's ticks until it is found, so a missing one shows early.
	if !p.cfg.DisablePurge && !p.schema.sessionsOK.Load() && ctx.Err() == nil {
		if err := p.checkTable(ctx, "purge", p.sessionsCheck(), &p.schema.sessionsOK); errors.Is(err, ErrSchema) {
			p.logSchemaError(&p.schema.purgeLog, "lastseen: purge will fail", err)
		}
	}
}

// logFlush writes the one line of a flush run (scheduled, or Close's final
// flush): its counts, at Info, Debug when it found nothing to write, Error
// when it failed (schema problems rate-limited).
func (p *Plugin) logFlush(msg string, res FlushResult, err error) {
	attrs := []any{"drained", res.Drained, "written", res.Written, "unknown", res.Unknown, "stale", res.Stale,
		"rejected", res.Rejected, "failed", res.Failed, "batches", res.Batches, "shards", res.Shards,
		"skipped", res.Skipped, "duration", res.Duration}
	if res.Dropped > 0 {
		attrs = append(attrs, "dropped", res.Dropped)
	}
	if res.Uncomparable > 0 {
		attrs = append(attrs, "uncomparable", res.Uncomparable)
	}
	if res.Ambiguous > 0 {
		attrs = append(attrs, "ambiguous", res.Ambiguous)
	}
	if res.Evicted > 0 {
		attrs = append(attrs, "evicted", res.Evicted)
	}
	switch {
	case errors.Is(err, ErrSchema):
		p.logSchemaError(&p.schema.flushLog, msg+" failed", err, attrs...)
	case err != nil:
		p.log.Error(msg+" failed", append(attrs, "err", err)...)
	case res.Drained == 0:
		p.log.Debug(msg+": nothing pending", attrs...)
	default:
		p.log.Info(msg, attrs...)
	}
}

// retry runs fn, and runs it again while it fails with an error retryable
// accepts (a deadlock or serialization failure: Dialect.Retryable), at most
// max more times (MaxRetries; negative: never), waiting backoff between
// attempts. retryable is asked only when another attempt is allowed, so it
// may log the retry. It returns how many times fn was repeated and fn's last
// error, or ctx's cause when ctx ends during a wait. Flush (writeWithRetry)
// and purge (deleteBatch) use it.
func retry(ctx context.Context, max int, retryable func(error) bool, fn func() error) (retries int, err error) {
	for ; ; retries++ {
		err = fn()
		if err == nil || retries >= max || !retryable(err) {
			return retries, err
		}
		if err := backoff(ctx, retries); err != nil {
			return retries, err
		}
	}
}

// backoff waits before retry attempt+1 of a deadlocked or serialized
// statement: 10ms, 40ms, 160ms, ... It returns ctx's cause if ctx ends first.
func backoff(ctx context.Context, attempt int) error {
	t := time.NewTimer(10 * time.Millisecond << (2 * attempt))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}

// sortBatch orders a batch by primary key before its statement: integer
// keys by value, string and Scanner keys (UUIDs) by their stored text,
// byte by byte. The rows a statement updates then come in index order
// (neighbouring ids share pages: less random I/O), and concurrent writers
// of overlapping batches (several instances, a refused batch written
// again) take the row locks in one order, which cannot deadlock one
// another (PostgreSQL manual, "Deadlocks": acquire locks in a consistent
// order).
func sortBatch(batch []entry) {
	slices.SortFunc(batch, func(a, b entry) int {
		switch x := a.id.(type) {
		case int64:
			if y, ok := b.id.(int64); ok {
				return cmp.Compare(x, y)
			}
		case uint64:
			if y, ok := b.id.(uint64); ok {
				return cmp.Compare(x, y)
			}
		}
		return strings.Compare(a.field, b.field)
	})
}
