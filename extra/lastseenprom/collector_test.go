package lastseenprom

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/bsm/redislock"
	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/internal/testseam"
	"github.com/lastseen/lastseen/tests/testenv"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"
	"gorm.io/gorm"
)

var start = time.Date(2026, 3, 1, 9, 30, 0, 0, time.UTC)

// env is one plugin on a SQLite file and a miniredis.
type env struct {
	p     *lastseen.Plugin
	db    *gorm.DB
	r     *testenv.Redis
	clock *testenv.Clock
}

// member is a second tracked model, table "members".
type member struct {
	ID         uint64 `gorm:"primaryKey"`
	LastSeenAt *time.Time
}

// newEnv opens the plugin of userModel with rules (Config.Rules).
func newEnv(t *testing.T, userModel any, rules ...lastseen.Rule) *env {
	t.Helper()
	r := testenv.Miniredis().Open(t)
	db := testenv.SQLite().New(t).Open(t)
	must(t, db.AutoMigrate(userModel, &lastseen.Session{}))
	c := testenv.NewClock(start)
	p := testenv.Use(t, db, lastseen.Config{
		Redis:    r.Client,
		Model:    userModel,
		Logger:   testenv.Discard,
		Buffer:   lastseen.BufferConfig{Shards: 2, TouchTimeout: 2 * time.Second},
		Flush:    lastseen.FlushConfig{Schedule: "off"},
		Sessions: lastseen.SessionConfig{Schedule: "off"},
		Rules:    rules,
		Test:     lastseen.TestConfig{Now: c.Now, Seam: &testseam.Seam{PurgePause: -1}},
	})
	return &env{p: p, db: db, r: r, clock: c}
}

var must = testenv.Must

// register builds the collector on reg with a clock that steps 250ms per
// read, so that every observed run lasts exactly 0.25s, and a scrape
// timeout of a minute (opts may set another), so that a slow machine does
// not leave the buffer gauges out.
func register(t *testing.T, reg prometheus.Registerer, e *env, opts ...Option) *Collector {
	t.Helper()
	c, err := New(reg, e.p, append([]Option{WithScrapeTimeout(time.Minute)}, opts...)...)
	must(t, err)
	c.now = testenv.SteppingClock(start, 250*time.Millisecond).Now
	return c
}

// TestCollectorScrape runs a known sequence of touches, flushes and purges
// and compares the whole scrape of a pedantic registry, twice: with a full
// buffer and after the flush.
func TestCollectorScrape(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, &lastseen.User{})
	reg := prometheus.NewPedanticRegistry()
	register(t, reg, e, WithConstLabels(prometheus.Labels{"service": "api"}))
	must(t, e.db.Create(&[]lastseen.User{{ID: 1}, {ID: 2}}).Error)

	touch := func(id any) error { _, err := e.p.Touch(ctx, id); return err }
	must(t, touch(1))         // recorded
	must(t, touch(1))         // cached: the local cache answers
	must(t, touch(2))         // recorded
	must(t, touch(uint16(2))) // throttled: not a cached key type, Redis answers
	must(t, touch(3))         // recorded; no such row
	if err := touch("x"); !errors.Is(err, lastseen.ErrInvalidUserID) {
		t.Fatalf("touch x: %v, want ErrInvalidUserID", err)
	}
	e.r.Mini.SetError("LOADING Redis is loading the dataset in memory")
	if err := touch(4); err == nil { // error: kept in the backlog
		t.Fatal("touch 4 with Redis failing: no error")
	}
	e.r.Mini.SetError("")
	e.clock.Add(90 * time.Second)

	compareScrape(t, reg, "testdata/before_flush.prom")

	res, err := e.p.Flush(ctx) // users 1 and 2 written, 3 and the backlog's 4 unknown
	must(t, err)
	if res.Written != 2 || res.Unknown != 2 {
		t.Fatalf("flush: %+v, want 2 written and 2 unknown", res)
	}
	must(t, e.db.Create(&[]lastseen.Session{
		{ID: "a", UserID: 1, ExpiresAt: start}, {ID: "b", UserID: 1, ExpiresAt: start}, {ID: "z", UserID: 1, ExpiresAt: start.Add(time.Hour)},
	}).Error)
	_, err = e.p.PurgeExpiredSessions(ctx) // deletes a and b
	must(t, err)
	lock, err := redislock.New(e.r.Client).Obtain(ctx, e.p.Config().Buffer.Prefix+":purge:lock", time.Minute, nil) // the derived prefix
	must(t, err)
	if _, err := e.p.PurgeExpiredSessions(ctx); err != lastseen.ErrLocked {
		t.Fatalf("purge under another's lock: %v, want ErrLocked", err)
	}
	must(t, lock.Release(ctx))
	must(t, e.db.Migrator().DropTable(&lastseen.Session{}))
	if _, err := e.p.PurgeExpiredSessions(ctx); err == nil {
		t.Fatal("purge without a sessions table: no error")
	}

	compareScrape(t, reg, "testdata/after_flush_and_purges.prom")
}

var update = flag.Bool("update", false, "rewrite the testdata/*.prom files from the scrapes")

// compareScrape compares the whole scrape of reg with the golden file
// (Prometheus text format, HELP and TYPE lines included). With -update it
// rewrites the file instead: review the diff.
func compareScrape(t *testing.T, reg prometheus.Gatherer, golden string) {
	t.Helper()
	if *update {
		mfs, err := reg.Gather()
		must(t, err)
		var b bytes.Buffer
		for _, mf := range mfs {
			if _, err := expfmt.MetricFamilyToText(&b, mf); err != nil {
				t.Fatal(err)
			}
		}
		must(t, os.WriteFile(golden, b.Bytes(), 0o644))
		return
	}
	f, err := os.Open(golden)
	must(t, err)
	defer f.Close()
	must(t, testutil.GatherAndCompare(reg, f))
}

// TestTwoPluginsOneRegistry: plugins of two tracked models register on one
// registry, told apart by their table label; registering a plugin's table
// twice fails with prometheus.AlreadyRegisteredError and leaves the first
// registration working; a nil Registerer and an uninitialized plugin are
// refused.
func TestTwoPluginsOneRegistry(t *testing.T) {
	ctx := context.Background()
	users, members := newEnv(t, &lastseen.User{}), newEnv(t, &member{})
	reg := prometheus.NewPedanticRegistry()
	register(t, reg, users)
	register(t, reg, members)
	for _, id := range []int{1, 2} {
		_, err := users.p.Touch(ctx, id)
		must(t, err)
	}
	_, err := members.p.Touch(ctx, 7)
	must(t, err)

	_, err = New(reg, users.p)
	var dup prometheus.AlreadyRegisteredError
	if !errors.As(err, &dup) || !strings.HasPrefix(err.Error(), `lastseenprom: register table "users": `) {
		t.Errorf("second registration of users: err = %v, want a wrapped AlreadyRegisteredError", err)
	}
	must(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP lastseen_pending_users Users in the Redis pending hashes, waiting for the next flush (HLEN).
# TYPE lastseen_pending_users gauge
lastseen_pending_users{table="members"} 1
lastseen_pending_users{table="users"} 2
# HELP lastseen_touches_total Touch and TouchAt calls by result: recorded (opened a throttle window), throttled (Redis answered: inside a window), cached (the local cache answered), invalid (bad id or time), error (Redis did not answer; kept in the backlog or dropped).
# TYPE lastseen_touches_total counter
lastseen_touches_total{result="cached",table="members"} 0
lastseen_touches_total{result="cached",table="users"} 0
lastseen_touches_total{result="error",table="members"} 0
lastseen_touches_total{result="error",table="users"} 0
lastseen_touches_total{result="invalid",table="members"} 0
lastseen_touches_total{result="invalid",table="users"} 0
lastseen_touches_total{result="recorded",table="members"} 1
lastseen_touches_total{result="recorded",table="users"} 2
lastseen_touches_total{result="throttled",table="members"} 0
lastseen_touches_total{result="throttled",table="users"} 0
`), "lastseen_pending_users", "lastseen_touches_total"))

	if _, err := New(nil, users.p); err == nil || err.Error() != "lastseenprom: nil Registerer" {
		t.Errorf("nil Registerer: err = %v", err)
	}
	if _, err := New(prometheus.NewRegistry(), lastseen.New(lastseen.Config{})); !errors.Is(err, lastseen.ErrNotInitialized) {
		t.Errorf("uninitialized plugin: err = %v, want ErrNotInitialized", err)
	}
	for _, o := range []struct {
		opt  Option
		want string
	}{
		{WithBufferSample(-1), "lastseenprom: buffer sample is -1, want 0 to 1000"},
		{WithBufferSample(1001), "lastseenprom: buffer sample is 1001, want 0 to 1000"},
		{WithScrapeTimeout(0), "lastseenprom: scrape timeout is 0s, want a positive duration"},
	} {
		if _, err := New(prometheus.NewRegistry(), users.p, o.opt); err == nil || err.Error() != o.want {
			t.Errorf("option: err = %v, want %q", err, o.want)
		}
	}
}

// TestBufferReadError: a scrape whose Redis read fails leaves the buffer
// gauges out and counts the failure; WithBufferSample(0) leaves the oldest
// age out.
func TestBufferReadError(t *testing.T) {
	e := newEnv(t, &lastseen.User{})
	reg := prometheus.NewPedanticRegistry()
	register(t, reg, e, WithBufferSample(0))
	names := []string{"lastseen_buffer_read_errors_total", "lastseen_oldest_pending_age_seconds", "lastseen_pending_users", "lastseen_inflight_users"}
	const help = `
# HELP lastseen_buffer_read_errors_total Scrapes whose Redis read of the buffer failed; the buffer gauges are left out of those scrapes.
# TYPE lastseen_buffer_read_errors_total counter
`
	must(t, testutil.GatherAndCompare(reg, strings.NewReader(help+`lastseen_buffer_read_errors_total{table="users"} 0
# HELP lastseen_inflight_users Users in the Redis in-flight hashes: being written, or left by a failed flush (HLEN).
# TYPE lastseen_inflight_users gauge
lastseen_inflight_users{table="users"} 0
# HELP lastseen_pending_users Users in the Redis pending hashes, waiting for the next flush (HLEN).
# TYPE lastseen_pending_users gauge
lastseen_pending_users{table="users"} 0
`), names...))
	e.r.Mini.SetError("LOADING Redis is loading the dataset in memory")
	must(t, testutil.GatherAndCompare(reg, strings.NewReader(help+`lastseen_buffer_read_errors_total{table="users"} 1
`), names...))
	e.r.Mini.SetError("")
}

// token is the model of the rule tests: tracked by LastUsedAt, table
// "tokens".
type token struct {
	ID         uint64 `gorm:"primaryKey;autoIncrement:false"`
	LastUsedAt *time.Time
	CreatedAt  time.Time
}

// TestCollectorRules runs the rule "revoke" (90 days, batches of 2) on
// tokens 1 to 3, unused since 2025-11-01, and 4, used 2026-02-20: the
// first batch deletes 1 and 2; 3, touched before the run, is held back
// by the buffer, so its batch opens no transaction. A run under another
// instance's lock and one without the table follow. The scrape shows each
// outcome under the rule's label, the flush's ambiguous and uncomparable
// outcomes, and one duration per run that held the lock.
func TestCollectorRules(t *testing.T) {
	ctx := context.Background()
	r := testenv.Miniredis().Open(t)
	db := testenv.SQLite().New(t).Open(t)
	must(t, db.AutoMigrate(&token{}))
	c := testenv.NewClock(start)
	p := testenv.Use(t, db, lastseen.Config{
		Redis: r.Client, Model: &token{}, Field: "LastUsedAt", Logger: testenv.Discard,
		Buffer:   lastseen.BufferConfig{Shards: 2, TouchTimeout: 2 * time.Second},
		Flush:    lastseen.FlushConfig{Schedule: "off"},
		Sessions: lastseen.SessionConfig{Disabled: true},
		Rules:    []lastseen.Rule{{Name: "revoke", After: 90 * 24 * time.Hour, BatchSize: 2, Schedule: "off"}},
		Test:     lastseen.TestConfig{Now: c.Now, Seam: &testseam.Seam{PurgePause: -1}},
	})
	reg := prometheus.NewPedanticRegistry()
	register(t, reg, &env{p: p, db: db, r: r, clock: c})
	old, recent := time.Date(2025, 11, 1, 0, 0, 0, 0, time.UTC), time.Date(2026, 2, 20, 0, 0, 0, 0, time.UTC)
	must(t, db.Create(&[]token{{ID: 1, LastUsedAt: &old}, {ID: 2, LastUsedAt: &old}, {ID: 3, LastUsedAt: &old}, {ID: 4, LastUsedAt: &recent}}).Error)
	_, err := p.Touch(ctx, 3)
	must(t, err)

	res, err := p.RunRule(ctx, "revoke")
	must(t, err)
	if res.Deleted != 2 || res.Batches != 1 || res.Kept != 1 {
		t.Fatalf("run: %+v, want 2 deleted in 1 batch, 1 kept", res)
	}
	lock, err := redislock.New(r.Client).Obtain(ctx, p.Config().Buffer.Prefix+":rule:revoke:lock", time.Minute, nil)
	must(t, err)
	if _, err := p.RunRule(ctx, "revoke"); err != lastseen.ErrLocked {
		t.Fatalf("run under another's lock: %v, want ErrLocked", err)
	}
	must(t, lock.Release(ctx))
	must(t, db.Migrator().DropTable(&token{}))
	if _, err := p.RunRule(ctx, "revoke"); err == nil {
		t.Fatal("run without the tokens table: no error")
	}

	must(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP lastseen_flush_rows_total Buffered entries a flush took, by outcome: written (the column moved forward), unknown (no such row, Update mode), stale (the column was as new), rejected (unreadable, dropped), failed (refused by the database, back in pending), uncomparable (the column could not be compared with), ambiguous (in an hour a DST fall-back repeats, on a naive MySQL column: left unwritten).
# TYPE lastseen_flush_rows_total counter
lastseen_flush_rows_total{outcome="ambiguous",table="tokens"} 0
lastseen_flush_rows_total{outcome="failed",table="tokens"} 0
lastseen_flush_rows_total{outcome="rejected",table="tokens"} 0
lastseen_flush_rows_total{outcome="stale",table="tokens"} 0
lastseen_flush_rows_total{outcome="uncomparable",table="tokens"} 0
lastseen_flush_rows_total{outcome="unknown",table="tokens"} 0
lastseen_flush_rows_total{outcome="written",table="tokens"} 0
# HELP lastseen_rule_refused_rows_total Inactive rows the database refused to act on, skipped, by rule.
# TYPE lastseen_rule_refused_rows_total counter
lastseen_rule_refused_rows_total{rule="revoke",table="tokens"} 0
# HELP lastseen_last_successful_rule_run_timestamp_seconds Unix time at which the last run of the rule without error ended, on the plugin's clock, by rule; absent before the first.
# TYPE lastseen_last_successful_rule_run_timestamp_seconds gauge
lastseen_last_successful_rule_run_timestamp_seconds{rule="revoke",table="tokens"} 1.7723574e+09
# HELP lastseen_rule_acted_rows_total Inactive rows rule runs acted on (deleted, or handed to the rule's Action), by rule.
# TYPE lastseen_rule_acted_rows_total counter
lastseen_rule_acted_rows_total{rule="revoke",table="tokens"} 2
# HELP lastseen_rule_batches_total Transactions rule runs committed, by rule; a batch whose rows were all held back by buffered activity opens none.
# TYPE lastseen_rule_batches_total counter
lastseen_rule_batches_total{rule="revoke",table="tokens"} 1
# HELP lastseen_rule_duration_seconds Duration of inactivity rule runs that held the rule's lock, by rule and result: ok or error.
# TYPE lastseen_rule_duration_seconds histogram
lastseen_rule_duration_seconds_bucket{result="error",rule="revoke",table="tokens",le="0.1"} 0
lastseen_rule_duration_seconds_bucket{result="error",rule="revoke",table="tokens",le="0.5"} 1
lastseen_rule_duration_seconds_bucket{result="error",rule="revoke",table="tokens",le="1"} 1
lastseen_rule_duration_seconds_bucket{result="error",rule="revoke",table="tokens",le="5"} 1
lastseen_rule_duration_seconds_bucket{result="error",rule="revoke",table="tokens",le="10"} 1
lastseen_rule_duration_seconds_bucket{result="error",rule="revoke",table="tokens",le="30"} 1
lastseen_rule_duration_seconds_bucket{result="error",rule="revoke",table="tokens",le="60"} 1
lastseen_rule_duration_seconds_bucket{result="error",rule="revoke",table="tokens",le="300"} 1
lastseen_rule_duration_seconds_bucket{result="error",rule="revoke",table="tokens",le="900"} 1
lastseen_rule_duration_seconds_bucket{result="error",rule="revoke",table="tokens",le="1800"} 1
lastseen_rule_duration_seconds_bucket{result="error",rule="revoke",table="tokens",le="3600"} 1
lastseen_rule_duration_seconds_bucket{result="error",rule="revoke",table="tokens",le="+Inf"} 1
lastseen_rule_duration_seconds_sum{result="error",rule="revoke",table="tokens"} 0.25
lastseen_rule_duration_seconds_count{result="error",rule="revoke",table="tokens"} 1
lastseen_rule_duration_seconds_bucket{result="ok",rule="revoke",table="tokens",le="0.1"} 0
lastseen_rule_duration_seconds_bucket{result="ok",rule="revoke",table="tokens",le="0.5"} 1
lastseen_rule_duration_seconds_bucket{result="ok",rule="revoke",table="tokens",le="1"} 1
lastseen_rule_duration_seconds_bucket{result="ok",rule="revoke",table="tokens",le="5"} 1
lastseen_rule_duration_seconds_bucket{result="ok",rule="revoke",table="tokens",le="10"} 1
lastseen_rule_duration_seconds_bucket{result="ok",rule="revoke",table="tokens",le="30"} 1
lastseen_rule_duration_seconds_bucket{result="ok",rule="revoke",table="tokens",le="60"} 1
lastseen_rule_duration_seconds_bucket{result="ok",rule="revoke",table="tokens",le="300"} 1
lastseen_rule_duration_seconds_bucket{result="ok",rule="revoke",table="tokens",le="900"} 1
lastseen_rule_duration_seconds_bucket{result="ok",rule="revoke",table="tokens",le="1800"} 1
lastseen_rule_duration_seconds_bucket{result="ok",rule="revoke",table="tokens",le="3600"} 1
lastseen_rule_duration_seconds_bucket{result="ok",rule="revoke",table="tokens",le="+Inf"} 1
lastseen_rule_duration_seconds_sum{result="ok",rule="revoke",table="tokens"} 0.25
lastseen_rule_duration_seconds_count{result="ok",rule="revoke",table="tokens"} 1
# HELP lastseen_rule_kept_rows_total Inactive rows rule runs left because their newer activity was still buffered (or the buffer could not be read), by rule.
# TYPE lastseen_rule_kept_rows_total counter
lastseen_rule_kept_rows_total{rule="revoke",table="tokens"} 1
# HELP lastseen_rule_runs_total Inactivity rule runs by rule and result: ok, error, or locked (another instance held the rule's lock).
# TYPE lastseen_rule_runs_total counter
lastseen_rule_runs_total{result="error",rule="revoke",table="tokens"} 1
lastseen_rule_runs_total{result="locked",rule="revoke",table="tokens"} 1
lastseen_rule_runs_total{result="ok",rule="revoke",table="tokens"} 1
`), "lastseen_flush_rows_total", "lastseen_last_successful_rule_run_timestamp_seconds", "lastseen_rule_acted_rows_total",
		"lastseen_rule_batches_total", "lastseen_rule_duration_seconds", "lastseen_rule_kept_rows_total", "lastseen_rule_refused_rows_total", "lastseen_rule_runs_total"))
}

// TestCollectorDropped: without Redis, and a database that refuses every
// write (SQLite PRAGMA query_only on its one connection), the timestamps
// in the in-process buffer are lost at Close; the collector reports them.
func TestCollectorDropped(t *testing.T) {
	ctx := context.Background()
	db := testenv.SQLite().New(t).Open(t)
	must(t, db.AutoMigrate(&lastseen.User{}))
	p := lastseen.New(lastseen.Config{
		Logger:   testenv.Discard,
		Flush:    lastseen.FlushConfig{Schedule: "off"},
		Sessions: lastseen.SessionConfig{Disabled: true},
	})
	must(t, db.Use(p))
	reg := prometheus.NewPedanticRegistry()
	register(t, reg, &env{p: p, db: db})
	for id := 1; id <= 3; id++ {
		_, err := p.Touch(ctx, id)
		must(t, err)
	}
	sqlDB, err := db.DB()
	must(t, err)
	sqlDB.SetMaxOpenConns(1)
	must(t, db.Exec("PRAGMA query_only = ON").Error)
	if err := p.Close(ctx); err == nil || !strings.Contains(err.Error(), "3 timestamps lost") {
		t.Fatalf("Close: %v, want 3 timestamps lost", err)
	}
	must(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP lastseen_flush_dropped_total Buffered timestamps dropped for good: refused by the database Flush.MaxRefusals times (each refusal also counted failed), or left in the in-process buffer at Close.
# TYPE lastseen_flush_dropped_total counter
lastseen_flush_dropped_total{table="users"} 3
`), "lastseen_flush_dropped_total"))
}
