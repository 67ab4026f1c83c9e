package tests

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/tests/testenv"
	"github.com/redis/go-redis/v9"
)

// evictingRedis starts a private redis-server with maxmemory 4mb and the
// given maxmemory-policy (and extra arguments), and returns a harness on it
// with SQLite.
func evictingRedis(t *testing.T, policy string, extra ...string) (*harness, *privateRedis) {
	t.Helper()
	srv := startPrivateRedis(t, append([]string{"--maxmemory", "4mb", "--maxmemory-policy", policy}, extra...)...)
	h := newHarness(t, testenv.SQLite(), clientKind(newPrivateClient(t, srv.Addr())))
	return h, srv
}

// evictionConfig is the harness's lastseen.Config logging into logs.
func evictionConfig(h *harness, logs *testenv.Logs) lastseen.Config {
	cfg := h.config()
	cfg.Logger = testenv.TextLogger(logs)
	return cfg
}

// evictedKeys reads INFO stats evicted_keys from one server.
func evictedKeys(t testing.TB, c redis.Cmdable) int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "stats").Result()
	must(t, err)
	v, ok := infoField(info, "evicted_keys")
	if !ok {
		t.Fatal("INFO stats has no evicted_keys")
	}
	n, err := strconv.ParseInt(v, 10, 64)
	must(t, err)
	return n
}

// logAttrs are the attributes every log line of a plugin on the harness's
// prefix starts with (the plugin's Name, the table, the prefix).
func logAttrs(h *harness) string {
	return "plugin=lastseen:github.com/lastseen/lastseen.User.LastSeenAt table=users prefix=" + h.prefix
}

// evictionWarning is the warning line about allkeys-lru for the harness's
// prefix.
func evictionWarning(h *harness) string {
	return `level=WARN msg="lastseen: Redis maxmemory-policy is allkeys-lru: at maxmemory Redis may evict the pending and in-flight hashes, ` +
		`and the touches they hold are lost without an error; run CONFIG SET maxmemory-policy noeviction (and set it in redis.conf), ` +
		`or give lastseen a Redis of its own" ` + logAttrs(h) + ` maxmemory_policy=allkeys-lru`
}

// TestEvictionPolicyWarnedOnce: a Redis with allkeys-lru gets one warning
// naming the policy, the risk and the fix, however many checks follow
// (Initialize, then flushes a minute apart), and lastseen.Status shows the policy.
func TestEvictionPolicyWarnedOnce(t *testing.T) {
	var logs testenv.Logs
	h, _ := evictingRedis(t, "allkeys-lru")
	ctx := context.Background()
	p, db := h.plugin(evictionConfig(h, &logs))
	must(t, db.AutoMigrate(&lastseen.User{}))
	equal(t, "warnings after Initialize", logs.Count(evictionWarning(h)), 1)
	for range 3 {
		h.clock.Add(evictionCheckInterval)
		_, err := p.Flush(ctx)
		must(t, err)
	}
	equal(t, "warnings after 3 more checks", logs.Count(evictionWarning(h)), 1)
	equal(t, "policy lines", logs.Count("maxmemory_policy="), 1)
	st, err := p.Status(ctx)
	must(t, err)
	equal(t, "Status.EvictionPolicy", st.EvictionPolicy, "allkeys-lru")
	equal(t, "Status.EvictionRisk", st.EvictionRisk, true)
	equal(t, "Stats.Evictions", p.Stats().Evictions, 0)
}

// evictionUsers is how many users TestEvictionsReportedByTheNextFlush
// touches into a Redis of 1.5 MB (about 0.6 MB above an empty server's):
// their pending entries and throttle markers need more.
const evictionUsers = 20_000

// TestEvictionsReportedByTheNextFlush: 20,000 users touched into a Redis
// of 1.5 MB under allkeys-lru make Redis evict (markers and pending hashes
// alike); the first flush after the loss, with no eviction check due (the
// last was at db.Use, less than a minute ago), reports exactly the INFO
// stats evicted_keys delta the test reads, in FlushResult.Evicted and in
// Stats.Evictions, with one WARN line carrying it; the next flush reports
// 0 and logs nothing more.
func TestEvictionsReportedByTheNextFlush(t *testing.T) {
	var logs testenv.Logs
	srv := startPrivateRedis(t, "--maxmemory", "1500kb", "--maxmemory-policy", "allkeys-lru")
	h := newHarness(t, testenv.SQLite(), clientKind(newPrivateClient(t, srv.Addr())))
	ctx := context.Background()
	rdb := h.r.Client
	p, db := h.plugin(evictionConfig(h, &logs))
	must(t, db.AutoMigrate(&lastseen.User{}))
	before := evictedKeys(t, rdb) // what Initialize read as its baseline

	for id := 1; id <= evictionUsers; id++ {
		_, err := p.Touch(ctx, id)
		must(t, err)
	}
	// Lift the limit: no command evicts any more (not the flush's locks
	// either, which allkeys-lru may evict like any key: that flush would
	// report the lock lost), so the delta read now is the one the flush
	// reads.
	must(t, rdb.ConfigSet(ctx, "maxmemory", "0").Err())
	after := evictedKeys(t, rdb)
	if after == before {
		t.Fatalf("evicted_keys did not grow: %d users touched into 1.5 MB", evictionUsers)
	}
	equal(t, "Stats.Evictions before the flush", p.Stats().Evictions, 0)
	line := fmt.Sprintf(`level=WARN msg="lastseen: Redis evicted keys since the last check; pending timestamps may have been lost" %s evicted=%d maxmemory_policy=allkeys-lru`,
		logAttrs(h), after-before)

	res, err := p.Flush(ctx)
	must(t, err)
	equal(t, "FlushResult.Evicted", int64(res.Evicted), after-before)
	equal(t, "Stats.Evictions", p.Stats().Evictions, after-before)
	equal(t, "eviction log lines", logs.Count(line), 1)
	t.Logf("%d users touched, %d keys evicted, %d users drained by the flush", evictionUsers, after-before, res.Drained)

	res, err = p.Flush(ctx)
	must(t, err)
	equal(t, "FlushResult.Evicted of the next flush", res.Evicted, 0)
	equal(t, "Stats.Evictions after the next flush", p.Stats().Evictions, after-before)
	equal(t, "eviction log lines after the next flush", logs.Count("evicted="), 1)
}

// TestEvictionPolicyChangeAtRunTime: CONFIG SET at run time is picked up
// by the first check a minute after the last one: noeviction clears the
// risk (one note), volatile-lru raises it again (one new warning).
func TestEvictionPolicyChangeAtRunTime(t *testing.T) {
	var logs testenv.Logs
	h, _ := evictingRedis(t, "allkeys-lru")
	ctx := context.Background()
	rdb := h.r.Client
	p, db := h.plugin(evictionConfig(h, &logs))
	must(t, db.AutoMigrate(&lastseen.User{}))
	status := func(what, policy string, risk bool) {
		t.Helper()
		st, err := p.Status(ctx)
		must(t, err)
		equal(t, what+": policy", st.EvictionPolicy, policy)
		equal(t, what+": risk", st.EvictionRisk, risk)
	}

	must(t, rdb.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err())
	_, err := p.Flush(ctx)
	must(t, err)
	status("within the minute", "allkeys-lru", true)
	h.clock.Add(evictionCheckInterval)
	_, err = p.Flush(ctx)
	must(t, err)
	status("after CONFIG SET noeviction", "noeviction", false)
	equal(t, "noeviction notes", logs.Count(`level=INFO msg="lastseen: Redis maxmemory-policy is now noeviction"`), 1)

	must(t, rdb.ConfigSet(ctx, "maxmemory-policy", "volatile-lru").Err())
	h.clock.Add(evictionCheckInterval)
	status("after CONFIG SET volatile-lru (lastseen.Status checks too)", "volatile-lru", true)
	equal(t, "volatile-lru warnings", logs.Count(`level=WARN msg="lastseen: Redis maxmemory-policy is volatile-lru:`), 1)
	equal(t, "allkeys-lru warnings", logs.Count(evictionWarning(h)), 1)
}

// TestRequireNoEviction: with RequireNoEviction, Initialize refuses an
// evicting policy with lastseen.ErrInvalidConfig naming it and the fix, accepts
// noeviction, and accepts an unreadable policy (miniredis) with a warning.
func TestRequireNoEviction(t *testing.T) {
	t.Run("allkeys-lru", func(t *testing.T) {
		var logs testenv.Logs
		h, _ := evictingRedis(t, "allkeys-lru")
		cfg := evictionConfig(h, &logs)
		cfg.Buffer.RequireNoEviction = true
		p := lastseen.New(cfg)
		err := h.openDB().Use(p)
		equal(t, "errors.Is lastseen.ErrInvalidConfig", errors.Is(err, lastseen.ErrInvalidConfig), true)
		equal(t, "error", fmt.Sprint(err), `lastseen: invalid config: Redis maxmemory-policy is "allkeys-lru", which can evict the buffer, `+
			`and Buffer.RequireNoEviction is set: run CONFIG SET maxmemory-policy noeviction on the Redis (on every master of a cluster), `+
			`or give lastseen a Redis of its own`)
		equal(t, "tracker started", internals(p).Buffer == nil, true)
		equal(t, "buffer keys written", strings.Join(h.keys(), " "), "")
	})
	t.Run("noeviction", func(t *testing.T) {
		var logs testenv.Logs
		h, _ := evictingRedis(t, "noeviction")
		cfg := evictionConfig(h, &logs)
		cfg.Buffer.RequireNoEviction = true
		p, _ := h.plugin(cfg)
		st, err := p.Status(context.Background())
		must(t, err)
		equal(t, "policy", st.EvictionPolicy, "noeviction")
		equal(t, "policy log lines", logs.Count("maxmemory_policy="), 0)
	})
	t.Run("unknown", func(t *testing.T) {
		var logs testenv.Logs
		h := newHarness(t, testenv.SQLite(), testenv.Miniredis())
		cfg := evictionConfig(h, &logs)
		cfg.Buffer.RequireNoEviction = true
		p, _ := h.plugin(cfg)
		st, err := p.Status(context.Background())
		must(t, err)
		equal(t, "policy", st.EvictionPolicy, "unknown")
		equal(t, "risk", st.EvictionRisk, false)
		equal(t, "warnings", logs.Count(`level=WARN msg="lastseen: cannot read Redis maxmemory-policy (CONFIG GET and INFO memory did not answer); make sure it is noeviction" `+logAttrs(h)+` maxmemory_policy=unknown`), 1)
	})
}

// TestEvictionPolicyWithoutConfig: a Redis whose CONFIG command is disabled
// (rename-command CONFIG "", as managed Redis does) is read from INFO
// memory's maxmemory_policy, warned about once, and counted from INFO stats.
func TestEvictionPolicyWithoutConfig(t *testing.T) {
	var logs testenv.Logs
	h, _ := evictingRedis(t, "allkeys-lfu", "--rename-command", "CONFIG", "")
	ctx := context.Background()
	if err := h.r.Client.ConfigGet(ctx, "maxmemory-policy").Err(); err == nil {
		t.Fatal("CONFIG GET answered; the server should have it disabled")
	}
	p, _ := h.plugin(evictionConfig(h, &logs))
	st, err := p.Status(ctx)
	must(t, err)
	equal(t, "policy", st.EvictionPolicy, "allkeys-lfu")
	equal(t, "risk", st.EvictionRisk, true)
	equal(t, "warnings", logs.Count(`level=WARN msg="lastseen: Redis maxmemory-policy is allkeys-lfu:`), 1)
}

// TestEvictionPolicyEveryRedisKind: miniredis answers neither CONFIG nor
// INFO memory: "unknown", nothing fails, no log line (lastseen.Status shows it); the
// shared Redis and every master of the cluster run noeviction: no line
// either.
func TestEvictionPolicyEveryRedisKind(t *testing.T) {
	for _, r := range testenv.RedisKinds() {
		t.Run(r.Name, func(t *testing.T) {
			var logs testenv.Logs
			h := newHarness(t, testenv.SQLite(), r)
			ctx := context.Background()
			must(t, h.db.AutoMigrate(&lastseen.User{}, &lastseen.Session{}))
			p, _ := h.plugin(evictionConfig(h, &logs))
			_, err := p.Touch(ctx, 1)
			must(t, err)
			h.clock.Add(evictionCheckInterval)
			res, err := p.Flush(ctx)
			must(t, err)
			equal(t, "written", res.Written, 0) // no row 1: Unknown
			equal(t, "unknown", res.Unknown, 1)
			st, err := p.Status(ctx)
			must(t, err)
			want := "noeviction"
			if r.Name == "miniredis" {
				want = "unknown"
			}
			equal(t, "policy", st.EvictionPolicy, want)
			equal(t, "risk", st.EvictionRisk, false)
			equal(t, "policy log lines", logs.Count("maxmemory_policy="), 0)
			equal(t, "warnings", logs.Count("level=WARN"), 0)
			equal(t, "evictions", p.Stats().Evictions, 0)
		})
	}
}

// evictionCheckInterval is how often the plugin reads the eviction policy
// and counts again at the most (once a minute on its clock, as documented).
const evictionCheckInterval = time.Minute

// infoField returns one field of an INFO reply.
func infoField(info, name string) (string, bool) {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v, true
		}
	}
	return "", false
}
