package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/lastseen/lastseen/tests/testenv"
	"github.com/redis/go-redis/v9"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

var (
	must     = testenv.Must
	needs    = testenv.Need
	mustTime = testenv.MustTime
)

func equal[T comparable](t testing.TB, what string, got, want T) {
	t.Helper()
	testenv.Equal(t, what, got, want)
}

// servers are the PostgreSQL and MySQL dialects with their GORM drivers.
var servers = testenv.Servers{PostgresDriver: postgres.Open, MySQLDriver: mysql.Open}

func quiet() *gorm.Config { return &gorm.Config{Logger: logger.Discard} }

// forEachDB runs fn on every dialect, skipping those without a server.
func forEachDB(t *testing.T, fn func(t *testing.T, d *testenv.DB)) {
	for _, o := range servers.Dialects() {
		t.Run(o.Name, func(t *testing.T) { fn(t, o.New(t)) })
	}
}

// testRedis starts an in-process miniredis for one test.
func testRedis(t testing.TB) (*miniredis.Miniredis, redis.UniversalClient) {
	r := testenv.Miniredis().Open(t)
	return r.Mini, r.Client
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

// TestOperatorReplyTimeout: an operator command waits 10s for a Redis
// reply (go-redis's default, 3s, failed statuses on a busy Redis), unless
// the redis:// URL sets its own read_timeout and write_timeout.
func TestOperatorReplyTimeout(t *testing.T) {
	mr := miniredis.RunT(t)
	for _, c := range []struct {
		flag        string
		read, write time.Duration
	}{
		{mr.Addr(), 10 * time.Second, 10 * time.Second},
		{"redis://" + mr.Addr() + "/0", 10 * time.Second, 10 * time.Second},
		{"redis://" + mr.Addr() + "/0?read_timeout=2s&write_timeout=1s", 2 * time.Second, time.Second},
	} {
		rdb, err := (&connFlags{Redis: c.flag}).openRedis(t.Context())
		must(t, err)
		opt := rdb.(*redis.Client).Options()
		equal(t, c.flag+": read timeout", opt.ReadTimeout, c.read)
		equal(t, c.flag+": write timeout", opt.WriteTimeout, c.write)
		must(t, rdb.Close())
	}
}
