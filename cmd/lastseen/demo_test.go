package main

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/internal/keys"
	"github.com/lastseen/lastseen/tests/testenv"
	"github.com/redis/go-redis/v9"
)

// demoModel is what a workload must produce, computed from the requests
// alone with the throttle semantics: a signed-in request is recorded when
// the user has no recorded touch yet or the last one is a throttle window
// or more before it; each flush writes the users recorded since the one
// before, one UPDATE per shard that has any; the column ends at each
// user's last recorded touch.
type demoModel struct {
	authenticated, distinct, recorded int
	flushes, rows, statements         int
	last                              map[int64]time.Time
}

// shardOf is the plugin's shard of a user id with the 16 default shards.
func shardOf(id int64) int { return keys.ShardOf(strconv.FormatInt(id, 10), lastseen.DefaultShards) }

// simulate computes the model for the demo's fast mode: a flush before
// the first request at or after each flush boundary, and one at Close.
func simulate(work []demoRequest, start time.Time, throttle, every time.Duration) demoModel {
	m := demoModel{last: map[int64]time.Time{}}
	dirty := map[int64]bool{}
	flush := func() {
		m.flushes++
		m.rows += len(dirty)
		shards := map[int]bool{}
		for id := range dirty {
			shards[shardOf(id)] = true
		}
		m.statements += len(shards)
		clear(dirty)
	}
	next := start.Add(every)
	for _, r := range work {
		at := start.Add(r.at)
		for !at.Before(next) {
			flush()
			next = next.Add(every)
		}
		if r.user == 0 {
			continue
		}
		m.authenticated++
		// Throttle windows are fixed periods of the clock from the Unix epoch.
		window := func(t time.Time) int64 { return t.UnixMilli() / throttle.Milliseconds() }
		if last, ok := m.last[r.user]; !ok || window(last) != window(at) {
			m.last[r.user] = at
			m.recorded++
			dirty[r.user] = true
		}
	}
	flush()
	m.distinct = len(m.last)
	return m
}

// TestDemoWorkload: the workload is reproducible from its seed, in time
// order within the span at millisecond resolution, over users 1..N with
// the asked share of anonymous requests, and skewed: the busiest user sends
// more than the 50 least busy ones together.
func TestDemoWorkload(t *testing.T) {
	const users, requests = 200, 20000
	w := demoWorkload(5, users, requests, 10*time.Second, 0.25, 1.1)
	equal(t, "same seed, same workload", slices.Equal(w, demoWorkload(5, users, requests, 10*time.Second, 0.25, 1.1)), true)
	equal(t, "other seed, other workload", slices.Equal(w, demoWorkload(6, users, requests, 10*time.Second, 0.25, 1.1)), false)
	equal(t, "requests", len(w), requests)
	per := map[int64]int{}
	anonymous := 0
	for i, r := range w {
		if r.at < 0 || r.at >= 10*time.Second || r.at%time.Millisecond != 0 || (i > 0 && r.at < w[i-1].at) {
			t.Fatalf("request %d at %v: not in order within the span at ms resolution", i, r.at)
		}
		if r.user == 0 {
			anonymous++
			continue
		}
		if r.user < 1 || r.user > users {
			t.Fatalf("request %d from user %d, want 1..%d", i, r.user, users)
		}
		per[r.user]++
	}
	// 25% of 20000 is 5000; a binomial standard deviation is about 61.
	if anonymous < 4700 || anonymous > 5300 {
		t.Errorf("anonymous = %d, want about 5000", anonymous)
	}
	counts := make([]int, 0, users)
	for id := int64(1); id <= users; id++ {
		counts = append(counts, per[id])
	}
	slices.Sort(counts)
	least := 0
	for _, n := range counts[:50] {
		least += n
	}
	if busiest := counts[len(counts)-1]; busiest <= least {
		t.Errorf("busiest user sent %d requests, the 50 least busy %d together: not skewed", busiest, least)
	}
}

// fastDemo is a shortened demo on the simulated clock.
func fastDemo(out *bytes.Buffer, conn connFlags) *demoCmd {
	return &demoCmd{connFlags: conn, Users: 40, Requests: 3000, Duration: 20 * time.Second, Throttle: 2 * time.Second,
		FlushEvery: 3 * time.Second, Anonymous: 0.1, Skew: 1.1, Seed: 7, Fast: true, out: out}
}

// checkAgainstModel asserts every figure of a fast demo against the model.
func checkAgainstModel(t *testing.T, c *demoCmd, res *demoResult) {
	t.Helper()
	m := simulate(demoWorkload(c.Seed, c.Users, c.Requests, c.Duration, c.Anonymous, c.Skew), res.start, c.Throttle, c.FlushEvery)
	s := res.Stats
	equal(t, "requests", res.Requests, c.Requests)
	equal(t, "signed-in requests", res.Authenticated, m.authenticated)
	equal(t, "distinct users", res.Distinct, m.distinct)
	equal(t, "touches", s.Touches, int64(m.authenticated))
	equal(t, "recorded", s.Recorded, int64(m.recorded))
	equal(t, "throttled", s.Throttled, int64(m.authenticated-m.recorded))
	equal(t, "redis errors", s.RedisErrors, 0)
	equal(t, "backlogged", s.Backlogged, 0)
	if !c.Memory {
		equal(t, "touches sent to Redis = touches the local cache did not answer", res.RedisTouches, s.Touches-s.CacheHits)
	}
	equal(t, "flushes", s.Flushes, int64(m.flushes))
	equal(t, "flush errors", s.FlushErrors, 0)
	equal(t, "rows written", s.RowsWritten, int64(m.rows))
	equal(t, "unknown", s.Unknown, 0)
	equal(t, "stale", s.Stale, 0)
	equal(t, "write statements", res.Writes, int64(m.statements))
	equal(t, "rows set in the table", res.RowsSet, int64(m.distinct))
	equal(t, "mismatches", len(res.Mismatches), 0)
	equal(t, "users read back", len(res.LastSeen), len(m.last))
	for id, want := range m.last {
		if got := res.LastSeen[id]; !got.Equal(want) {
			t.Errorf("user %d last_seen_at = %s, want %s", id, got.Format(time.RFC3339Nano), want.Format(time.RFC3339Nano))
		}
	}
	if m.rows >= m.authenticated || m.flushes != 7 {
		t.Errorf("model: %d rows for %d requests in %d flushes: the workload does not exercise the plugin", m.rows, m.authenticated, m.flushes)
	}
}

// TestDemoFast runs a shortened demo in-process on SQLite and miniredis and
// checks its figures and its printed summary against the model.
func TestDemoFast(t *testing.T) {
	var out bytes.Buffer
	c := fastDemo(&out, connFlags{})
	res, err := c.run(context.Background())
	must(t, err)
	checkAgainstModel(t, c, res)

	s := res.Stats
	printed := lines(out.String())
	for _, want := range []string{
		"  workload    40 users (Zipf s=1.1, seed 7), 3000 requests over 20s, 10% anonymous",
		fmt.Sprintf("  requests      3000: %d signed in, %d anonymous; %d distinct users", res.Authenticated, 3000-res.Authenticated, res.Distinct),
		fmt.Sprintf("  touches       %d: %d recorded (opened a throttle window), %d throttled (%d answered by the in-process cache)",
			s.Touches, s.Recorded, s.Throttled, s.CacheHits),
		fmt.Sprintf("  flushes       7 (the last at Close): %d rows written in %d SQL statements (and 0 queries)", s.RowsWritten, res.Writes),
		fmt.Sprintf("  table check   %d rows with last_seen_at set, %d distinct users seen: ok", res.Distinct, res.Distinct),
		"  value check   every last_seen_at is the user's last recorded touch: ok",
		fmt.Sprintf("  write per request   %d row writes in %d statements (UPDATE ... SET last_seen_at = now() per signed-in request)",
			res.Authenticated, res.Authenticated),
		fmt.Sprintf("  ratio               %.1fx fewer row writes, %.1fx fewer statements",
			float64(res.Authenticated)/float64(s.RowsWritten), float64(res.Authenticated)/float64(res.Writes)),
	} {
		if !slices.Contains(printed, want) {
			t.Errorf("summary lacks line %q:\n%s", want, out.String())
		}
	}
}

// TestDemoThrottleBoundaries sends a hand-written workload through the
// demo's HTTP server, which starts at the start of a throttle window: a
// touch at the start of the next window is recorded, one a millisecond
// earlier is not, whenever the user was recorded before; a request at a
// flush boundary comes after that flush.
func TestDemoThrottleBoundaries(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	work := []demoRequest{
		{ms(0), 1},    // recorded
		{ms(100), 2},  // recorded
		{ms(1999), 1}, // throttled: 1ms before the window ends
		{ms(2000), 1}, // recorded: the next window
		{ms(2099), 2}, // recorded: the next window, 1999ms after its last
		{ms(2500), 1}, // throttled
		{ms(2900), 0}, // anonymous
		{ms(3000), 3}, // after the flush at 3s (users 1 and 2): recorded
		{ms(3999), 1}, // throttled
		{ms(4000), 1}, // recorded
		{ms(5000), 2}, // recorded
		{ms(6500), 1}, // after the flush at 6s (users 1, 2 and 3): recorded
	}
	var out bytes.Buffer
	c := &demoCmd{Users: 3, Requests: len(work), Duration: 7 * time.Second, Throttle: 2 * time.Second,
		FlushEvery: 3 * time.Second, Anonymous: 0.1, Skew: 1.1, Fast: true, out: &out, work: work}
	res, err := c.run(context.Background())
	must(t, err)
	s := res.Stats
	equal(t, "requests", res.Requests, 12)
	equal(t, "signed in", res.Authenticated, 11)
	equal(t, "touches", s.Touches, 11)
	equal(t, "recorded", s.Recorded, 8)
	equal(t, "throttled", s.Throttled, 3)
	equal(t, "flushes", s.Flushes, 3)          // at 3s, at 6s, at Close
	equal(t, "rows written", s.RowsWritten, 6) // 2 + 3 + 1
	equal(t, "write statements", res.Writes, 6)
	equal(t, "rows set", res.RowsSet, 3)
	for id, want := range map[int64]time.Duration{1: ms(6500), 2: ms(5000), 3: ms(3000)} {
		equal(t, fmt.Sprintf("user %d last_seen_at", id), res.LastSeen[id].Sub(res.start), want)
	}
}

// TestDemoDialects runs the shortened demo on PostgreSQL and MySQL (and a
// SQLite file given by path), checks it against the model and that it
// dropped its table.
func TestDemoDialects(t *testing.T) {
	forEachDB(t, func(t *testing.T, d *testenv.DB) {
		var conn connFlags
		switch d.Dialect {
		case "sqlite":
			conn.SQLite = d.DSN
		case "postgres":
			conn.Postgres = d.DSN
		case "mysql":
			conn.MySQL = d.DSN
		}
		var out bytes.Buffer
		c := fastDemo(&out, conn)
		res, err := c.run(context.Background())
		must(t, err)
		checkAgainstModel(t, c, res)
		db := d.Open(t)
		equal(t, "demo table left behind", db.Migrator().HasTable(res.Table), false)
	})
}

// TestDemoRealRedis runs a short paced demo on the real clock against a
// real Redis and a Redis Cluster. Marker expiry then follows the real
// clock, so the exact per-user values are not predictable; what must hold
// whatever the timing: one row set per user seen, each value within a
// throttle window (and the touch timeout) before the user's last request,
// every touch either recorded or throttled, and no key left behind.
func TestDemoRealRedis(t *testing.T) {
	for _, kind := range []struct{ name, env, flag string }{
		{"redis", testenv.EnvRedis, "redis"}, {"cluster", testenv.EnvRedisCluster, "cluster"},
	} {
		t.Run(kind.name, func(t *testing.T) {
			addr := needs(t, kind.env)
			conn := connFlags{Redis: addr}
			var rdb redis.UniversalClient = redis.NewClient(&redis.Options{Addr: addr})
			if kind.flag == "cluster" {
				conn = connFlags{RedisCluster: strings.Split(addr, ",")}
				rdb = redis.NewClusterClient(&redis.ClusterOptions{Addrs: conn.RedisCluster})
			}
			defer rdb.Close()
			var out bytes.Buffer
			c := &demoCmd{connFlags: conn, Users: 30, Requests: 300, Duration: 2 * time.Second, Throttle: 500 * time.Millisecond,
				FlushEvery: time.Second, Anonymous: 0.1, Skew: 1.1, Seed: 3, out: &out}
			res, err := c.run(context.Background())
			must(t, err)
			s := res.Stats
			equal(t, "requests", res.Requests, 300)
			equal(t, "touches", s.Touches, int64(res.Authenticated))
			equal(t, "recorded + throttled", s.Recorded+s.Throttled, s.Touches)
			equal(t, "redis errors", s.RedisErrors, 0)
			if !c.Memory {
				equal(t, "touches sent to Redis = touches the local cache did not answer", res.RedisTouches, s.Touches-s.CacheHits)
			}
			equal(t, "rows set = distinct users", res.RowsSet, int64(res.Distinct))
			equal(t, "users outside the window", fmt.Sprint(res.Mismatches), "[]")
			equal(t, "rows written = drained (no unknown or stale)", s.RowsWritten, s.Drained)
			var left []string
			var mu sync.Mutex // ForEachMaster runs on the masters at once
			collect := func(ctx context.Context, c *redis.Client) error {
				keys, err := c.Keys(ctx, res.Prefix+":*").Result()
				mu.Lock()
				left = append(left, keys...)
				mu.Unlock()
				return err
			}
			if cc, ok := rdb.(*redis.ClusterClient); ok {
				must(t, cc.ForEachMaster(context.Background(), collect))
			} else {
				must(t, collect(context.Background(), rdb.(*redis.Client)))
			}
			equal(t, "keys left", len(left), 0)
		})
	}
}

// TestDemoFlags: bad demo flags are refused with the flag's name.
func TestDemoFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"demo", "--fast", "--redis", "127.0.0.1:6379"}, "lastseen: --fast needs the in-process Redis"},
		{[]string{"demo", "--skew", "1"}, "lastseen: --skew is 1, want more than 1"},
		{[]string{"demo", "--users", "0"}, "lastseen: --users is 0, want at least 1"},
		{[]string{"demo", "--flush-every", "1500ms"}, "lastseen: --flush-every is 1.5s, want whole seconds"},
		{[]string{"demo", "--anonymous", "1"}, "lastseen: --anonymous is 1, want 0 <= x < 1"},
	} {
		_, err := runCLI(t, nil, c.args...)
		if err == nil || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("%v: error %v, want %q", c.args, err, c.want)
		}
	}
}
