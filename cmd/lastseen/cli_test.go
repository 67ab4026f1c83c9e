package main

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/internal/keys"
	"github.com/lastseen/lastseen/tests/testenv"
	"github.com/redis/go-redis/v9"
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
		{nil, "lastseen: expected one of \"demo\", \"status\", \"flush\", \"purge\", \"buffers\", ...\n" +
			"run \"lastseen --help\" for the commands\n"},
		{[]string{"nosuch"}, "lastseen: unexpected argument nosuch\nrun \"lastseen --help\" for the commands\n"},
		{[]string{"flush", "--prefx", "x"}, "lastseen: unknown flag --prefx, did you mean \"--prefix\"?\n" +
			"run \"lastseen flush --help\" for its flags\n"},
		{[]string{"purge", "--session-id-type", "uuid"}, "lastseen: --session-id-type must be one of \"int\",\"string\" but got \"uuid\"\n" +
			"run \"lastseen purge --help\" for its flags\n"},
		{[]string{"drop", "--redis", mr.Addr()}, "lastseen: missing flags: --prefix=STRING\n" +
			"run \"lastseen drop --help\" for its flags\n"},
		{[]string{"status", "--postgres", "x", "--sqlite", "y"}, "lastseen: --postgres and --sqlite can't be used together\n" +
			"run \"lastseen status --help\" for its flags\n"},
		{[]string{"demo", "--users", "abc"}, "lastseen: --users: expected a valid 64 bit int but got \"abc\"\n" +
			"run \"lastseen demo --help\" for its flags\n"},
		{[]string{"demo", "--skew", "1"}, "lastseen: --skew is 1, want more than 1\nrun \"lastseen demo --help\" for its flags\n"},
		{[]string{"demo", "--fast", "--redis", mr.Addr()},
			"lastseen: --fast needs the in-process Redis or --memory: a real Redis expires its keys (locks, presence counts) in real time\n" +
				"run \"lastseen demo --help\" for its flags\n"},
		{[]string{"demo", "--memory", "--redis", mr.Addr()}, "lastseen: --redis and --memory can't be used together\n" +
			"run \"lastseen demo --help\" for its flags\n"},
		{[]string{"bench", "--zipf", "1", "--postgres", "x", "--redis", "y"},
			"lastseen: bench: --zipf is 1, want more than 1 (math/rand/v2's Zipf needs s > 1)\nrun \"lastseen bench --help\" for its flags\n"},
		{[]string{"bench", "nosuch", "--postgres", "x", "--redis", "y"},
			"lastseen: [<what>] must be one of \"requests\",\"flush\",\"purge\",\"all\",\"memory\",\"replica\" but got \"nosuch\"\nrun \"lastseen bench --help\" for its flags\n"},
		{[]string{"status", "--redis", mr.Addr()},
			"lastseen: no database: give one of --postgres, --mysql or --sqlite\nrun \"lastseen status --help\" for its flags\n"},
		{[]string{"flush", "--sqlite", missing},
			"lastseen: no redis: give --redis or --redis-cluster\nrun \"lastseen flush --help\" for its flags\n"},
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
	equal(t, "prefix", c.Status.Prefix, "") // found in the manifests (TestOpsDerivedPrefix)
	_, err = parser.Parse([]string{"purge"})
	must(t, err)
	f := c.Purge.ruleFlags
	equal(t, "purge batch size", f.PurgeBatchSize, lastseen.DefaultBatchSize)
	equal(t, "sessions table", f.SessionsTable, "sessions")
	equal(t, "session id column", f.SessionIDColumn, "id")
	equal(t, "session id type", f.SessionIDType, "string")
	equal(t, "expires column", f.ExpiresColumn, "expires_at")
	equal(t, "idle timeout", f.IdleTimeout, time.Duration(0))
	equal(t, "active column", f.ActiveColumn, "last_active_at")
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
	mr, rdb := testRedis(t)
	d := testenv.SQLite().New(t)
	app := d.Open(t)
	must(t, app.AutoMigrate(&lastseen.User{}))
	now := func() time.Time { return mustTime("2026-03-01T09:30:00Z") }
	noBuffer := "lastseen: no buffer for this database in this Redis: is the app's Redis this one? (lastseen buffers lists the buffers it holds)\n"
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"flush", "--redis", mr.Addr()}, noBuffer},
		{[]string{"status", "--redis", mr.Addr()}, noBuffer},
		{[]string{"purge", "--redis", mr.Addr()}, noBuffer},
		{[]string{"status", "--redis", mr.Addr(), "--prefix", "typo"}, "lastseen: no buffer at prefix \"typo\" in this Redis (lastseen buffers lists them)\n"},
		{[]string{"purge"}, "lastseen: table \"sessions\" not found (set --sessions-table)\n"},
		{[]string{"drop", "--redis", mr.Addr(), "--prefix", "typo"}, "lastseen: no buffer at prefix \"typo\" in this Redis (lastseen buffers lists them)\n"},
	} {
		args := append(append([]string{}, c.args...), d.Flags()...)
		if c.args[0] == "drop" {
			args = c.args
		}
		out, errOut, code := runExit(t, now, args...)
		equal(t, strings.Join(c.args, " ")+": exit code", code, exitFailed)
		equal(t, strings.Join(c.args, " ")+": stderr", errOut, c.want)
		equal(t, strings.Join(c.args, " ")+": stdout", out, "")
	}
	keysLeft, err := rdb.Keys(context.Background(), "*").Result()
	must(t, err)
	equal(t, "keys the failed commands wrote", strings.Join(keysLeft, ","), "")
}

// TestWrongIDTypeFailsDryRunAndPurge: without Redis the flags give the
// session rule; a --session-id-type that does not match the column fails
// the dry run exactly as it fails the real purge, before anything is read
// or deleted.
func TestWrongIDTypeFailsDryRunAndPurge(t *testing.T) {
	d := testenv.SQLite().New(t)
	app := d.Open(t)
	must(t, app.AutoMigrate(&lastseen.Session{}))
	must(t, app.Create(&lastseen.Session{ID: "s1", UserID: 1, ExpiresAt: mustTime("2026-02-28T09:30:00Z")}).Error)
	now := func() time.Time { return mustTime("2026-03-01T09:30:00Z") }
	const wantSession = "lastseen: column \"id\" of table \"sessions\" is text, not --session-id-type int (set --session-id-type string)\n"
	for _, args := range [][]string{{"purge", "--dry-run", "--session-id-type", "int"}, {"purge", "--session-id-type", "int"}} {
		out, errOut, code := runExit(t, now, append(args, d.Flags()...)...)
		equal(t, strings.Join(args, " ")+": exit code", code, exitFailed)
		equal(t, strings.Join(args, " ")+": stderr", errOut, wantSession)
		equal(t, strings.Join(args, " ")+": stdout", out, "")
	}
	var n int64
	must(t, app.Model(&lastseen.Session{}).Count(&n).Error)
	equal(t, "sessions left", n, 1)
}

// TestReadOnlyCommandsWriteNothing: status (text and JSON), buffers and
// purge --dry-run leave every Redis key as it was, on the app's prefix and
// without one (found in the manifests), and so does a status with a
// mistyped --prefix (refused). Shards past the manifest's that hold
// entries are warned about.
func TestReadOnlyCommandsWriteNothing(t *testing.T) {
	ctx := context.Background()
	mr, rdb := testRedis(t)
	d := testenv.SQLite().New(t)
	app := d.Open(t)
	must(t, app.AutoMigrate(&lastseen.User{}, &lastseen.Session{}))
	must(t, app.Create(&[]lastseen.User{{ID: 1}, {ID: 2}, {ID: 3}, {ID: 4}}).Error)
	clock := testenv.ClockAt("2026-03-01T09:30:00Z")
	cfg := appConfig(rdb, "app", clock.Now)
	cfg.Buffer.Shards = 64
	p := lastseen.New(cfg)
	must(t, app.Use(p))
	for id := range uint64(4) {
		_, err := p.TouchAt(ctx, id+1, mustTime("2026-03-01T09:00:00Z"))
		must(t, err)
	}
	before := snapshot(t, rdb)
	base := append([]string{"--redis", mr.Addr()}, d.Flags()...)
	for _, args := range [][]string{{"status"}, {"status", "--json"}, {"status", "--prefix", "app"}, {"status", "--table", "users"},
		{"purge", "--dry-run"}, {"buffers"}} {
		a := append(append([]string{}, args...), base...)
		if args[0] == "buffers" {
			a = append(args, "--redis", mr.Addr())
		}
		_, errOut, code := runExit(t, clock.Now, a...)
		equal(t, strings.Join(args, " ")+": exit code", code, exitOK)
		equal(t, strings.Join(args, " ")+": stderr", errOut, "")
		equal(t, strings.Join(args, " ")+": Redis unchanged", snapshot(t, rdb), before)
	}
	_, _, code := runExit(t, clock.Now, append([]string{"status", "--prefix", "ap"}, base...)...)
	equal(t, "status --prefix ap: exit code", code, exitFailed)
	equal(t, "status --prefix ap: Redis unchanged", snapshot(t, rdb), before)

	// Entries in a shard past the manifest's 64 (an instance with more).
	must(t, rdb.HSet(ctx, keys.ForShard("app", 70, 128).Pending(0), "5", "1772355600000000").Err())
	_, errOut, code := runExit(t, clock.Now, append([]string{"status"}, base...)...)
	equal(t, "status with shard 70: exit code", code, exitOK)
	equal(t, "status with shard 70: stderr", errOut,
		"lastseen: warning: shards 70 of prefix \"app\" hold buffered entries but the buffer has 64 shards: an instance ran with another Buffer.Shards\n")
}

// snapshot is every key of rdb with its type and value (hashes field by
// field, HyperLogLogs by their count), in key order.
func snapshot(t testing.TB, rdb redis.UniversalClient) string {
	t.Helper()
	ctx := context.Background()
	names, err := rdb.Keys(ctx, "*").Result()
	must(t, err)
	slices.Sort(names)
	var b strings.Builder
	for _, k := range names {
		typ, err := rdb.Type(ctx, k).Result()
		must(t, err)
		switch typ {
		case "hash":
			m, err := rdb.HGetAll(ctx, k).Result()
			must(t, err)
			fields := slices.Sorted(maps.Keys(m))
			fmt.Fprintf(&b, "%s hash", k)
			for _, f := range fields {
				fmt.Fprintf(&b, " %s=%s", f, m[f])
			}
		case "string":
			if n, err := rdb.PFCount(ctx, k).Result(); err == nil {
				fmt.Fprintf(&b, "%s hll %d", k, n)
				break
			}
			v, err := rdb.Get(ctx, k).Result()
			must(t, err)
			fmt.Fprintf(&b, "%s string %s", k, v)
		default:
			fmt.Fprintf(&b, "%s %s", k, typ)
			if n, err := rdb.PFCount(ctx, k).Result(); err == nil {
				fmt.Fprintf(&b, " %d", n)
			}
		}
		b.WriteByte('\n')
	}
	return b.String()
}
