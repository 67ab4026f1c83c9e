package tests

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/internal/keys"
	"github.com/lastseen/lastseen/tests/testenv"
	"github.com/redis/go-redis/v9"
)

// Attacks on buffer format 2 (bucketed pending, in-flight and marker
// hashes, internal/buffer/redisbuf, internal/keys): inputs and faults chosen to break the
// layout. Each test states what it attacks; they all assert exact values.

// idsAt returns n integer ids from from on whose decimal text keys.Locate
// puts in shard, bucket of shards shards.
func idsAt(shards, shard, bucket, n, from int) []int {
	var out []int
	for id := from; len(out) < n; id++ {
		if s, b := keys.Locate(strconv.Itoa(id), shards); s == shard && b == bucket {
			out = append(out, id)
		}
	}
	return out
}

// seedIDs creates users of the default model with the given ids and a NULL
// last seen.
func seedIDs(t testing.TB, h *harness, ids []int) {
	t.Helper()
	must(t, h.db.AutoMigrate(&lastseen.User{}))
	users := make([]lastseen.User, len(ids))
	for i, id := range ids {
		users[i].ID = uint64(id)
	}
	must(t, h.db.CreateInBatches(&users, 500).Error)
}

// encodings returns the OBJECT ENCODING of shard n's pending (or in-flight)
// hashes, by bucket ("" for an absent hash).
func encodings(t testing.TB, c redis.UniversalClient, k keys.Shard, inflight bool) []string {
	t.Helper()
	names := k.AllPending()
	if inflight {
		names = k.AllInFlight()
	}
	out := make([]string, len(names))
	for b, key := range names {
		enc, err := c.ObjectEncoding(context.Background(), key).Result()
		if err != nil && err != redis.Nil {
			t.Fatalf("object encoding %s: %v", key, err)
		}
		out[b] = enc
	}
	return out
}

// TestAttackHashtableBucketsDrain: the flush's scan (redisShard.scan) reads
// a shard's in-flight buckets in one pipeline of HSCAN and resumes a
// bucket whose HSCAN returned a cursor. A private server with
// hash-max-listpack-entries 8 makes two of the four buckets of shard 0
// (Shards 1024) hashtable-encoded, so their HSCAN pages come with cursors,
// one before and one after an empty bucket, with BatchSize 7 (pages of
// about 7 fields, batches cut across pages, the prefetch racing the
// acknowledgements that shrink the hash). Then an in-flight set left over
// by a failed flush (swap -2, scan sized by inflightLen) under newer
// pending entries of half the users. Every user is written once per flush
// with its exact value, Status and SampleBuffer count exactly, nothing is
// left in Redis.
func TestAttackHashtableBucketsDrain(t *testing.T) {
	rs := startPrivateRedis(t, "--hash-max-listpack-entries", "8")
	rdb := newPrivateClient(t, rs.Addr())
	h := newHarness(t, testenv.SQLite(), clientKind(rdb))
	ctx := context.Background()
	cfg := h.config()
	cfg.Buffer.Shards = 1024
	cfg.Flush.BatchSize = 7
	cfg.Throttle = time.Minute
	p, db := h.plugin(cfg)

	var ids []int
	sizes := []int{3, 40, 0, 25} // by bucket of shard 0
	for b, n := range sizes {
		ids = append(ids, idsAt(1024, 0, b, n, 1)...)
	}
	seedIDs(t, h, ids)
	base := mustTime("2026-03-01T09:00:00Z")
	want := map[int]string{}
	for i, id := range ids {
		at := base.Add(time.Duration(i) * time.Second)
		ok, err := p.TouchAt(ctx, id, at)
		must(t, err)
		equal(t, fmt.Sprintf("touch %d", id), ok, true)
		want[id] = at.Format(time.RFC3339)
	}
	equal(t, "pending encodings", strings.Join(encodings(t, rdb, shardKeys(p, 0), false), ","), "listpack,hashtable,,hashtable")

	st, err := p.Status(ctx)
	must(t, err)
	equal(t, "status pending", st.Pending, int64(len(ids)))
	equal(t, "status oldest", st.Oldest.Format(time.RFC3339), "2026-03-01T09:00:00Z")
	sample, err := p.SampleBuffer(ctx, 1000)
	must(t, err)
	equal(t, "sample pending", sample.Pending, int64(len(ids)))
	equal(t, "sample exact", sample.Exact, true)
	equal(t, "sample oldest", sample.Oldest.Format(time.RFC3339), "2026-03-01T09:00:00Z")
	anyIDs := make([]any, len(ids))
	for i, id := range ids {
		anyIDs[i] = id
	}
	seen, err := p.LastSeenMany(ctx, anyIDs)
	must(t, err)
	for i, id := range ids {
		equal(t, fmt.Sprintf("LastSeenMany(%d)", id), seen[i].Format(time.RFC3339), want[id])
	}

	res, err := p.Flush(ctx)
	must(t, err)
	equal(t, "drained", res.Drained, len(ids))
	equal(t, "written", res.Written, len(ids))
	equal(t, "stale", res.Stale, 0)
	for _, id := range ids {
		equal(t, fmt.Sprintf("user %d", id), lastSeenColumn(t, db, "users", "id", "last_seen_at", id), want[id])
	}
	equal(t, "buffers left", len(h.pendingKeys()), 0)

	// A flush that swapped and then died: the in-flight hashes stay, and
	// half the users are touched again, newer, into pending.
	h.expireThrottle(time.Minute)
	for i, id := range ids {
		at := base.Add(31*time.Minute + time.Duration(i)*time.Second)
		_, err := p.TouchAt(ctx, id, at)
		must(t, err)
		want[id] = at.Format(time.RFC3339)
	}
	must(t, buf(p).LeaveInFlight(ctx, 0))
	equal(t, "in-flight encodings", strings.Join(encodings(t, rdb, shardKeys(p, 0), true), ","), "listpack,hashtable,,hashtable")
	h.expireThrottle(time.Minute)
	newer := 0
	for i, id := range ids {
		if i%2 == 0 {
			continue
		}
		at := base.Add(33*time.Minute + time.Duration(i)*time.Second)
		_, err := p.TouchAt(ctx, id, at)
		must(t, err)
		want[id] = at.Format(time.RFC3339)
		newer++
	}
	st, err = p.Status(ctx)
	must(t, err)
	equal(t, "status in-flight", st.InFlight, int64(len(ids)))
	equal(t, "status pending", st.Pending, int64(newer))
	res, err = p.Flush(ctx)
	must(t, err)
	equal(t, "drained (left-over, then pending)", res.Drained, len(ids)+newer)
	equal(t, "written", res.Written, len(ids)+newer)
	for _, id := range ids {
		equal(t, fmt.Sprintf("user %d", id), lastSeenColumn(t, db, "users", "id", "last_seen_at", id), want[id])
	}
	equal(t, "buffers left", len(h.pendingKeys()), 0)
}

// TestAttackGarbageWindows: window fields that a touch never writes (by
// hand, another program) throttle the user as any field does, and the
// flush moves what they hold like any entry: a value that is not a
// timestamp is rejected (counted, dropped), a timestamp is written, and ""
// (an entry already moved) writes nothing.
func TestAttackGarbageWindows(t *testing.T) {
	forEachRedis(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		seedUsers(t, h.db, 4)
		cfg := h.config()
		cfg.Throttle = time.Minute
		cfg.Buffer.LocalCacheSize = -1
		p, db := h.plugin(cfg)
		h.clock.Add(30 * time.Second) // 09:30:30Z, in the window ending at 09:31
		end := windowEnd(p)
		values := []string{"abc", "", strconv.FormatInt(mustTime("2026-03-01T09:30:10Z").UnixMicro(), 10), "-5"}
		for i, v := range values {
			uid := strconv.Itoa(i + 1)
			must(t, h.r.Client.HSet(ctx, windowKey(p, uid, end), uid, v).Err())
			must(t, h.r.Client.HSetNX(ctx, shardKeys(p, keys.ShardOf(uid, p.Config().Buffer.Shards)).Windows(),
				strconv.FormatInt(end.UnixMilli(), 10), 0).Err())
			ok, err := p.Touch(ctx, i+1)
			must(t, err)
			equal(t, fmt.Sprintf("touch over a field %q: recorded", v), ok, false)
		}
		res, err := p.Flush(ctx)
		must(t, err)
		equal(t, "drained / written / rejected", fmt.Sprint(res.Drained, res.Written, res.Rejected), "3 1 2")
		for id, want := range []string{"", "", "2026-03-01T09:30:10Z", ""} {
			equal(t, fmt.Sprintf("user %d", id+1), lastSeenColumn(t, db, "users", "id", "last_seen_at", id+1), want)
		}
	})
}

// TestAttackClockSkew: two instances share a prefix, one clock ahead of the
// other. Throttle windows are fixed periods of each instance's own clock:
// when the two clocks fall in different windows, each records the user once
// in its window, and a user recorded in a window is throttled there on
// both. No timestamp is lost: the column ends at the newest recorded one.
func TestAttackClockSkew(t *testing.T) {
	forEachRedis(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		seedUsers(t, h.db, 3)
		cfg := h.config()
		cfg.Throttle = time.Minute
		cfg.Buffer.LocalCacheSize = -1
		a, db := h.plugin(cfg)
		for i, c := range []struct {
			skew  time.Duration
			steps []string // "a" or "b" touches, "+Ns" advances both clocks, each touch with its result
			want  string   // the column after a's flush
		}{
			// b at 09:31:05 is in the next window: both record, then a
			// enters b's window and is throttled by b's entry.
			{20 * time.Second, []string{"a true", "b true", "a false", "+15s", "a false", "b false"}, "2026-03-01T09:31:05Z"},
			// b at 09:40:25 is in a's window; then a enters the next window
			// first, and b follows it there.
			{-20 * time.Second, []string{"a true", "b false", "+15s", "a true", "b false", "+20s", "b false"}, "2026-03-01T09:41:00Z"},
			// More than two windows apart: each records once in its own.
			{150 * time.Second, []string{"a true", "b true", "a false", "b false"}, "2026-03-01T09:53:15Z"},
		} {
			id := i + 1
			h.clock.Set(mustTime("2026-03-01T09:30:45Z").Add(time.Duration(i) * 10 * time.Minute))
			other := testenv.NewClock(h.clock.Now().Add(c.skew))
			bcfg := cfg
			bcfg.Test.Now = other.Now
			b, _ := h.plugin(bcfg)
			for k, step := range c.steps {
				if d, ok := strings.CutPrefix(step, "+"); ok {
					dur, err := time.ParseDuration(d)
					must(t, err)
					h.clock.Add(dur)
					other.Add(dur)
					continue
				}
				name, want, _ := strings.Cut(step, " ")
				p := map[string]*lastseen.Plugin{"a": a, "b": b}[name]
				ok, err := p.Touch(ctx, id)
				must(t, err)
				equal(t, fmt.Sprintf("skew %v, step %d: %s records", c.skew, k, name), fmt.Sprint(ok), want)
			}
			_, err := a.Flush(ctx)
			must(t, err)
			equal(t, fmt.Sprintf("skew %v: column", c.skew), lastSeenColumn(t, db, "users", "id", "last_seen_at", id), c.want)
		}
	})
}

// scriptLoads counts SCRIPT LOAD commands sent through a client.
type scriptLoads struct{ n atomic.Int64 }

func (s *scriptLoads) DialHook(next redis.DialHook) redis.DialHook { return next }
func (s *scriptLoads) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if strings.EqualFold(cmd.Name(), "script") && len(cmd.Args()) > 1 && strings.EqualFold(fmt.Sprint(cmd.Args()[1]), "load") {
			s.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (s *scriptLoads) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// flushScripts runs SCRIPT FLUSH on every master of a cluster, or on the
// first master only with onlyFirst (a restarted or new master).
func flushScripts(t testing.TB, c redis.UniversalClient, onlyFirst bool) {
	t.Helper()
	ctx := context.Background()
	cc, ok := c.(*redis.ClusterClient)
	if !ok {
		must(t, c.ScriptFlush(ctx).Err())
		return
	}
	addrs := masterAddrs(t, cc)
	if onlyFirst {
		addrs = addrs[:1]
	}
	for _, addr := range addrs {
		m := redis.NewClient(&redis.Options{Addr: addr})
		err := m.ScriptFlush(ctx).Err()
		m.Close()
		must(t, err)
	}
}

// onFirstMaster reports whether key's slot is served by the first master
// (by address) of cluster c, the one flushScripts(onlyFirst) flushes.
func onFirstMaster(t testing.TB, c redis.UniversalClient, key string) bool {
	t.Helper()
	ctx := context.Background()
	cc := c.(*redis.ClusterClient)
	addrs := masterAddrs(t, cc)
	m, err := cc.MasterForKey(ctx, key)
	must(t, err)
	return m.Options().Addr == addrs[0]
}

// masterAddrs lists the addresses of a cluster's masters, sorted.
// ForEachMaster calls its function on every master at once: the list is
// built under a mutex.
func masterAddrs(t testing.TB, cc *redis.ClusterClient) []string {
	t.Helper()
	var mu sync.Mutex
	var addrs []string
	must(t, cc.ForEachMaster(context.Background(), func(ctx context.Context, m *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		addrs = append(addrs, m.Options().Addr)
		return nil
	}))
	slices.Sort(addrs)
	return addrs
}

// TestAttackNoScriptReads: the reads that pipeline EVALSHA
// (evalPipelined: LastSeenMany, Pending, SampleBuffer, Status) after
// SCRIPT FLUSH, on every master or on one master of a cluster only: each
// loads its script once (SCRIPT LOAD), runs again and answers exactly, with
// no error and no Redis error counted.
func TestAttackNoScriptReads(t *testing.T) {
	forEachRedis(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		cfg := h.config()
		cfg.Throttle = time.Minute
		p, db := h.plugin(cfg)
		seedUsers(t, db, 40)
		ids := make([]any, 40)
		for i := range ids {
			ids[i] = i + 1
			_, err := p.TouchAt(ctx, i+1, mustTime("2026-03-01T09:00:00Z").Add(time.Duration(i)*time.Second))
			must(t, err)
		}
		loads := &scriptLoads{}
		h.r.Client.AddHook(loads)
		_, isCluster := h.r.Client.(*redis.ClusterClient)
		for _, onlyFirst := range []bool{false, true} {
			if onlyFirst && !isCluster {
				continue
			}
			what := fmt.Sprintf("one master only %v", onlyFirst)
			check := func(name string, read func() error) {
				t.Helper()
				flushScripts(t, h.r.Client, onlyFirst)
				before := loads.n.Load()
				must(t, read())
				want := int64(1)
				if name == "Pending" && onlyFirst && !onFirstMaster(t, h.r.Client, pendingKey(p, "40")) {
					want = 0 // its shard's master kept its scripts
				}
				equal(t, what+": "+name+": SCRIPT LOADs", loads.n.Load()-before, want)
			}
			check("LastSeenMany", func() error {
				seen, err := p.LastSeenMany(ctx, ids)
				for i := range ids {
					equal(t, fmt.Sprintf("%s: LastSeenMany(%d)", what, i+1), seen[i].Format(time.RFC3339),
						mustTime("2026-03-01T09:00:00Z").Add(time.Duration(i)*time.Second).Format(time.RFC3339))
				}
				return err
			})
			check("Pending", func() error {
				at, ok, err := p.Pending(ctx, 40)
				equal(t, what+": Pending(40)", ok && at.Equal(mustTime("2026-03-01T09:00:39Z")), true)
				return err
			})
			check("SampleBuffer", func() error {
				s, err := p.SampleBuffer(ctx, 16)
				equal(t, what+": sample pending", s.Pending, int64(40))
				equal(t, what+": sample oldest", s.Oldest.Format(time.RFC3339), "2026-03-01T09:00:00Z")
				return err
			})
			check("Status", func() error {
				st, err := p.Status(ctx)
				equal(t, what+": status pending", st.Pending, int64(40))
				equal(t, what+": status oldest", st.Oldest.Format(time.RFC3339), "2026-03-01T09:00:00Z")
				return err
			})
		}
		equal(t, "redis errors", p.Stats().RedisErrors, 0)
	})
}

// longKeyUser is a users table keyed by text up to 128 bytes (the default
// MaxIDLength).
type longKeyUser struct {
	ID         string `gorm:"primaryKey;size:128"`
	LastSeenAt *time.Time
}

func (longKeyUser) TableName() string { return "users" }

// TestAttackLongIDsOneShard: ids of MaxIDLength bytes (past Redis's
// hash-max-listpack-value, 64 bytes, so every bucket holding one is
// hashtable-encoded) with Shards 1: 4,096 buckets in one hash tag, so
// swap.lua, ack.lua and sample.lua name 4,097 to 8,193 keys of one slot,
// and ids that differ only in case or in a trailing byte land apart. Touch,
// LastSeenMany, Status, SampleBuffer and two flushes (one in batches of 3,
// one of a left-over in-flight set) are exact on every Redis kind.
func TestAttackLongIDsOneShard(t *testing.T) {
	forEachRedis(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		cfg := h.config()
		cfg.Buffer.Shards = 1
		cfg.Flush.BatchSize = 3
		cfg.Throttle = time.Minute
		cfg.Model = &longKeyUser{}
		must(t, h.db.AutoMigrate(&longKeyUser{}))
		p, db := h.plugin(cfg)
		var ids []string
		for i := range 30 {
			stem := strings.Repeat("x", 120) + fmt.Sprintf("%08d", i)
			ids = append(ids, stem, strings.ToUpper(stem))
		}
		ids = append(ids, strings.Repeat("é", 64)) // 128 bytes of UTF-8
		users := make([]longKeyUser, len(ids))
		for i, id := range ids {
			users[i].ID = id
		}
		must(t, db.Create(&users).Error)
		want := map[string]string{}
		anyIDs := make([]any, len(ids))
		for i, id := range ids {
			at := mustTime("2026-03-01T09:00:00Z").Add(time.Duration(i) * time.Second)
			ok, err := p.TouchAt(ctx, id, at)
			must(t, err)
			equal(t, fmt.Sprintf("touch %d", i), ok, true)
			want[id] = at.Format(time.RFC3339)
			anyIDs[i] = id
		}
		seen, err := p.LastSeenMany(ctx, anyIDs)
		must(t, err)
		for i, id := range ids {
			equal(t, fmt.Sprintf("LastSeenMany(%d)", i), seen[i].Format(time.RFC3339), want[id])
		}
		st, err := p.Status(ctx)
		must(t, err)
		equal(t, "status pending", st.Pending, int64(len(ids)))
		equal(t, "status unreadable", st.Unreadable, int64(0))
		sample, err := p.SampleBuffer(ctx, 1000)
		must(t, err)
		equal(t, "sample pending", sample.Pending, int64(len(ids)))
		equal(t, "sample oldest", sample.Oldest.Format(time.RFC3339), "2026-03-01T09:00:00Z")
		res, err := p.Flush(ctx)
		must(t, err)
		equal(t, "written", res.Written, len(ids))
		equal(t, "drained", res.Drained, len(ids))

		h.expireThrottle(time.Minute)
		for i, id := range ids {
			at := mustTime("2026-03-01T09:31:00Z").Add(time.Duration(i) * time.Second)
			_, err := p.TouchAt(ctx, id, at)
			must(t, err)
			want[id] = at.Format(time.RFC3339)
		}
		must(t, buf(p).LeaveInFlight(ctx, 0))
		st, err = p.Status(ctx)
		must(t, err)
		equal(t, "status in-flight", st.InFlight, int64(len(ids)))
		res, err = p.Flush(ctx)
		must(t, err)
		equal(t, "written from the left-over in-flight set", res.Written, len(ids))
		for i, id := range ids {
			equal(t, fmt.Sprintf("user %d", i), lastSeenColumn(t, db, "users", "id", "last_seen_at", id), want[id])
		}
		equal(t, "buffers left", len(h.pendingKeys()), 0)
	})
}

// TestAttackPausedRedisReads: Redis hangs (CLIENT PAUSE) during
// LastSeenMany and Pending: LastSeenMany answers from the database within
// its own bound (5×TouchTimeout) without an error, and once Redis is back
// both read the buffer again, the connection cut short by the deadline
// not reused with a stale reply.
func TestAttackPausedRedisReads(t *testing.T) {
	rs := startPrivateRedis(t)
	rdb := newPrivateClient(t, rs.Addr())
	h := newHarness(t, testenv.SQLite(), clientKind(rdb))
	ctx := context.Background()
	cfg := h.config()
	cfg.Buffer.TouchTimeout = 20 * time.Millisecond
	cfg.Throttle = time.Minute
	p, db := h.plugin(cfg)
	seedUsers(t, db, 20)
	ids := make([]any, 20)
	for i := range ids {
		ids[i] = i + 1
		_, err := p.TouchAt(ctx, i+1, mustTime("2026-03-01T09:00:00Z"))
		must(t, err)
	}
	_, err := p.Flush(ctx)
	must(t, err)
	h.expireThrottle(time.Minute)
	for i := range ids {
		_, err := p.TouchAt(ctx, i+1, mustTime("2026-03-01T09:31:00Z").Add(time.Duration(i)*time.Second))
		must(t, err)
	}

	admin := newPrivateClient(t, rs.Addr())
	must(t, admin.Do(ctx, "CLIENT", "PAUSE", "1500", "ALL").Err())
	seen, err := p.LastSeenMany(ctx, ids)
	must(t, err)
	for i := range ids {
		equal(t, fmt.Sprintf("paused: LastSeenMany(%d)", i+1), seen[i].Format(time.RFC3339), "2026-03-01T09:00:00Z")
	}
	must(t, admin.Do(ctx, "CLIENT", "UNPAUSE").Err())
	waitForRedis(t, rdb)
	for range 3 { // each on a connection of the pool, none holding a stale reply
		seen, err = p.LastSeenMany(ctx, ids)
		must(t, err)
		for i := range ids {
			equal(t, fmt.Sprintf("after: LastSeenMany(%d)", i+1), seen[i].Format(time.RFC3339),
				mustTime("2026-03-01T09:31:00Z").Add(time.Duration(i)*time.Second).Format(time.RFC3339))
		}
		at, ok, err := p.Pending(ctx, 7)
		must(t, err)
		equal(t, "after: Pending(7)", ok && at.Equal(mustTime("2026-03-01T09:31:06Z")), true)
	}
}

// TestAttackThrottleChanged: a second instance on the prefix with another
// Throttle (a rolling deploy) starts and logs the mismatch once. Windows
// are named by their end (Unix ms): where both instances' windows end at
// the same instant they share the hash and throttle each other; where they
// end apart, each records the user in its own (more writes, as the
// manifest's warning says). Nothing is lost: the column ends at the newest
// timestamp.
func TestAttackThrottleChanged(t *testing.T) {
	forEachRedis(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		seedUsers(t, h.db, 1)
		cfg := h.config()
		cfg.Throttle = time.Minute
		a, db := h.plugin(cfg)
		logs := &testenv.Logs{}
		bcfg := cfg
		bcfg.Throttle = 2 * time.Minute
		bcfg.Logger = testenv.JSONLogger(logs)
		b, _ := h.plugin(bcfg)
		out := logs.Take()
		equal(t, "mismatch logged", strings.Count(out, "the buffer was created with another Throttle"), 1)
		equal(t, "values logged", strings.Contains(out, `"manifest_throttle":"1m0s","throttle":"2m0s"`), true)

		touch := func(p *lastseen.Plugin, name string, want bool) {
			t.Helper()
			ok, err := p.Touch(ctx, 1)
			must(t, err)
			equal(t, name, ok, want)
		}
		touch(a, "a records at 09:30:00 (its window ends at 09:31)", true)
		h.clock.Add(10 * time.Second)
		touch(b, "b records at 09:30:10 (its window ends at 09:32)", true)
		h.clock.Add(80 * time.Second)
		touch(a, "a at 09:31:30, in b's window (both end at 09:32)", false)
		h.clock.Add(10 * time.Second)
		touch(b, "b at 09:31:40, in its own window", false)
		h.clock.Add(30 * time.Second)
		touch(a, "a records at 09:32:10 (its window ends at 09:33)", true)
		touch(b, "b records at 09:32:10 (its window ends at 09:34)", true)
		_, err := a.Flush(ctx)
		must(t, err)
		equal(t, "column", lastSeenColumn(t, db, "users", "id", "last_seen_at", 1), "2026-03-01T09:32:10Z")
	})
}
