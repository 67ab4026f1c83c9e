// Package testenv holds the CLI tests' shared helpers: the services given
// by the same environment variables as the library's tests, and exact
// assertions.
package testenv

import (
	"os"
	"testing"
)

// The environment variables of the services: unset, a test that needs the
// service skips; with LASTSEEN_REQUIRE_SERVICES set, that skip is a failure.
const (
	Postgres     = "LASTSEEN_POSTGRES_DSN"
	MySQL        = "LASTSEEN_MYSQL_DSN"
	Redis        = "LASTSEEN_REDIS_ADDR"
	RedisCluster = "LASTSEEN_REDIS_CLUSTER"
	Require      = "LASTSEEN_REQUIRE_SERVICES"
)

// Need returns the value of the service variable env, or skips the test
// (fails it when Require is set).
func Need(t testing.TB, env string) string {
	t.Helper()
	v := os.Getenv(env)
	if v == "" {
		if os.Getenv(Require) != "" {
			t.Fatalf("%s is not set but %s is: this test must run", env, Require)
		}
		t.Skipf("%s not set", env)
	}
	return v
}

// Must fails the test now on a non-nil error.
func Must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// Equal reports got != want as an error naming what.
func Equal[T comparable](t testing.TB, what string, got, want T) {
	t.Helper()
	if got != want {
		t.Errorf("%s = %v, want %v", what, got, want)
	}
}
