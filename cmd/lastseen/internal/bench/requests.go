package bench

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lastseen/lastseen"
	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// stream is the request stream every variant replays: request i is
// from user ids[i] (1..users). boxed holds the same ids as any, boxed once
// up front, as a middleware's userID function hands them to Touch.
type stream struct {
	ids      []uint64
	boxed    []any
	distinct int
	users    int // ids are 1..users
}

// newStream draws n requests from a Zipf(s, v=1) distribution over
// users ranks with a fixed seed (math/rand/v2 PCG), and maps ranks to ids
// through a seeded permutation so that popular users are spread over the
// table instead of sitting on its first page.
func newStream(users, n int, s float64, seed uint64) stream {
	r := rand.New(rand.NewPCG(seed, 0x5eed_1a57_5eed_1a57))
	perm := r.Perm(users)
	z := rand.NewZipf(r, s, 1, uint64(users-1))
	st := stream{ids: make([]uint64, n), boxed: make([]any, n), users: users}
	seen := make([]bool, users+1)
	for i := range n {
		id := uint64(perm[z.Uint64()]) + 1
		st.ids[i], st.boxed[i] = id, id
		if !seen[id] {
			seen[id] = true
			st.distinct++
		}
	}
	return st
}

// design is one way of tracking last-seen: track is the call a request
// makes, flush the final drain into the database (rows written, or 0 for a
// design without one).
type design interface {
	track(ctx context.Context, i int) error
	flush(ctx context.Context) (int64, error)
	close(ctx context.Context)
}

// variant is one row of the request benchmark's table.
type variant struct {
	Name           string        `json:"name"`
	Table          string        `json:"table"`
	Requests       int           `json:"requests"`
	RequestWall    time.Duration `json:"request_wall_ns"`
	RequestsPerSec float64       `json:"requests_per_sec"`
	P50            time.Duration `json:"p50_ns"`
	P99            time.Duration `json:"p99_ns"`
	Max            time.Duration `json:"max_ns"`
	Errors         int64         `json:"errors"`
	FirstError     string        `json:"first_error,omitempty"`

	RedisCommands         int64            `json:"redis_commands"`          // INFO commandstats delta, whole variant
	RedisCommandsRequests int64            `json:"redis_commands_requests"` // same, request phase only
	RedisPerCommand       map[string]int64 `json:"redis_per_command"`
	ClientCommands        int64            `json:"client_commands"`    // sent by this process
	ClientRoundTrips      int64            `json:"client_round_trips"` // a pipeline is one
	RedisPerRequest       float64          `json:"redis_commands_per_request"`
	ClientPerRequest      float64          `json:"client_commands_per_request"`

	RowsWritten    int64  `json:"rows_written"` // pg_stat_user_tables n_tup_ins+upd+del delta
	HotUpdates     int64  `json:"hot_updates"`
	DeadTuples     int64  `json:"dead_tuples"`
	WALBytes       int64  `json:"wal_bytes"` // pg_current_wal_lsn delta (whole server)
	OwnWALBytes    int64  `json:"own_wal_bytes"`
	OwnWALRecords  int64  `json:"own_wal_records"`
	OwnWAL         bool   `json:"own_wal_measured"`
	CheckpointNote string `json:"checkpoint_error,omitempty"`

	FlushWall       time.Duration `json:"flush_wall_ns"`
	FlushRows       int64         `json:"flush_rows"`
	FlushRowsPerSec float64       `json:"flush_rows_per_sec"`

	RowsRatio   float64 `json:"rows_vs_per_request"`
	WALRatio    float64 `json:"wal_vs_per_request"`
	OwnWALRatio float64 `json:"own_wal_vs_per_request"`
	P50Ratio    float64 `json:"p50_vs_per_request"`

	Heap         heapResult      `json:"heap"`                // requests and the final flush
	HeapPerUser  float64         `json:"heap_bytes_per_user"` // peak heap growth / distinct users
	UsersUpdated int64           `json:"users_updated"`
	Check        string          `json:"check"`
	Library      *lastseen.Stats `json:"library_stats,omitempty"`

	// bench replica only (replica.go)
	WALPer10k    float64     `json:"wal_bytes_per_10k_requests,omitempty"`
	Lag          *lagSummary `json:"replica_lag,omitempty"`
	LagSamples   []lagSample `json:"replica_lag_samples,omitempty"`
	LagP99Ratio  float64     `json:"replica_lag_p99_vs_per_request,omitempty"`
	LagMaxRatio  float64     `json:"replica_lag_max_vs_per_request,omitempty"`
	StandbyCheck string      `json:"standby_check,omitempty"`
}

// requestsResult is the request benchmark's result.
type requestsResult struct {
	Users     int           `json:"users"`
	Requests  int           `json:"requests"`
	Distinct  int           `json:"distinct_users"`
	Zipf      float64       `json:"zipf_s"`
	Workers   int           `json:"workers"`
	Seed      uint64        `json:"seed"`
	Throttle  string        `json:"throttle"`
	Timeout   string        `json:"touch_timeout"`
	Variants  []variant     `json:"variants"`
	Touch     *touchResult  `json:"touch_interleaved"` // requests_touch.go
	Generated time.Duration `json:"stream_generation_ns"`
}

// designVariant is one design a request stream runs through: its name, the
// prefix of its table's name, and how it opens on that table.
type designVariant struct {
	name, tablePrefix string
	open              func(db *gorm.DB, table string) (design, error)
}

// designs returns the designs st runs through, in order: an UPDATE per
// request, the seed design (SET NX PX, when seed is set), lastseen without
// and with its local cache. scope ("" or a word such as "replica") starts
// the names of their tables (scope_) and Redis keys (-scope).
func (e *env) designs(st stream, scope string, seed bool) []designVariant {
	table, key := "", ""
	if scope != "" {
		table, key = scope+"_", "-"+scope
	}
	vs := []designVariant{{"per-request", table + "per_request_", func(db *gorm.DB, name string) (design, error) {
		return &perRequest{db: db, table: name, ids: st.ids}, nil
	}}}
	if seed {
		vs = append(vs, designVariant{"seed", table + "seed_", func(db *gorm.DB, _ string) (design, error) {
			p := e.prefix + key + "-seed"
			return &seedDesign{rdb: e.rdb, db: db, marker: p + ":seen:", pending: p + ":pending", throttle: e.cmd.Throttle, ids: st.ids}, nil
		}})
	}
	return append(vs,
		designVariant{"lastseen", table + "lastseen_", func(db *gorm.DB, _ string) (design, error) {
			return e.openLastseen(db, e.prefix+key+"-lastseen", -1, st.boxed)
		}},
		designVariant{"lastseen+local", table + "local_", func(db *gorm.DB, _ string) (design, error) {
			return e.openLastseen(db, e.prefix+key+"-local", 0, st.boxed)
		}})
}

func (e *env) runRequests(ctx context.Context) (*requestsResult, error) {
	c := e.cmd
	t0 := time.Now()
	st := newStream(c.Users, c.Requests, c.Zipf, c.Seed)
	res := &requestsResult{Users: c.Users, Requests: c.Requests, Distinct: st.distinct, Zipf: c.Zipf, Workers: c.Workers,
		Seed: c.Seed, Throttle: c.Throttle.String(), Timeout: "20ms (library default)",
		Generated: time.Since(t0)}
	if c.TouchTimeout > 0 {
		res.Timeout = c.TouchTimeout.String()
	}
	c.progress("requests: %d requests from %d of %d users (Zipf s=%v, seed %d), %d workers",
		c.Requests, st.distinct, c.Users, c.Zipf, c.Seed, c.Workers)

	variants := e.designs(st, "", true)
	for _, v := range variants {
		r, err := e.runVariant(ctx, v.name, v.tablePrefix, st, v.open)
		if err != nil {
			return nil, err
		}
		res.Variants = append(res.Variants, r)
	}
	setRatios(res.Variants)
	var err error
	if res.Touch, err = e.runTouch(ctx, st); err != nil {
		return nil, err
	}
	return res, nil
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// runVariant prepares the variant's own users table, replays the stream
// with the workers, runs the final flush, and measures both phases.
func (e *env) runVariant(ctx context.Context, name, tablePrefix string, st stream,
	open func(db *gorm.DB, table string) (design, error)) (variant, error) {
	r := &variantRun{e: e, name: name, st: st, v: variant{Name: name, Requests: len(st.ids)}}
	db, pool, err := e.openPool(ctx, tablePrefix, e.cmd.Workers+2)
	if err != nil {
		return r.v, err
	}
	defer pool.Close()
	r.db, r.pool = db, pool
	err = r.setUp(ctx, open)
	if r.d != nil {
		defer r.d.close(context.WithoutCancel(ctx))
	}
	if err != nil {
		return r.v, err
	}
	steps := []func(context.Context) error{r.baseline, r.replay, r.flush, r.countRedis, r.countPostgres, r.check}
	if e.lag != nil { // bench replica: the standby's lag during the requests and the flush
		steps = []func(context.Context) error{r.baseline, r.lagStart, r.replay, r.flush, r.lagStop, r.countRedis, r.countPostgres, r.check}
		defer func() {
			if r.lagRunning {
				_, _ = e.lag.stop()
			}
		}()
	}
	for _, step := range steps {
		if err := step(ctx); err != nil {
			return r.v, err
		}
	}
	return r.v, nil
}

// variantRun is one run of runVariant: its table and design, the
// baselines taken before the requests, and the variant it fills in, step
// by step.
type variantRun struct {
	e     *env
	name  string
	st    stream
	db    *gorm.DB
	pool  *sql.DB
	d     design
	v     variant
	start time.Time // the requests' clock origin (the users were seen a day before)

	before        tableCounters    // pg_stat_user_tables before the requests
	lsn0          string           // WAL position before the requests
	cs0, cs1      map[string]int64 // Redis INFO commandstats before and after the requests
	cmds0, trips0 int64            // client-side command and round-trip counters before
	heap          *heapSampler     // heap growth from the requests to the end of the flush
	lagRunning    bool             // bench replica: the lag sampler runs
}

// setUp creates the users table, opens the design on it and warms the
// Redis connections.
func (r *variantRun) setUp(ctx context.Context, open func(db *gorm.DB, table string) (design, error)) error {
	var err error
	r.start = time.Now().UTC().Truncate(time.Microsecond)
	r.v.Table, err = r.e.createUsers(ctx, r.db, r.st.users, r.start.Add(-24*time.Hour), tableSchema{})
	if err != nil {
		return err
	}
	if r.d, err = open(r.db, r.v.Table); err != nil {
		return err
	}
	return r.e.warmRedis(ctx, r.e.cmd.Workers)
}

// baseline takes the table statistics, WAL position and command counts
// the run is measured from.
func (r *variantRun) baseline(ctx context.Context) error {
	e := r.e
	if err := e.flushPgStats(ctx, r.pool); err != nil {
		return err
	}
	var err error
	if r.before, err = e.tableStats(ctx, r.v.Table); err != nil {
		return err
	}
	r.v.CheckpointNote = e.checkpoint(ctx)
	if r.lsn0, err = e.walLSN(ctx); err != nil {
		return err
	}
	if r.cs0, err = e.commandStats(ctx); err != nil {
		return err
	}
	r.cmds0, r.trips0 = e.count.cmds.Load(), e.count.trips.Load()
	return nil
}

// replay sends the stream's requests through the design and records their
// rate, latencies and errors.
func (r *variantRun) replay(ctx context.Context) error {
	v, n := &r.v, len(r.st.ids)
	r.e.cmd.progress("%s: %d requests into %s", r.name, n, v.Table)
	r.heap = startHeap(time.Millisecond)
	lat, errs, first, wall := replay(ctx, r.d, n, r.e.cmd.Workers)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	v.RequestWall, v.Errors = wall, errs
	if first != nil {
		v.FirstError = first.Error()
	}
	v.RequestsPerSec = float64(n) / wall.Seconds()
	v.P50, v.P99, v.Max = percentile(lat, 50), percentile(lat, 99), lat[len(lat)-1]
	var err error
	r.cs1, err = r.e.commandStats(ctx)
	return err
}

// flush writes what the design buffered (the per-request design has
// nothing to flush) and stops the heap sampler.
func (r *variantRun) flush(ctx context.Context) error {
	v := &r.v
	f0 := time.Now()
	var err error
	v.FlushRows, err = r.d.flush(ctx)
	if err != nil {
		return fmt.Errorf("lastseen: bench: %s: flush: %w", r.name, err)
	}
	if _, ok := r.d.(*perRequest); !ok {
		v.FlushWall = time.Since(f0)
		v.FlushRowsPerSec = float64(v.FlushRows) / v.FlushWall.Seconds()
	}
	v.Heap = r.heap.Stop()
	v.HeapPerUser = float64(v.Heap.PeakHeapGrowth) / float64(r.st.distinct)
	return nil
}

// countRedis counts the commands of the run, on the client and on the
// server, for the requests alone and with the flush.
func (r *variantRun) countRedis(ctx context.Context) error {
	e, v, n := r.e, &r.v, float64(len(r.st.ids))
	cs2, err := e.commandStats(ctx)
	if err != nil {
		return err
	}
	v.ClientCommands, v.ClientRoundTrips = e.count.cmds.Load()-r.cmds0, e.count.trips.Load()-r.trips0
	v.RedisCommandsRequests, _ = commandDelta(r.cs0, r.cs1)
	v.RedisCommands, v.RedisPerCommand = commandDelta(r.cs0, cs2)
	v.RedisPerRequest = float64(v.RedisCommands) / n
	v.ClientPerRequest = float64(v.ClientCommands) / n
	return nil
}

// countPostgres measures what the run wrote: rows, HOT updates, dead
// tuples, WAL (all and the table's own), and the library's counters.
func (r *variantRun) countPostgres(ctx context.Context) error {
	e, v := r.e, &r.v
	if err := e.flushPgStats(ctx, r.pool); err != nil {
		return err
	}
	lsn1, err := e.walLSN(ctx)
	if err != nil {
		return err
	}
	after, err := e.tableStats(ctx, v.Table)
	if err != nil {
		return err
	}
	v.RowsWritten = after.written() - r.before.written()
	v.HotUpdates = after.HotUpdated - r.before.HotUpdated
	v.DeadTuples = after.Dead
	if v.WALBytes, err = e.walBytes(ctx, r.lsn0, lsn1); err != nil {
		return err
	}
	v.OwnWALBytes, v.OwnWALRecords, v.OwnWAL, err = e.ownWAL(ctx, r.lsn0, lsn1, v.Table)
	if err != nil {
		e.cmd.progress("%s: no WAL attribution: %v", r.name, err)
	}
	if ls, ok := r.d.(*lastseenDesign); ok {
		s := ls.p.Stats()
		v.Library = &s
	}
	return nil
}

// check compares the table with the stream and reports the run.
func (r *variantRun) check(ctx context.Context) error {
	v := &r.v
	var err error
	v.UsersUpdated, v.Check, err = r.e.checkVariant(ctx, r.db, r.d, *v, r.st, r.start)
	if err != nil {
		return err
	}
	r.e.cmd.progress("%s: %.0f req/s, p50 %v, %d rows, %s WAL, check %s", r.name, v.RequestsPerSec, v.P50, v.RowsWritten,
		fmtBytes(v.WALBytes), v.Check)
	return nil
}

// createUsers creates "<prefix>users" from lastseen.User (id bigint primary
// key, last_seen_at timestamptz without an index: the library's default
// model), shaped by ts (an index on last_seen_at, a fillfactor), with users
// rows seen at seenAt, vacuumed and analyzed.
func (e *env) createUsers(ctx context.Context, db *gorm.DB, users int, seenAt time.Time, ts tableSchema) (string, error) {
	db = db.WithContext(ctx)
	table, err := migrateTable(db, &lastseen.User{}, "users")
	if err != nil {
		return "", err
	}
	if ts.fillfactor > 0 {
		if err := db.Exec("ALTER TABLE ? SET (fillfactor = "+strconv.Itoa(ts.fillfactor)+")", clause.Table{Name: table}).Error; err != nil {
			return "", fmt.Errorf("lastseen: bench: fillfactor of %s: %w", table, err)
		}
	}
	if ts.index {
		if err := db.Exec("CREATE INDEX ? ON ? (?)", clause.Table{Name: "idx_" + table + "_last_seen_at"}, clause.Table{Name: table},
			clause.Column{Name: "last_seen_at"}).Error; err != nil {
			return "", fmt.Errorf("lastseen: bench: index on %s: %w", table, err)
		}
	}
	err = db.Exec("INSERT INTO ? (?, ?) SELECT g, ? FROM generate_series(1, ?::bigint) AS g",
		clause.Table{Name: table}, clause.Column{Name: "id"}, clause.Column{Name: "last_seen_at"}, seenAt, users).Error
	if err != nil {
		return "", fmt.Errorf("lastseen: bench: fill %s: %w", table, err)
	}
	if err := db.Exec("VACUUM (ANALYZE) ?", clause.Table{Name: table}).Error; err != nil {
		return "", fmt.Errorf("lastseen: bench: vacuum %s: %w", table, err)
	}
	return table, nil
}

// warmRedis opens the Redis pool's connections before the measurement.
func (e *env) warmRedis(ctx context.Context, n int) error {
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := e.rdb.Ping(ctx).Err(); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return fmt.Errorf("lastseen: bench: redis: %w", err)
	}
	return nil
}

// replay runs requests 0..n-1 through d.track from workers goroutines
// (each takes the next request) and returns the sorted latencies of the
// tracking calls, the error count and first error, and the wall time.
func replay(ctx context.Context, d design, n, workers int) ([]time.Duration, int64, error, time.Duration) {
	start := time.Now()
	lat, errs, first := replayRange(ctx, d, 0, n, workers)
	return lat, errs, first, time.Since(start)
}

// replayRange runs requests from..to-1 through d.track as replay does and
// returns their sorted latencies, the error count and the first error.
func replayRange(ctx context.Context, d design, from, to, workers int) ([]time.Duration, int64, error) {
	var errs atomic.Int64
	var next atomic.Int64
	next.Store(int64(from))
	var firstOnce sync.Once
	var first error
	parts := make([][]time.Duration, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lat := make([]time.Duration, 0, (to-from)/workers+1)
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= to {
					break
				}
				t := time.Now()
				err := d.track(ctx, i)
				lat = append(lat, time.Since(t))
				if err != nil {
					errs.Add(1)
					firstOnce.Do(func() { first = err })
				}
			}
			parts[w] = lat
		}()
	}
	wg.Wait()
	return sortedDurations(parts), errs.Load(), first
}

// checkVariant checks the database after the flush: every user of the
// stream, and no other, was moved to a time at or after the run's start.
func (e *env) checkVariant(ctx context.Context, db *gorm.DB, d design, v variant, st stream, start time.Time) (int64, string, error) {
	var updated int64
	err := db.WithContext(ctx).Table(v.Table).Where(clause.Gte{Column: clause.Column{Name: "last_seen_at"}, Value: start}).Count(&updated).Error
	if err != nil {
		return 0, "", fmt.Errorf("lastseen: bench: check %s: %w", v.Table, err)
	}
	var problems []string
	if updated != int64(st.distinct) {
		problems = append(problems, fmt.Sprintf("%d users updated, want %d", updated, st.distinct))
	}
	want := int64(st.distinct)
	if v.Name == "per-request" {
		want = int64(len(st.ids))
	}
	if v.RowsWritten != want {
		problems = append(problems, fmt.Sprintf("%d rows written, want %d", v.RowsWritten, want))
	}
	if ls, ok := d.(*lastseenDesign); ok {
		buf, err := ls.p.Status(ctx)
		if err != nil {
			return 0, "", fmt.Errorf("lastseen: bench: status: %w", err)
		}
		if buf.Pending+buf.InFlight != 0 {
			problems = append(problems, fmt.Sprintf("%d pending and %d in-flight entries left in Redis", buf.Pending, buf.InFlight))
		}
	}
	if len(problems) == 0 {
		return updated, "ok", nil
	}
	return updated, fmt.Sprint(problems), nil
}

// perRequest is the design users start with: one UPDATE per request.
type perRequest struct {
	db    *gorm.DB
	table string
	ids   []uint64
}

func (b *perRequest) track(ctx context.Context, i int) error {
	return b.db.WithContext(ctx).Exec("UPDATE ? SET ? = ? WHERE ? = ?", clause.Table{Name: b.table},
		clause.Column{Name: "last_seen_at"}, time.Now(), clause.Column{Name: "id"}, b.ids[i]).Error
}

func (b *perRequest) flush(context.Context) (int64, error) { return 0, nil }
func (b *perRequest) close(context.Context)                {}

// seedDesign is the design the library descends from, as is: SET marker NX
// EX, then HSET when the marker was new (two commands); the drain is
// HGETALL then DEL, written with INSERT ... ON CONFLICT (id) DO UPDATE in
// batches of 1,000.
type seedDesign struct {
	rdb             *redis.Client
	db              *gorm.DB
	marker, pending string
	throttle        time.Duration
	ids             []uint64
}

func (b *seedDesign) track(ctx context.Context, i int) error {
	id := strconv.FormatUint(b.ids[i], 10)
	ok, err := b.rdb.SetNX(ctx, b.marker+id, 1, b.throttle).Result()
	if err != nil || !ok {
		return err
	}
	return b.rdb.HSet(ctx, b.pending, id, time.Now().UnixMicro()).Err()
}

func (b *seedDesign) flush(ctx context.Context) (int64, error) {
	m, err := b.rdb.HGetAll(ctx, b.pending).Result()
	if err != nil {
		return 0, err
	}
	if err := b.rdb.Del(ctx, b.pending).Err(); err != nil {
		return 0, err
	}
	users := make([]lastseen.User, 0, len(m))
	for k, v := range m {
		id, err1 := strconv.ParseUint(k, 10, 64)
		us, err2 := strconv.ParseInt(v, 10, 64)
		if err1 != nil || err2 != nil {
			return 0, fmt.Errorf("seed: bad pending entry %q=%q", k, v)
		}
		at := time.UnixMicro(us).UTC()
		users = append(users, lastseen.User{ID: id, LastSeenAt: &at})
	}
	if len(users) == 0 {
		return 0, nil
	}
	tx := b.db.WithContext(ctx).Clauses(clause.OnConflict{
		Columns:   []clause.Column{{Name: "id"}},
		DoUpdates: clause.AssignmentColumns([]string{"last_seen_at"}),
	}).CreateInBatches(&users, 1000)
	return tx.RowsAffected, tx.Error
}

func (b *seedDesign) close(context.Context) {}

// lastseenDesign is the library through its public API: Touch on the
// request path, Flush at the end.
type lastseenDesign struct {
	p     *lastseen.Plugin
	boxed []any
}

// openLastseen registers a plugin on db: the given prefix and local cache
// size (-1 off, 0 the default), the run's throttle window, no scheduler.
func (e *env) openLastseen(db *gorm.DB, prefix string, localCache int, boxed []any) (*lastseenDesign, error) {
	p := lastseen.New(lastseen.Config{
		Redis:    e.rdb,
		Throttle: e.cmd.Throttle,
		Logger:   e.pluginLogger(),
		Buffer:   lastseen.BufferConfig{Prefix: prefix, LocalCacheSize: localCache, TouchTimeout: e.cmd.TouchTimeout},
		Flush:    lastseen.FlushConfig{Schedule: "off"},
		Sessions: lastseen.SessionConfig{Schedule: "off"},
	})
	if err := db.Use(p); err != nil {
		return nil, fmt.Errorf("lastseen: bench: db.Use: %w", err)
	}
	return &lastseenDesign{p: p, boxed: boxed}, nil
}

func (b *lastseenDesign) track(ctx context.Context, i int) error {
	_, err := b.p.Touch(ctx, b.boxed[i])
	return err
}

func (b *lastseenDesign) flush(ctx context.Context) (int64, error) {
	res, err := b.p.Flush(ctx)
	return int64(res.Written), err
}

func (b *lastseenDesign) close(ctx context.Context) { _ = b.p.Close(ctx) }
