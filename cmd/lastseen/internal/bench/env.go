package bench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/lastseen/lastseen/cmd/lastseen/internal/runenv"
	"github.com/redis/go-redis/v9"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
	"gorm.io/gorm/logger"
	"gorm.io/gorm/schema"
)

// env is one benchmark run's connections and its private namespace: a
// PostgreSQL schema and a Redis key prefix, both removed by close.
type env struct {
	cmd    *Cmd
	pg     *pgx.ConnConfig // search_path set to schema
	schema string          // lastseen_bench_<hex>
	prefix string          // lastseen-bench-<hex>, Redis keys
	admin  *gorm.DB        // measurement and DDL
	pools  []*sql.DB
	tracer *sqlTracer

	rdb   *redis.Client // request path: every command counted by count
	plain *redis.Client // INFO, fills, checks: not counted
	count *redisCounter
	timed *redis.Client // the flush and purge plugins: round trips timed by timer
	timer *redisTimer

	walSchema string // schema of pg_walinspect, "" when unavailable
	walNote   string // why pg_walinspect is unavailable
	created   bool   // the schema exists

	lag *lagWatch // bench replica: samples the standby's lag during each variant's requests and flush
}

func openEnv(ctx context.Context, c *Cmd) (*env, error) {
	pg, err := pgx.ParseConfig(c.Postgres)
	if err != nil {
		return nil, fmt.Errorf("lastseen: bench: --postgres: %w", err)
	}
	id := runenv.RandomName("")
	e := &env{cmd: c, pg: pg, schema: "lastseen_bench_" + id, prefix: "lastseen-bench-" + id, tracer: newSQLTracer()}
	pg.RuntimeParams["search_path"] = e.schema
	pg.Tracer = e.tracer

	opt, err := runenv.RedisOptions(c.Redis)
	if err != nil {
		return nil, fmt.Errorf("lastseen: bench: %w", errors.Unwrap(err))
	}
	// The plugin sends on a client with ContextTimeoutEnabled as it is, so
	// the hooks below see its commands (without it, it opens a copy).
	opt.ContextTimeoutEnabled = true
	e.count = &redisCounter{}
	e.rdb = redis.NewClient(opt)
	e.rdb.AddHook(e.count)
	e.plain = redis.NewClient(opt)
	e.timer = &redisTimer{}
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

// openPool opens a connection pool of n connections to the benchmark's
// schema, with GORM naming every table with tablePrefix (so each variant
// gets its own "<prefix>users" table from lastseen.User), and opens its n
// connections now so that connecting is not timed.
func (e *env) openPool(ctx context.Context, tablePrefix string, n int) (*gorm.DB, *sql.DB, error) {
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
	if err := onEachConn(ctx, sqlDB, n, "SELECT 1"); err != nil {
		return nil, nil, fmt.Errorf("lastseen: bench: postgres: %w", err)
	}
	return db, sqlDB, nil
}

// migrateTable creates (or completes) model's table on db with GORM's
// AutoMigrate and returns the table's name (with the pool's table prefix);
// what names the table in the error ("users", "sessions").
func migrateTable(db *gorm.DB, model any, what string) (string, error) {
	if err := db.AutoMigrate(model); err != nil {
		return "", fmt.Errorf("lastseen: bench: create %s table: %w", what, err)
	}
	stmt := &gorm.Statement{DB: db}
	if err := stmt.Parse(model); err != nil {
		return "", err
	}
	return stmt.Schema.Table, nil
}

// onEachConn runs query on n distinct connections of the pool at once
// (holding them all, so the pool cannot hand out one twice).
func onEachConn(ctx context.Context, db *sql.DB, n int, query string) error {
	return withEachConn(ctx, db, n, func(c *sql.Conn) error {
		_, err := c.ExecContext(ctx, query)
		return err
	})
}

// withEachConn takes n distinct connections of the pool, all held at once,
// and calls fn with each in turn; it stops at fn's first error.
func withEachConn(ctx context.Context, db *sql.DB, n int, fn func(*sql.Conn) error) error {
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
		if err := fn(c); err != nil {
			return err
		}
	}
	return nil
}

// flushPgStats makes every connection of the pool report its pending
// table statistics now: pg_stat_force_next_flush() (PostgreSQL 15+) applies
// when the backend goes idle, which happens before the reply to the SELECT
// reaches us. Without it a backend may hold its counts for up to 10s.
func (e *env) flushPgStats(ctx context.Context, pool *sql.DB) error {
	n := pool.Stats().OpenConnections
	if err := onEachConn(ctx, pool, n, "SELECT pg_stat_force_next_flush()"); err != nil {
		return fmt.Errorf("lastseen: bench: pg_stat_force_next_flush: %w", err)
	}
	return nil
}

// setupWalInspect finds or creates pg_walinspect (in the benchmark's
// schema, so dropping the schema removes it). Without it the per-variant
// WAL attribution is reported as unavailable.
func (e *env) setupWalInspect(ctx context.Context) {
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
func (e *env) close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var errs []error
	if err := runenv.DeleteKeys(ctx, e.plain, e.prefix+"*"); err != nil {
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

func (e *env) closeClients() {
	e.rdb.Close()
	e.plain.Close()
	e.timed.Close()
}

// pluginLogger is the plugins' logger: warnings and errors on stderr.
func (e *env) pluginLogger() *slog.Logger {
	var w io.Writer = os.Stderr
	if e.cmd.log != nil {
		w = e.cmd.log
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// runInfo describes the machine and the servers.
type runInfo struct {
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

// loadAvg returns the 1, 5 and 15 minute load averages, or "".
func loadAvg() string {
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

func (e *env) info(ctx context.Context) runInfo {
	in := runInfo{
		Date: time.Now().UTC().Format(time.RFC3339), GoVersion: runtime.Version(),
		CPUs: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0), Schema: e.schema, LoadStart: loadAvg(),
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
