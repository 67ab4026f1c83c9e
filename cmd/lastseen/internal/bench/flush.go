package bench

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime/pprof"
	"strconv"
	"time"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/internal/keys"
	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// flushResult is the flush-at-scale result: for each size and table
// schema, the library's Flush of Users pending users into a table of Users
// rows, against the database's own limit measured in the same run with the
// same number of connections.
type flushResult struct {
	Shards      int        `json:"shards"`
	BatchSize   int        `json:"batch_size"`
	Concurrency int        `json:"flush_concurrency"` // the library's, and the raw runs' connections
	Runs        []flushRun `json:"runs"`
}

// flushRun is one size and one schema.
type flushRun struct {
	Users          int                  `json:"users"`
	Schema         string               `json:"schema"` // plain, indexed or fillfactor90 (schemas)
	FillWall       time.Duration        `json:"redis_fill_ns"`
	RawUnnest      flushSide            `json:"raw_unnest"` // before the library's flush
	RawCopy        flushSide            `json:"raw_copy"`   // before it too
	RawMethod      string               `json:"raw_method"` // the faster of the two, run again after
	RawAfter       flushSide            `json:"raw_after"`
	RawRowsPerSec  float64              `json:"raw_limit_rows_per_sec"` // mean of the faster method before and after
	Lib            flushSide            `json:"lastseen"`
	Ratio          float64              `json:"lastseen_vs_raw"`
	Redis          redisTime            `json:"lastseen_redis"`
	Heap           heapResult           `json:"lastseen_heap"`
	BytesPerUser   float64              `json:"lastseen_heap_bytes_per_user"`
	Result         lastseen.FlushResult `json:"lastseen_flush_result"`
	CheckpointNote string               `json:"checkpoint_error,omitempty"`
	Check          string               `json:"check"`
}

// flushSide is one way of writing the timestamps into a table of its own.
type flushSide struct {
	Table      string        `json:"table"`
	CPU        cpuUse        `json:"cpu"`
	Wall       time.Duration `json:"wall_ns"`
	Rows       int64         `json:"rows"`
	RowsPerSec float64       `json:"rows_per_sec"`
	SQL        sqlStats      `json:"sql"`
	Updates    int64         `json:"updates"`     // pg_stat_user_tables n_tup_upd
	HotUpdates int64         `json:"hot_updates"` // n_tup_hot_upd
}

// hotShare is HotUpdates / Updates, or 0.
func (s flushSide) hotShare() float64 { return ratio(float64(s.HotUpdates), float64(s.Updates)) }

// schemas are the users tables bench flush compares: the default
// lastseen.User (no index on last_seen_at), the same with the index the
// default model had before (every update non-HOT), and without the index
// at fillfactor 90 (room on each page for the new row versions).
var schemas = map[string]tableSchema{
	"plain":        {},
	"indexed":      {index: true},
	"fillfactor90": {fillfactor: 90},
}

// tableSchema is how createUsers shapes a users table.
type tableSchema struct {
	index      bool // CREATE INDEX on last_seen_at
	fillfactor int  // 0: PostgreSQL's default (100)
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
	res := &flushResult{Shards: lastseen.DefaultShards, BatchSize: lastseen.DefaultBatchSize, Concurrency: c.FlushConcurrency}
	for _, n := range c.FlushUsers {
		for _, schema := range c.FlushSchemas {
			run, err := e.flushOnce(ctx, n, schema)
			if err != nil {
				return nil, err
			}
			res.Runs = append(res.Runs, *run)
		}
	}
	return res, nil
}

// flushOnce measures one size and schema: the raw methods (unnest, COPY)
// on tables of their own, the library's flush, then the faster raw method
// again, so that a drift of the shared machine's load or of the database's
// caches during the run does not favour either side.
func (e *env) flushOnce(ctx context.Context, n int, schema string) (*flushRun, error) {
	c := e.cmd
	res := &flushRun{Users: n, Schema: schema}
	now := time.Now().UTC().Truncate(time.Microsecond)
	base := now.Add(-10 * time.Minute)
	libDB, libPool, err := e.createFlushTables(ctx, res, base)
	if err != nil {
		return nil, err
	}
	shards := shardBatches(n, lastseen.DefaultShards, lastseen.DefaultBatchSize, c.Seed)
	res.CheckpointNote = e.checkpoint(ctx)
	if err := e.rawFlushesFirst(ctx, res, shards, base); err != nil {
		return nil, err
	}
	p, err := e.pendingForLibrary(ctx, libDB, res, base)
	if p != nil {
		defer p.Close(context.WithoutCancel(ctx))
	}
	if err != nil {
		return nil, err
	}
	if note := e.checkpoint(ctx); note != "" {
		res.CheckpointNote = note
	}
	c.progress("flush %d %s: lastseen Flush of %d pending users", n, schema, n)
	if err := e.libFlush(ctx, p, libPool, res); err != nil {
		return nil, err
	}
	e.checkpoint(ctx)
	c.progress("flush %d %s: raw %s again, on a fourth table", n, schema, res.RawMethod)
	if err := e.rawFlush(ctx, res.RawMethod, &res.RawAfter, shards, base); err != nil {
		return nil, err
	}
	best := res.RawUnnest
	if res.RawMethod == "copy" {
		best = res.RawCopy
	}
	res.RawRowsPerSec = (best.RowsPerSec + res.RawAfter.RowsPerSec) / 2
	res.Ratio = res.Lib.RowsPerSec / res.RawRowsPerSec
	if res.Check, err = e.checkFlush(ctx, libDB, p, res, base); err != nil {
		return nil, err
	}
	c.progress("flush %d %s: raw %s %.0f and %.0f rows/s (copy %.0f, unnest %.0f), lastseen %.0f rows/s (%.2f), HOT %.0f%%, heap +%s, check %s",
		n, schema, res.RawMethod, best.RowsPerSec, res.RawAfter.RowsPerSec, res.RawCopy.RowsPerSec, res.RawUnnest.RowsPerSec,
		res.Lib.RowsPerSec, res.Ratio, 100*res.Lib.hotShare(), fmtBytes(res.Heap.PeakHeapGrowth), res.Check)
	return res, nil
}

// createFlushTables creates the four users tables of one flush run (raw
// unnest, raw copy, the library's, raw again after it), last seen a day
// before base, and returns the library's handle and pool; the others'
// pools are closed.
func (e *env) createFlushTables(ctx context.Context, res *flushRun, base time.Time) (*gorm.DB, *sql.DB, error) {
	c, n := e.cmd, res.Users
	prefix := fmt.Sprintf("f%d_%s_", n, res.Schema)
	c.progress("flush %d %s: creating four tables of %d users", n, res.Schema, n)
	var libDB *gorm.DB
	var libPool *sql.DB
	for i, t := range []*flushSide{&res.RawUnnest, &res.RawCopy, &res.Lib, &res.RawAfter} {
		db, pool, err := e.openPool(ctx, prefix+strconv.Itoa(i)+"_", c.FlushConcurrency+1)
		if err != nil {
			return nil, nil, err
		}
		if t.Table, err = e.createUsers(ctx, db, n, base.Add(-24*time.Hour), schemas[res.Schema]); err != nil {
			return nil, nil, err
		}
		if t == &res.Lib {
			libDB, libPool = db, pool
		} else {
			pool.Close()
		}
	}
	return libDB, libPool, nil
}

// rawFlushesFirst runs the raw unnest and copy writes, each followed by a
// checkpoint, and picks the faster as the raw method.
func (e *env) rawFlushesFirst(ctx context.Context, res *flushRun, shards [][][]int64, base time.Time) error {
	c := e.cmd
	for _, m := range []struct {
		name string
		side *flushSide
	}{{"unnest", &res.RawUnnest}, {"copy", &res.RawCopy}} {
		c.progress("flush %d %s: raw %s on %d connections", res.Users, res.Schema, m.name, c.FlushConcurrency)
		if err := e.rawFlush(ctx, m.name, m.side, shards, base); err != nil {
			return err
		}
		e.checkpoint(ctx)
	}
	res.RawMethod = "unnest"
	if res.RawCopy.RowsPerSec > res.RawUnnest.RowsPerSec {
		res.RawMethod = "copy"
	}
	return nil
}

// pendingForLibrary fills the buffered entry of every user into Redis,
// registers the library's plugin on db (the caller closes it, also on an
// error once it is returned) and checks that the plugin reads them all.
func (e *env) pendingForLibrary(ctx context.Context, db *gorm.DB, res *flushRun, base time.Time) (*lastseen.Plugin, error) {
	c, n := e.cmd, res.Users
	keyPrefix := fmt.Sprintf("%s-flush%d%s", e.prefix, n, res.Schema)
	c.progress("flush %d %s: filling %d entries into Redis throttle windows (HSET pipelines)", n, res.Schema, n)
	f0 := time.Now()
	if err := e.fillPending(ctx, keyPrefix, n, lastseen.DefaultShards, base, c.Seed); err != nil {
		return nil, err
	}
	res.FillWall = time.Since(f0)
	p := lastseen.New(lastseen.Config{
		Redis:    e.timed,
		Logger:   e.pluginLogger(),
		Buffer:   lastseen.BufferConfig{Prefix: keyPrefix},
		Flush:    lastseen.FlushConfig{Schedule: "off", Concurrency: c.FlushConcurrency},
		Sessions: lastseen.SessionConfig{Disabled: true}, // the flush's tables have no sessions table
	})
	if err := db.Use(p); err != nil {
		return nil, fmt.Errorf("lastseen: bench: db.Use: %w", err)
	}
	return p, checkPending(ctx, p, n, base, c.Seed)
}

// libFlush runs and measures the library's Flush.
func (e *env) libFlush(ctx context.Context, p *lastseen.Plugin, pool *sql.DB, res *flushRun) error {
	stopProfile, err := startProfile(e.cmd.CPUProfile)
	if err != nil {
		return err
	}
	before, err := e.tableStats(ctx, res.Lib.Table)
	if err != nil {
		return err
	}
	pids, err := poolBackends(ctx, pool, e.cmd.FlushConcurrency+1)
	if err != nil {
		return err
	}
	cpu := &cpuMeter{redis: e.rdb, backends: pids}
	cpu.start(ctx)
	heap := startHeap(time.Millisecond)
	e.tracer.start()
	e.timer.start()
	t0 := time.Now()
	res.Result, err = p.Flush(ctx)
	res.Lib.Wall = time.Since(t0)
	res.Redis = e.timer.stop()
	res.Lib.SQL = e.tracer.stop()
	res.Heap = heap.Stop()
	res.Lib.CPU = cpu.stop(ctx)
	stopProfile()
	if err != nil {
		return fmt.Errorf("lastseen: bench: flush: %w", err)
	}
	res.Lib.Rows = int64(res.Result.Written)
	res.Lib.RowsPerSec = float64(res.Lib.Rows) / res.Lib.Wall.Seconds()
	res.BytesPerUser = float64(res.Heap.PeakHeapGrowth) / float64(res.Users)
	if err := e.flushPgStats(ctx, pool); err != nil {
		return err
	}
	return e.countUpdates(ctx, &res.Lib, before)
}

// countUpdates sets the side's updates and HOT updates since before.
func (e *env) countUpdates(ctx context.Context, side *flushSide, before tableCounters) error {
	after, err := e.tableStats(ctx, side.Table)
	if err != nil {
		return err
	}
	side.Updates, side.HotUpdates = after.Updated-before.Updated, after.HotUpdated-before.HotUpdated
	return nil
}

// shardBatches groups ids 1..n by the library's shard, shuffles each
// shard (HSCAN returns a hash in no useful order) and cuts it into
// batches: shard -> batches -> ids.
func shardBatches(n, shards, size int, seed uint64) [][][]int64 {
	byShard := make([][]int64, shards)
	for id := 1; id <= n; id++ {
		s := keys.ShardOf(strconv.Itoa(id), shards)
		byShard[s] = append(byShard[s], int64(id))
	}
	r := rand.New(rand.NewPCG(seed, 0xf1a5_4f1a_5411))
	out := make([][][]int64, shards)
	for s, ids := range byShard {
		r.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
		for len(ids) > 0 {
			k := min(size, len(ids))
			out[s] = append(out[s], ids[:k])
			ids = ids[k:]
		}
	}
	return out
}

// flushBatches is shardBatches flattened.
func flushBatches(n, shards, size int, seed uint64) [][]int64 {
	var out [][]int64
	for _, b := range shardBatches(n, shards, size, seed) {
		out = append(out, b...)
	}
	return out
}

// fillPending writes ids 1..n straight into the library's buffer, as
// Touch leaves them: each id's Unix microseconds in its bucket's hash of
// the throttle window (DefaultThrottle, counted from the Unix epoch) its
// time falls in, and each window registered in its shard's hash of windows
// (internal/keys), with HSET of up to 1,000 pairs, 50 per pipeline. The
// library's flush then moves them to pending, as it does in production.
func (e *env) fillPending(ctx context.Context, prefix string, n, shards int, base time.Time, seed uint64) error {
	pairs := map[string][]any{}
	ends := map[int]map[int64]bool{}
	pipe := e.plain.Pipeline()
	send := func(force bool) error {
		if pipe.Len() >= 50 || (force && pipe.Len() > 0) {
			if _, err := pipe.Exec(ctx); err != nil {
				return fmt.Errorf("lastseen: bench: fill pending: %w", err)
			}
		}
		return nil
	}
	th := lastseen.DefaultThrottle.Milliseconds()
	var windows []string
	for id := 1; id <= n; id++ {
		uid := strconv.Itoa(id)
		s, b := keys.Locate(uid, shards)
		at := flushTime(base, seed, uint64(id))
		end := (at.UnixMilli()/th + 1) * th
		if ends[s] == nil {
			ends[s] = map[int64]bool{}
		}
		ends[s][end] = true
		key := keys.ForShard(prefix, s, shards).Window(b, end)
		if _, ok := pairs[key]; !ok {
			windows = append(windows, key)
		}
		pairs[key] = append(pairs[key], uid, at.UnixMicro())
		if len(pairs[key]) == 2000 {
			pipe.HSet(ctx, key, pairs[key]...)
			pairs[key] = pairs[key][:0]
			if err := send(false); err != nil {
				return err
			}
		}
	}
	for key, p := range pairs {
		if len(p) > 0 {
			pipe.HSet(ctx, key, p...)
		}
		if err := send(false); err != nil {
			return err
		}
	}
	for s, es := range ends {
		for end := range es {
			pipe.HSet(ctx, keys.ForShard(prefix, s, shards).Windows(), strconv.FormatInt(end, 10), 0)
		}
	}
	if err := send(true); err != nil {
		return err
	}
	var lens []*redis.IntCmd
	if _, err := e.plain.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for _, key := range windows {
			lens = append(lens, pipe.HLen(ctx, key))
		}
		return nil
	}); err != nil {
		return fmt.Errorf("lastseen: bench: HLEN: %w", err)
	}
	var total int64
	for _, l := range lens {
		total += l.Val()
	}
	if total != int64(n) {
		return fmt.Errorf("lastseen: bench: filled %d entries, want %d", total, n)
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
func (e *env) checkFlush(ctx context.Context, db *gorm.DB, p *lastseen.Plugin, res *flushRun, base time.Time) (string, error) {
	var problems []string
	if res.RawUnnest.Rows != int64(res.Users) || res.RawCopy.Rows != int64(res.Users) || res.RawAfter.Rows != int64(res.Users) {
		problems = append(problems, fmt.Sprintf("raw updated %d, %d and %d rows, want %d", res.RawUnnest.Rows, res.RawCopy.Rows, res.RawAfter.Rows, res.Users))
	}
	if res.Result.Written != res.Users || res.Result.Drained != res.Users {
		problems = append(problems, fmt.Sprintf("flush drained %d and wrote %d, want %d", res.Result.Drained, res.Result.Written, res.Users))
	}
	var differ, fresh int64
	err := db.WithContext(ctx).Raw("SELECT count(*) FROM ? AS l JOIN ? AS r ON l.? = r.? WHERE l.? IS DISTINCT FROM r.?",
		clause.Table{Name: res.Lib.Table}, clause.Table{Name: res.RawUnnest.Table}, clause.Column{Name: "id"}, clause.Column{Name: "id"},
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
