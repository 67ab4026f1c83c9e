package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alecthomas/kong"
	"github.com/alicebob/miniredis/v2"
	"github.com/glebarez/sqlite"
	"github.com/lastseen/lastseen"
	"github.com/redis/go-redis/v9"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

func TestBenchParseCommandStats(t *testing.T) {
	got, err := benchParseCommandStats("# Commandstats\r\n" +
		"cmdstat_evalsha:calls=12,usec=340,usec_per_call=28.33,rejected_calls=0,failed_calls=1\r\n" +
		"cmdstat_client|info:calls=3,usec=9,usec_per_call=3.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_info:calls=7,usec=700,usec_per_call=100.00,rejected_calls=0,failed_calls=0\r\n")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{"evalsha": 12, "client|info": 3, "info": 7}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("parse = %v, want %v", got, want)
	}
	if _, err := benchParseCommandStats("cmdstat_get:usec=1"); err == nil || !strings.Contains(err.Error(), "no calls=") {
		t.Errorf("missing calls: err = %v", err)
	}
	total, per := benchCommandDelta(map[string]int64{"get": 5, "info": 1, "set": 2}, map[string]int64{"get": 9, "info": 4, "set": 2, "hset": 3})
	if total != 7 || fmt.Sprint(per) != "map[get:4 hset:3]" {
		t.Errorf("delta = %d %v, want 7 map[get:4 hset:3] (INFO and unchanged commands left out)", total, per)
	}
}

func TestBenchPercentile(t *testing.T) {
	var d []time.Duration
	for i := 1; i <= 200; i++ {
		d = append(d, time.Duration(i))
	}
	for _, c := range []struct {
		p    float64
		want time.Duration
	}{{50, 100}, {99, 198}, {100, 200}, {0.1, 1}} {
		if got := benchPercentile(d, c.p); got != c.want {
			t.Errorf("p%v = %v, want %v", c.p, got, c.want)
		}
	}
	if got := benchPercentile(nil, 50); got != 0 {
		t.Errorf("empty p50 = %v, want 0", got)
	}
}

func TestBenchStream(t *testing.T) {
	a := newBenchStream(500, 20_000, 1.1, 7)
	b := newBenchStream(500, 20_000, 1.1, 7)
	c := newBenchStream(500, 20_000, 1.1, 8)
	if !slices.Equal(a.ids, b.ids) {
		t.Fatal("the same seed gave two streams")
	}
	if slices.Equal(a.ids, c.ids) {
		t.Fatal("seeds 7 and 8 gave the same stream")
	}
	count := map[uint64]int{}
	for i, id := range a.ids {
		if id < 1 || id > 500 {
			t.Fatalf("id %d out of 1..500", id)
		}
		if a.boxed[i] != any(id) {
			t.Fatalf("boxed[%d] = %v, want %d", i, a.boxed[i], id)
		}
		count[id]++
	}
	equal(t, "distinct", a.distinct, len(count))
	// Zipf s=1.1: the most popular user gets about 1/H(500) of the
	// requests, H(500) = sum 1/n^1.1 ~ 5.3, so far more than the 1/500 a
	// uniform stream would give.
	top := 0
	for _, n := range count {
		top = max(top, n)
	}
	if top < 20_000/10 {
		t.Errorf("most popular user has %d requests, want a Zipf head of over %d", top, 20_000/10)
	}
	one := newBenchStream(1, 10, 1.1, 1)
	equal(t, "single user distinct", one.distinct, 1)
	equal(t, "single user ids", fmt.Sprint(one.ids), "[1 1 1 1 1 1 1 1 1 1]")
}

// TestBenchShardMatchesLibrary checks that the flush benchmark fills the
// pending hash the library itself writes for a user.
func TestBenchShardMatchesLibrary(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	db, err := gorm.Open(sqlite.Open(filepath.Join(t.TempDir(), "b.db")), &gorm.Config{Logger: logger.Discard})
	must(t, err)
	p := lastseen.New(lastseen.Config{Redis: rdb, Prefix: "b", DisableScheduler: true, TouchTimeout: time.Second})
	must(t, db.Use(p))
	must(t, db.AutoMigrate(&lastseen.User{}))
	defer p.Close(context.Background())
	for id := 1; id <= 64; id++ {
		if _, err := p.Touch(context.Background(), uint64(id)); err != nil {
			t.Fatal(err)
		}
		key := "b:{" + strconv.Itoa(benchShard(strconv.Itoa(id), lastseen.DefaultShards)) + "}:pending"
		if !mr.Exists(key) || mr.HGet(key, strconv.Itoa(id)) == "" {
			t.Fatalf("user %d is not in %s: benchShard differs from the library", id, key)
		}
	}
}

func TestBenchFlushBatches(t *testing.T) {
	batches := benchFlushBatches(10_000, 16, 1000, 3)
	seen := map[int64]bool{}
	for _, b := range batches {
		if len(b) == 0 || len(b) > 1000 {
			t.Fatalf("batch of %d", len(b))
		}
		s := benchShard(strconv.FormatInt(b[0], 10), 16)
		for _, id := range b {
			if seen[id] {
				t.Fatalf("id %d twice", id)
			}
			seen[id] = true
			if got := benchShard(strconv.FormatInt(id, 10), 16); got != s {
				t.Fatalf("batch mixes shards %d and %d", s, got)
			}
		}
	}
	equal(t, "ids", len(seen), 10_000)
	again := benchFlushBatches(10_000, 16, 1000, 3)
	equal(t, "deterministic", fmt.Sprint(again), fmt.Sprint(batches))
}

func TestBenchFlushTime(t *testing.T) {
	base := time.Date(2026, 3, 1, 9, 30, 0, 0, time.UTC)
	for id := uint64(1); id <= 1000; id++ {
		at := benchFlushTime(base, 1, id)
		if at.Before(base) || !at.Before(base.Add(5*time.Minute)) || at.Nanosecond()%1000 != 0 {
			t.Fatalf("time of %d = %v, want whole microseconds in [base, base+5m)", id, at)
		}
	}
	equal(t, "stable", benchFlushTime(base, 1, 42).Equal(benchFlushTime(base, 1, 42)), true)
}

func TestBenchFormat(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{benchInt(0), "0"},
		{benchInt(999), "999"},
		{benchInt(1000), "1,000"},
		{benchInt(1234567), "1,234,567"},
		{benchInt(-1000), "-1,000"},
		{benchBytes(512), "512 B"},
		{benchBytes(1536), "1.5 KiB"},
		{benchBytes(3 << 20), "3.0 MiB"},
		{benchDur(1500 * time.Microsecond), "1.50 ms"},
		{benchDur(140), "140 ns"},
		{benchRatioText(0.02), "0.0200 (1/50.0)"},
		{benchRatioText(1), "1.00"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}

func TestBenchValidate(t *testing.T) {
	ok := benchCmd{Postgres: "x", Redis: "y", Users: 1, Requests: 1, Zipf: 1.1, Workers: 1, Throttle: time.Second, FlushUsers: 1}
	must(t, ok.validate())
	for _, c := range []struct {
		edit func(c *benchCmd)
		want string
	}{
		{func(c *benchCmd) { c.Zipf = 1 }, "lastseen: bench: --zipf is 1, want more than 1 (math/rand/v2's Zipf needs s > 1)"},
		{func(c *benchCmd) { c.Users = 0 }, "lastseen: bench: --users is 0, want at least 1"},
		{func(c *benchCmd) { c.Workers = 0 }, "lastseen: bench: --workers is 0, want at least 1"},
		{func(c *benchCmd) { c.Throttle = time.Microsecond }, "lastseen: bench: --throttle is 1µs, want at least 1ms"},
		{func(c *benchCmd) { c.PurgeLive = -1 }, "lastseen: bench: --purge-expired 0 / --purge-live -1, want 0 or more"},
		{func(c *benchCmd) { c.Redis = "" }, "lastseen: bench: --redis is required"},
	} {
		bad := ok
		c.edit(&bad)
		if err := bad.validate(); err == nil || err.Error() != c.want {
			t.Errorf("validate = %v, want %q", err, c.want)
		}
	}
}

// TestBenchTinyRun runs `lastseen bench all` at a tiny size against the
// real PostgreSQL and Redis, and checks the exact counts the run reports
// and that it left nothing behind. Timings are not checked.
func TestBenchTinyRun(t *testing.T) {
	for _, env := range []string{"LASTSEEN_POSTGRES_DSN", "LASTSEEN_REDIS_ADDR"} {
		if os.Getenv(env) == "" {
			if os.Getenv("LASTSEEN_REQUIRE_SERVICES") != "" {
				t.Fatalf("%s is not set but LASTSEEN_REQUIRE_SERVICES is", env)
			}
			t.Skipf("%s not set", env)
		}
	}
	jsonPath := filepath.Join(t.TempDir(), "bench.json")
	var c cli
	parser, err := kong.New(&c, kong.Name("lastseen"), kong.Exit(func(int) { t.Fatal("kong exited") }))
	must(t, err)
	kctx, err := parser.Parse([]string{"bench", "all", "--users", "40", "--requests", "400", "--workers", "4",
		"--flush-users", "2500", "--purge-expired", "1500", "--purge-live", "150", "--json", jsonPath})
	must(t, err)
	var out bytes.Buffer
	c.Bench.out, c.Bench.log = &out, io.Discard
	must(t, kctx.Run())

	b, err := os.ReadFile(jsonPath)
	must(t, err)
	var rep benchReport
	must(t, json.Unmarshal(b, &rep))
	st := newBenchStream(40, 400, 1.1, 1)
	equal(t, "distinct", rep.Requests.Distinct, st.distinct)
	for _, v := range rep.Requests.Variants {
		want := int64(st.distinct)
		if v.Name == "per-request" {
			want = 400
		}
		equal(t, v.Name+" rows written", v.RowsWritten, want)
		equal(t, v.Name+" users updated", v.UsersUpdated, int64(st.distinct))
		equal(t, v.Name+" check", v.Check, "ok")
	}
	equal(t, "per-request client commands", rep.Requests.Variants[0].ClientCommands, int64(0))
	equal(t, "flush raw rows", rep.Flush.Raw.Rows, int64(2500))
	equal(t, "flush raw rows after", rep.Flush.RawAfter.Rows, int64(2500))
	equal(t, "flush written", rep.Flush.Lib.Rows, int64(2500))
	equal(t, "flush raw statements", rep.Flush.Raw.SQL.Writes, int64(len(benchFlushBatches(2500, 16, 1000, 1))))
	equal(t, "flush check", rep.Flush.Check, "ok")
	equal(t, "purge deleted", rep.Purge.Result.Deleted, 1500)
	equal(t, "purge live left", rep.Purge.LiveLeft, int64(150))
	equal(t, "purge transactions", rep.Purge.SQL.Txs, int64(rep.Purge.Result.Batches))
	equal(t, "purge check", rep.Purge.Check, "ok")
	for _, want := range []string{"## Requests: 400 requests", "| rows written (pg_stat_user_tables) | 400 |", "## Flush: 2,500 pending users", "## Purge: 1,500 expired + 150 live sessions", "## Targets of issue 5"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}

	// Nothing left behind: the schema and the Redis keys are gone.
	db, err := gorm.Open(postgres.Open(os.Getenv("LASTSEEN_POSTGRES_DSN")), &gorm.Config{Logger: logger.Discard})
	must(t, err)
	defer closeDB(db)
	var schemas int64
	must(t, db.Raw("SELECT count(*) FROM pg_namespace WHERE nspname = ?", rep.Info.Schema).Scan(&schemas).Error)
	equal(t, "schema left", schemas, int64(0))
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("LASTSEEN_REDIS_ADDR")})
	defer rdb.Close()
	keys, err := benchCountKeys(context.Background(), rdb, "lastseen-bench-"+strings.TrimPrefix(rep.Info.Schema, "lastseen_bench_")+"*")
	must(t, err)
	equal(t, "redis keys left", keys, 0)
}
