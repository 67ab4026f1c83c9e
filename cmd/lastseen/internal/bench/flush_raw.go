package bench

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// rawFlush is the database's limit for one flush: the same batches as the
// library's (its shards, BatchSize users each), each batch sorted by id,
// written by FlushConcurrency connections that take one shard at a time as
// the library's flush does, with no Redis. method is
//
//   - "unnest": one prepared statement per batch with two typed arrays, the
//     statement shape of the PostgreSQL dialect:
//     UPDATE t SET last_seen_at = v.ts FROM unnest($1::bigint[], $2::timestamptz[]) AS v(id, ts)
//     WHERE t.id = v.id AND (t.last_seen_at IS NULL OR t.last_seen_at < v.ts)
//   - "copy": per batch, in one transaction, COPY into a temporary table
//     (ON COMMIT DELETE ROWS) and one UPDATE ... FROM it with the same guard.
//
// The counters of pg_stat_user_tables give the updates and HOT updates.
func (e *env) rawFlush(ctx context.Context, method string, side *flushSide, shards [][][]int64, base time.Time) error {
	// Arguments are built and connections opened before the clock starts.
	work := rawBatches(shards, base, e.cmd.Seed)
	w := newRawWriter(method, side.Table)
	defer w.close(context.WithoutCancel(ctx))
	if err := w.connect(ctx, e.pg, e.cmd.FlushConcurrency); err != nil {
		return err
	}
	before, err := e.tableStats(ctx, side.Table)
	if err != nil {
		return err
	}
	cpu := &cpuMeter{backends: w.pids()}
	cpu.start(ctx)
	e.tracer.start()
	t0 := time.Now()
	side.Rows, err = w.run(ctx, work)
	side.Wall = time.Since(t0)
	side.CPU = cpu.stop(ctx)
	side.SQL = e.tracer.stop()
	if err != nil {
		return fmt.Errorf("lastseen: bench: raw %s: %w", method, err)
	}
	side.RowsPerSec = float64(side.Rows) / side.Wall.Seconds()
	for _, c := range w.conns {
		if _, err := c.Exec(ctx, "SELECT pg_stat_force_next_flush()"); err != nil {
			return fmt.Errorf("lastseen: bench: pg_stat_force_next_flush: %w", err)
		}
	}
	return e.countUpdates(ctx, side, before)
}

// rawBatch is one batch of the raw write: ids sorted, each with its
// timestamp.
type rawBatch struct {
	ids   []int64
	times []time.Time
}

// rawBatches builds the raw write's arguments: per shard, its batches with
// ids sorted and their flushTime timestamps.
func rawBatches(shards [][][]int64, base time.Time, seed uint64) [][]rawBatch {
	work := make([][]rawBatch, len(shards))
	for s, bs := range shards {
		for _, b := range bs {
			ids := slices.Clone(b)
			slices.Sort(ids)
			times := make([]time.Time, len(ids))
			for j, id := range ids {
				times[j] = flushTime(base, seed, uint64(id))
			}
			work[s] = append(work[s], rawBatch{ids, times})
		}
	}
	return work
}

// rawWriter writes batches into one table by hand, on connections of its
// own: with one UPDATE … FROM unnest($1, $2) (method "unnest"), or with
// COPY into a temporary table and one UPDATE … FROM it (method "copy").
// Either keeps the newer timestamp only, as the library does.
type rawWriter struct {
	method   string
	unnest   string // the unnest UPDATE, prepared under its own text
	fromTemp string // the UPDATE from the temporary table
	conns    []*pgx.Conn
}

func newRawWriter(method, table string) *rawWriter {
	t := pgx.Identifier{table}.Sanitize()
	guard := ` WHERE t."id" = v.id AND (t."last_seen_at" IS NULL OR t."last_seen_at" < v.ts)`
	return &rawWriter{
		method:   method,
		unnest:   "UPDATE " + t + ` AS t SET "last_seen_at" = v.ts FROM unnest($1::bigint[], $2::timestamptz[]) AS v(id, ts)` + guard,
		fromTemp: "UPDATE " + t + ` AS t SET "last_seen_at" = v.ts FROM lastseen_bench_v AS v` + guard,
	}
}

// connect opens n connections, each with the unnest statement prepared
// and the temporary table created.
func (w *rawWriter) connect(ctx context.Context, cfg *pgx.ConnConfig, n int) error {
	for range n {
		c, err := pgx.ConnectConfig(ctx, cfg.Copy())
		if err != nil {
			return fmt.Errorf("lastseen: bench: connect: %w", err)
		}
		w.conns = append(w.conns, c)
		if _, err := c.Prepare(ctx, w.unnest, w.unnest); err != nil { // named by its text: the tracer sees the SQL
			return fmt.Errorf("lastseen: bench: prepare: %w", err)
		}
		if _, err := c.Exec(ctx, "CREATE TEMP TABLE lastseen_bench_v (id bigint, ts timestamptz) ON COMMIT DELETE ROWS"); err != nil {
			return fmt.Errorf("lastseen: bench: temp table: %w", err)
		}
	}
	return nil
}

// pids are the process ids of the connections' backends.
func (w *rawWriter) pids() []int {
	out := make([]int, len(w.conns))
	for i, c := range w.conns {
		out[i] = int(c.PgConn().PID())
	}
	return out
}

func (w *rawWriter) close(ctx context.Context) {
	for _, c := range w.conns {
		c.Close(ctx)
	}
}

// run writes every shard's batches, one shard at a time per connection,
// and returns the rows updated; a connection stops at its first error,
// and the first error is returned.
func (w *rawWriter) run(ctx context.Context, work [][]rawBatch) (int64, error) {
	next := make(chan []rawBatch, len(work))
	for _, s := range work {
		next <- s
	}
	close(next)
	var mu sync.Mutex
	var total int64
	var firstErr error
	var wg sync.WaitGroup
	for _, c := range w.conns {
		wg.Go(func() {
			for shard := range next {
				for _, b := range shard {
					rows, err := w.write(ctx, c, b)
					mu.Lock()
					total += rows
					if err != nil && firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					if err != nil {
						return
					}
				}
			}
		})
	}
	wg.Wait()
	return total, firstErr
}

// write writes one batch on c and returns the rows it updated.
func (w *rawWriter) write(ctx context.Context, c *pgx.Conn, b rawBatch) (int64, error) {
	if w.method == "unnest" {
		tag, err := c.Exec(ctx, w.unnest, b.ids, b.times)
		return tag.RowsAffected(), err
	}
	tx, err := c.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	rows := make([][]any, len(b.ids))
	for i := range b.ids {
		rows[i] = []any{b.ids[i], b.times[i]}
	}
	if _, err := tx.CopyFrom(ctx, pgx.Identifier{"lastseen_bench_v"}, []string{"id", "ts"}, pgx.CopyFromRows(rows)); err != nil {
		return 0, err
	}
	tag, err := tx.Exec(ctx, w.fromTemp)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), tx.Commit(ctx)
}
