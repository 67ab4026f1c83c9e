package tests

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lastseen/lastseen"
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
		cfg := oneShardUncached(h)
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
		equal(t, "windows still throttling", throttling(h), 0)
	})
}

// TestWindowDeletedWhileTouchInFlight: a touch's HSETNX reaches Redis only
// after a flush's swap moved and deleted its window (the window had been
// over for a throttle window by then: a stalled client, or a test clock
// that runs ahead). Its command recreates the window's hash, which no
// registration names; the touch sees on its return that this may have
// happened and registers the window again, so the next flush writes the
// entry and deletes the hash.
func TestWindowDeletedWhileTouchInFlight(t *testing.T) {
	forEachRedis(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		seedUsers(t, h.db, 4)
		cfg := oneShardUncached(h)
		h.clock.Set(mustTime("2026-03-01T10:00:30Z"))
		p, db := h.plugin(cfg)
		stall := &stallHook{match: ":window:", run: func() {
			h.clock.Add(2 * time.Minute) // the window ended at 10:01 and has been over for a minute
			res, err := p.Flush(ctx)
			must(t, err)
			equal(t, "written by the flush during the stall", res.Written, 1)
		}}
		ok, err := p.Touch(ctx, 1)
		must(t, err)
		equal(t, "user 1 recorded", ok, true)
		h.r.Client.AddHook(stall)
		stall.arm()
		ok, err = p.Touch(ctx, 2) // lands in the window the stall's flush deleted
		must(t, err)
		equal(t, "user 2 recorded", ok, true)
		equal(t, "stalls", stall.ran.Load(), int64(1))
		// Two later windows, so that the flush's tick no longer registers
		// the stray one again as one of the process's last two.
		for _, id := range []int{3, 4} {
			ok, err = p.Touch(ctx, id)
			must(t, err)
			equal(t, fmt.Sprintf("user %d recorded", id), ok, true)
			h.clock.Add(2 * time.Minute)
		}
		_, err = p.Flush(ctx)
		must(t, err)
		var cols []string
		for id := 1; id <= 4; id++ {
			cols = append(cols, lastSeenColumn(t, db, "users", "id", "last_seen_at", id))
		}
		equal(t, "columns of users 1 to 4", strings.Join(cols, " "),
			"2026-03-01T10:00:30Z 2026-03-01T10:00:30Z 2026-03-01T10:02:30Z 2026-03-01T10:04:30Z")
		equal(t, "buffers left", strings.Join(h.pendingKeys(), " "), "")
		equal(t, "windows still throttling at 10:06:30", throttling(h), 0)
	})
}

// stallHook runs run once, when armed, before the first command (alone or
// in a pipeline) whose key contains match is sent: the command reaches
// Redis after whatever run did.
type stallHook struct {
	match string
	run   func()
	armed atomic.Bool
	ran   atomic.Int64
}

func (s *stallHook) arm() { s.armed.Store(true) }

func (s *stallHook) before(cmds ...redis.Cmder) {
	for _, c := range cmds {
		if k, ok := c.Args()[min(1, len(c.Args())-1)].(string); ok && strings.Contains(k, s.match) && s.armed.CompareAndSwap(true, false) {
			s.ran.Add(1)
			s.run()
			return
		}
	}
}

func (s *stallHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (s *stallHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		s.before(cmd)
		return next(ctx, cmd)
	}
}

func (s *stallHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		s.before(cmds...)
		return next(ctx, cmds)
	}
}

// oneShardUncached is the harness's config with one shard, no local cache
// (every touch reaches Redis) and a one-minute throttle window.
func oneShardUncached(h *harness) lastseen.Config {
	cfg := h.config()
	cfg.Buffer.Shards = 1
	cfg.Buffer.LocalCacheSize = -1
	cfg.Throttle = time.Minute
	return cfg
}

// throttling counts the users a throttle window still throttles on the
// harness's clock.
func throttling(h *harness) int {
	n := 0
	for _, k := range h.keys() {
		if strings.Contains(k, ":seen:") {
			n++
		}
	}
	return n
}
