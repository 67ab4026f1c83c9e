package tests

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/glebarez/sqlite"
	"github.com/lastseen/lastseen"
	"github.com/redis/go-redis/v9"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// Environment variables that point the tests at real servers. Unset, the
// tests that need them skip with a one-line reason; with
// LASTSEEN_REQUIRE_SERVICES=1 (as .ci/run sets) such a skip is a failure.
const (
	envPostgres     = "LASTSEEN_POSTGRES_DSN" // host=127.0.0.1 user=postgres dbname=lastseen_test sslmode=disable
	envMySQL        = "LASTSEEN_MYSQL_DSN"    // root@tcp(127.0.0.1:3306)/lastseen_test?parseTime=true
	envRedis        = "LASTSEEN_REDIS_ADDR"   // 127.0.0.1:6379
	envRedisCluster = "LASTSEEN_REDIS_CLUSTER"
	envRequire      = "LASTSEEN_REQUIRE_SERVICES"
)

// needService skips (or, under LASTSEEN_REQUIRE_SERVICES, fails) when the
// environment variable is unset, and returns its value.
func needService(t testing.TB, env string) string {
	t.Helper()
	v := os.Getenv(env)
	if v == "" {
		if os.Getenv(envRequire) != "" {
			t.Fatalf("%s is not set but %s is: this test must run", env, envRequire)
		}
		t.Skipf("%s not set", env)
	}
	return v
}

func randomName(prefix string) string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// fakeClock is the plugin's clock in tests.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock(rfc3339 string) *fakeClock { return &fakeClock{now: mustTime(rfc3339)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func (c *fakeClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

func mustTime(s string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		panic(err)
	}
	return t.UTC()
}

// dbOpener opens fresh, isolated databases of one dialect: a SQLite file, a
// PostgreSQL schema or a MySQL database of its own, dropped at cleanup.
type dbOpener struct {
	name string
	open func(t testing.TB) func() *gorm.DB // returns a func opening more handles to the same database
}

// quietGorm returns a new config per handle: a handle takes one plugin of a name.
func quietGorm() *gorm.Config { return &gorm.Config{Logger: logger.Default.LogMode(logger.Silent)} }

func sqliteOpener() dbOpener {
	return dbOpener{name: "sqlite", open: func(t testing.TB) func() *gorm.DB {
		path := filepath.Join(t.TempDir(), "test.db")
		return func() *gorm.DB {
			db, err := gorm.Open(sqlite.Open(path+"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)"), quietGorm())
			if err != nil {
				t.Fatalf("open sqlite: %v", err)
			}
			t.Cleanup(func() { closeDB(db) })
			return db
		}
	}}
}

func postgresOpener() dbOpener {
	return dbOpener{name: "postgres", open: func(t testing.TB) func() *gorm.DB {
		dsn := needService(t, envPostgres)
		admin, err := gorm.Open(postgres.Open(dsn), quietGorm())
		if err != nil {
			t.Fatalf("open postgres: %v", err)
		}
		schema := randomName("t_")
		if err := admin.Exec("CREATE SCHEMA " + schema).Error; err != nil {
			t.Fatalf("create schema: %v", err)
		}
		t.Cleanup(func() {
			admin.Exec("DROP SCHEMA " + schema + " CASCADE")
			closeDB(admin)
		})
		return func() *gorm.DB {
			db, err := gorm.Open(postgres.Open(dsn+" search_path="+schema), quietGorm())
			if err != nil {
				t.Fatalf("open postgres: %v", err)
			}
			t.Cleanup(func() { closeDB(db) })
			return db
		}
	}}
}

func mysqlOpener() dbOpener {
	return dbOpener{name: "mysql", open: func(t testing.TB) func() *gorm.DB {
		dsn := needService(t, envMySQL)
		admin, err := gorm.Open(mysql.Open(dsn), quietGorm())
		if err != nil {
			t.Fatalf("open mysql: %v", err)
		}
		name := randomName("lastseen_t_")
		if err := admin.Exec("CREATE DATABASE " + name).Error; err != nil {
			t.Fatalf("create database: %v", err)
		}
		t.Cleanup(func() {
			admin.Exec("DROP DATABASE " + name)
			closeDB(admin)
		})
		slash, q := strings.Index(dsn, "/"), strings.Index(dsn, "?")
		if q < 0 {
			q = len(dsn)
		}
		own := dsn[:slash+1] + name + dsn[q:]
		return func() *gorm.DB {
			db, err := gorm.Open(mysql.Open(own), quietGorm())
			if err != nil {
				t.Fatalf("open mysql: %v", err)
			}
			t.Cleanup(func() { closeDB(db) })
			return db
		}
	}}
}

func closeDB(db *gorm.DB) {
	if sqlDB, err := db.DB(); err == nil {
		sqlDB.Close()
	}
}

func allDialects() []dbOpener { return []dbOpener{sqliteOpener(), postgresOpener(), mysqlOpener()} }

// redisKind makes Redis clients of one kind, each test with a key prefix of
// its own that is deleted at cleanup.
type redisKind struct {
	name string
	open func(t testing.TB) *testRedis
}

// The test clients set ContextTimeoutEnabled, so the plugin sends on them
// as they are and hooks a test adds to them (command counters, recorders)
// see the plugin's commands. With the go-redis default (false) the plugin
// opens a client of its own (redisclient.go); the tests of that path build
// such clients themselves (deadline_test.go).
type testRedis struct {
	client redis.UniversalClient // nil for the in-process buffer (memoryKind)
	mr     *miniredis.Miniredis  // nil on a real server
}

func miniredisKind() redisKind {
	return redisKind{name: "miniredis", open: func(t testing.TB) *testRedis {
		mr := miniredis.RunT(t)
		c := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
		t.Cleanup(func() { c.Close() })
		return &testRedis{client: c, mr: mr}
	}}
}

func realRedisKind() redisKind {
	return redisKind{name: "redis", open: func(t testing.TB) *testRedis {
		c := redis.NewClient(&redis.Options{Addr: needService(t, envRedis), ContextTimeoutEnabled: true})
		t.Cleanup(func() { c.Close() })
		return &testRedis{client: c}
	}}
}

func clusterRedisKind() redisKind {
	return redisKind{name: "cluster", open: func(t testing.TB) *testRedis {
		addrs := strings.Split(needService(t, envRedisCluster), ",")
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true})
		t.Cleanup(func() { c.Close() })
		return &testRedis{client: c}
	}}
}

func allRedis() []redisKind { return []redisKind{miniredisKind(), realRedisKind(), clusterRedisKind()} }

// memoryKind is no Redis at all: Config.Redis stays nil and the plugin
// buffers in process (memoryBuffer). The harness shows that buffer's state
// under the Redis key names (keys, pendingKeys), so that tests written
// against Redis check the same state; tests about Redis itself skip it
// (needRedis).
func memoryKind() redisKind {
	return redisKind{name: "memory", open: func(testing.TB) *testRedis { return &testRedis{} }}
}

// allBuffers is every buffer forEachEnv runs on: the Redis kinds and the
// in-process buffer.
func allBuffers() []redisKind { return append(allRedis(), memoryKind()) }

// deleteKeys removes every key matching pattern, on every master of a
// cluster.
func deleteKeys(ctx context.Context, c redis.UniversalClient, pattern string) error {
	del := func(ctx context.Context, c redis.Cmdable) error {
		iter := c.Scan(ctx, 0, pattern, 1000).Iterator()
		for iter.Next(ctx) {
			if err := c.Del(ctx, iter.Val()).Err(); err != nil {
				return err
			}
		}
		return iter.Err()
	}
	if cc, ok := c.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error { return del(ctx, m) })
	}
	return del(ctx, c)
}

// harness is one test environment: a database of one dialect, a Redis of
// one kind, a key prefix and a clock.
type harness struct {
	t       testing.TB
	dialect string
	redis   string
	openDB  func() *gorm.DB
	db      *gorm.DB
	r       *testRedis
	prefix  string
	clock   *fakeClock
	plugins []*lastseen.Plugin // made by plugin(), whose memory buffers keys() shows
}

func newHarness(t testing.TB, d dbOpener, r redisKind) *harness {
	h := &harness{t: t, dialect: d.name, redis: r.name, clock: newClock("2026-03-01T09:30:00Z")}
	h.r = r.open(t)
	h.openDB = d.open(t)
	h.db = h.openDB()
	h.prefix = randomName("ls")
	if h.r.client != nil {
		t.Cleanup(func() { _ = deleteKeys(context.Background(), h.r.client, h.prefix+":*") })
	}
	return h
}

// memory reports whether the harness runs on the in-process buffer.
func (h *harness) memory() bool { return h.r.client == nil }

// needRedis skips a test that is about Redis itself (its keys, commands,
// outages, or one buffer shared by several instances) on the in-process
// buffer.
func (h *harness) needRedis(t testing.TB, why string) {
	t.Helper()
	if h.memory() {
		t.Skipf("about Redis itself: %s", why)
	}
}

// forEachEnv runs fn for every dialect with miniredis, with a real Redis,
// with a Redis Cluster, and with no Redis (the in-process buffer).
func forEachEnv(t *testing.T, fn func(t *testing.T, h *harness)) {
	for _, r := range allBuffers() {
		for _, d := range allDialects() {
			t.Run(d.name+"/"+r.name, func(t *testing.T) {
				fn(t, newHarness(t, d, r))
			})
		}
	}
}

// forEachDialect runs fn for every dialect with miniredis only: for tests
// about SQL, where the Redis kind does not matter.
func forEachDialect(t *testing.T, fn func(t *testing.T, h *harness)) {
	for _, d := range allDialects() {
		t.Run(d.name, func(t *testing.T) { fn(t, newHarness(t, d, miniredisKind())) })
	}
}

// config returns a test Config: this harness's Redis, prefix and clock, no
// scheduler, logs discarded.
func (h *harness) config() lastseen.Config {
	return lastseen.Config{
		Redis:            h.r.client,
		Prefix:           h.prefix,
		Now:              h.clock.Now,
		DisableScheduler: true,
		Logger:           slog.New(slog.NewTextHandler(io.Discard, nil)),
		TouchTimeout:     2 * time.Second,
	}
}

// plugin registers a plugin with cfg on a new handle to the harness's
// database (each handle takes one plugin) and closes it at cleanup.
func (h *harness) plugin(cfg lastseen.Config) (*lastseen.Plugin, *gorm.DB) {
	h.t.Helper()
	db := h.openDB()
	p := lastseen.New(cfg)
	if err := db.Use(p); err != nil {
		h.t.Fatalf("db.Use: %v", err)
	}
	h.t.Cleanup(func() { p.Close(context.Background()) })
	h.plugins = append(h.plugins, p)
	return p, db
}

// expireThrottle makes the throttle window pass: the clock moves by d and
// the Redis markers expire (miniredis fast-forwards; on a real server the
// markers are deleted, which is what their expiry does).
func (h *harness) expireThrottle(d time.Duration) {
	h.t.Helper()
	h.clock.Add(d)
	switch {
	case h.memory(): // markers end on the plugin's clock
		return
	case h.r.mr != nil:
		h.r.mr.FastForward(d)
		return
	}
	if err := deleteKeys(context.Background(), h.r.client, h.prefix+":*:seen:*"); err != nil {
		h.t.Fatalf("expire markers: %v", err)
	}
}

// keys lists this harness's Redis keys, sorted, with the prefix cut off;
// on the in-process buffer, the keys Redis would hold for its state
// (memoryKeys).
func (h *harness) keys() []string {
	if h.memory() {
		return h.memoryKeys()
	}
	ctx := context.Background()
	var out []string
	var mu sync.Mutex
	collect := func(ctx context.Context, c redis.Cmdable) error {
		iter := c.Scan(ctx, 0, h.prefix+":*", 1000).Iterator()
		for iter.Next(ctx) {
			mu.Lock()
			out = append(out, strings.TrimPrefix(iter.Val(), h.prefix))
			mu.Unlock()
		}
		return iter.Err()
	}
	var err error
	if cc, ok := h.r.client.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error { return collect(ctx, m) })
	} else {
		err = collect(ctx, h.r.client)
	}
	if err != nil {
		h.t.Fatalf("scan keys: %v", err)
	}
	return h.logicalKeys(out)
}

// logicalKeys names Redis keys by what they hold, as memoryKeys names the
// in-process buffer's state: a bucket's pending or in-flight hash as its
// shard's (":{N}:pending:<b>" as ":{N}:pending"), and a marker hash as one
// ":{N}:seen:<id>" per user it holds a marker for. Sorted, without
// duplicates.
func (h *harness) logicalKeys(raw []string) []string {
	set := map[string]bool{}
	for _, k := range raw {
		parts := strings.Split(k, ":")
		switch {
		case len(parts) == 4 && (parts[2] == "pending" || parts[2] == "inflight"):
			set[strings.Join(parts[:3], ":")] = true
		case len(parts) == 5 && parts[2] == "seen":
			fields, err := h.r.client.HKeys(context.Background(), h.prefix+k).Result()
			if err != nil {
				h.t.Fatalf("markers %s: %v", k, err)
			}
			for _, f := range fields {
				set[strings.Join(parts[:3], ":")+":"+f] = true
			}
		default:
			set[k] = true
		}
	}
	out := make([]string, 0, len(set))
	for k := range set {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// pendingKeys lists the pending and in-flight hashes left in Redis.
func (h *harness) pendingKeys() []string {
	var out []string
	for _, k := range h.keys() {
		if strings.HasSuffix(k, ":pending") || strings.HasSuffix(k, ":inflight") { // logicalKeys
			out = append(out, k)
		}
	}
	return out
}

// lastSeenColumn reads the time column of one row as UTC, "" for NULL, or
// "missing" when the row does not exist.
func lastSeenColumn(t testing.TB, db *gorm.DB, table, pk, col string, id any) string {
	t.Helper()
	var rows []struct{ V *time.Time }
	err := db.Table(table).Select(col+" AS v").Where(pk+" = ?", id).Scan(&rows).Error
	if err != nil {
		t.Fatalf("read %s.%s: %v", table, col, err)
	}
	switch {
	case len(rows) == 0:
		return "missing"
	case rows[0].V == nil:
		return ""
	}
	return rows[0].V.UTC().Format(time.RFC3339Nano)
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func equal[T comparable](t testing.TB, what string, got, want T) {
	t.Helper()
	if got != want {
		t.Errorf("%s = %v, want %v", what, got, want)
	}
}
