package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/cmd/lastseen/internal/runenv"
	"github.com/lastseen/lastseen/internal/keys"
	"github.com/lastseen/lastseen/tests/testenv"
	"github.com/redis/go-redis/v9"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

func TestParseCommandStats(t *testing.T) {
	got, err := parseCommandStats("# Commandstats\r\n" +
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
	if _, err := parseCommandStats("cmdstat_get:usec=1"); err == nil || !strings.Contains(err.Error(), "no calls=") {
		t.Errorf("missing calls: err = %v", err)
	}
	total, per := commandDelta(map[string]int64{"get": 5, "info": 1, "set": 2}, map[string]int64{"get": 9, "info": 4, "set": 2, "hset": 3})
	if total != 7 || fmt.Sprint(per) != "map[get:4 hset:3]" {
		t.Errorf("delta = %d %v, want 7 map[get:4 hset:3] (INFO and unchanged commands left out)", total, per)
	}
}

func TestPercentile(t *testing.T) {
	var d []time.Duration
	for i := 1; i <= 200; i++ {
		d = append(d, time.Duration(i))
	}
	for _, c := range []struct {
		p    float64
		want time.Duration
	}{{50, 100}, {99, 198}, {100, 200}, {0.1, 1}} {
		if got := percentile(d, c.p); got != c.want {
			t.Errorf("p%v = %v, want %v", c.p, got, c.want)
		}
	}
	if got := percentile(nil, 50); got != 0 {
		t.Errorf("empty p50 = %v, want 0", got)
	}
}

func TestStreamIsSeededAndSkewed(t *testing.T) {
	a := newStream(500, 20_000, 1.1, 7)
	b := newStream(500, 20_000, 1.1, 7)
	c := newStream(500, 20_000, 1.1, 8)
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
	testenv.Equal(t, "distinct", a.distinct, len(count))
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
	one := newStream(1, 10, 1.1, 1)
	testenv.Equal(t, "single user distinct", one.distinct, 1)
	testenv.Equal(t, "single user ids", fmt.Sprint(one.ids), "[1 1 1 1 1 1 1 1 1 1]")
}

// TestFillMatchesLibraryLayout: the flush benchmark writes the throttle
// windows' hashes directly, as Touch leaves them; the library's Pending
// must find every filled user at the filled time, and its Status must
// count them all.
func TestFillMatchesLibraryLayout(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Miniredis().Open(t).Client.(*redis.Client)
	db := testenv.SQLite().New(t).Open(t)
	p := testenv.Use(t, db, lastseen.Config{
		Redis:    rdb,
		Buffer:   lastseen.BufferConfig{Prefix: "b", LocalCacheSize: -1},
		Flush:    lastseen.FlushConfig{Schedule: "off"},
		Sessions: lastseen.SessionConfig{Schedule: "off"},
	})
	base := time.Date(2026, 3, 1, 9, 30, 0, 0, time.UTC)
	e := &env{plain: rdb}
	testenv.Must(t, e.fillPending(ctx, "b", 3000, lastseen.DefaultShards, base, 1))
	testenv.Must(t, checkPending(ctx, p, 3000, base, 1))
	st, err := p.Status(ctx)
	testenv.Must(t, err)
	testenv.Equal(t, "pending", st.Pending, int64(3000))
	testenv.Equal(t, "oldest", st.Oldest.Before(base), false)
}

func TestFlushBatchesFollowShards(t *testing.T) {
	batches := flushBatches(10_000, 16, 1000, 3)
	seen := map[int64]bool{}
	for _, b := range batches {
		if len(b) == 0 || len(b) > 1000 {
			t.Fatalf("batch of %d", len(b))
		}
		s := keys.ShardOf(strconv.FormatInt(b[0], 10), 16)
		for _, id := range b {
			if seen[id] {
				t.Fatalf("id %d twice", id)
			}
			seen[id] = true
			if got := keys.ShardOf(strconv.FormatInt(id, 10), 16); got != s {
				t.Fatalf("batch mixes shards %d and %d", s, got)
			}
		}
	}
	testenv.Equal(t, "ids", len(seen), 10_000)
	again := flushBatches(10_000, 16, 1000, 3)
	testenv.Equal(t, "deterministic", fmt.Sprint(again), fmt.Sprint(batches))
}

func TestFlushTimeWithinFiveMinutes(t *testing.T) {
	base := time.Date(2026, 3, 1, 9, 30, 0, 0, time.UTC)
	for id := uint64(1); id <= 1000; id++ {
		at := flushTime(base, 1, id)
		if at.Before(base) || !at.Before(base.Add(5*time.Minute)) || at.Nanosecond()%1000 != 0 {
			t.Fatalf("time of %d = %v, want whole microseconds in [base, base+5m)", id, at)
		}
	}
	testenv.Equal(t, "stable", flushTime(base, 1, 42).Equal(flushTime(base, 1, 42)), true)
}

func TestFormat(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{fmtInt(0), "0"},
		{fmtInt(999), "999"},
		{fmtInt(1000), "1,000"},
		{fmtInt(1234567), "1,234,567"},
		{fmtInt(-1000), "-1,000"},
		{fmtBytes(512), "512 B"},
		{fmtBytes(1536), "1.5 KiB"},
		{fmtBytes(3 << 20), "3.0 MiB"},
		{fmtDur(1500 * time.Microsecond), "1.50 ms"},
		{fmtDur(140), "140 ns"},
		{fmtRatio(0.02), "0.0200 (1/50.0)"},
		{fmtRatio(1), "1.00"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}

func TestValidate(t *testing.T) {
	ok := Cmd{Postgres: "x", Redis: "y", Users: 1, Requests: 1, Zipf: 1.1, Workers: 1, Throttle: time.Second, FlushUsers: []int{1},
		FlushSchemas: []string{"plain"}, FlushConcurrency: 1}
	testenv.Must(t, ok.validate())
	for _, c := range []struct {
		edit func(c *Cmd)
		want string
	}{
		{func(c *Cmd) { c.Zipf = 1 }, "lastseen: bench: --zipf is 1, want more than 1 (math/rand/v2's Zipf needs s > 1)"},
		{func(c *Cmd) { c.Users = 0 }, "lastseen: bench: --users is 0, want at least 1"},
		{func(c *Cmd) { c.Workers = 0 }, "lastseen: bench: --workers is 0, want at least 1"},
		{func(c *Cmd) { c.Throttle = time.Microsecond }, "lastseen: bench: --throttle is 1µs, want at least 1ms"},
		{func(c *Cmd) { c.PurgeLive = -1 }, "lastseen: bench: --purge-expired 0 / --purge-live -1, want 0 or more"},
		{func(c *Cmd) { c.Redis = "" }, "lastseen: bench: --redis is required"},
		{func(c *Cmd) { c.FlushUsers = []int{10, 0} }, "lastseen: bench: --flush-users is [10 0], want sizes of at least 1"},
	} {
		bad := ok
		c.edit(&bad)
		if err := bad.validate(); err == nil || err.Error() != c.want {
			t.Errorf("validate = %v, want %q", err, c.want)
		}
	}
}

// TestTinyRun runs `lastseen bench all` at a tiny size against the real
// PostgreSQL and Redis, and checks the exact counts the run reports and
// that it left nothing behind. Timings are not checked.
func TestTinyRun(t *testing.T) {
	pg, addr := testenv.Need(t, testenv.EnvPostgres), testenv.Need(t, testenv.EnvRedis)
	jsonPath := filepath.Join(t.TempDir(), "bench.json")
	var out bytes.Buffer
	c := &Cmd{What: "all", Postgres: pg, Redis: addr, Users: 40, Requests: 400, Zipf: 1.1, Workers: 4, Seed: 1,
		Throttle: lastseen.DefaultThrottle, FlushUsers: []int{2500}, FlushSchemas: []string{"plain", "indexed"}, FlushConcurrency: 2,
		ScaleUsers: []int{30, 60}, PurgeExpired: 1500, PurgeLive: 150, JSON: jsonPath, out: &out, log: io.Discard,
		// A bound no loaded machine reaches: the counts below, not the latency, are checked.
		TouchTimeout: 10 * time.Second}
	testenv.Must(t, c.run(context.Background()))

	b, err := os.ReadFile(jsonPath)
	testenv.Must(t, err)
	var rep report
	testenv.Must(t, json.Unmarshal(b, &rep))
	st := newStream(40, 400, 1.1, 1)
	testenv.Equal(t, "distinct", rep.Requests.Distinct, st.distinct)
	for _, v := range rep.Requests.Variants {
		want := int64(st.distinct)
		if v.Name == "per-request" {
			want = 400
		}
		testenv.Equal(t, v.Name+" rows written", v.RowsWritten, want)
		testenv.Equal(t, v.Name+" users updated", v.UsersUpdated, int64(st.distinct))
		testenv.Equal(t, v.Name+" check", v.Check, "ok")
	}
	testenv.Equal(t, "touch variants", len(rep.Requests.Touch.Variants), 2)
	for _, v := range rep.Requests.Touch.Variants {
		testenv.Equal(t, "touch "+v.Name+" calls", v.Requests, 400)
		testenv.Equal(t, "touch "+v.Name+" errors", v.Errors, int64(0))
	}
	l := rep.Requests.Touch.Variants[1] // go-redis starts a goroutine per new connection (Dials), lastseen none per call
	testenv.Equal(t, "touch lastseen goroutines besides pool dials", l.Goroutines-l.Dials, int64(0))
	testenv.Equal(t, "scale runs", len(rep.Scale), 2)
	for _, s := range rep.Scale {
		want := newStream(s.Users, 10*s.Users, 1.1, 1)
		testenv.Equal(t, fmt.Sprintf("scale %d requests", s.Users), s.Requests, 10*s.Users)
		testenv.Equal(t, fmt.Sprintf("scale %d rows written", s.Users), s.Variant.RowsWritten, int64(want.distinct))
		testenv.Equal(t, fmt.Sprintf("scale %d check", s.Users), s.Variant.Check, "ok")
	}
	testenv.Equal(t, "per-request client commands", rep.Requests.Variants[0].ClientCommands, int64(0))
	testenv.Equal(t, "flush runs", len(rep.Flush.Runs), 2)
	for _, f := range rep.Flush.Runs {
		testenv.Equal(t, f.Schema+" flush raw unnest rows", f.RawUnnest.Rows, int64(2500))
		testenv.Equal(t, f.Schema+" flush raw COPY rows", f.RawCopy.Rows, int64(2500))
		testenv.Equal(t, f.Schema+" flush raw rows after", f.RawAfter.Rows, int64(2500))
		testenv.Equal(t, f.Schema+" flush written", f.Lib.Rows, int64(2500))
		testenv.Equal(t, f.Schema+" flush raw statements", f.RawUnnest.SQL.Writes, int64(len(flushBatches(2500, 16, 1000, 1))))
		testenv.Equal(t, f.Schema+" flush check", f.Check, "ok")
		// The raw write uses no Redis; every other part is read on this
		// machine, where CI runs PostgreSQL and Redis (-1: unreadable).
		testenv.Equal(t, f.Schema+" raw Redis CPU", f.RawUnnest.CPU.Redis, 0.0)
		testenv.Equal(t, f.Schema+" CPU parts read (raw database, lastseen database, client, Redis)",
			[4]bool{f.RawUnnest.CPU.Database >= 0, f.Lib.CPU.Database >= 0, f.Lib.CPU.Client >= 0, f.Lib.CPU.Redis >= 0}, [4]bool{true, true, true, true})
	}
	// An index on last_seen_at makes every update non-HOT.
	testenv.Equal(t, "indexed HOT updates", rep.Flush.Runs[1].Lib.HotUpdates, int64(0))
	testenv.Equal(t, "indexed updates", rep.Flush.Runs[1].Lib.Updates, int64(2500))
	testenv.Equal(t, "purge deleted", rep.Purge.Result.Deleted, 1500)
	testenv.Equal(t, "purge live left", rep.Purge.LiveLeft, int64(150))
	testenv.Equal(t, "purge transactions", rep.Purge.SQL.Txs, int64(rep.Purge.Result.Batches))
	testenv.Equal(t, "purge check", rep.Purge.Check, "ok")
	for _, want := range []string{"## Requests: 400 requests", "## Requests at scale", "## Tracking call: seed against lastseen without its local cache, interleaved (20 rounds, 4 workers)", "| rows written (pg_stat_user_tables) | 400 |", "| 2,500 | plain |", "## Purge: 1,500 expired + 150 live sessions", "CPU per 1,000 rows written", "## Targets (judged on this run"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}

	// Nothing left behind: the schema and the Redis keys are gone.
	db, err := gorm.Open(postgres.Open(pg), &gorm.Config{Logger: logger.Discard})
	testenv.Must(t, err)
	t.Cleanup(func() { testenv.CloseDB(db) })
	var schemas int64
	testenv.Must(t, db.Raw("SELECT count(*) FROM pg_namespace WHERE nspname = ?", rep.Info.Schema).Scan(&schemas).Error)
	testenv.Equal(t, "schema left", schemas, int64(0))
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { rdb.Close() })
	keys, err := runenv.CountKeys(context.Background(), rdb, "lastseen-bench-"+strings.TrimPrefix(rep.Info.Schema, "lastseen_bench_")+"*")
	testenv.Must(t, err)
	testenv.Equal(t, "redis keys left", keys, 0)
}

// TestMemoryRun runs `lastseen bench memory` at 2,000 users, on private
// redis-servers and on an existing server (one the test starts, given as
// --memory-redis), and checks the exact counts each row reports, that the
// keys are gone and the private servers stopped. Bytes are not checked.
func TestMemoryRun(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv(testenv.EnvRequire) != "" {
			t.Fatalf("redis-server is not on PATH but %s is set: this test must run", testenv.EnvRequire)
		}
		t.Skip("redis-server not on PATH")
	}
	ctx := context.Background()
	bad := Cmd{What: "memory", Throttle: time.Second, MemoryFlags: MemoryFlags{MemoryUsers: 0, MemoryWorkers: 1}}
	if err := bad.validate(); err == nil || err.Error() != "lastseen: bench: --memory-users is 0, want at least 1" {
		t.Errorf("validate = %v", err)
	}
	for _, existing := range []bool{false, true} {
		t.Run(fmt.Sprintf("existing=%v", existing), func(t *testing.T) {
			jsonPath := filepath.Join(t.TempDir(), "memory.json")
			var out bytes.Buffer
			c := &Cmd{What: "memory", Throttle: lastseen.DefaultThrottle, JSON: jsonPath, out: &out, log: io.Discard,
				MemoryFlags: MemoryFlags{MemoryUsers: 2000, MemoryWorkers: 8, quiet: 300 * time.Millisecond}}
			var own *redis.Client
			if existing {
				srv, err := startRedisServer(ctx)
				testenv.Must(t, err)
				t.Cleanup(func() { testenv.Must(t, srv.stop()) })
				c.MemoryRedis = srv.addr
				own = redis.NewClient(&redis.Options{Addr: srv.addr})
				t.Cleanup(func() { own.Close() })
			}
			testenv.Must(t, c.run(ctx))
			b, err := os.ReadFile(jsonPath)
			testenv.Must(t, err)
			var rep memoryReport
			testenv.Must(t, json.Unmarshal(b, &rep))
			testenv.Equal(t, "rows", len(rep.Memory.Rows), 3)
			testenv.Equal(t, "warning", rep.Memory.Warning != "", existing)
			for _, r := range rep.Memory.Rows {
				testenv.Equal(t, r.Name+" pending", r.Pending, int64(2000))
				testenv.Equal(t, r.Name+" recorded", r.Recorded, int64(2000))
				testenv.Equal(t, r.Name+" keys delta", r.KeysDelta, r.PrefixKeys)
				testenv.Equal(t, r.Name+" encodings checked", r.EncodingCheck, int(r.Hashes))
				testenv.Equal(t, r.Name+" check", r.Check, "ok")
				if !existing {
					// The private server is stopped: nothing answers there.
					if conn, err := net.DialTimeout("tcp", r.Addr, time.Second); err == nil {
						conn.Close()
						t.Errorf("%s: %s still accepts connections after the run", r.Name, r.Addr)
					}
				}
			}
			f1 := rep.Memory.Rows[0]
			testenv.Equal(t, "format 1 name", f1.Name, memFormat1)
			testenv.Equal(t, "format 1 keys", f1.PrefixKeys, int64(2016)) // a marker per user and 16 pending hashes
			testenv.Equal(t, "format 1 hashes", f1.Hashes, int64(16))
			testenv.Equal(t, "format 1 encodings", fmt.Sprint(f1.Encodings), "map[listpack:16]") // 125 fields each
			testenv.Equal(t, "library name", rep.Memory.Rows[1].Name, memLibrary)
			testenv.Equal(t, "library presence keys", rep.Memory.Rows[1].PresenceKeys, int64(0))
			def := rep.Memory.Rows[2]
			testenv.Equal(t, "default config name", def.Name, memDefault)
			testenv.Equal(t, "default config presence keys", def.PresenceKeys, int64(2)) // one minute and one day for all the shards
			// Redis's HyperLogLog estimate of ids 1..2,000 in one set (its hash is
			// fixed: the same estimate every run).
			testenv.Equal(t, "default config active users", def.ActiveUsers, int64(2006))
			if existing {
				n, err := own.DBSize(ctx).Result()
				testenv.Must(t, err)
				testenv.Equal(t, "keys left", n, int64(0))
			}
			for _, want := range []string{"# lastseen bench memory", "| pending entries | 2,000 | 2,000 | 2,000 |", "| keys (DBSIZE delta) | 2,016 |"} {
				if !strings.Contains(out.String(), want) {
					t.Errorf("report lacks %q:\n%s", want, out.String())
				}
			}
		})
	}
}
