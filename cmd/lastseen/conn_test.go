package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alecthomas/kong"
	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// The same environment variables as the library's tests: unset, the tests
// that need a server skip; with LASTSEEN_REQUIRE_SERVICES=1 that skip is a
// failure.
const (
	envPostgres = "LASTSEEN_POSTGRES_DSN"
	envMySQL    = "LASTSEEN_MYSQL_DSN"
	envRedis    = "LASTSEEN_REDIS_ADDR"
	envRequire  = "LASTSEEN_REQUIRE_SERVICES"
)

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

func mustTime(s string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		panic(err)
	}
	return t.UTC()
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

// testDB is an isolated database of one dialect, as the CLI's flags and as
// a GORM handle for the test's own setup and checks.
type testDB struct {
	name  string
	flags []string // --sqlite PATH, --postgres DSN or --mysql DSN
	open  func(t testing.TB, cfg *gorm.Config) *gorm.DB
}

func quiet() *gorm.Config { return &gorm.Config{Logger: logger.Discard} }

// dbOpeners are the dialects: an isolated SQLite file, and a PostgreSQL
// schema and a MySQL database of the test's own when their variables are
// set.
var dbOpeners = []struct {
	name string
	open func(t testing.TB) testDB
}{{"sqlite", sqliteDB}, {"postgres", postgresDB}, {"mysql", mysqlDB}}

func sqliteDB(t testing.TB) testDB {
	path := filepath.Join(t.TempDir(), "app.db")
	c := connFlags{SQLite: path}
	return testDB{name: "sqlite", flags: []string{"--sqlite", path}, open: func(t testing.TB, cfg *gorm.Config) *gorm.DB {
		db, err := c.openDB(context.Background(), cfg.NamingStrategy)
		must(t, err)
		t.Cleanup(func() { closeDB(db) })
		return db
	}}
}

func postgresDB(t testing.TB) testDB {
	dsn := needService(t, envPostgres)
	admin, err := gorm.Open(postgres.Open(dsn), quiet())
	must(t, err)
	schema := randomName("cli_")
	must(t, admin.Exec("CREATE SCHEMA "+schema).Error)
	t.Cleanup(func() {
		admin.Exec("DROP SCHEMA " + schema + " CASCADE")
		closeDB(admin)
	})
	own := dsn + " search_path=" + schema
	return testDB{name: "postgres", flags: []string{"--postgres", own}, open: func(t testing.TB, cfg *gorm.Config) *gorm.DB {
		db, err := gorm.Open(postgres.Open(own), cfg)
		must(t, err)
		t.Cleanup(func() { closeDB(db) })
		return db
	}}
}

func mysqlDB(t testing.TB) testDB {
	dsn := needService(t, envMySQL)
	admin, err := gorm.Open(mysql.Open(dsn), quiet())
	must(t, err)
	name := randomName("lastseen_cli_")
	must(t, admin.Exec("CREATE DATABASE "+name).Error)
	t.Cleanup(func() {
		admin.Exec("DROP DATABASE " + name)
		closeDB(admin)
	})
	slash, q := strings.Index(dsn, "/"), strings.Index(dsn, "?")
	if q < 0 {
		q = len(dsn)
	}
	own := dsn[:slash+1] + name + dsn[q:]
	return testDB{name: "mysql", flags: []string{"--mysql", own}, open: func(t testing.TB, cfg *gorm.Config) *gorm.DB {
		db, err := gorm.Open(mysql.Open(own), cfg)
		must(t, err)
		t.Cleanup(func() { closeDB(db) })
		return db
	}}
}

// forEachDB runs fn on every dialect, skipping those without a server.
func forEachDB(t *testing.T, fn func(t *testing.T, d testDB)) {
	for _, o := range dbOpeners {
		t.Run(o.name, func(t *testing.T) { fn(t, o.open(t)) })
	}
}

// testRedis starts an in-process miniredis for one test.
func testRedis(t testing.TB) (*miniredis.Miniredis, redis.UniversalClient) {
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { c.Close() })
	return mr, c
}

// fixedClock is a settable clock for the commands and the app's plugin.
type fixedClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fixedClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fixedClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

// runCLI parses args with the real command line and runs the command,
// with its output in the returned buffer and now as its clock.
func runCLI(t testing.TB, now func() time.Time, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	var c cli
	c.Status.out, c.Status.now = &out, now
	c.Flush.out, c.Flush.now = &out, now
	c.Purge.out, c.Purge.now = &out, now
	c.Demo.out = &out
	parser, err := kong.New(&c, kong.Name("lastseen"), kong.Exit(func(code int) { t.Fatalf("kong exit %d", code) }))
	must(t, err)
	kctx, err := parser.Parse(args)
	if err != nil {
		return "", err
	}
	err = kctx.Run()
	return out.String(), err
}

// lines splits output into lines without the final newline.
func lines(s string) []string { return strings.Split(strings.TrimSuffix(s, "\n"), "\n") }
