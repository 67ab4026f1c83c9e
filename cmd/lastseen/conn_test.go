package main

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/lastseen/lastseen/cmd/lastseen/internal/runenv"
	"github.com/lastseen/lastseen/cmd/lastseen/internal/testenv"
	"github.com/redis/go-redis/v9"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

func mustTime(s string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		panic(err)
	}
	return t.UTC()
}

var (
	must  = testenv.Must
	needs = testenv.Need
)

func equal[T comparable](t testing.TB, what string, got, want T) {
	t.Helper()
	testenv.Equal(t, what, got, want)
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
	dsn := needs(t, testenv.Postgres)
	admin, err := gorm.Open(postgres.Open(dsn), quiet())
	must(t, err)
	schema := runenv.RandomName("cli_")
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
	dsn := needs(t, testenv.MySQL)
	admin, err := gorm.Open(mysql.Open(dsn), quiet())
	must(t, err)
	name := runenv.RandomName("lastseen_cli_")
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

// runExit runs the CLI as main does, with now as the operator commands'
// clock, and returns what it printed and its exit code.
func runExit(t testing.TB, now func() time.Time, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errOut bytes.Buffer
	var c cli
	c.Status.now, c.Flush.now, c.Purge.now = now, now, now
	code = run(&c, args, &out, &errOut)
	return out.String(), errOut.String(), code
}

// runCLI runs the CLI and returns its output, and its stderr as an error
// when it exits non-zero.
func runCLI(t testing.TB, now func() time.Time, args ...string) (string, error) {
	t.Helper()
	out, errOut, code := runExit(t, now, args...)
	if code != 0 {
		return out, errors.New(strings.TrimSuffix(errOut, "\n"))
	}
	return out, nil
}

// lines splits output into lines without the final newline.
func lines(s string) []string { return strings.Split(strings.TrimSuffix(s, "\n"), "\n") }
