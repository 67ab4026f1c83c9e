package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime/pprof"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/internal/keys"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// flushResult is the flush-at-scale result: the library's Flush of Users
// pending users into a table of Users rows, against the database's own
// limit measured in the same run.
type flushResult struct {
	Users          int                  `json:"users"`
	Shards         int                  `json:"shards"`
	BatchSize      int                  `json:"batch_size"`
	FillWall       time.Duration        `json:"redis_fill_ns"`
	Raw            flushSide            `json:"raw"`       // before the library's flush
	RawAfter       flushSide            `json:"raw_after"` // after it, on a third table
	RawRowsPerSec  float64              `json:"raw_limit_rows_per_sec"`
	Lib            flushSide            `json:"lastseen"`
	Ratio          float64              `json:"lastseen_vs_raw"`
	Redis          redisTime            `json:"lastseen_redis"`
	Heap           heapResult           `json:"lastseen_heap"`
	Result         lastseen.FlushResult `json:"lastseen_flush_result"`
	CheckpointNote string               `json:"checkpoint_error,omitempty"`
	Check          string               `json:"check"`
}

// flushSide is one way of writing the timestamps.
type flushSide struct {
	Table      string        `json:"table"`
	Wall       time.Duration `json:"wall_ns"`
	Rows       int64         `json:"rows"`
	RowsPerSec float64       `json:"rows_per_sec"`
	SQL        sqlStats      `json:"sql"`
}

// flushTime is user id's pending timestamp: within 5 minutes after
// base, spread by a hash of seed and id, so that it can be recomputed
// instead of kept in memory.
func flushTime(base time.Time, seed, id uint64) time.Time {
	x := seed ^ id*0x9e3779b97f4a7c15 // splitmix64
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	x ^= x >> 31
	return base.Add(time.Duration(x%300_000_000) * time.Microsecond)
}

func (e *env) runFlush(ctx context.Context) (*flushResult, error) {
	c := e.cmd
	n := c.FlushUsers
	res := &flushResult{Users: n, Shards: lastseen.DefaultShards, BatchSize: lastseen.DefaultBatchSize}
	now := time.Now().UTC().Truncate(time.Microsecond)
	base := now.Add(-10 * time.Minute)
	c.progress("flush: creating three tables of %d users", n)
	var libDB *gorm.DB
	for _, t := range []struct {
		prefix string
		db     **gorm.DB
		table  *string
	}{{"flushraw_", nil, &res.Raw.Table}, {"flushlib_", &libDB, &res.Lib.Table}, {"flushrawafter_", nil, &res.RawAfter.Table}} {
		db, pool, err := e.openPool(ctx, t.prefix, 2)
		if err != nil {
			return nil, err
		}
		if *t.table, err = e.createUsers(ctx, db, n, base.Add(-24*time.Hour)); err != nil {
			return nil, err
		}
		if t.db != nil {
			*t.db = db
		} else {
			pool.Close()
		}
	}

	// The database's limit: the same kind of batches (the library's shards,
	// BatchSize users each, in an order as random as HSCAN's) sent as raw
	// bulk UPDATEs over one pgx connection, no Redis; once before and once
	// after the library's flush, on tables of their own, so that a drift of
	// the shared machine's load or of the database's caches during the run
	// does not favour either side.
	batches := flushBatches(n, res.Shards, res.BatchSize, c.Seed)
	res.CheckpointNote = e.checkpoint(ctx)
	c.progress("flush: raw UPDATE of %d rows in %d batches", n, len(batches))
	if err := e.rawUpdates(ctx, &res.Raw, batches, base, c.Seed); err != nil {
		return nil, err
	}

	prefix := e.prefix + "-flush"
	c.progress("flush: filling %d pending entries into Redis (HSET pipelines)", n)
	f0 := time.Now()
	if err := e.fillPending(ctx, prefix, n, res.Shards, base, c.Seed); err != nil {
		return nil, err
	}
	res.FillWall = time.Since(f0)
	p := lastseen.New(lastseen.Config{Redis: e.timed, Prefix: prefix, DisableScheduler: true, Logger: e.pluginLogger(), FlushConcurrency: c.FlushConcurrency})
	if err := libDB.Use(p); err != nil {
		return nil, fmt.Errorf("lastseen: bench: db.Use: %w", err)
	}
	defer p.Close(context.WithoutCancel(ctx))
	if err := checkPending(ctx, p, n, base, c.Seed); err != nil {
		return nil, err
	}
	if note := e.checkpoint(ctx); note != "" {
		res.CheckpointNote = note
	}

	c.progress("flush: lastseen Flush of %d pending users", n)
	stopProfile, err := startProfile(c.CPUProfile)
	if err != nil {
		return nil, err
	}
	heap := startHeap(time.Millisecond)
	e.tracer.start()
	e.timer.start()
	t0 := time.Now()
	res.Result, err = p.Flush(ctx)
	res.Lib.Wall = time.Since(t0)
	res.Redis = e.timer.stop()
	res.Lib.SQL = e.tracer.stop()
	res.Heap = heap.Stop()
	stopProfile()
	if err != nil {
		return nil, fmt.Errorf("lastseen: bench: flush: %w", err)
	}
	res.Lib.Rows = int64(res.Result.Written)
	res.Lib.RowsPerSec = float64(res.Lib.Rows) / res.Lib.Wall.Seconds()

	if note := e.checkpoint(ctx); note != "" {
		res.CheckpointNote = note
	}
	c.progress("flush: raw UPDATE again, on a third table")
	if err := e.rawUpdates(ctx, &res.RawAfter, batches, base, c.Seed); err != nil {
		return nil, err
	}
	res.RawRowsPerSec = (res.Raw.RowsPerSec + res.RawAfter.RowsPerSec) / 2
	res.Ratio = res.Lib.RowsPerSec / res.RawRowsPerSec
	if res.Check, err = e.checkFlush(ctx, libDB, p, res, base); err != nil {
		return nil, err
	}
	c.progress("flush: raw %.0f and %.0f rows/s, lastseen %.0f rows/s (%.2f), heap +%s, check %s",
		res.Raw.RowsPerSec, res.RawAfter.RowsPerSec, res.Lib.RowsPerSec, res.Ratio, fmtBytes(res.Heap.PeakHeapGrowth), res.Check)
	return res, nil
}

// flushBatches groups ids 1..n by the library's shard, shuffles each
// shard (HSCAN returns a hash in no useful order) and cuts it into batches.
func flushBatches(n, shards, size int, seed uint64) [][]int64 {
	byShard := make([][]int64, shards)
	for id := 1; id <= n; id++ {
		s := keys.ShardOf(strconv.Itoa(id), shards)
		byShard[s] = append(byShard[s], int64(id))
	}
	r := rand.New(rand.NewPCG(seed, 0xf1a5_4f1a_5411))
	var batches [][]int64
	for _, ids := range byShard {
		r.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
		for len(ids) > 0 {
			k := min(size, len(ids))
			batches = append(batches, ids[:k])
			ids = ids[k:]
		}
	}
	return batches
}

// rawUpdates sends the batches as the statement shape the library's
// PostgreSQL dialect uses (UPDATE ... FROM unnest(ids, times) with the
// newer-only guard), typed arrays bound directly, on one pgx connection.
func (e *env) rawUpdates(ctx context.Context, side *flushSide, batches [][]int64, base time.Time, seed uint64) error {
	conn, err := pgx.ConnectConfig(ctx, e.pg.Copy())
	if err != nil {
		return fmt.Errorf("lastseen: bench: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	t := pgx.Identifier{side.Table}.Sanitize()
	sql := "UPDATE " + t + ` AS t SET "last_seen_at" = v.ts FROM unnest($1::bigint[], $2::timestamptz[]) AS v(id, ts)` +
		` WHERE t."id" = v.id AND (t."last_seen_at" IS NULL OR t."last_seen_at" < v.ts)`
	// Arguments are built before the clock starts.
	times := make([][]time.Time, len(batches))
	for i, b := range batches {
		times[i] = make([]time.Time, len(b))
		for j, id := range b {
			times[i][j] = flushTime(base, seed, uint64(id))
		}
	}
	if _, err := conn.Prepare(ctx, sql, sql); err != nil { // named by its text: the tracer sees the SQL
		return fmt.Errorf("lastseen: bench: prepare: %w", err)
	}
	side.Rows = 0
	e.tracer.start()
	t0 := time.Now()
	for i, b := range batches {
		tag, err := conn.Exec(ctx, sql, b, times[i])
		if err != nil {
			e.tracer.stop()
			return fmt.Errorf("lastseen: bench: raw update: %w", err)
		}
		side.Rows += tag.RowsAffected()
	}
	side.Wall = time.Since(t0)
	side.SQL = e.tracer.stop()
	side.RowsPerSec = float64(side.Rows) / side.Wall.Seconds()
	return nil
}

// fillPending writes ids 1..n straight into the library's pending hashes,
// as Touch would have left them (field: id in decimal, value: Unix
// microseconds), with HSET of 1,000 pairs, 50 per pipeline.
func (e *env) fillPending(ctx context.Context, prefix string, n, shards int, base time.Time, seed uint64) error {
	pairs := make([][]any, shards)
	pipe := e.plain.Pipeline()
	send := func(force bool) error {
		if pipe.Len() >= 50 || (force && pipe.Len() > 0) {
			if _, err := pipe.Exec(ctx); err != nil {
				return fmt.Errorf("lastseen: bench: fill pending: %w", err)
			}
		}
		return nil
	}
	key := func(s int) string { return keys.ForShard(prefix, s).Pending }
	for id := 1; id <= n; id++ {
		uid := strconv.Itoa(id)
		s := keys.ShardOf(uid, shards)
		pairs[s] = append(pairs[s], uid, flushTime(base, seed, uint64(id)).UnixMicro())
		if len(pairs[s]) == 2000 {
			pipe.HSet(ctx, key(s), pairs[s]...)
			pairs[s] = nil
			if err := send(false); err != nil {
				return err
			}
		}
	}
	for s, p := range pairs {
		if len(p) > 0 {
			pipe.HSet(ctx, key(s), p...)
		}
	}
	if err := send(true); err != nil {
		return err
	}
	var total int64
	for s := range shards {
		l, err := e.plain.HLen(ctx, key(s)).Result()
		if err != nil {
			return fmt.Errorf("lastseen: bench: HLEN: %w", err)
		}
		total += l
	}
	if total != int64(n) {
		return fmt.Errorf("lastseen: bench: filled %d pending entries, want %d", total, n)
	}
	return nil
}

// checkPending asks the library, through Pending, for a sample of the
// filled users: it finds them only if the fill used its key layout.
func checkPending(ctx context.Context, p *lastseen.Plugin, n int, base time.Time, seed uint64) error {
	step := max(1, n/100)
	for id := 1; id <= n; id += step {
		at, ok, err := p.Pending(ctx, uint64(id))
		if err != nil {
			return fmt.Errorf("lastseen: bench: pending(%d): %w", id, err)
		}
		if want := flushTime(base, seed, uint64(id)); !ok || !at.Equal(want) {
			return fmt.Errorf("lastseen: bench: pending(%d) = %v, %v; want %v: the fill does not match the library's keys", id, at, ok, want)
		}
	}
	return nil
}

// checkFlush compares the two tables row by row and looks for leftovers.
func (e *env) checkFlush(ctx context.Context, db *gorm.DB, p *lastseen.Plugin, res *flushResult, base time.Time) (string, error) {
	var problems []string
	if res.Raw.Rows != int64(res.Users) || res.RawAfter.Rows != int64(res.Users) {
		problems = append(problems, fmt.Sprintf("raw updated %d and %d rows, want %d", res.Raw.Rows, res.RawAfter.Rows, res.Users))
	}
	if res.Result.Written != res.Users || res.Result.Drained != res.Users {
		problems = append(problems, fmt.Sprintf("flush drained %d and wrote %d, want %d", res.Result.Drained, res.Result.Written, res.Users))
	}
	var differ, fresh int64
	err := db.WithContext(ctx).Raw("SELECT count(*) FROM ? AS l JOIN ? AS r ON l.? = r.? WHERE l.? IS DISTINCT FROM r.?",
		clause.Table{Name: res.Lib.Table}, clause.Table{Name: res.Raw.Table}, clause.Column{Name: "id"}, clause.Column{Name: "id"},
		clause.Column{Name: "last_seen_at"}, clause.Column{Name: "last_seen_at"}).Scan(&differ).Error
	if err != nil {
		return "", fmt.Errorf("lastseen: bench: compare tables: %w", err)
	}
	if differ != 0 {
		problems = append(problems, fmt.Sprintf("%d rows differ from the raw table", differ))
	}
	err = db.WithContext(ctx).Table(res.Lib.Table).Where(clause.Gte{Column: clause.Column{Name: "last_seen_at"}, Value: base}).Count(&fresh).Error
	if err != nil {
		return "", fmt.Errorf("lastseen: bench: count: %w", err)
	}
	if fresh != int64(res.Users) {
		problems = append(problems, fmt.Sprintf("%d rows carry a flushed time, want %d", fresh, res.Users))
	}
	st, err := p.Status(ctx)
	if err != nil {
		return "", fmt.Errorf("lastseen: bench: status: %w", err)
	}
	if st.Pending+st.InFlight != 0 {
		problems = append(problems, fmt.Sprintf("%d pending and %d in-flight entries left in Redis", st.Pending, st.InFlight))
	}
	if len(problems) == 0 {
		return "ok", nil
	}
	return fmt.Sprint(problems), nil
}

// startProfile starts a CPU profile into path ("" for none) and
// returns the function that stops it.
func startProfile(path string) (func(), error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("lastseen: bench: --cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("lastseen: bench: --cpuprofile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}
