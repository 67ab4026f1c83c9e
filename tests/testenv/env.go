// Package testenv is the one test helper package of the lastseen modules:
// the library's black-box tests (tests/), the CLI's tests (cmd/lastseen)
// and the integrations' tests (extra/*) open their databases and Redis
// servers through it, from the same environment variables, and share its
// settable clock, log capture, Redis key cleanup and random names.
//
// The environment matrix: SQLite (a temporary file) and miniredis always
// run; PostgreSQL, MySQL, a Redis server and a Redis Cluster run when their
// LASTSEEN_* variable is set, and a test that needs one skips with a
// one-line reason when it is not. With LASTSEEN_REQUIRE_SERVICES set (as
// .ci/run sets it) such a skip is a failure instead.
//
// It does not import the PostgreSQL and MySQL drivers: the tests that run
// on those servers hand them in (Servers), so that the extra/* modules,
// whose tests use only SQLite and miniredis, do not require them.
//
// The root package's own in-package tests do not use it: importing it
// from the library's module would add the tests module (and its
// requirements) to the library's go.mod.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"

	"github.com/redis/go-redis/v9"
)

// The environment variables of the services, with the values .ci/run
// exports for the services on this machine.
const (
	EnvPostgres     = "LASTSEEN_POSTGRES_DSN"  // host=127.0.0.1 port=5432 user=postgres dbname=lastseen_test sslmode=disable
	EnvMySQL        = "LASTSEEN_MYSQL_DSN"     // root@tcp(127.0.0.1:3306)/lastseen_test?parseTime=true
	EnvRedis        = "LASTSEEN_REDIS_ADDR"    // 127.0.0.1:6379
	EnvRedisCluster = "LASTSEEN_REDIS_CLUSTER" // 127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003 (comma-separated seeds)
	EnvRequire      = "LASTSEEN_REQUIRE_SERVICES"
)

// Need returns the value of the service variable env. Unset, it skips the
// test, or fails it when EnvRequire is set to anything non-empty.
func Need(t testing.TB, env string) string {
	t.Helper()
	v := os.Getenv(env)
	if v == "" {
		if os.Getenv(EnvRequire) != "" {
			t.Fatalf("%s is not set but %s is: this test must run", env, EnvRequire)
		}
		t.Skipf("%s not set", env)
	}
	return v
}

// RandomName returns prefix followed by 10 random hex digits (40 bits), for
// a schema, database, table or Redis key prefix of a test's own.
func RandomName(prefix string) string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// QuietRedisLog silences go-redis's pool logger for the whole test binary
// (call it from TestMain): the outage tests make it print "failed to dial"
// lines by the dozen, which bury a real failure. What the plugin itself
// logs goes to each test's own logger.
func QuietRedisLog() { redis.SetLogger(discardRedisLog{}) }

type discardRedisLog struct{}

func (discardRedisLog) Printf(context.Context, string, ...any) {}

// Must fails the test now on a non-nil error.
func Must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// Equal reports got != want as an error naming what, and lets the test go
// on.
func Equal[T comparable](t testing.TB, what string, got, want T) {
	t.Helper()
	if got != want {
		t.Errorf("%s = %v, want %v", what, got, want)
	}
}
