package tests

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/tests/testenv"
)

// forEachMemory runs fn for every dialect with no Redis: the in-process
// buffer.
func forEachMemory(t *testing.T, fn func(t *testing.T, h *harness)) {
	for _, d := range servers.Dialects() {
		t.Run(d.Name, func(t *testing.T) { fn(t, newHarness(t, d, memoryKind())) })
	}
}

// TestMemoryBufferChosenWithoutRedis: Config.Redis nil gives the in-process
// buffer, which has no breaker and no backlog.
func TestMemoryBufferChosenWithoutRedis(t *testing.T) {
	h := newHarness(t, testenv.SQLite(), memoryKind())
	p, _ := h.plugin(h.config())
	isMemory := buf(p).Memory()
	equal(t, "memory buffer", isMemory, true)
	equal(t, "breaker", p.Breaker(), "closed")
	equal(t, "backlog", p.Stats().Backlog, 0)
}

// TestMemoryThrottleOncePerWindow: with the local cache off, the buffer
// itself throttles on the plugin's clock: recorded at 09:30:00, not at
// 09:34:59.999 (the pending value stays 09:30), recorded again at
// 09:35:00 exactly, when the 5m window ends; the pending value only moves
// forward (a touch at an older time opens a window but keeps 09:35).
func TestMemoryThrottleOncePerWindow(t *testing.T) {
	forEachMemory(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		cfg := h.config()
		cfg.Buffer.LocalCacheSize = -1
		p, _ := h.plugin(cfg)
		touch := func(what string, want bool) {
			t.Helper()
			ok, err := p.Touch(ctx, 7)
			must(t, err)
			equal(t, what, ok, want)
		}
		touch("09:30:00 recorded", true)
		h.clock.Set(mustTime("2026-03-01T09:34:59.999Z"))
		touch("09:34:59.999 throttled", false)
		equal(t, "pending after the throttled touch", pendingAt(t, p, 7), "2026-03-01T09:30:00Z")
		h.clock.Set(mustTime("2026-03-01T09:35:00Z"))
		touch("09:35:00 recorded", true)
		equal(t, "pending", pendingAt(t, p, 7), "2026-03-01T09:35:00Z")
		h.clock.Set(mustTime("2026-03-01T09:40:00Z"))
		ok, err := p.TouchAt(ctx, 7, mustTime("2026-03-01T09:20:00Z"))
		must(t, err)
		equal(t, "older time opens a window", ok, true)
		equal(t, "pending never lowered", pendingAt(t, p, 7), "2026-03-01T09:35:00Z")
		s := p.Stats()
		equal(t, "stats", fmt.Sprintf("touches=%d recorded=%d throttled=%d", s.Touches, s.Recorded, s.Throttled),
			"touches=4 recorded=3 throttled=1")
	})
}

// TestMemoryThrottleWithLocalCache: the local cache takes its deadline
// from the buffer's answer: a throttled touch 2m into the window caches
// the 3m left, so the next touch at 09:34:59 is a cache hit and the one
// at 09:35 reaches the buffer again.
func TestMemoryThrottleWithLocalCache(t *testing.T) {
	h := newHarness(t, testenv.SQLite(), memoryKind())
	ctx := context.Background()
	p, _ := h.plugin(h.config())
	_, err := p.Touch(ctx, 7)
	must(t, err)
	h.clock.Set(mustTime("2026-03-01T09:34:59Z"))
	ok, err := p.Touch(ctx, 7)
	must(t, err)
	equal(t, "09:34:59", ok, false)
	h.clock.Set(mustTime("2026-03-01T09:35:00Z"))
	ok, err = p.Touch(ctx, 7)
	must(t, err)
	equal(t, "09:35:00", ok, true)
	s := p.Stats()
	equal(t, "stats", fmt.Sprintf("recorded=%d throttled=%d cache_hits=%d", s.Recorded, s.Throttled, s.CacheHits),
		"recorded=2 throttled=1 cache_hits=1")
}

// TestMemoryFlushForwardOnlyAndUnknown: one flush writes the NULL row (2),
// leaves the row whose column is newer (1, Stale), skips the id without a
// row (9, Unknown) and creates no row; the buffer is empty after it.
func TestMemoryFlushForwardOnlyAndUnknown(t *testing.T) {
	forEachMemory(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		p, db := h.plugin(h.config())
		seedUsers(t, db, 2)
		must(t, db.Model(&lastseen.User{}).Where("id = ?", 1).Update("last_seen_at", mustTime("2026-03-01T10:00:00Z")).Error)
		for _, id := range []int{1, 2, 9} {
			_, err := p.TouchAt(ctx, id, mustTime("2026-03-01T09:30:00Z"))
			must(t, err)
		}
		res, err := p.Flush(ctx)
		must(t, err)
		res.Duration = 0
		equal(t, "flush", fmt.Sprintf("%+v", res),
			fmt.Sprintf("%+v", lastseen.FlushResult{Drained: 3, Written: 1, Unknown: 1, Stale: 1, Batches: 3, Shards: 3})) // users 1, 2, 9: shards 12, 5, 4
		equal(t, "columns", fmt.Sprint(columnsByID(t, db, "users", "id", "last_seen_at")),
			"map[1:2026-03-01T10:00:00Z 2:2026-03-01T09:30:00Z]")
		equal(t, "buffer left", strings.Join(h.keys(), " "), ":{12}:seen:1 :{4}:seen:9 :{5}:seen:2") // only the throttle markers
		again, err := p.Flush(ctx)
		must(t, err)
		equal(t, "second flush drained", again.Drained, 0)
	})
}

// TestMemoryRefusedRowRequeued: the database refuses user 7's row; the
// flush isolates it, writes the other 59, returns ErrRefused with Failed 1
// and puts user 7 back in pending; once allowed, the next flush writes it.
func TestMemoryRefusedRowRequeued(t *testing.T) {
	forEachMemory(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		cfg := h.config()
		cfg.Flush.BatchSize = 8
		p, db := h.plugin(cfg)
		want := seedFaultUsers(t, db, 60)
		allow := refuseUser(t, db, h.dialect, 7)
		touchFaultUsers(t, p, 60, "2026-03-01T09:00:00Z", want)
		res, err := p.Flush(ctx)
		if !errors.Is(err, lastseen.ErrRefused) {
			t.Fatalf("flush: %v, want ErrRefused", err)
		}
		equal(t, "written", res.Written, 59)
		equal(t, "failed", res.Failed, 1)
		equal(t, "drained", res.Drained, 60)
		equal(t, "pending(7) requeued", pendingValue(t, p, 7), "2026-03-01T09:00:07Z")
		st, err := p.Status(ctx)
		must(t, err)
		equal(t, "status", fmt.Sprintf("pending=%d in-flight=%d", st.Pending, st.InFlight), "pending=1 in-flight=0")
		allow()
		res, err = p.Flush(ctx)
		must(t, err)
		equal(t, "written after allow", res.Written, 1)
		equal(t, "user 7", lastSeenColumn(t, db, "users", "id", "last_seen_at", 7), "2026-03-01T09:00:07Z")
	})
}

// TestMemoryPurgeInProcessLock: the purge runs under the in-process lock:
// while it is held, PurgeExpiredSessions returns ErrLocked (PurgeSkipped
// 1); released, it deletes the 3 expired sessions of 5.
func TestMemoryPurgeInProcessLock(t *testing.T) {
	forEachMemory(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		p, db := h.plugin(purgeConfig(h, 2))
		seedSessions(t, db, sess("a", "2026-03-01T09:00:00Z"), sess("b", "2026-03-01T09:10:00Z"),
			sess("c", "2026-03-01T09:30:00Z"), sess("d", "2026-03-01T09:31:00Z"), sess("e", "2026-03-01T12:00:00Z"))
		release, err := buf(p).LockPurge(ctx)
		must(t, err)
		_, err = p.PurgeExpiredSessions(ctx)
		equal(t, "purge while locked", err, lastseen.ErrLocked)
		release(ctx)
		release(ctx) // releasing twice is harmless
		res, err := p.PurgeExpiredSessions(ctx)
		must(t, err)
		equal(t, "purge", fmt.Sprintf("deleted=%d batches=%d", res.Deleted, res.Batches), "deleted=3 batches=2")
		equal(t, "left", sessionIDs(t, db.Model(&lastseen.Session{}).Order("id")), "d,e")
		s := p.Stats()
		equal(t, "stats", fmt.Sprintf("purges=%d skipped=%d deleted=%d", s.Purges, s.PurgeSkipped, s.SessionsDeleted),
			"purges=1 skipped=1 deleted=3")
	})
}

// TestMemoryFlushSkipsLockedShard: a shard whose in-process flush lock is
// held is skipped (Skipped 1) and flushed by the next flush.
func TestMemoryFlushSkipsLockedShard(t *testing.T) {
	h := newHarness(t, testenv.SQLite(), memoryKind())
	ctx := context.Background()
	cfg := h.config()
	cfg.Buffer.Shards = 1
	p, db := h.plugin(cfg)
	seedUsers(t, db, 3)
	for id := 1; id <= 3; id++ {
		_, err := p.Touch(ctx, id)
		must(t, err)
	}
	release, err := buf(p).LockShard(ctx, 0)
	must(t, err)
	res, err := p.Flush(ctx)
	must(t, err)
	equal(t, "while held", fmt.Sprintf("drained=%d skipped=%d", res.Drained, res.Skipped), "drained=0 skipped=1")
	release(ctx)
	res, err = p.Flush(ctx)
	must(t, err)
	equal(t, "after release", fmt.Sprintf("drained=%d written=%d skipped=%d", res.Drained, res.Written, res.Skipped), "drained=3 written=3 skipped=0")
}

// TestMemoryReadsAndStatus: Pending, LastSeen and Status read the
// in-process buffer: user 1 pending at 09:20 over a column of 09:00, user 2
// in flight at 09:10 (a flush that failed after its swap), user 3 in the
// column only.
func TestMemoryReadsAndStatus(t *testing.T) {
	forEachMemory(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		cfg := h.config()
		cfg.Buffer.Shards = 1
		p, db := h.plugin(cfg)
		seedUsers(t, db, 3)
		must(t, db.Model(&lastseen.User{}).Where("id IN ?", []int{1, 3}).Update("last_seen_at", mustTime("2026-03-01T09:00:00Z")).Error)
		_, err := p.TouchAt(ctx, 2, mustTime("2026-03-01T09:10:00Z"))
		must(t, err)
		h.leaveInFlight(p, 0)
		_, err = p.TouchAt(ctx, 1, mustTime("2026-03-01T09:20:00Z"))
		must(t, err)

		equal(t, "pending(1)", pendingAt(t, p, 1), "2026-03-01T09:20:00Z")
		equal(t, "pending(2)", pendingAt(t, p, 2), "2026-03-01T09:10:00Z")
		equal(t, "pending(3)", pendingAt(t, p, 3), "none")
		for id, want := range map[int]string{1: "2026-03-01T09:20:00Z", 2: "2026-03-01T09:10:00Z", 3: "2026-03-01T09:00:00Z"} {
			at, ok, err := p.LastSeen(ctx, id)
			must(t, err)
			equal(t, fmt.Sprint("last seen ", id), ok && at.Format(time.RFC3339) == want, true)
		}
		many, err := p.LastSeenMany(ctx, []any{3, 2, 1, 4})
		must(t, err)
		equal(t, "last seen many", fmt.Sprint(many[0].Format(time.RFC3339), " ", many[1].Format(time.RFC3339), " ",
			many[2].Format(time.RFC3339), " ", many[3].IsZero()), "2026-03-01T09:00:00Z 2026-03-01T09:10:00Z 2026-03-01T09:20:00Z true")

		st, err := p.Status(ctx)
		must(t, err)
		equal(t, "status", fmt.Sprintf("%+v", st), fmt.Sprintf("%+v", lastseen.Status{At: mustTime("2026-03-01T09:30:00Z"),
			Shards:  []lastseen.ShardStatus{{Shard: 0, Pending: 1, InFlight: 1, Oldest: mustTime("2026-03-01T09:10:00Z")}},
			Pending: 1, InFlight: 1, Oldest: mustTime("2026-03-01T09:10:00Z")}))
		s, err := p.SampleBuffer(ctx, 16)
		must(t, err)
		equal(t, "sample", s, lastseen.BufferSample{At: mustTime("2026-03-01T09:30:00Z"), Pending: 1, InFlight: 1,
			Oldest: mustTime("2026-03-01T09:10:00Z"), Exact: true})

		res, err := p.Flush(ctx) // the in-flight set first, then pending
		must(t, err)
		equal(t, "flush", fmt.Sprintf("drained=%d written=%d", res.Drained, res.Written), "drained=2 written=2")
		equal(t, "columns", fmt.Sprint(columnsByID(t, db, "users", "id", "last_seen_at")),
			"map[1:2026-03-01T09:20:00Z 2:2026-03-01T09:10:00Z 3:2026-03-01T09:00:00Z]")
	})
}

// TestMemorySeveralModels: a users plugin and a sessions plugin, both
// without Redis and on the default Prefix, register on one *gorm.DB (each
// buffer is its own) and keep their ids apart: user "7" and session "7"
// each reach their own table only.
func TestMemorySeveralModels(t *testing.T) {
	forEachMemory(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		db := h.openDB()
		must(t, db.AutoMigrate(&lastseen.User{}, &lastseen.Session{}))
		must(t, db.Create(&lastseen.User{ID: 7}).Error)
		must(t, db.Create(&lastseen.Session{ID: "7", UserID: 7, ExpiresAt: mustTime("2026-03-02T00:00:00Z")}).Error)
		uc := h.config()
		uc.Buffer.Prefix = ""
		sc := uc
		sc.Model, sc.Field = &lastseen.Session{}, "LastActiveAt"
		users, sessions := lastseen.New(uc), lastseen.New(sc)
		must(t, db.Use(users))
		must(t, db.Use(sessions))
		t.Cleanup(func() { users.Close(ctx); sessions.Close(ctx) })
		// Each derives its own prefix from its table (the manifest's
		// namespace); in process they are only names.
		equal(t, "users prefix", strings.HasPrefix(users.Config().Buffer.Prefix, "lastseen:users:"), true)
		equal(t, "sessions prefix", strings.HasPrefix(sessions.Config().Buffer.Prefix, "lastseen:sessions:"), true)

		_, err := users.TouchAt(ctx, 7, mustTime("2026-03-01T09:10:00Z"))
		must(t, err)
		_, err = sessions.TouchAt(ctx, "7", mustTime("2026-03-01T09:20:00Z"))
		must(t, err)
		equal(t, "users pending(7)", pendingAt(t, users, 7), "2026-03-01T09:10:00Z")
		equal(t, "sessions pending(7)", pendingAt(t, sessions, "7"), "2026-03-01T09:20:00Z")
		for _, p := range []*lastseen.Plugin{users, sessions} {
			res, err := p.Flush(ctx)
			must(t, err)
			equal(t, p.Name()+" written", res.Written, 1)
		}
		equal(t, "user 7", lastSeenColumn(t, db, "users", "id", "last_seen_at", 7), "2026-03-01T09:10:00Z")
		equal(t, "session 7", lastSeenColumn(t, db, "sessions", "id", "last_active_at", "7"), "2026-03-01T09:20:00Z")
	})
}

// TestMemoryPresenceCounts: Online and ActiveUsers count exactly in
// memory, with the Redis keys' expiry: 3 users at 09:30, 2 more at 09:33;
// Online(5m) is 5 at 09:35:59 and 2 at 09:36:00; the day counts 5.
func TestMemoryPresenceCounts(t *testing.T) {
	h := newHarness(t, testenv.SQLite(), memoryKind())
	ctx, count := context.Background(), counted(t)
	cfg := h.config()
	cfg.Buffer.Shards = 2
	p, _ := h.plugin(cfg)
	touchRange(t, p, 1, 3, h.clock.Now())
	h.clock.Add(3 * time.Minute)
	touchRange(t, p, 4, 5, h.clock.Now())
	equal(t, "online 5m at 09:33", count(p.Online(ctx, 5*time.Minute)), int64(5))
	h.clock.Set(mustTime("2026-03-01T09:35:59Z"))
	equal(t, "online 5m at 09:35:59", count(p.Online(ctx, 5*time.Minute)), int64(5))
	h.clock.Set(mustTime("2026-03-01T09:36:00Z"))
	equal(t, "online 5m at 09:36:00", count(p.Online(ctx, 5*time.Minute)), int64(2))
	day := mustTime("2026-03-01T00:00:00Z")
	equal(t, "active today", count(p.ActiveUsers(ctx, day, day)), int64(5))
	h.clock.Set(mustTime("2026-03-01T10:40:00Z")) // the 09:30 bucket's hour has passed
	equal(t, "online 1h at 10:40", count(p.Online(ctx, time.Hour)), int64(0))
}

// TestMemoryMarkersSwept: expired throttle markers leave the map at the
// flush's swap, so the buffer does not grow with every user ever seen.
func TestMemoryMarkersSwept(t *testing.T) {
	h := newHarness(t, testenv.SQLite(), memoryKind())
	ctx := context.Background()
	cfg := h.config()
	cfg.Buffer.Shards = 1
	p, db := h.plugin(cfg)
	seedUsers(t, db, 10)
	touchRange(t, p, 1, 10, h.clock.Now())
	b := buf(p)
	equal(t, "markers", b.Markers(0), 10)
	h.clock.Add(5 * time.Minute)
	touchRange(t, p, 1, 1, h.clock.Now())
	_, err := p.Flush(ctx)
	must(t, err)
	equal(t, "markers after the swap", b.Markers(0), 1)
}
