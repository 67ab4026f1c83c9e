package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/internal/keys"
	"github.com/lastseen/lastseen/tests/testenv"
	"gorm.io/gorm"
)

// idleSessions are the sessions of the rule tests at 10:00 with a 30m idle
// timeout: a expired by its expiry, b and g idle in the column, c and f
// live (f never active: NULL is never idle), d idle in the column but
// touched at 09:50 (buffered), e past its expiry though touched at 09:55.
func idleSessions() []lastseen.Session {
	at := func(s string) *time.Time { t := mustTime("2026-03-01T" + s + ":00Z"); return &t }
	return []lastseen.Session{
		{ID: "a", UserID: 1, ExpiresAt: *at("09:00")},
		{ID: "b", UserID: 1, ExpiresAt: *at("12:00"), LastActiveAt: at("09:00")},
		{ID: "c", UserID: 1, ExpiresAt: *at("12:00"), LastActiveAt: at("09:45")},
		{ID: "d", UserID: 2, ExpiresAt: *at("12:00"), LastActiveAt: at("09:10")},
		{ID: "e", UserID: 2, ExpiresAt: *at("09:59"), LastActiveAt: at("09:10")},
		{ID: "f", UserID: 2, ExpiresAt: *at("12:00")},
		{ID: "g", UserID: 3, ExpiresAt: *at("12:00"), LastActiveAt: at("09:20")},
	}
}

// twoModelApp is the app of the rule tests: a plugin for users and one
// that tracks the sessions' activity, both with the session rule of a 30m
// idle timeout and with derived prefixes (nil r: the in-process buffer).
// It returns both plugins, after touching d and e.
func twoModelApp(t *testing.T, app *gorm.DB, r *testenv.Redis, now func() time.Time) (sessions, users *lastseen.Plugin) {
	t.Helper()
	ctx := context.Background()
	must(t, app.AutoMigrate(&lastseen.User{}, &lastseen.Session{}))
	must(t, app.Create(&[]lastseen.User{{ID: 1}, {ID: 2}, {ID: 3}}).Error)
	must(t, app.Create(idleSessions()).Error)
	cfg := appConfig(nil, "", now)
	if r != nil {
		cfg.Redis = r.Client
	}
	cfg.Sessions.IdleTimeout = 30 * time.Minute
	users = lastseen.New(cfg)
	cfg.Model, cfg.Field = &lastseen.Session{}, "LastActiveAt"
	sessions = lastseen.New(cfg)
	must(t, app.Use(users))
	must(t, app.Use(sessions))
	if r != nil {
		for _, p := range []*lastseen.Plugin{users, sessions} {
			prefix := p.Config().Buffer.Prefix
			t.Cleanup(func() { testenv.DeleteKeys(context.Background(), r.Client, keys.All(prefix)) })
		}
	}
	for id, at := range map[string]string{"d": "09:50", "e": "09:55"} {
		_, err := sessions.TouchAt(ctx, id, mustTime("2026-03-01T"+at+":00Z"))
		must(t, err)
	}
	return sessions, users
}

func sessionsLeft(t *testing.T, app *gorm.DB) string {
	t.Helper()
	var ids []string
	must(t, app.Model(&lastseen.Session{}).Order("id").Pluck("id", &ids).Error)
	return strings.Join(ids, ",")
}

// TestCLIPurgeAppliesTheAppsRule: in a two-model app (users, and sessions
// tracked with an idle timeout), purge and its dry run run from the CLI
// with no flag but the connections pick the sessions' buffer, as the app's
// scheduled purge does, and apply its rule: absolute and idle expiry
// mixed, sessions with newer buffered activity kept and counted apart.
// The dry run agrees with the app's ExpiredSessions; the purge deletes
// exactly those rows and takes the sessions buffer's purge lock.
func TestCLIPurgeAppliesTheAppsRule(t *testing.T) {
	forEachOpsEnv(t, func(t *testing.T, d *testenv.DB, r *testenv.Redis, _ string) {
		ctx := context.Background()
		clock := testenv.ClockAt("2026-03-01T10:00:00Z")
		app := d.Open(t)
		sessions, users := twoModelApp(t, app, r, clock.Now)
		app.Config.NowFunc = clock.Now

		ec, err := sessions.ExpiredSessions(ctx)
		must(t, err)
		equal(t, "app's ExpiredSessions", fmt.Sprintf("expired=%d kept=%d oldest=%s", ec.Expired, ec.Kept, ec.Oldest.Format(time.RFC3339)),
			"expired=4 kept=1 oldest=2026-03-01T09:00:00Z")
		var scoped int64
		must(t, app.Model(&lastseen.Session{}).Scopes(lastseen.Expired).Count(&scoped).Error)
		equal(t, "Expired scope (no buffer check)", scoped, int64(5))

		flags := append(append([]string{}, d.Flags()...), "--redis", r.Addr)
		run := func(args ...string) (string, error) {
			t.Helper()
			return runCLI(t, clock.Now, append(args, flags...)...)
		}
		out, err := run("purge", "--dry-run")
		must(t, err)
		equalLines(t, "purge --dry-run", out, []string{
			"dry run  nothing deleted",
			"cutoff   2026-03-01T10:00:00Z",
			"expired  4",
			"kept     1",
			"oldest   2026-03-01T09:00:00Z (1h0m0s ago)",
		})
		out, err = run("status", "--table", "users") // the users' rule reads the sessions' buffer too
		must(t, err)
		ls := lines(out)
		equal(t, "status --table users before the purge: last line", ls[len(ls)-1],
			`expired sessions in "sessions": 4 (and 1 kept: newer activity buffered), oldest expiry 2026-03-01T09:00:00Z (1h0m0s ago)`)
		_, err = run("status")
		equal(t, "status without --prefix", fmt.Sprint(err), fmt.Sprintf("lastseen: 2 buffers for this database: %s, %s: give --prefix or --table",
			bufferNames(users, sessions)[0], bufferNames(users, sessions)[1]))

		// The purge takes the lock of the buffer the app's scheduled purge runs in.
		lock := keys.PurgeLock(sessions.Config().Buffer.Prefix)
		must(t, r.Client.Set(ctx, lock, "held", time.Minute).Err())
		_, err = run("purge")
		equal(t, "purge while the app purges", fmt.Sprint(err), "lastseen: another instance holds the lock: a purge is running elsewhere; nothing deleted")
		must(t, r.Client.Del(ctx, lock).Err())
		must(t, r.Client.Set(ctx, keys.PurgeLock(users.Config().Buffer.Prefix), "held", time.Minute).Err())
		out, err = run("purge")
		must(t, err)
		equalLines(t, "purge", splitDuration(t, out), []string{
			"deleted   4",
			"batches   1",
			"cutoff    2026-03-01T10:00:00Z",
			"stopped   false",
		})
		equal(t, "sessions left", sessionsLeft(t, app), "c,d,f")

		out, err = run("status", "--table", "sessions")
		must(t, err)
		ls = lines(out)
		equal(t, "status --table sessions: last line", ls[len(ls)-1],
			`expired sessions in "sessions": 0 (and 1 kept: newer activity buffered), oldest expiry 2026-03-01T12:00:00Z (2h0m0s ahead of the clock)`)
		out, err = run("status", "--prefix", users.Config().Buffer.Prefix)
		must(t, err)
		ls = lines(out)
		equal(t, "status of the users buffer: last line", ls[len(ls)-1],
			`expired sessions in "sessions": 0 (and 1 kept: newer activity buffered), oldest expiry 2026-03-01T12:00:00Z (2h0m0s ahead of the clock)`)
	})
}

// bufferNames are the buffers of ps as the CLI names them, in prefix order.
func bufferNames(ps ...*lastseen.Plugin) []string {
	var out []string
	for _, p := range ps {
		c := p.Config()
		table, column := "users", "last_seen_at"
		if _, ok := c.Model.(*lastseen.Session); ok {
			table, column = "sessions", "last_active_at"
		}
		out = append(out, fmt.Sprintf("%s (%s.%s)", c.Buffer.Prefix, table, column))
	}
	slices.Sort(out)
	return out
}

// TestCLIPurgeWithoutRedis: for an app on the in-process buffer the purge
// runs on the database alone, with the rule the flags give, and says on
// stderr what it cannot see: d's activity buffered in the app's memory.
func TestCLIPurgeWithoutRedis(t *testing.T) {
	forEachDB(t, func(t *testing.T, d *testenv.DB) {
		clock := testenv.ClockAt("2026-03-01T10:00:00Z")
		app := d.Open(t)
		twoModelApp(t, app, nil, clock.Now)
		const warning = "lastseen: warning: without Redis this purge cannot see activity still in the app's memory: " +
			"a session idle in the table but active since the app's last flush counts as idle (purge in the app, Plugin.PurgeExpiredSessions, to check it)\n"
		out, errOut, code := runExit(t, clock.Now, append([]string{"purge", "--dry-run"}, d.Flags()...)...)
		equal(t, "dry run by expiry: exit code", code, exitOK)
		equal(t, "dry run by expiry: stderr", errOut, warning)
		equalLines(t, "dry run by expiry", out, []string{
			"dry run  nothing deleted",
			"cutoff   2026-03-01T10:00:00Z",
			"expired  2",
			"kept     0",
			"oldest   2026-03-01T09:00:00Z (1h0m0s ago)",
		})
		idle := append([]string{"--idle-timeout", "30m"}, d.Flags()...)
		out, _, code = runExit(t, clock.Now, append([]string{"purge", "--dry-run"}, idle...)...)
		equal(t, "dry run with --idle-timeout: exit code", code, exitOK)
		equal(t, "dry run with --idle-timeout: expired line", lines(out)[2], "expired  5")
		out, errOut, code = runExit(t, clock.Now, append([]string{"purge"}, idle...)...)
		equal(t, "purge: exit code", code, exitOK)
		equal(t, "purge: stderr", errOut, warning)
		equal(t, "purge: deleted line", lines(out)[0], "deleted   5")
		equal(t, "sessions left", sessionsLeft(t, app), "c,f")
	})
}

// TestCLIBuffersAndDrop: buffers lists every buffer of a Redis from its
// manifest with its pending and in-flight counts; drop refuses a buffer
// that holds timestamps unless --force, then deletes its keys and no other
// buffer's, even one whose prefix starts with its own.
func TestCLIBuffersAndDrop(t *testing.T) {
	ctx := context.Background()
	mr, rdb := testRedis(t)
	clock := testenv.ClockAt("2026-03-01T10:00:00Z")
	var dbs []string
	for _, prefix := range []string{"app", "app:sub"} {
		d := testenv.SQLite().New(t)
		app := d.Open(t)
		must(t, app.AutoMigrate(&lastseen.User{}))
		cfg := appConfig(rdb, prefix, clock.Now)
		cfg.Sessions.Disabled = true
		p := lastseen.New(cfg)
		must(t, app.Use(p))
		for id := range uint64(len(prefix)) { // 3 users for app, 7 for app:sub
			_, err := p.TouchAt(ctx, id+1, mustTime("2026-03-01T09:00:00Z"))
			must(t, err)
		}
		// A presence count, as a flush writes it (the flush would drain the
		// pending entries).
		must(t, rdb.PFAdd(ctx, keys.ForPresence(prefix).Online(29539320), "1").Err())
		dbs = append(dbs, d.DSN)
	}
	abs := func(p string) string { a, err := filepath.Abs(p); must(t, err); return a }
	out, err := runCLI(t, nil, "buffers", "--redis", mr.Addr())
	must(t, err)
	equalLines(t, "buffers", out, []string{
		"prefix   tracks              model          key      shards  pending  in-flight  sessions  database",
		"app      users.last_seen_at  lastseen.User  integer  16      3        0          -         sqlite " + abs(dbs[0]),
		"app:sub  users.last_seen_at  lastseen.User  integer  16      7        0          -         sqlite " + abs(dbs[1]),
	})
	all, err := rdb.Keys(ctx, "app:*").Result()
	must(t, err)
	owned := 0
	for _, k := range all {
		if !strings.HasPrefix(k, "app:sub:") {
			owned++
		}
	}
	equal(t, "app's presence key", slices.Contains(all, "app:{presence}:online:29539320"), true)
	_, err = runCLI(t, nil, "drop", "--redis", mr.Addr(), "--prefix", "app")
	equal(t, "drop refused", fmt.Sprint(err), `lastseen: buffer "app" holds 3 pending and 0 in-flight timestamps: flush them first (lastseen flush --prefix app), or give --force to discard them`)
	out, errOut, code := runExit(t, nil, "drop", "--redis", mr.Addr(), "--prefix", "app", "--force")
	equal(t, "drop --force: exit code", code, exitOK)
	equal(t, "drop --force: stdout", out, fmt.Sprintf("dropped buffer \"app\" (users.last_seen_at): %d keys deleted, 3 pending and 0 in-flight timestamps discarded\n", owned))
	equal(t, "drop --force: stderr", errOut, "lastseen: warning: 3 timestamps discarded with buffer \"app\"\n")
	left, err := rdb.Keys(ctx, "*").Result()
	must(t, err)
	for _, k := range left {
		if !strings.HasPrefix(k, "app:sub:") {
			t.Errorf("key %q left, want only keys of app:sub", k)
		}
	}
	equal(t, "app:sub's presence key kept", slices.Contains(left, "app:sub:{presence}:online:29539320"), true)
	out, err = runCLI(t, nil, "buffers", "--redis", mr.Addr())
	must(t, err)
	equal(t, "buffers after drop", len(lines(out)), 2)
	equal(t, "buffers after drop: row", strings.Fields(lines(out)[1])[0], "app:sub")
}

// TestRedisDownIsOneLine: with Redis unreachable the command prints one
// line on stderr, its own, and no go-redis log line.
func TestRedisDownIsOneLine(t *testing.T) {
	d := testenv.SQLite().New(t)
	must(t, d.Open(t).AutoMigrate(&lastseen.User{}))
	for _, cmd := range []string{"status", "flush", "purge", "buffers"} {
		args := []string{cmd, "--redis", "127.0.0.1:1"}
		if cmd != "buffers" {
			args = append(args, d.Flags()...)
		}
		c := exec.Command(os.Args[0])
		c.Env = append(os.Environ(), "LASTSEEN_CLI_ARGS="+strings.Join(args, "\x1f"))
		var stderr strings.Builder
		c.Stderr = &stderr
		err := c.Run()
		equal(t, cmd+": exit code", c.ProcessState.ExitCode(), exitFailed)
		if _, ok := err.(*exec.ExitError); !ok {
			t.Fatalf("%s: run the CLI process: %v", cmd, err)
		}
		got := lines(stderr.String())
		equal(t, cmd+": stderr lines", len(got), 1)
		equal(t, cmd+": stderr", got[0], "lastseen: redis 127.0.0.1:1 does not answer: dial tcp 127.0.0.1:1: connect: connection refused")
	}
}

// wideUser and wideSession have unsigned keys, which the CLI reads as the
// app does: on MySQL (BIGINT UNSIGNED) past the largest signed value.
type wideUser struct {
	ID     uint64 `gorm:"primaryKey;autoIncrement:false"`
	SeenAt *time.Time
}

type wideSession struct {
	ID        uint64 `gorm:"primaryKey;autoIncrement:false"`
	ExpiresAt time.Time
}

// TestCLIUnsignedKeys: a uint64 key the manifest records as unsigned is
// flushed and purged by the CLI as by the app (on MySQL with ids past
// 2^63, which an int64 cannot hold); a flush warns that the app's OnBatch
// hook does not run in it.
func TestCLIUnsignedKeys(t *testing.T) {
	forEachDB(t, func(t *testing.T, d *testenv.DB) {
		clock := testenv.ClockAt("2026-03-01T10:00:00Z")
		mr, rdb := testRedis(t)
		app := d.Open(t)
		must(t, app.AutoMigrate(&wideUser{}, &wideSession{}))
		big := uint64(7)
		if d.Dialect == "mysql" {
			big = 1<<63 + 5
		}
		must(t, app.Create(&[]wideUser{{ID: 1}, {ID: big}}).Error)
		must(t, app.Create(&[]wideSession{{ID: big, ExpiresAt: mustTime("2026-03-01T09:00:00Z")}, {ID: 2, ExpiresAt: mustTime("2026-03-01T11:00:00Z")}}).Error)
		cfg := appConfig(rdb, "wide", clock.Now)
		cfg.Model, cfg.Field, cfg.Sessions.Model = &wideUser{}, "SeenAt", &wideSession{}
		cfg.Flush.OnBatch = func(*gorm.DB, []lastseen.Seen) error { return nil }
		p := lastseen.New(cfg)
		must(t, app.Use(p))
		_, err := p.TouchAt(context.Background(), big, mustTime("2026-03-01T09:50:00Z"))
		must(t, err)
		flags := append([]string{"--redis", mr.Addr()}, d.Flags()...)
		out, errOut, code := runExit(t, clock.Now, append([]string{"flush"}, flags...)...)
		equal(t, "flush: exit code", code, exitOK)
		equal(t, "flush: stderr", errOut, "lastseen: warning: the app's Flush.OnBatch hook does not run in this flush: what it derives from each batch is not updated for these rows\n")
		equal(t, "flush: written line", lines(out)[1], "written   1")
		var u wideUser
		must(t, app.First(&u, big).Error)
		equal(t, "user's seen_at", u.SeenAt.UTC().Format(time.RFC3339), "2026-03-01T09:50:00Z")
		out, err = runCLI(t, clock.Now, append([]string{"purge"}, flags...)...)
		must(t, err)
		equal(t, "purge: deleted line", lines(out)[0], "deleted   1")
		var left []uint64
		must(t, app.Model(&wideSession{}).Order("id").Pluck("id", &left).Error)
		equal(t, "sessions left", fmt.Sprint(left), "[2]")
	})
}
