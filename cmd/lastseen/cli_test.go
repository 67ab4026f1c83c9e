package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/internal/keys"
	"github.com/lastseen/lastseen/tests/testenv"
)

// TestCommandLineMistakesExit2: a mistake on the command line prints one
// line naming it and one hint, nothing on stdout, and exits 2 (kong's
// default was 80 and the whole usage).
func TestCommandLineMistakesExit2(t *testing.T) {
	mr, _ := testRedis(t)
	missing := filepath.Join(t.TempDir(), "missing.db")
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "lastseen: expected one of \"demo\", \"status\", \"flush\", \"purge\", \"bench\"\n" +
			"run \"lastseen --help\" for the commands\n"},
		{[]string{"nosuch"}, "lastseen: unexpected argument nosuch\nrun \"lastseen --help\" for the commands\n"},
		{[]string{"flush", "--prefx", "x"}, "lastseen: unknown flag --prefx, did you mean \"--prefix\"?\n" +
			"run \"lastseen flush --help\" for its flags\n"},
		{[]string{"flush", "--user-id-type", "uuid"}, "lastseen: --user-id-type must be one of \"int\",\"string\" but got \"uuid\"\n" +
			"run \"lastseen flush --help\" for its flags\n"},
		{[]string{"status", "--postgres", "x", "--sqlite", "y"}, "lastseen: --postgres and --sqlite can't be used together\n" +
			"run \"lastseen status --help\" for its flags\n"},
		{[]string{"demo", "--users", "abc"}, "lastseen: --users: expected a valid 64 bit int but got \"abc\"\n" +
			"run \"lastseen demo --help\" for its flags\n"},
		{[]string{"demo", "--skew", "1"}, "lastseen: --skew is 1, want more than 1\nrun \"lastseen demo --help\" for its flags\n"},
		{[]string{"demo", "--fast", "--redis", mr.Addr()},
			"lastseen: --fast needs the in-process Redis or --memory: a real Redis expires throttle markers in real time\n" +
				"run \"lastseen demo --help\" for its flags\n"},
		{[]string{"demo", "--memory", "--redis", mr.Addr()}, "lastseen: --redis and --memory can't be used together\n" +
			"run \"lastseen demo --help\" for its flags\n"},
		{[]string{"bench", "--zipf", "1", "--postgres", "x", "--redis", "y"},
			"lastseen: bench: --zipf is 1, want more than 1 (math/rand/v2's Zipf needs s > 1)\nrun \"lastseen bench --help\" for its flags\n"},
		{[]string{"bench", "nosuch", "--postgres", "x", "--redis", "y"},
			"lastseen: [<what>] must be one of \"requests\",\"flush\",\"purge\",\"all\",\"memory\" but got \"nosuch\"\nrun \"lastseen bench --help\" for its flags\n"},
		{[]string{"status", "--redis", mr.Addr()},
			"lastseen: no database: give one of --postgres, --mysql or --sqlite\nrun \"lastseen status --help\" for its flags\n"},
		{[]string{"purge", "--sqlite", missing},
			"lastseen: no redis: give --redis or --redis-cluster\nrun \"lastseen purge --help\" for its flags\n"},
	} {
		out, errOut, code := runExit(t, nil, c.args...)
		equal(t, strings.Join(c.args, " ")+": exit code", code, exitUsage)
		equal(t, strings.Join(c.args, " ")+": stderr", errOut, c.want)
		equal(t, strings.Join(c.args, " ")+": stdout", out, "")
	}
}

// TestHelpExits0: --help prints the usage on stdout and exits 0.
func TestHelpExits0(t *testing.T) {
	out, errOut, code := runExit(t, nil, "--help")
	equal(t, "exit code", code, exitOK)
	equal(t, "stderr", errOut, "")
	equal(t, "first line", strings.SplitN(out, "\n", 2)[0], "Usage: lastseen <command>")
}

// TestFlagDefaultsComeFromTheLibrary: the operator commands' defaults are
// the library's Default* values and its default models' names.
func TestFlagDefaultsComeFromTheLibrary(t *testing.T) {
	var c cli
	parser, err := newParser(&c)
	must(t, err)
	_, err = parser.Parse([]string{"status"})
	must(t, err)
	f := c.Status.targetFlags
	equal(t, "prefix", f.Prefix, "") // derived by the library, as Config.Prefix left empty (TestOpsDerivedPrefix)
	equal(t, "shards", f.Shards, lastseen.DefaultShards)
	equal(t, "batch size", f.BatchSize, lastseen.DefaultBatchSize)
	equal(t, "purge batch size", f.PurgeBatchSize, lastseen.DefaultBatchSize)
	equal(t, "users table", f.UsersTable, "users")
	equal(t, "user id column", f.UserIDColumn, "id")
	equal(t, "user id type", f.UserIDType, "int")
	equal(t, "last-seen column", f.LastSeenColumn, "last_seen_at")
	equal(t, "sessions table", f.SessionsTable, "sessions")
	equal(t, "session id column", f.SessionIDColumn, "id")
	equal(t, "session id type", f.SessionIDType, "string")
	equal(t, "expires column", f.ExpiresColumn, "expires_at")
	_, err = parser.Parse([]string{"bench", "--postgres", "x", "--redis", "y"})
	must(t, err)
	equal(t, "bench throttle", c.Bench.Throttle, lastseen.DefaultThrottle)
	equal(t, "bench flush concurrency", c.Bench.FlushConcurrency, 2)
	_, err = parser.Parse([]string{"bench", "memory"}) // needs neither --postgres nor --redis
	must(t, err)
	equal(t, "bench memory users", c.Bench.MemoryUsers, 1_000_000)
}

// TestSQLiteMustExist: status, flush and purge refuse a --sqlite path that
// does not exist (exit 2) and do not create it.
func TestSQLiteMustExist(t *testing.T) {
	mr, _ := testRedis(t)
	missing := filepath.Join(t.TempDir(), "typo.db")
	for _, cmd := range []string{"status", "flush", "purge"} {
		out, errOut, code := runExit(t, nil, cmd, "--sqlite", missing, "--redis", mr.Addr())
		equal(t, cmd+": exit code", code, exitUsage)
		equal(t, cmd+": stderr", errOut, "lastseen: --sqlite "+missing+": no such file (status, flush and purge open an existing database only)\n"+
			"run \"lastseen "+cmd+" --help\" for its flags\n")
		equal(t, cmd+": stdout", out, "")
		_, err := os.Stat(missing)
		equal(t, cmd+": file created", err == nil, false)
	}
}

// TestFailuresExit1: a command that runs and fails prints its error (one
// line, starting with "lastseen:") and exits 1.
func TestFailuresExit1(t *testing.T) {
	mr, _ := testRedis(t)
	d := testenv.SQLite().New(t)
	app := d.Open(t)
	must(t, app.AutoMigrate(&lastseen.User{}))
	now := func() time.Time { return mustTime("2026-03-01T09:30:00Z") }
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"flush", "--users-table", "members"}, "lastseen: table \"members\" not found (set --users-table)\n"},
		{[]string{"flush", "--last-seen-column", "seen"}, "lastseen: table \"users\" has no column \"seen\" (set --last-seen-column)\n"},
		{[]string{"purge"}, "lastseen: table \"sessions\" not found (set --sessions-table)\n"},
	} {
		args := append(append(append([]string{}, c.args...), "--redis", mr.Addr()), d.Flags()...)
		out, errOut, code := runExit(t, now, args...)
		equal(t, strings.Join(c.args, " ")+": exit code", code, exitFailed)
		equal(t, strings.Join(c.args, " ")+": stderr", errOut, c.want)
		equal(t, strings.Join(c.args, " ")+": stdout", out, "")
	}
}

// TestWrongIDTypeFailsDryRunAndPurge: a --session-id-type (or
// --user-id-type) that does not match the column fails the dry run exactly
// as it fails the real purge, before anything is read or deleted.
func TestWrongIDTypeFailsDryRunAndPurge(t *testing.T) {
	mr, rdb := testRedis(t)
	d := testenv.SQLite().New(t)
	app := d.Open(t)
	must(t, app.AutoMigrate(&lastseen.User{}, &lastseen.Session{}))
	must(t, app.Create(&lastseen.Session{ID: "s1", UserID: 1, ExpiresAt: mustTime("2026-02-28T09:30:00Z")}).Error)
	now := func() time.Time { return mustTime("2026-03-01T09:30:00Z") }
	base := append([]string{"--redis", mr.Addr()}, d.Flags()...)
	const wantSession = "lastseen: column \"id\" of table \"sessions\" is text, not --session-id-type int (set --session-id-type string)\n"
	for _, args := range [][]string{{"purge", "--dry-run", "--session-id-type", "int"}, {"purge", "--session-id-type", "int"}} {
		out, errOut, code := runExit(t, now, append(args, base...)...)
		equal(t, strings.Join(args, " ")+": exit code", code, exitFailed)
		equal(t, strings.Join(args, " ")+": stderr", errOut, wantSession)
		equal(t, strings.Join(args, " ")+": stdout", out, "")
	}
	var n int64
	must(t, app.Model(&lastseen.Session{}).Count(&n).Error)
	equal(t, "sessions left", n, 1)

	// The purges above wrote the buffer's manifest (integer keys): the
	// library refuses a text key before the command checks the column.
	_, errOut, code := runExit(t, now, append([]string{"flush", "--user-id-type", "string"}, base...)...)
	equal(t, "flush: exit code", code, exitFailed)
	derived := lastseen.New(lastseen.Config{
		Redis:    rdb,
		Logger:   discard,
		Flush:    lastseen.FlushConfig{Schedule: "off"},
		Sessions: lastseen.SessionConfig{Schedule: "off"},
	})
	must(t, app.Use(derived))
	prefix := derived.Config().Buffer.Prefix
	equal(t, "flush: stderr", errOut, fmt.Sprintf(`lastseen: invalid config: the buffer at prefix %q was created for key type "integer", `+
		`this instance has key type "text": set another Buffer.Prefix (or leave Buffer.Prefix empty to derive one from the database and table), `+
		"or flush the buffer empty with the old setting and delete the key %s:manifest\n", prefix, prefix))
	// On a fresh buffer the command's own check names the flag.
	must(t, rdb.Del(context.Background(), keys.Manifest(prefix)).Err())
	_, errOut, code = runExit(t, now, append([]string{"flush", "--user-id-type", "string"}, base...)...)
	equal(t, "flush on a fresh buffer: exit code", code, exitFailed)
	equal(t, "flush on a fresh buffer: stderr", errOut, "lastseen: column \"id\" of table \"users\" is integer, not --user-id-type string (set --user-id-type int)\n")
}

// TestWarnsWhenPrefixOrShardsMatchNoBuffer: status and flush warn on
// stderr (and still exit 0) when --prefix has no key at all (the manifest
// they write themselves does not count), or when shards past --shards hold
// entries; a --shards that disagrees with the buffer's manifest is refused.
func TestWarnsWhenPrefixOrShardsMatchNoBuffer(t *testing.T) {
	ctx := context.Background()
	mr, rdb := testRedis(t)
	d := testenv.SQLite().New(t)
	app := d.Open(t)
	must(t, app.AutoMigrate(&lastseen.User{}, &lastseen.Session{}))
	must(t, app.Create(&[]lastseen.User{{ID: 1}, {ID: 2}, {ID: 3}, {ID: 4}}).Error)
	clock := testenv.ClockAt("2026-03-01T09:30:00Z")
	p := lastseen.New(lastseen.Config{
		Redis:    rdb,
		Logger:   discard,
		Buffer:   lastseen.BufferConfig{Prefix: "app", Shards: 64, TouchTimeout: 2 * time.Second},
		Flush:    lastseen.FlushConfig{Schedule: "off"},
		Sessions: lastseen.SessionConfig{Schedule: "off"},
		Test:     lastseen.TestConfig{Now: clock.Now},
	})
	must(t, app.Use(p))
	for id := range uint64(4) {
		_, err := p.TouchAt(ctx, id+1, mustTime("2026-03-01T09:00:00Z"))
		must(t, err)
	}
	base := append([]string{"--redis", mr.Addr()}, d.Flags()...)
	derived := lastseen.New(lastseen.Config{
		Redis:    rdb,
		Logger:   discard,
		Flush:    lastseen.FlushConfig{Schedule: "off"},
		Sessions: lastseen.SessionConfig{Schedule: "off"},
	})
	must(t, d.Open(t).Use(derived)) // what the CLI derives without --prefix

	for _, cmd := range []string{"status", "flush"} {
		_, errOut, code := runExit(t, clock.Now, append([]string{cmd}, base...)...)
		equal(t, cmd+" default prefix: exit code", code, exitOK)
		equal(t, cmd+" default prefix: stderr", errOut,
			fmt.Sprintf("lastseen: warning: no Redis key under prefix %q: set --prefix to the app's Config.Prefix\n", derived.Config().Buffer.Prefix))
	}
	// The buffer "app" was created with Shards 64: --shards 16 is refused.
	_, errOut, code := runExit(t, clock.Now, append([]string{"status", "--prefix", "app"}, base...)...)
	equal(t, "status --shards 16: exit code", code, exitFailed)
	equal(t, "status --shards 16: stderr", errOut,
		`lastseen: invalid config: the buffer at prefix "app" was created with Buffer.Shards 64, this instance has Buffer.Shards 16: `+
			"set Buffer.Shards: 64, or flush the buffer empty with Buffer.Shards 64 and delete the key app:manifest\n")
	_, errOut, code = runExit(t, clock.Now, append([]string{"flush", "--prefix", "app", "--shards", "64"}, base...)...)
	equal(t, "flush --shards 64: exit code", code, exitOK)
	equal(t, "flush --shards 64: stderr", errOut, "")
	// Flushed: no buffer, but the throttle markers are still under "app".
	_, errOut, code = runExit(t, clock.Now, append([]string{"status", "--prefix", "app", "--shards", "64"}, base...)...)
	equal(t, "status after flush: exit code", code, exitOK)
	equal(t, "status after flush: stderr", errOut, "")
}
