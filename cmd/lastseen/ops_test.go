package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/internal/keys"
	"github.com/lastseen/lastseen/tests/testenv"
	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"
)

// opsRedisKinds are the Redis kinds of the ops tests: miniredis and a real
// Redis.
var opsRedisKinds = []testenv.RedisKind{testenv.Miniredis(), testenv.RedisServer()}

// forEachOpsEnv runs fn for every dialect with miniredis and a real Redis,
// with a key prefix whose keys are removed at cleanup.
func forEachOpsEnv(t *testing.T, fn func(t *testing.T, d *testenv.DB, r *testenv.Redis, prefix string)) {
	for _, rk := range opsRedisKinds {
		for _, o := range servers.Dialects() {
			t.Run(o.Name+"/"+rk.Name, func(t *testing.T) {
				r := rk.Open(t)
				d := o.New(t)
				fn(t, d, r, testenv.KeyPrefix(t, r.Client))
			})
		}
	}
}

// discard drops the plugin's logs in tests that do not read them.
var discard = testenv.Discard

// appConfig is the Config of the app whose buffer the commands operate on:
// its Redis and Prefix, a 1m throttle window, nothing scheduled (the tests
// flush and purge by hand), and the tests' clock.
func appConfig(rdb redis.UniversalClient, prefix string, now func() time.Time) lastseen.Config {
	return lastseen.Config{
		Redis:    rdb,
		Throttle: time.Minute,
		Logger:   discard,
		Buffer:   lastseen.BufferConfig{Prefix: prefix, TouchTimeout: 2 * time.Second},
		Flush:    lastseen.FlushConfig{Schedule: "off"},
		Sessions: lastseen.SessionConfig{Schedule: "off"},
		Test:     lastseen.TestConfig{Now: now},
	}
}

// shardTable is the status command's table: 16 shards, the given ones with
// their figures, every other one empty.
func shardTable(rows map[int]string, total string) []string {
	out := []string{"shard  pending  in-flight  oldest"}
	for i := range 16 {
		if r, ok := rows[i]; ok {
			out = append(out, fmt.Sprintf("%-7d%s", i, r))
			continue
		}
		out = append(out, fmt.Sprintf("%-7d0        0          -", i))
	}
	return append(out, "total  "+total)
}

func equalLines(t testing.TB, what string, got string, want []string) {
	t.Helper()
	g := lines(got)
	if strings.Join(g, "\n") != strings.Join(want, "\n") {
		t.Errorf("%s output:\n%s\nwant:\n%s", what, strings.Join(g, "\n"), strings.Join(want, "\n"))
	}
}

// splitDuration checks that the last line is "duration  <a Go duration>"
// and returns the other lines.
func splitDuration(t testing.TB, out string) string {
	t.Helper()
	ls := lines(out)
	last := ls[len(ls)-1]
	v, ok := strings.CutPrefix(last, "duration  ")
	if !ok {
		t.Fatalf("last line %q is not the duration", last)
	}
	if _, err := time.ParseDuration(v); err != nil {
		t.Errorf("duration %q: %v", v, err)
	}
	return strings.Join(ls[:len(ls)-1], "\n") + "\n"
}

// TestOpsDefaultModels runs status, flush and purge against the plugin's
// own models (lastseen.User, lastseen.Session) after an app plugin touched
// users: user ids 9 and 10 fall in shard 4, 2 in shard 5, 99 (no such user)
// in 7 and 1 in 12.
func TestOpsDefaultModels(t *testing.T) {
	forEachOpsEnv(t, func(t *testing.T, d *testenv.DB, r *testenv.Redis, prefix string) {
		ctx := context.Background()
		clock := testenv.ClockAt("2026-03-01T09:30:00Z")
		app := d.Open(t)
		must(t, app.AutoMigrate(&lastseen.User{}, &lastseen.Session{}))
		must(t, app.Create(&[]lastseen.User{{ID: 1}, {ID: 2}, {ID: 9}, {ID: 10}, {ID: 11}}).Error)
		must(t, app.Create(&[]lastseen.Session{
			{ID: "s1", UserID: 1, ExpiresAt: mustTime("2026-02-28T09:30:00Z")},
			{ID: "s2", UserID: 1, ExpiresAt: mustTime("2026-03-01T09:29:59Z")},
			{ID: "s3", UserID: 2, ExpiresAt: mustTime("2026-03-01T09:30:00Z")}, // expires now: expired
			{ID: "s4", UserID: 2, ExpiresAt: mustTime("2026-03-01T09:30:01Z")},
		}).Error)
		p := lastseen.New(appConfig(r.Client, prefix, clock.Now))
		must(t, app.Use(p))
		for _, touch := range []struct {
			id uint64
			at string
		}{{9, "2026-03-01T09:00:00Z"}, {10, "2026-03-01T09:10:00Z"}, {2, "2026-03-01T09:20:00Z"},
			{99, "2026-03-01T09:25:00Z"}, {1, "2026-03-01T09:29:30Z"}} {
			_, err := p.TouchAt(ctx, touch.id, mustTime(touch.at))
			must(t, err)
		}
		flags := append(append([]string{}, d.Flags()...), append([]string{"--redis", r.Addr}, "--prefix", prefix)...)
		run := func(args ...string) string {
			t.Helper()
			out, err := runCLI(t, clock.Now, append(args, flags...)...)
			if err != nil {
				t.Fatalf("%s: %v\n%s", args[0], err, out)
			}
			return out
		}

		out := run("status")
		policy := "redis maxmemory-policy: noeviction"
		if r.Mini != nil { // neither CONFIG nor INFO memory
			policy = "redis maxmemory-policy: unknown"
		}
		want := append([]string{fmt.Sprintf("redis buffer (prefix %q, 16 shards, users.last_seen_at) at 2026-03-01T09:30:00Z", prefix), policy},
			shardTable(map[int]string{
				4:  "2        0          2026-03-01T09:00:00Z (30m0s ago)",
				5:  "1        0          2026-03-01T09:20:00Z (10m0s ago)",
				7:  "1        0          2026-03-01T09:25:00Z (5m0s ago)",
				12: "1        0          2026-03-01T09:29:30Z (30s ago)",
			}, "5        0          2026-03-01T09:00:00Z (30m0s ago)")...)
		want = append(append(want, healthLines(d.Dialect)...), `expired sessions in "sessions": 3, oldest expiry 2026-02-28T09:30:00Z (24h0m0s ago)`)
		equalLines(t, "status", settled(out), want)

		out = run("flush")
		equalLines(t, "flush", splitDuration(t, out), []string{
			"drained   5",
			"written   4",
			"unknown   1",
			"stale     0",
			"rejected  0",
			"failed    0",
			"batches   4",
			"shards    4",
			"skipped   0",
		})
		for id, want := range map[uint64]string{1: "2026-03-01T09:29:30Z", 2: "2026-03-01T09:20:00Z",
			9: "2026-03-01T09:00:00Z", 10: "2026-03-01T09:10:00Z", 11: "NULL"} {
			var u lastseen.User
			must(t, app.First(&u, id).Error)
			got := "NULL"
			if u.LastSeenAt != nil {
				got = u.LastSeenAt.UTC().Format(time.RFC3339)
			}
			equal(t, fmt.Sprintf("user %d last_seen_at", id), got, want)
		}
		var ghosts int64
		must(t, app.Model(&lastseen.User{}).Where("id = ?", 99).Count(&ghosts).Error)
		equal(t, "rows for unknown user 99", ghosts, 0)

		out = run("status")
		want = append([]string{fmt.Sprintf("redis buffer (prefix %q, 16 shards, users.last_seen_at) at 2026-03-01T09:30:00Z", prefix), policy},
			shardTable(nil, "0        0          -")...)
		want = append(append(want, healthLines(d.Dialect)...), `expired sessions in "sessions": 3, oldest expiry 2026-02-28T09:30:00Z (24h0m0s ago)`)
		equalLines(t, "status after flush", settled(out), want)

		equalLines(t, "purge --dry-run", run("purge", "--dry-run"), []string{
			"dry run  nothing deleted",
			"cutoff   2026-03-01T09:30:00Z",
			"expired  3",
			"kept     0",
			"oldest   2026-02-28T09:30:00Z (24h0m0s ago)",
		})
		out = run("purge")
		equalLines(t, "purge", splitDuration(t, out), []string{
			"deleted   3",
			"batches   1",
			"cutoff    2026-03-01T09:30:00Z",
			"stopped   false",
		})
		var left []string
		must(t, app.Model(&lastseen.Session{}).Order("id").Pluck("id", &left).Error)
		equal(t, "sessions left", strings.Join(left, ","), "s4")
		equalLines(t, "purge --dry-run after purge", run("purge", "--dry-run"), []string{
			"dry run  nothing deleted",
			"cutoff   2026-03-01T09:30:00Z",
			"expired  0",
			"kept     0",
			"oldest   -",
		})
	})
}

// account and appSession are an app's own models: a string primary key, a
// required column and a custom last-seen column; a gorm.Model session with
// soft delete, a token column and a custom expiry column.
type account struct {
	ID     string `gorm:"primaryKey;size:36"`
	Email  string `gorm:"not null;size:190"`
	SeenAt int64  `lastseen:"unix"`
}

func (account) TableName() string { return "accounts" }

type appSession struct {
	gorm.Model
	Token      string    `gorm:"uniqueIndex;size:64;not null"`
	ValidUntil time.Time `gorm:"index;not null"`
}

func (appSession) TableName() string { return "app_sessions" }

// TestOpsAppModels: the commands find the app's own tables, columns, key
// types and encodings in the buffer's manifest, with no flag but the
// connections: the flush writes the app's Unix-seconds column and the
// purge deletes expired sessions, soft-deleted ones included.
func TestOpsAppModels(t *testing.T) {
	forEachDB(t, func(t *testing.T, d *testenv.DB) {
		ctx := context.Background()
		clock := testenv.ClockAt("2026-03-01T12:00:00Z")
		mr, rdb := testRedis(t)
		app := d.Open(t)
		must(t, app.AutoMigrate(&account{}, &appSession{}))
		must(t, app.Create(&[]account{{ID: "6f1c0d9e-0000-4000-8000-000000000001", Email: "a@example.test"},
			{ID: "6f1c0d9e-0000-4000-8000-000000000002", Email: "b@example.test"}}).Error)
		sessions := []appSession{
			{Token: "t1", ValidUntil: mustTime("2026-03-01T11:00:00Z")},
			{Token: "t2", ValidUntil: mustTime("2026-03-01T11:59:59Z")},
			{Token: "t3", ValidUntil: mustTime("2026-03-01T12:00:01Z")},
			{Token: "t4", ValidUntil: mustTime("2026-03-02T00:00:00Z")},
		}
		must(t, app.Create(&sessions).Error)
		must(t, app.Delete(&sessions[1]).Error) // soft-deleted and expired
		must(t, app.Delete(&sessions[3]).Error) // soft-deleted, live

		p := lastseen.New(lastseen.Config{
			Redis:    rdb,
			Logger:   discard,
			Model:    &account{},
			Field:    "SeenAt",
			Buffer:   lastseen.BufferConfig{TouchTimeout: 2 * time.Second},
			Flush:    lastseen.FlushConfig{Schedule: "off"},
			Sessions: lastseen.SessionConfig{Schedule: "off", Model: &appSession{}, ExpiresField: "ValidUntil"},
			Test:     lastseen.TestConfig{Now: clock.Now},
		})
		must(t, app.Use(p))
		_, err := p.TouchAt(ctx, "6f1c0d9e-0000-4000-8000-000000000002", mustTime("2026-03-01T11:58:00Z"))
		must(t, err)

		flags := append(append([]string{}, d.Flags()...), "--redis", mr.Addr())
		run := func(args ...string) string {
			t.Helper()
			out, err := runCLI(t, clock.Now, append(args, flags...)...)
			if err != nil {
				t.Fatalf("%s: %v\n%s", args[0], err, out)
			}
			return out
		}
		out := run("flush")
		equalLines(t, "flush", splitDuration(t, out), []string{
			"drained   1",
			"written   1",
			"unknown   0",
			"stale     0",
			"rejected  0",
			"failed    0",
			"batches   1",
			"shards    1",
			"skipped   0",
		})
		var accounts []account
		must(t, app.Order("id").Find(&accounts).Error)
		equal(t, "accounts", len(accounts), 2)
		equal(t, "account 1 seen_at", accounts[0].SeenAt, 0)
		equal(t, "account 2 seen_at", accounts[1].SeenAt, mustTime("2026-03-01T11:58:00Z").Unix())

		equalLines(t, "purge --dry-run", run("purge", "--dry-run"), []string{
			"dry run  nothing deleted",
			"cutoff   2026-03-01T12:00:00Z",
			"expired  2",
			"kept     0",
			"oldest   2026-03-01T11:00:00Z (1h0m0s ago)",
		})
		equalLines(t, "purge", splitDuration(t, run("purge")), []string{
			"deleted   2",
			"batches   1",
			"cutoff    2026-03-01T12:00:00Z",
			"stopped   false",
		})
		var tokens []string
		must(t, app.Unscoped().Model(&appSession{}).Order("token").Pluck("token", &tokens).Error)
		equal(t, "sessions left (unscoped)", strings.Join(tokens, ","), "t3,t4")
	})
}

// TestOpsErrors: every mistake an operator can make with the flags gets an
// error naming it.
func TestOpsErrors(t *testing.T) {
	mr, _ := testRedis(t)
	d := testenv.SQLite().New(t)
	app := d.Open(t)
	must(t, app.AutoMigrate(&lastseen.User{}))
	now := func() time.Time { return mustTime("2026-03-01T09:30:00Z") }
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"status", "--redis", mr.Addr()}, "lastseen: no database: give one of --postgres, --mysql or --sqlite"},
		{append([]string{"flush"}, d.Flags()...), "lastseen: no redis: give --redis or --redis-cluster"},
		{append([]string{"status"}, d.Flags()...), "lastseen: no redis: give --redis or --redis-cluster"},
		{append([]string{"flush", "--redis", "127.0.0.1:1"}, d.Flags()...), "lastseen: redis 127.0.0.1:1 does not answer: "},
		{append([]string{"purge", "--expires-column", "ends_at"}, d.Flags()...), `lastseen: table "sessions" not found (set --sessions-table)`},
	} {
		_, err := runCLI(t, now, c.args...)
		if err == nil || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("%v: error %v, want %q", c.args, err, c.want)
		}
	}
	must(t, app.AutoMigrate(&lastseen.Session{}))
	_, err := runCLI(t, now, append([]string{"purge", "--expires-column", "ends_at"}, d.Flags()...)...)
	equal(t, "purge --expires-column ends_at", fmt.Sprint(err), `lastseen: table "sessions" has no column "ends_at" (set --expires-column)`)
	_, err = runCLI(t, now, append([]string{"purge", "--idle-timeout", "30m", "--active-column", "seen"}, d.Flags()...)...)
	equal(t, "purge --active-column seen", fmt.Sprint(err), `lastseen: table "sessions" has no column "seen" (set --active-column)`)
	must(t, app.Exec("CREATE TABLE unix_sessions (id text PRIMARY KEY, expires_at integer NOT NULL)").Error)
	_, err = runCLI(t, now, append([]string{"purge", "--sessions-table", "unix_sessions"}, d.Flags()...)...)
	equal(t, "purge of an integer expiry column", fmt.Sprint(err),
		`lastseen: column "expires_at" of table "unix_sessions" is integer, not --expires-encoding time (set --expires-encoding unix or unixmilli)`)
}

// TestPurgeLocked: while another instance (an app that left Prefix empty)
// holds the purge lock, purge without --prefix derives the app's prefix,
// deletes nothing and says why.
func TestPurgeLocked(t *testing.T) {
	mr, rdb := testRedis(t)
	d := testenv.SQLite().New(t)
	app := d.Open(t)
	must(t, app.AutoMigrate(&lastseen.User{}, &lastseen.Session{}))
	must(t, app.Create(&lastseen.Session{ID: "s1", UserID: 1, ExpiresAt: mustTime("2026-02-28T09:30:00Z")}).Error)
	p := lastseen.New(lastseen.Config{
		Redis:    rdb,
		Logger:   discard,
		Flush:    lastseen.FlushConfig{Schedule: "off"},
		Sessions: lastseen.SessionConfig{Schedule: "off"},
	})
	must(t, app.Use(p))
	prefix := p.Config().Buffer.Prefix
	equal(t, "derived prefix", strings.HasPrefix(prefix, "lastseen:users:"), true)
	must(t, mr.Set(keys.PurgeLock(prefix), "held-by-another-instance"))
	now := func() time.Time { return mustTime("2026-03-01T09:30:00Z") }
	_, err := runCLI(t, now, append([]string{"purge", "--redis", mr.Addr()}, d.Flags()...)...)
	equal(t, "error", fmt.Sprint(err), "lastseen: another instance holds the lock: a purge is running elsewhere; nothing deleted")
	var n int64
	must(t, app.Model(&lastseen.Session{}).Count(&n).Error)
	equal(t, "sessions left", n, 1)
}

// TestOpsDerivedPrefix: for an app that leaves Prefix empty, the status
// command without --prefix finds the app's derived prefix in the
// manifests, so status sees the app's pending users.
func TestOpsDerivedPrefix(t *testing.T) {
	forEachOpsEnv(t, func(t *testing.T, d *testenv.DB, r *testenv.Redis, _ string) {
		ctx := context.Background()
		clock := testenv.ClockAt("2026-03-01T09:30:00Z")
		app := d.Open(t)
		must(t, app.AutoMigrate(&lastseen.User{}, &lastseen.Session{}))
		p := lastseen.New(lastseen.Config{
			Redis:    r.Client,
			Logger:   discard,
			Buffer:   lastseen.BufferConfig{TouchTimeout: 2 * time.Second},
			Flush:    lastseen.FlushConfig{Schedule: "off"},
			Sessions: lastseen.SessionConfig{Schedule: "off"},
			Test:     lastseen.TestConfig{Now: clock.Now},
		})
		must(t, app.Use(p))
		prefix := p.Config().Buffer.Prefix
		t.Cleanup(func() { testenv.DeleteKeys(context.Background(), r.Client, keys.All(prefix)) })
		equal(t, "derived prefix", strings.HasPrefix(prefix, "lastseen:users:"), true)
		_, err := p.TouchAt(ctx, uint64(9), mustTime("2026-03-01T09:00:00Z")) // shard 4
		must(t, err)
		out, err := runCLI(t, clock.Now, append(append([]string{"status"}, d.Flags()...), []string{"--redis", r.Addr}...)...)
		must(t, err)
		ls := lines(out)
		equal(t, "header", ls[0], fmt.Sprintf("redis buffer (prefix %q, 16 shards, users.last_seen_at) at 2026-03-01T09:30:00Z", prefix))
		total := ""
		for _, l := range ls {
			if strings.HasPrefix(l, "total  ") {
				total = l
			}
		}
		equal(t, "total", total, "total  1        0          2026-03-01T09:00:00Z (30m0s ago)")
	})
}

// TestLayoutColumnLocation: the commands load the app's column location
// as its manifest records it (an IANA name or a fixed offset), and refuse
// a zone the app could not name (its manifest says "Local") for a naive
// column instead of taking their own; a column that holds instants (a
// timestamptz) or an integer encoding does not depend on it.
func TestLayoutColumnLocation(t *testing.T) {
	for _, c := range []struct {
		naive    bool
		encoding string
	}{{false, "time"}, {true, "unixmilli"}} {
		l := newLayout()
		l.naive = func(string, string) (bool, error) { return c.naive, nil }
		b := bufferInfo{Prefix: "app", m: map[string]string{"table": "users", "column": "last_seen_at", "id_column": "id",
			"key_kind": "signed", "encoding": c.encoding, "shards": "16", "batch": "1000", "throttle": "5m0s", "location": "Local"}}
		cfg, err := l.config(b, lastseen.Config{})
		if err != nil || cfg.Flush.ColumnLocation != nil {
			t.Errorf("Local, naive %v, encoding %s: ColumnLocation %v, err %v; want nil, nil", c.naive, c.encoding, cfg.Flush.ColumnLocation, err)
		}
	}
	for _, c := range []struct{ loc, want, err string }{
		{"", "<nil>", ""},
		{"Europe/Berlin", "Europe/Berlin +7200", ""},
		{"+01:00", "+01:00 +3600", ""},
		{"-05:30", "-05:30 -19800", ""},
		{"Local", "", `lastseen: buffer "app": column users.last_seen_at holds wall times in the app's zone "Local", which the app could not name (TZ unset, /etc/localtime not a link into zoneinfo): set Flush.ColumnLocation in the app, or run it with TZ set, and start it again`},
		{"Nowhere/Zone", "", `lastseen: buffer "app": column users.last_seen_at holds wall times in the app's zone "Nowhere/Zone", which the app could not name (TZ unset, /etc/localtime not a link into zoneinfo): set Flush.ColumnLocation in the app, or run it with TZ set, and start it again`},
	} {
		b := bufferInfo{Prefix: "app", m: map[string]string{"table": "users", "column": "last_seen_at", "id_column": "id",
			"key_kind": "signed", "encoding": "time", "shards": "16", "batch": "1000", "throttle": "5m0s", "location": c.loc}}
		cfg, err := newLayout().config(b, lastseen.Config{})
		if c.err != "" {
			if err == nil || err.Error() != c.err {
				t.Errorf("location %q: err = %v, want %s", c.loc, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("location %q: %v", c.loc, err)
		}
		got := "<nil>"
		if l := cfg.Flush.ColumnLocation; l != nil {
			_, off := time.Date(2026, 7, 1, 0, 0, 0, 0, time.UTC).In(l).Zone() // offset in July, in seconds
			got = fmt.Sprintf("%s %+d", l, off)
		}
		if got != c.want {
			t.Errorf("location %q: ColumnLocation %s, want %s", c.loc, got, c.want)
		}
	}
}
