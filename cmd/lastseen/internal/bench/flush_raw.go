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
	seed := e.cmd.Seed
	n := e.cmd.FlushConcurrency
	t := pgx.Identifier{side.Table}.Sanitize()
	guard := ` WHERE t."id" = v.id AND (t."last_seen_at" IS NULL OR t."last_seen_at" < v.ts)`
	unnest := "UPDATE " + t + ` AS t SET "last_seen_at" = v.ts FROM unnest($1::bigint[], $2::timestamptz[]) AS v(id, ts)` + guard
	fromTemp := "UPDATE " + t + ` AS t SET "last_seen_at" = v.ts FROM lastseen_bench_v AS v` + guard

	// Arguments are built and connections opened before the clock starts.
	type batch struct {
		ids   []int64
		times []time.Time
	}
	work := make([][]batch, len(shards))
	for s, bs := range shards {
		for _, b := range bs {
			ids := slices.Clone(b)
			slices.Sort(ids)
			times := make([]time.Time, len(ids))
			for j, id := range ids {
				times[j] = flushTime(base, seed, uint64(id))
			}
			work[s] = append(work[s], batch{ids, times})
		}
	}
	conns := make([]*pgx.Conn, n)
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Close(context.WithoutCancel(ctx))
			}
		}
	}()
	for i := range conns {
		c, err := pgx.ConnectConfig(ctx, e.pg.Copy())
		if err != nil {
			return fmt.Errorf("lastseen: bench: connect: %w", err)
		}
		conns[i] = c
		if _, err := c.Prepare(ctx, unnest, unnest); err != nil { // named by its text: the tracer sees the SQL
			return fmt.Errorf("lastseen: bench: prepare: %w", err)
		}
		if _, err := c.Exec(ctx, "CREATE TEMP TABLE lastseen_bench_v (id bigint, ts timestamptz) ON COMMIT DELETE ROWS"); err != nil {
			return fmt.Errorf("lastseen: bench: temp table: %w", err)
		}
	}
	write := func(c *pgx.Conn, b batch) (int64, error) {
		if method == "unnest" {
			tag, err := c.Exec(ctx, unnest, b.ids, b.times)
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
		tag, err := tx.Exec(ctx, fromTemp)
		if err != nil {
			return 0, err
		}
		return tag.RowsAffected(), tx.Commit(ctx)
	}

	before, err := e.tableStats(ctx, side.Table)
	if err != nil {
		return err
	}
	next := make(chan []batch, len(work))
	for _, w := range work {
		next <- w
	}
	close(next)
	var mu sync.Mutex
	var firstErr error
	side.Rows = 0
	var wg sync.WaitGroup
	e.tracer.start()
	t0 := time.Now()
	for _, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for shard := range next {
				for _, b := range shard {
					rows, err := write(c, b)
					mu.Lock()
					side.Rows += rows
					if err != nil && firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					if err != nil {
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	side.Wall = time.Since(t0)
	side.SQL = e.tracer.stop()
	if firstErr != nil {
		return fmt.Errorf("lastseen: bench: raw %s: %w", method, firstErr)
	}
	side.RowsPerSec = float64(side.Rows) / side.Wall.Seconds()
	for _, c := range conns {
		if _, err := c.Exec(ctx, "SELECT pg_stat_force_next_flush()"); err != nil {
			return fmt.Errorf("lastseen: bench: pg_stat_force_next_flush: %w", err)
		}
	}
	return e.countUpdates(ctx, side, before)
}
