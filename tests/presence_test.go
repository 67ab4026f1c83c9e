package tests

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/internal/keys"
	"github.com/lastseen/lastseen/tests/testenv"
	"github.com/redis/go-redis/v9"
)

// touchRange touches users from..to at at and fails unless each was recorded.
func touchRange(t testing.TB, p *lastseen.Plugin, from, to int, at time.Time) {
	t.Helper()
	for id := from; id <= to; id++ {
		ok, err := p.TouchAt(context.Background(), id, at)
		must(t, err)
		if !ok {
			t.Fatalf("touch of user %d at %s not recorded", id, at.Format(time.RFC3339))
		}
	}
}

// flushed runs a flush and fails t on its error: with Redis the presence
// counts hold the touches up to the last flush.
func flushed(t testing.TB, p *lastseen.Plugin) {
	t.Helper()
	_, err := p.Flush(context.Background())
	must(t, err)
}

// counted returns a function that fails t on a count's error and returns
// the count: counted(t)(p.Online(ctx, d)).
func counted(t testing.TB) func(int64, error) int64 {
	return func(n int64, err error) int64 {
		t.Helper()
		must(t, err)
		return n
	}
}

// TestOnlineCountsWindowsOpened: Online(d) counts the users whose touch
// opened a window from the start of the minute of now-d to now, as of the
// last flush (the flush adds the entries it drains; before it the count is
// 0), exactly for these small sets (one HyperLogLog per minute for all the
// shards: Redis counts ids 1..n exactly up to n = 127, 129 for 128): 80
// users at 09:30, 40 more at 09:33, the first 80 again inside their window
// (not counted twice); at 09:35:59 Online(5m) still covers the 09:30
// minute (120), at 09:36:00 no longer (40). Online(10m) covers both. The
// count is one PFCOUNT, one round trip.
func TestOnlineCountsWindowsOpened(t *testing.T) {
	forEachRedis(t, func(t *testing.T, h *harness) {
		ctx, count := context.Background(), counted(t)
		must(t, h.db.AutoMigrate(&lastseen.User{})) // for the flush
		cfg := h.config()
		cfg.Buffer.LocalCacheSize = -1 // every touch reaches the script
		p, _ := h.plugin(cfg)          // Throttle 5m, OnlineWindow 1h
		touchRange(t, p, 1, 80, h.clock.Now())
		equal(t, "online 5m at 09:30 before a flush", count(p.Online(ctx, 5*time.Minute)), int64(0))
		flushed(t, p)
		equal(t, "online 5m at 09:30", count(p.Online(ctx, 5*time.Minute)), int64(80))
		h.clock.Add(3 * time.Minute) // 09:33
		for id := 1; id <= 80; id++ {
			ok, err := p.TouchAt(ctx, id, h.clock.Now())
			must(t, err)
			equal(t, fmt.Sprint("user ", id, " again recorded"), ok, false)
		}
		touchRange(t, p, 81, 120, h.clock.Now())
		flushed(t, p)
		equal(t, "online 5m at 09:33", count(p.Online(ctx, 5*time.Minute)), int64(120))

		h.clock.Set(mustTime("2026-03-01T09:35:59Z"))
		equal(t, "online 5m at 09:35:59", count(p.Online(ctx, 5*time.Minute)), int64(120))
		h.clock.Set(mustTime("2026-03-01T09:36:00Z"))
		equal(t, "online 5m at 09:36:00", count(p.Online(ctx, 5*time.Minute)), int64(40))
		equal(t, "online 10m at 09:36:00", count(p.Online(ctx, 10*time.Minute)), int64(120))
		equal(t, "online 1h at 09:36:00", count(p.Online(ctx, time.Hour)), int64(120))

		rt := countRoundTrips(h.r.Client)
		_, err := p.Online(ctx, time.Hour)
		must(t, err)
		equal(t, "online round trips", rt.String(), "0 pipelines of 0 commands, 1 single commands")

		for _, d := range []time.Duration{time.Minute, 5*time.Minute - time.Millisecond, time.Hour + time.Second} {
			if _, err := p.Online(ctx, d); !errors.Is(err, lastseen.ErrInvalidTime) {
				t.Errorf("Online(%v) error = %v, want ErrInvalidTime", d, err)
			}
		}
	})
}

// TestActiveUsersByUTCDay: users count on the UTC day of their touch, as
// of the last flush; a range counts each user once: day 1 users 1..80,
// flushed, day 2 users 41..120 (after their windows ended), flushed, give
// 80, 80 and 120 for both days (on a real Redis and Cluster; miniredis sums
// a multi-key PFCOUNT; sets small enough for exact counts, as in
// TestOnlineCountsWindowsOpened). Ranges
// that end before they start or start before the days kept are refused; a
// range in the future counts 0.
func TestActiveUsersByUTCDay(t *testing.T) {
	forEachRedis(t, func(t *testing.T, h *harness) {
		ctx, count := context.Background(), counted(t)
		must(t, h.db.AutoMigrate(&lastseen.User{})) // for the flush
		cfg := h.config()
		cfg.Presence.ActiveUsersRetention = 2*24*time.Hour + 5*time.Hour // whole days: 2
		p, _ := h.plugin(cfg)
		h.clock.Set(mustTime("2026-03-01T23:58:00Z"))
		touchRange(t, p, 1, 80, h.clock.Now())
		flushed(t, p)
		h.expireThrottle(5 * time.Minute) // 2026-03-02T00:03:00Z
		touchRange(t, p, 41, 120, h.clock.Now())
		flushed(t, p)

		day1, day2 := mustTime("2026-03-01T12:00:00Z"), mustTime("2026-03-02T00:00:00Z")
		equal(t, "active on day 1", count(p.ActiveUsers(ctx, day1, day1)), int64(80))
		equal(t, "active on day 2", count(p.ActiveUsers(ctx, day2, day2)), int64(80))
		if h.r.Mini == nil {
			// miniredis v2.40.0 answers a PFCOUNT of several keys with the sum
			// of their counts (db.go hllCount), not the union's cardinality
			// that Redis gives: only a real server can check the union.
			equal(t, "active on both days", count(p.ActiveUsers(ctx, day1, day2)), int64(120))
			equal(t, "active in the 3 days kept and tomorrow", count(p.ActiveUsers(ctx, mustTime("2026-02-28T00:00:00Z"), mustTime("2026-03-03T00:00:00Z"))), int64(120))
		}
		equal(t, "active next week", count(p.ActiveUsers(ctx, mustTime("2026-03-09T00:00:00Z"), mustTime("2026-03-10T00:00:00Z"))), int64(0))

		for _, r := range [][2]string{
			{"2026-03-02T00:00:00Z", "2026-03-01T23:59:59Z"}, // ends before it starts
			{"2026-02-27T23:59:59Z", "2026-03-02T00:00:00Z"}, // 3 days before today: expired
		} {
			if _, err := p.ActiveUsers(ctx, mustTime(r[0]), mustTime(r[1])); !errors.Is(err, lastseen.ErrInvalidTime) {
				t.Errorf("ActiveUsers(%s, %s) error = %v, want ErrInvalidTime", r[0], r[1], err)
			}
		}
	})
}

// TestPresenceKeysExpire: the flush writes the presence keys: the minute
// bucket lives OnlineWindow after its minute ends, the day key
// ActiveUsersRetention (whole days) after its day ends, both computed on
// the plugin's clock at the flush; a backdated touch whose minute is past
// OnlineWindow adds to its day only. Both touches are late (their throttle
// windows ended by 09:30:00): they are pending and throttle nothing.
func TestPresenceKeysExpire(t *testing.T) {
	h := newHarness(t, testenv.SQLite(), testenv.Miniredis())
	ctx, count := context.Background(), counted(t)
	must(t, h.db.AutoMigrate(&lastseen.User{})) // for the flush
	cfg := h.config()
	cfg.Buffer.Shards = 1
	p, _ := h.plugin(cfg) // now 09:30:00, OnlineWindow 1h, retention 35 days
	touchRange(t, p, 1, 1, mustTime("2026-03-01T09:29:30Z"))
	touchRange(t, p, 2, 2, mustTime("2026-03-01T08:29:00Z")) // minute ended 1h ago: no bucket
	equal(t, "keys before the flush", strings.Join(h.keys(), " "), ":manifest :{0}:pending")
	flushed(t, p)
	online, active := h.prefix+":{presence}:online:29539289", h.prefix+":{presence}:active:2026-03-01"
	equal(t, "online bucket TTL", h.r.Mini.TTL(online), time.Hour) // its minute ends at 09:30:00 = now
	equal(t, "day TTL", h.r.Mini.TTL(active), 14*time.Hour+30*time.Minute+35*24*time.Hour)
	equal(t, "keys", strings.Join(h.keys(), " "),
		":manifest :{presence}:active:2026-03-01 :{presence}:online:29539289")
	equal(t, "active users", count(p.ActiveUsers(ctx, h.clock.Now(), h.clock.Now())), int64(2))
	equal(t, "online 1h", count(p.Online(ctx, time.Hour)), int64(1))
	h.r.Mini.FastForward(time.Hour - time.Second)
	equal(t, "online bucket 1s before its TTL", h.r.Mini.Exists(online), true)
	h.r.Mini.FastForward(time.Second)
	equal(t, "online bucket at its TTL", h.r.Mini.Exists(online), false)
}

// TestPresenceCountsOff: the touch is the same whether the counts are on
// or off (HSETNX of the window's entry, after the window's registration in
// the same pipeline on a process's first touch of it): the flush writes the
// HyperLogLogs. With OnlineWindow and ActiveUsersRetention negative the
// flush writes none and both reads return ErrCountsDisabled; with them on,
// the flush writes the minute's and the day's.
func TestPresenceCountsOff(t *testing.T) {
	forEachRedis(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		must(t, h.db.AutoMigrate(&lastseen.User{})) // for the flush
		cfg := h.config()
		cfg.Buffer.Shards = 1
		cfg.Presence.OnlineWindow, cfg.Presence.ActiveUsersRetention = -1, -1
		p, _ := h.plugin(cfg)
		rec := recordCommands(h.r.Client)
		touchRange(t, p, 1, 1, h.clock.Now())
		// 09:30:00Z, Throttle 5m: the window ending at 09:35:00Z.
		touchArgs := func(uid string) string {
			return fmt.Sprint([][]any{{"hsetnx", shardKeys(p, 0).Windows(), "1772357700000", 0},
				{"hsetnx", windowKey(p, uid, mustTime("2026-03-01T09:35:00Z")), uid, int64(1772357400000000)}})
		}
		equal(t, "commands, off", rec.names(), "hsetnx hsetnx")
		equal(t, "touch, off", fmt.Sprint(rec.all("hsetnx")), touchArgs("1"))
		equal(t, "redis keys, off", strings.Join(h.keys(), " "), ":manifest :{0}:pending :{0}:seen:1")
		flushed(t, p)
		equal(t, "redis keys after a flush, off", strings.Join(h.keys(), " "), ":manifest :{0}:seen:1")
		if _, err := p.Online(ctx, 5*time.Minute); !errors.Is(err, lastseen.ErrCountsDisabled) {
			t.Errorf("Online with the counts off: %v, want ErrCountsDisabled", err)
		}
		if _, err := p.ActiveUsers(ctx, h.clock.Now(), h.clock.Now()); !errors.Is(err, lastseen.ErrCountsDisabled) {
			t.Errorf("ActiveUsers with the counts off: %v, want ErrCountsDisabled", err)
		}

		on := h.config()
		on.Buffer.Shards = 1
		q, _ := h.plugin(on)
		rec.reset()
		touchRange(t, q, 2, 2, h.clock.Now())
		equal(t, "commands, on", rec.names(), "hsetnx hsetnx")
		equal(t, "touch, on", fmt.Sprint(rec.all("hsetnx")), touchArgs("2"))
		flushed(t, q)
		equal(t, "redis keys after a flush, on", strings.Join(h.keys(), " "),
			":manifest :{0}:seen:1 :{0}:seen:2 :{presence}:active:2026-03-01 :{presence}:online:29539290")
	})
}

// TestOnlineWindowConfig: OnlineWindow below Throttle is refused; left
// zero it defaults to 1h, or to Throttle when that is longer.
func TestOnlineWindowConfig(t *testing.T) {
	h := newHarness(t, testenv.SQLite(), testenv.Miniredis())
	cfg := h.config()
	cfg.Presence.OnlineWindow = time.Minute
	if err := h.openDB().Use(lastseen.New(cfg)); !errors.Is(err, lastseen.ErrInvalidConfig) || !strings.Contains(err.Error(), "OnlineWindow is 1m0s") {
		t.Errorf("OnlineWindow 1m with Throttle 5m: %v, want ErrInvalidConfig naming OnlineWindow", err)
	}
	equal(t, "default", lastseen.New(h.config()).Config().Presence.OnlineWindow, time.Hour)
	long := h.config()
	long.Throttle = 2 * time.Hour
	equal(t, "default with Throttle 2h", lastseen.New(long).Config().Presence.OnlineWindow, 2*time.Hour)
	equal(t, "default retention", lastseen.New(h.config()).Config().Presence.ActiveUsersRetention, 35*24*time.Hour)
}

// TestPresenceCountsOnCluster: on the Redis Cluster, with the default 16
// shards and users in every one of them, the flushes of all the shards add
// to one HyperLogLog per minute and one per day, all in the one slot of the
// hash tag {presence}; Online over a 5-minute window and ActiveUsers are
// each one PFCOUNT, exact (120 users at most: see
// TestOnlineCountsWindowsOpened), and no command fails (no CROSSSLOT).
// Users 1..60 at 09:30:00, 61..90 at 09:31:30, 91..120 at 09:34:10; at
// 09:36:00, their windows ended, users 1..30 again.
func TestPresenceCountsOnCluster(t *testing.T) {
	h := newHarness(t, testenv.SQLite(), testenv.RedisCluster())
	ctx, count := context.Background(), counted(t)
	cc := h.r.Client.(*redis.ClusterClient)
	rec := &errorRecorder{}
	h.r.Client.AddHook(rec)
	must(t, h.db.AutoMigrate(&lastseen.User{})) // for the flush
	cfg := h.config()
	cfg.Buffer.LocalCacheSize = -1
	p, _ := h.plugin(cfg) // 16 shards, Throttle 5m, OnlineWindow 1h
	shards := map[int]bool{}
	for id := 1; id <= 30; id++ {
		shards[keys.ShardOf(fmt.Sprint(id), lastseen.DefaultShards)] = true
	}
	equal(t, "shards of users 1..30", len(shards), lastseen.DefaultShards)

	touchRange(t, p, 1, 60, h.clock.Now())
	h.clock.Set(mustTime("2026-03-01T09:31:30Z"))
	touchRange(t, p, 61, 90, h.clock.Now())
	flushed(t, p)
	h.clock.Set(mustTime("2026-03-01T09:34:10Z"))
	touchRange(t, p, 91, 120, h.clock.Now())
	flushed(t, p)
	equal(t, "online 5m at 09:34:10", count(p.Online(ctx, 5*time.Minute)), int64(120))
	h.clock.Set(mustTime("2026-03-01T09:35:59Z"))
	equal(t, "online 5m at 09:35:59", count(p.Online(ctx, 5*time.Minute)), int64(120))
	h.expireThrottle(time.Second) // 09:36:00: the 09:30 minute has left the window
	equal(t, "online 5m at 09:36:00", count(p.Online(ctx, 5*time.Minute)), int64(60))
	touchRange(t, p, 1, 30, h.clock.Now())
	flushed(t, p)
	equal(t, "online 5m at 09:36:00, users 1..30 again", count(p.Online(ctx, 5*time.Minute)), int64(90))
	equal(t, "online 10m at 09:36:00", count(p.Online(ctx, 10*time.Minute)), int64(120))
	today, yesterday := h.clock.Now(), h.clock.Now().Add(-24*time.Hour)
	equal(t, "active today", count(p.ActiveUsers(ctx, today, today)), int64(120))
	equal(t, "active yesterday and today", count(p.ActiveUsers(ctx, yesterday, today)), int64(120))

	rt := countRoundTrips(h.r.Client)
	_, err := p.Online(ctx, 5*time.Minute)
	must(t, err)
	_, err = p.ActiveUsers(ctx, yesterday, today)
	must(t, err)
	equal(t, "count round trips", rt.String(), "0 pipelines of 0 commands, 2 single commands")

	var presence []string
	slots := map[int64]bool{}
	for _, k := range h.keys() {
		if strings.HasPrefix(k, ":{presence}:") {
			presence = append(presence, k)
			slots[cc.ClusterKeySlot(ctx, h.prefix+k).Val()] = true
		} else if strings.Contains(k, "online") || strings.Contains(k, "active") {
			t.Errorf("key %s: presence outside {presence}", k)
		}
	}
	equal(t, "presence keys", strings.Join(presence, " "), ":{presence}:active:2026-03-01 :{presence}:online:29539290 "+
		":{presence}:online:29539291 :{presence}:online:29539294 :{presence}:online:29539296")
	equal(t, "presence slots", len(slots), 1)
	equal(t, "command errors", strings.Join(rec.errs, "; "), "")
}
