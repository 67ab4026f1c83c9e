package tests

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/lastseen/lastseen/tests/testenv"
)

// TestWindowRegistryLostWithRedisData: Redis loses its data (FLUSHALL, as
// a restart without persistence or a failover to a stale replica leaves
// it) half a second after the process registered its window; its next
// touch is recorded in a window hash Redis no longer lists. The flush's
// tick registers the process's windows again, so the entry is written and
// the window deleted one throttle window after its end; only what Redis
// itself lost (user 1) is lost.
func TestWindowRegistryLostWithRedisData(t *testing.T) {
	rs := startPrivateRedis(t)
	rdb := newPrivateClient(t, rs.Addr())
	h := newHarness(t, testenv.SQLite(), clientKind(rdb))
	ctx := context.Background()
	cfg := h.config()
	cfg.Buffer.Shards = 1
	cfg.Throttle = time.Minute
	cfg.Buffer.LocalCacheSize = -1
	h.clock.Set(mustTime("2026-03-01T10:00:00Z"))
	p, db := h.plugin(cfg)
	seedUsers(t, db, 3)
	touch := func(id int) {
		t.Helper()
		ok, err := p.Touch(ctx, id)
		must(t, err)
		equal(t, fmt.Sprintf("user %d recorded", id), ok, true)
	}
	touch(1)
	must(t, rdb.FlushAll(ctx).Err())
	h.clock.Add(500 * time.Millisecond)
	touch(2) // within a second of the registration: not registered again by the touch
	h.clock.Add(3 * time.Minute)
	touch(3)
	for range 3 {
		_, err := p.Flush(ctx)
		must(t, err)
		h.clock.Add(3 * time.Minute)
	}
	got := fmt.Sprint(lastSeenColumn(t, db, "users", "id", "last_seen_at", 1), " ",
		lastSeenColumn(t, db, "users", "id", "last_seen_at", 2), " ", lastSeenColumn(t, db, "users", "id", "last_seen_at", 3))
	equal(t, "columns of users 1, 2, 3", got, " 2026-03-01T10:00:00.5Z 2026-03-01T10:03:00.5Z")
	keys, err := rdb.Keys(ctx, h.prefix+":*:window:*").Result()
	must(t, err)
	equal(t, "window hashes left", strings.Join(keys, " "), "")
}

// TestWindowRegistryThrottleMismatchSkew: an instance with a longer
// Throttle (a rolling deploy) and a clock 2 minutes behind writes into a
// window that a flusher with a shorter Throttle already moved and deleted,
// within a second of registering it. Its flush tick registers the window
// again: the entry is written, and no window hash is left.
func TestWindowRegistryThrottleMismatchSkew(t *testing.T) {
	forEachRedis(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		seedUsers(t, h.db, 3)
		cfg := h.config()
		cfg.Buffer.Shards = 1
		cfg.Buffer.LocalCacheSize = -1
		cfg.Throttle = time.Minute
		h.clock.Set(mustTime("2026-03-01T10:01:00Z"))
		f, db := h.plugin(cfg)
		acfg := cfg
		acfg.Throttle = 10 * time.Minute
		other := testenv.NewClock(mustTime("2026-03-01T09:59:00Z"))
		acfg.Test.Now = other.Now
		a, _ := h.plugin(acfg)
		touch := func(id int) {
			t.Helper()
			ok, err := a.Touch(ctx, id)
			must(t, err)
			equal(t, fmt.Sprintf("user %d recorded", id), ok, true)
		}
		touch(1) // a's window ends at 10:00, over on f's clock
		_, err := f.Flush(ctx)
		must(t, err)
		other.Add(500 * time.Millisecond)
		touch(2) // into the window f deleted
		h.clock.Add(20 * time.Minute)
		other.Add(20 * time.Minute)
		touch(3)
		for range 2 {
			_, err = f.Flush(ctx)
			must(t, err)
			_, err = a.Flush(ctx)
			must(t, err)
			h.clock.Add(20 * time.Minute)
			other.Add(20 * time.Minute)
		}
		got := fmt.Sprint(lastSeenColumn(t, db, "users", "id", "last_seen_at", 1), " ",
			lastSeenColumn(t, db, "users", "id", "last_seen_at", 2), " ", lastSeenColumn(t, db, "users", "id", "last_seen_at", 3))
		equal(t, "columns of users 1, 2, 3", got, "2026-03-01T09:59:00Z 2026-03-01T09:59:00.5Z 2026-03-01T10:19:00.5Z")
		equal(t, "buffers left", strings.Join(h.pendingKeys(), " "), "")
		left := 0
		for _, k := range h.keys() {
			if strings.Contains(k, ":seen:") {
				left++
			}
		}
		equal(t, "windows still throttling", left, 0)
	})
}
