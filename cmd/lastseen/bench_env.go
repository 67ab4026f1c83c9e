package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/redis/go-redis/v9"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
	"gorm.io/gorm/logger"
	"gorm.io/gorm/schema"
)

// benchEnv is one benchmark run's connections and its private namespace: a
// PostgreSQL schema and a Redis key prefix, both removed by close.
type benchEnv struct {
	cmd    *benchCmd
	pg     *pgx.ConnConfig // search_path set to schema
	schema string          // lastseen_bench_<hex>
	prefix string          // lastseen-bench-<hex>, Redis keys
	admin  *gorm.DB        // measurement and DDL
	pools  []*sql.DB
	tracer *benchTracer

	rdb   *redis.Client // request path: every command counted by count
	plain *redis.Client // INFO, fills, checks: not counted
	count *benchRedisCounter
	timed *redis.Client // the flush and purge plugins: round trips timed by timer
	timer *benchRedisTimer

	walSchema string // schema of pg_walinspect, "" when unavailable
	walNote   string // why pg_walinspect is unavailable
	created   bool   // the schema exists
}

func benchRandomHex() string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func openBenchEnv(ctx context.Context, c *benchCmd) (*benchEnv, error) {
	pg, err := pgx.ParseConfig(c.Postgres)
	if err != nil {
		return nil, fmt.Errorf("lastseen: bench: --postgres: %w", err)
	}
	id := benchRandomHex()
	e := &benchEnv{cmd: c, pg: pg, schema: "lastseen_bench_" + id, prefix: "lastseen-bench-" + id, tracer: newBenchTracer()}
	pg.RuntimeParams["search_path"] = e.schema
	pg.Tracer = e.tracer

	opt, err := benchRedisOptions(c.Redis)
	if err != nil {
		return nil, err
	}
	e.count = &benchRedisCounter{}
	e.rdb = redis.NewClient(opt)
	e.rdb.AddHook(e.count)
	e.plain = redis.NewClient(opt)
	e.timer = &benchRedisTimer{}
	e.timed = redis.NewClient(opt)
	e.timed.AddHook(e.timer)
	if err := e.plain.Ping(ctx).Err(); err != nil {
		e.closeClients()
		return nil, fmt.Errorf("lastseen: bench: redis %s: %w", opt.Addr, err)
	}

	if e.admin, _, err = e.openPool(ctx, "", 2); err != nil {
		e.closeClients()
		return nil, err
	}
	if err := e.admin.WithContext(ctx).Exec("CREATE SCHEMA ?", clause.Table{Name: e.schema}).Error; err != nil {
		e.closeClients()
		return nil, fmt.Errorf("lastseen: bench: create schema %s: %w", e.schema, err)
	}
	e.created = true
	c.progress("schema %s, redis prefix %s", e.schema, e.prefix)
	e.setupWalInspect(ctx)
	return e, nil
}

// benchRedisOptions reads host:port or a redis:// URL.
func benchRedisOptions(s string) (*redis.Options, error) {
	if strings.Contains(s, "://") {
		opt, err := redis.ParseURL(s)
		if err != nil {
			return nil, fmt.Errorf("lastseen: bench: --redis: %w", err)
		}
		return opt, nil
	}
	return &redis.Options{Addr: s}, nil
}

// openPool opens a connection pool of n connections to the benchmark's
// schema, with GORM naming every table with tablePrefix (so each variant
// gets its own "<prefix>users" table from lastseen.User), and opens its n
// connections now so that connecting is not timed.
func (e *benchEnv) openPool(ctx context.Context, tablePrefix string, n int) (*gorm.DB, *sql.DB, error) {
	sqlDB := stdlib.OpenDB(*e.pg.Copy())
	sqlDB.SetMaxOpenConns(n)
	sqlDB.SetMaxIdleConns(n)
	db, err := gorm.Open(postgres.New(postgres.Config{Conn: sqlDB}), &gorm.Config{
		Logger:         logger.Discard,
		NamingStrategy: schema.NamingStrategy{TablePrefix: tablePrefix},
	})
	if err != nil {
		sqlDB.Close()
		return nil, nil, fmt.Errorf("lastseen: bench: open postgres: %w", err)
	}
	e.pools = append(e.pools, sqlDB)
	if err := benchOnEachConn(ctx, sqlDB, n, "SELECT 1"); err != nil {
		return nil, nil, fmt.Errorf("lastseen: bench: postgres: %w", err)
	}
	return db, sqlDB, nil
}

// benchOnEachConn runs query on n distinct connections of the pool at once
// (holding them all, so the pool cannot hand out one twice).
func benchOnEachConn(ctx context.Context, db *sql.DB, n int, query string) error {
	conns := make([]*sql.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range n {
		c, err := db.Conn(ctx)
		if err != nil {
			return err
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		if _, err := c.ExecContext(ctx, query); err != nil {
			return err
		}
	}
	return nil
}

// flushPgStats makes every connection of the pool report its pending
// table statistics now: pg_stat_force_next_flush() (PostgreSQL 15+) applies
// when the backend goes idle, which happens before the reply to the SELECT
// reaches us. Without it a backend may hold its counts for up to 10s.
func (e *benchEnv) flushPgStats(ctx context.Context, pool *sql.DB) error {
	n := pool.Stats().OpenConnections
	if err := benchOnEachConn(ctx, pool, n, "SELECT pg_stat_force_next_flush()"); err != nil {
		return fmt.Errorf("lastseen: bench: pg_stat_force_next_flush: %w", err)
	}
	return nil
}

// setupWalInspect finds or creates pg_walinspect (in the benchmark's
// schema, so dropping the schema removes it). Without it the per-variant
// WAL attribution is reported as unavailable.
func (e *benchEnv) setupWalInspect(ctx context.Context) {
	db := e.admin.WithContext(ctx)
	var existing []string
	if err := db.Raw(`SELECT n.nspname FROM pg_extension x JOIN pg_namespace n ON n.oid = x.extnamespace WHERE x.extname = ?`,
		"pg_walinspect").Scan(&existing).Error; err != nil {
		e.walNote = err.Error()
		return
	}
	if len(existing) == 1 {
		e.walSchema = existing[0]
		return
	}
	if err := db.Exec("CREATE EXTENSION pg_walinspect WITH SCHEMA ?", clause.Table{Name: e.schema}).Error; err != nil {
		e.walNote = "pg_walinspect: " + err.Error()
		e.cmd.progress("no per-variant WAL attribution: %v", err)
		return
	}
	e.walSchema = e.schema
}

// close deletes the Redis keys and drops the schema, whatever happened
// before; it returns the first cleanup error.
func (e *benchEnv) close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var errs []error
	if err := benchDeleteKeys(ctx, e.plain, e.prefix+"*"); err != nil {
		errs = append(errs, fmt.Errorf("lastseen: bench: delete redis keys %s*: %w", e.prefix, err))
	}
	if e.created {
		if err := e.admin.WithContext(ctx).Exec("DROP SCHEMA ? CASCADE", clause.Table{Name: e.schema}).Error; err != nil {
			errs = append(errs, fmt.Errorf("lastseen: bench: drop schema %s: %w", e.schema, err))
		}
	}
	for _, p := range e.pools {
		p.Close()
	}
	e.closeClients()
	if len(errs) == 0 {
		e.cmd.progress("removed schema %s and keys %s*", e.schema, e.prefix)
	}
	return errors.Join(errs...)
}

func (e *benchEnv) closeClients() {
	e.rdb.Close()
	e.plain.Close()
	e.timed.Close()
}

// benchDeleteKeys deletes every key matching pattern (SCAN + UNLINK).
func benchDeleteKeys(ctx context.Context, rdb *redis.Client, pattern string) error {
	iter := rdb.Scan(ctx, 0, pattern, 1000).Iterator()
	var batch []string
	for iter.Next(ctx) {
		if batch = append(batch, iter.Val()); len(batch) == 500 {
			if err := rdb.Unlink(ctx, batch...).Err(); err != nil {
				return err
			}
			batch = batch[:0]
		}
	}
	if err := iter.Err(); err != nil {
		return err
	}
	if len(batch) > 0 {
		return rdb.Unlink(ctx, batch...).Err()
	}
	return nil
}

// benchCountKeys counts the keys matching pattern.
func benchCountKeys(ctx context.Context, rdb *redis.Client, pattern string) (int, error) {
	n := 0
	iter := rdb.Scan(ctx, 0, pattern, 1000).Iterator()
	for iter.Next(ctx) {
		n++
	}
	return n, iter.Err()
}

// benchLogger is the plugins' logger: warnings and errors on stderr.
func (e *benchEnv) benchLogger() *slog.Logger {
	var w io.Writer = os.Stderr
	if e.cmd.log != nil {
		w = e.cmd.log
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// benchInfo describes the machine and the servers.
type benchInfo struct {
	Date       string `json:"date"`
	GoVersion  string `json:"go_version"`
	CPUs       int    `json:"cpus"`
	GOMAXPROCS int    `json:"gomaxprocs"`
	Postgres   string `json:"postgres"`
	Redis      string `json:"redis"`
	Schema     string `json:"schema"`
	WALInspect string `json:"wal_inspect"`
	LoadStart  string `json:"loadavg_start"` // /proc/loadavg: the machine is shared
	LoadEnd    string `json:"loadavg_end"`
}

// benchLoadAvg returns the 1, 5 and 15 minute load averages, or "".
func benchLoadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

func (e *benchEnv) info(ctx context.Context) benchInfo {
	in := benchInfo{
		Date: time.Now().UTC().Format(time.RFC3339), GoVersion: runtime.Version(),
		CPUs: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0), Schema: e.schema, LoadStart: benchLoadAvg(),
	}
	var v []string
	if e.admin.WithContext(ctx).Raw("SHOW server_version").Scan(&v).Error == nil && len(v) == 1 {
		in.Postgres = v[0]
	}
	if s, err := e.plain.Info(ctx, "server").Result(); err == nil {
		for _, l := range strings.Split(s, "\n") {
			if r, ok := strings.CutPrefix(strings.TrimSpace(l), "redis_version:"); ok {
				in.Redis = r
			}
		}
	}
	in.WALInspect = "pg_walinspect in schema " + e.walSchema
	if e.walSchema == "" {
		in.WALInspect = "unavailable: " + e.walNote
	}
	return in
}

// benchRedisCounter counts the commands and round trips the benchmark's
// own client sends.
type benchRedisCounter struct {
	cmds, trips atomic.Int64
}

func (h *benchRedisCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *benchRedisCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.cmds.Add(1)
		h.trips.Add(1)
		return next(ctx, cmd)
	}
}

func (h *benchRedisCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.cmds.Add(int64(len(cmds)))
		h.trips.Add(1)
		return next(ctx, cmds)
	}
}

// benchRedisTimer times, while on, every round trip of a client: how long
// the flush or purge waited for Redis.
type benchRedisTimer struct {
	on           atomic.Bool
	trips, nanos atomic.Int64
}

// benchRedisTime is what benchRedisTimer saw.
type benchRedisTime struct {
	RoundTrips int64         `json:"round_trips"`
	Time       time.Duration `json:"time_ns"`
}

func (h *benchRedisTimer) start() {
	h.trips.Store(0)
	h.nanos.Store(0)
	h.on.Store(true)
}

func (h *benchRedisTimer) stop() benchRedisTime {
	h.on.Store(false)
	return benchRedisTime{RoundTrips: h.trips.Load(), Time: time.Duration(h.nanos.Load())}
}

func (h *benchRedisTimer) observe(t time.Time) {
	if h.on.Load() {
		h.trips.Add(1)
		h.nanos.Add(int64(time.Since(t)))
	}
}

func (h *benchRedisTimer) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *benchRedisTimer) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		defer h.observe(time.Now())
		return next(ctx, cmd)
	}
}

func (h *benchRedisTimer) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		defer h.observe(time.Now())
		return next(ctx, cmds)
	}
}

// benchTracer is a pgx query tracer that, while on, times statements and
// transactions (BEGIN to COMMIT/ROLLBACK on one connection).
type benchTracer struct {
	on    atomic.Bool
	mu    sync.Mutex
	begun map[*pgx.Conn]time.Time
	s     benchSQLStats
}

// benchSQLStats are what the tracer saw while on. Durations are as the
// client sees them (network round trip included).
type benchSQLStats struct {
	Statements   int64         `json:"statements"`
	Writes       int64         `json:"writes"` // INSERT, UPDATE, DELETE
	WriteTime    time.Duration `json:"write_time_ns"`
	LongestWrite time.Duration `json:"longest_write_ns"`
	ReadTime     time.Duration `json:"read_time_ns"` // SELECT
	LongestRead  time.Duration `json:"longest_read_ns"`
	Txs          int64         `json:"transactions"`
	TxTime       time.Duration `json:"transaction_time_ns"`
	LongestTx    time.Duration `json:"longest_transaction_ns"`
}

type benchTraceKey struct{}

type benchTraceStart struct {
	at   time.Time
	verb string
}

func newBenchTracer() *benchTracer { return &benchTracer{begun: map[*pgx.Conn]time.Time{}} }

func benchVerb(sql string) string {
	sql = strings.TrimSpace(sql)
	if i := strings.IndexAny(sql, " \n\t("); i > 0 {
		sql = sql[:i]
	}
	return strings.ToLower(sql)
}

func (t *benchTracer) TraceQueryStart(ctx context.Context, conn *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if !t.on.Load() {
		return ctx
	}
	st := benchTraceStart{at: time.Now(), verb: benchVerb(d.SQL)}
	if st.verb == "begin" {
		t.mu.Lock()
		t.begun[conn] = st.at
		t.mu.Unlock()
	}
	return context.WithValue(ctx, benchTraceKey{}, st)
}

func (t *benchTracer) TraceQueryEnd(ctx context.Context, conn *pgx.Conn, _ pgx.TraceQueryEndData) {
	st, ok := ctx.Value(benchTraceKey{}).(benchTraceStart)
	if !ok {
		return
	}
	now := time.Now()
	d := now.Sub(st.at)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.s.Statements++
	switch st.verb {
	case "insert", "update", "delete":
		t.s.Writes++
		t.s.WriteTime += d
		t.s.LongestWrite = max(t.s.LongestWrite, d)
	case "select":
		t.s.ReadTime += d
		t.s.LongestRead = max(t.s.LongestRead, d)
	case "commit", "rollback":
		if b, ok := t.begun[conn]; ok {
			delete(t.begun, conn)
			tx := now.Sub(b)
			t.s.Txs++
			t.s.TxTime += tx
			t.s.LongestTx = max(t.s.LongestTx, tx)
		}
	}
}

// start clears the figures and starts recording; stop stops and returns them.
func (t *benchTracer) start() {
	t.mu.Lock()
	t.s = benchSQLStats{}
	clear(t.begun)
	t.mu.Unlock()
	t.on.Store(true)
}

func (t *benchTracer) stop() benchSQLStats {
	t.on.Store(false)
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.s
}
