package tests

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/internal/keys"
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
		p, _ := h.plugin(cfg)
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
		equal(t, "columns of users 1 to 4", columns(t, h, 4),
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
	lose  bool // the stalled command runs, and its caller gets a timeout instead of its reply
	armed atomic.Bool
	ran   atomic.Int64
}

func (s *stallHook) arm() { s.armed.Store(true) }

// before runs run if one of cmds is the awaited command, and reports
// whether it did.
func (s *stallHook) before(cmds ...redis.Cmder) bool {
	for _, c := range cmds {
		if k, ok := c.Args()[min(1, len(c.Args())-1)].(string); ok && strings.Contains(k, s.match) && s.armed.CompareAndSwap(true, false) {
			s.ran.Add(1)
			s.run()
			return true
		}
	}
	return false
}

// after is the error the caller gets: a timeout when the reply is lost.
func (s *stallHook) after(stalled bool, err error) error {
	if stalled && s.lose && err == nil {
		return fmt.Errorf("i/o timeout (reply lost): %w", context.DeadlineExceeded)
	}
	return err
}

func (s *stallHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (s *stallHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		stalled := s.before(cmd)
		return s.after(stalled, next(ctx, cmd))
	}
}

func (s *stallHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		stalled := s.before(cmds...)
		return s.after(stalled, next(ctx, cmds))
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

// touchRecorded touches id on p and fails unless it was recorded.
func touchRecorded(t *testing.T, p *lastseen.Plugin, id int) {
	t.Helper()
	ok, err := p.Touch(context.Background(), id)
	must(t, err)
	equal(t, fmt.Sprintf("user %d recorded", id), ok, true)
}

// columns reads users 1..n's last_seen_at, space-separated ("" for NULL).
func columns(t *testing.T, h *harness, n int) string {
	t.Helper()
	var cols []string
	for id := 1; id <= n; id++ {
		cols = append(cols, lastSeenColumn(t, h.db, "users", "id", "last_seen_at", id))
	}
	return strings.Join(cols, " ")
}

// TestWindowStrayOnOtherFlusher: a touch's command reaches Redis after a
// flusher of another instance deleted its window, where the toucher's own
// clock or Throttle does not see the window as deleted yet: the flusher's
// clock runs 30 s ahead (less than a throttle window), or its Throttle is
// 1 minute against the toucher's 10. The toucher then writes to two later
// windows before its next flush tick. The tick registers again every
// window the toucher wrote to since the last one: user 2 is written, no
// hash is left.
func TestWindowStrayOnOtherFlusher(t *testing.T) {
	for _, c := range []struct {
		name             string
		throttle         time.Duration // the toucher's
		flusher, toucher string        // their clocks at the start
		stall, step      time.Duration // the clocks' advance during the stall, and per later touch
		want             string
	}{
		{"clock ahead", time.Minute, "2026-03-01T10:00:30Z", "2026-03-01T10:00:00Z", 90 * time.Second, time.Minute,
			"2026-03-01T10:00:00Z 2026-03-01T10:00:00Z 2026-03-01T10:02:30Z 2026-03-01T10:03:30Z"},
		{"shorter throttle", 10 * time.Minute, "2026-03-01T10:05:00Z", "2026-03-01T10:05:00Z", 6*time.Minute + 30*time.Second, 10 * time.Minute,
			"2026-03-01T10:05:00Z 2026-03-01T10:05:00Z 2026-03-01T10:21:30Z 2026-03-01T10:31:30Z"},
	} {
		t.Run(c.name, func(t *testing.T) {
			forEachRedis(t, func(t *testing.T, h *harness) {
				ctx := context.Background()
				seedUsers(t, h.db, 4)
				cfg := oneShardUncached(h)
				h.clock.Set(mustTime(c.flusher))
				f, _ := h.plugin(cfg)
				tcfg := cfg
				tcfg.Throttle = c.throttle
				other := testenv.NewClock(mustTime(c.toucher))
				tcfg.Test.Now = other.Now
				a, _ := h.plugin(tcfg)
				stall := &stallHook{match: ":window:", run: func() {
					h.clock.Add(c.stall)
					other.Add(c.stall)
					_, err := f.Flush(ctx)
					must(t, err)
				}}
				touchRecorded(t, a, 1)
				h.r.Client.AddHook(stall)
				stall.arm()
				touchRecorded(t, a, 2)
				equal(t, "stalls", stall.ran.Load(), int64(1))
				for _, id := range []int{3, 4} {
					h.clock.Add(c.step)
					other.Add(c.step)
					touchRecorded(t, a, id)
				}
				for range 3 {
					h.clock.Add(2 * c.throttle)
					other.Add(2 * c.throttle)
					_, err := a.Flush(ctx)
					must(t, err)
					_, err = f.Flush(ctx)
					must(t, err)
				}
				equal(t, "columns of users 1 to 4", columns(t, h, 4), c.want)
				nothingLeft(t, h)
			})
		})
	}
}

// TestWindowStrayReplyLost: the touch's command runs in Redis after a
// flush deleted its window, and its reply is lost (the client reports a
// timeout): the touch is kept in the backlog, and the flush tick registers
// the window again, so that its hash is deleted too.
func TestWindowStrayReplyLost(t *testing.T) {
	forEachRedis(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		seedUsers(t, h.db, 4)
		cfg := oneShardUncached(h)
		h.clock.Set(mustTime("2026-03-01T10:00:30Z"))
		p, _ := h.plugin(cfg)
		stall := &stallHook{match: ":window:", lose: true, run: func() {
			h.clock.Add(2 * time.Minute)
			_, err := p.Flush(ctx)
			must(t, err)
		}}
		touchRecorded(t, p, 1)
		h.r.Client.AddHook(stall)
		stall.arm()
		_, err := p.Touch(ctx, 2)
		if !errors.Is(err, lastseen.ErrBuffered) {
			t.Fatalf("touch with its reply lost: %v, want ErrBuffered", err)
		}
		for _, id := range []int{3, 4} {
			touchRecorded(t, p, id)
			h.clock.Add(2 * time.Minute)
		}
		for range 3 {
			_, err = p.Flush(ctx)
			must(t, err)
			h.clock.Add(2 * time.Minute)
		}
		equal(t, "columns of users 1 to 4", columns(t, h, 4),
			"2026-03-01T10:00:30Z 2026-03-01T10:00:30Z 2026-03-01T10:02:30Z 2026-03-01T10:04:30Z")
		nothingLeft(t, h)
	})
}

// TestWindowsIdleShardEmptied: a shard whose users went quiet keeps no
// registration of its windows once they have been over for a throttle
// window: the flush ticks stop registering them again, and a swap deletes
// them.
func TestWindowsIdleShardEmptied(t *testing.T) {
	forEachRedis(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		seedUsers(t, h.db, 2)
		cfg := oneShardUncached(h)
		h.clock.Set(mustTime("2026-03-01T10:00:30Z"))
		p, _ := h.plugin(cfg)
		touchRecorded(t, p, 1)
		h.clock.Add(time.Minute)
		touchRecorded(t, p, 2)
		for range 4 {
			h.clock.Add(time.Hour)
			_, err := p.Flush(ctx)
			must(t, err)
		}
		equal(t, "columns of users 1, 2", columns(t, h, 2), "2026-03-01T10:00:30Z 2026-03-01T10:01:30Z")
		equal(t, "window keys left", windowKeys(t, h), "")
	})
}

// nothingLeft asserts that no entry waits in Redis and that no key of a
// throttle window, or of their registrations, is left.
func nothingLeft(t *testing.T, h *harness) {
	t.Helper()
	equal(t, "buffers left", strings.Join(h.pendingKeys(), " "), "")
	equal(t, "window keys left", windowKeys(t, h), "")
}

// windowKeys lists the Redis keys of throttle windows and of their
// registrations under the harness's prefix, space-separated.
func windowKeys(t *testing.T, h *harness) string {
	t.Helper()
	raw, err := testenv.Keys(context.Background(), h.r.Client, h.prefix+":*:window*")
	must(t, err)
	return strings.Join(raw, " ")
}

// TestWindowMoveWithAndWithoutPending: the swap moves a window's new
// entries into pending whether the bucket's pending hash is empty or
// already holds a late touch (user 3's, beside user d's window entry in the
// same bucket); entries moved from a window still open stay as throttle
// marks, so the next flush drains only what is new; an ended window's
// hashes go, with or without entries left to move.
func TestWindowMoveWithAndWithoutPending(t *testing.T) {
	d := 4 // the first id after 3 in user 3's bucket, one shard
	for _, b3 := keys.Locate("3", 1); ; d++ {
		if _, b := keys.Locate(strconv.Itoa(d), 1); b == b3 {
			break
		}
	}
	forEachRedis(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		seedUsers(t, h.db, d)
		h.clock.Set(mustTime("2026-03-01T10:00:10Z"))
		p, _ := h.plugin(oneShardUncached(h))
		flush := func(at string) string {
			t.Helper()
			h.clock.Set(mustTime(at))
			res, err := p.Flush(ctx)
			must(t, err)
			return fmt.Sprintf("drained %d written %d stale %d", res.Drained, res.Written, res.Stale)
		}
		touchRecorded(t, p, 1)
		touchRecorded(t, p, 2)
		equal(t, "first flush", flush("2026-03-01T10:00:10Z"), "drained 2 written 2 stale 0")
		h.clock.Set(mustTime("2026-03-01T10:00:20Z"))
		ok, err := p.Touch(ctx, 1)
		must(t, err)
		equal(t, "user 1 recorded again in the open window", ok, false)
		touchRecorded(t, p, 3)
		equal(t, "second flush: user 3 only", flush("2026-03-01T10:00:20Z"), "drained 1 written 1 stale 0")
		h.clock.Set(mustTime("2026-03-01T10:00:30Z"))
		ok, err = p.TouchAt(ctx, 3, mustTime("2026-03-01T09:59:30Z"))
		must(t, err)
		equal(t, "late touch of user 3 recorded", ok, true)
		touchRecorded(t, p, d)
		equal(t, "third flush: user 3's late touch and user d", flush("2026-03-01T10:00:30Z"), "drained 2 written 1 stale 1")
		equal(t, "an ended window with nothing to move", flush("2026-03-01T10:01:05Z"), "drained 0 written 0 stale 0")
		equal(t, "window hashes left after it", strings.Count(windowKeys(t, h), ":window:"), 0)
		h.clock.Set(mustTime("2026-03-01T10:01:10Z"))
		touchRecorded(t, p, 2)
		equal(t, "an ended window with an entry to move", flush("2026-03-01T10:02:05Z"), "drained 1 written 1 stale 0")
		got := fmt.Sprint(columns(t, h, 3), " ", lastSeenColumn(t, h.db, "users", "id", "last_seen_at", d))
		equal(t, "columns of users 1, 2, 3 and d", got,
			"2026-03-01T10:00:10Z 2026-03-01T10:01:10Z 2026-03-01T10:00:20Z 2026-03-01T10:00:30Z")
		equal(t, "later flush", flush("2026-03-01T10:05:00Z"), "drained 0 written 0 stale 0")
		equal(t, "later flush", flush("2026-03-01T10:05:01Z"), "drained 0 written 0 stale 0")
		nothingLeft(t, h)
	})
}

// TestWindowFirstMoveTurnsHashIntoPending: a window nothing was moved from
// yet becomes its bucket's pending hash whole; an open one is written
// again with every field a throttle mark ("") and its count of moved
// entries set to its size, an ended one is gone. A count lost while marks
// stay (the hash of windows written again with 0) moves those marks with
// the new entry: the flush skips them (nothing written, nothing counted
// as dropped) and the count covers them again. A user in two ended
// windows is written once, with the newer time.
func TestWindowFirstMoveTurnsHashIntoPending(t *testing.T) {
	forEachRedis(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		seedUsers(t, h.db, 4)
		h.clock.Set(mustTime("2026-03-01T10:00:10Z"))
		p, _ := h.plugin(oneShardUncached(h))
		flush := func(at string) string { t.Helper(); return flushAt(t, h, p, at) }
		// state is every window hash's fields and values (field=value,
		// sorted) and the hash of windows, under the harness's prefix.
		state := func() string {
			t.Helper()
			var out []string
			for _, k := range strings.Fields(windowKeys(t, h)) {
				kv, err := h.r.Client.HGetAll(ctx, k).Result()
				must(t, err)
				name := "window"
				if strings.HasSuffix(k, ":windows") {
					name = "windows"
				}
				var fv []string
				for f, v := range kv {
					fv = append(fv, f+"="+v)
				}
				slices.Sort(fv)
				out = append(out, name+"{"+strings.Join(fv, " ")+"}")
			}
			slices.Sort(out)
			return strings.Join(out, " ")
		}
		const end = "1772359260000" // 2026-03-01T10:01:00Z in Unix ms
		for id := 1; id <= 3; id++ {
			touchRecorded(t, p, id)
		}
		equal(t, "first flush", flush("2026-03-01T10:00:10Z"), "drained 3 written 3 stale 0 rejected 0")
		equal(t, "open window after its first move", state(), "windows{"+end+"=3} window{1=} window{2=} window{3=}")

		must(t, h.r.Client.HSet(ctx, windowsKey(t, h), end, 0).Err())
		h.clock.Set(mustTime("2026-03-01T10:00:20Z"))
		touchRecorded(t, p, 4)
		equal(t, "flush after the count was lost", flush("2026-03-01T10:00:20Z"), "drained 1 written 1 stale 0 rejected 0")
		equal(t, "the count covers the marks again", state(), "windows{"+end+"=4} window{1=} window{2=} window{3=} window{4=}")
		ok, err := p.Touch(ctx, 2)
		must(t, err)
		equal(t, "user 2 still throttled in the open window", ok, false)

		h.clock.Set(mustTime("2026-03-01T10:01:10Z"))
		touchRecorded(t, p, 1)
		touchRecorded(t, p, 2)
		equal(t, "an ended window nothing was moved from", flush("2026-03-01T10:02:05Z"), "drained 2 written 2 stale 0 rejected 0")
		equal(t, "columns of users 1 to 4", columns(t, h, 4),
			"2026-03-01T10:01:10Z 2026-03-01T10:01:10Z 2026-03-01T10:00:10Z 2026-03-01T10:00:20Z")
		h.clock.Set(mustTime("2026-03-01T10:05:10Z"))
		touchRecorded(t, p, 1)
		touchRecorded(t, p, 3)
		h.clock.Set(mustTime("2026-03-01T10:06:10Z"))
		touchRecorded(t, p, 1)
		equal(t, "two ended windows nothing was moved from", flush("2026-03-01T10:07:05Z"), "drained 2 written 2 stale 0 rejected 0")
		equal(t, "columns of users 1 to 4, the newest of user 1's", columns(t, h, 4),
			"2026-03-01T10:06:10Z 2026-03-01T10:01:10Z 2026-03-01T10:05:10Z 2026-03-01T10:00:20Z")
		equal(t, "stats rejected", p.Stats().Rejected, int64(0))
		flush("2026-03-01T10:09:00Z")
		nothingLeft(t, h)
	})
}

// windowsKey is the one shard's hash of windows.
func windowsKey(t *testing.T, h *harness) string {
	t.Helper()
	for _, k := range strings.Fields(windowKeys(t, h)) {
		if strings.HasSuffix(k, ":windows") {
			return k
		}
	}
	t.Fatalf("no hash of windows in %q", windowKeys(t, h))
	return ""
}

// TestWindowCountWrongOrHashLost: a window's count of moved entries that
// is not a number, or larger than what its hashes hold (two of them lost,
// as an eviction or a DEL leaves it), holds back neither the swap nor a
// late touch, and the entries written into the window after it are
// flushed; the swap sets the count to the window's fields again.
func TestWindowCountWrongOrHashLost(t *testing.T) {
	forEachRedis(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		seedUsers(t, h.db, 6)
		h.clock.Set(mustTime("2026-03-01T10:00:10Z"))
		p, _ := h.plugin(oneShardUncached(h))
		flush := func(at string) string { t.Helper(); return flushAt(t, h, p, at) }
		shard := keys.ForShard(h.prefix, 0, 1)
		const end = 1772359260000 // 2026-03-01T10:01:00Z in Unix ms
		count := func() string {
			t.Helper()
			v, err := h.r.Client.HGet(ctx, shard.Windows(), strconv.FormatInt(end, 10)).Result()
			must(t, err)
			return v
		}
		for id := 1; id <= 3; id++ {
			touchRecorded(t, p, id)
		}
		equal(t, "first flush", flush("2026-03-01T10:00:10Z"), "drained 3 written 3 stale 0 rejected 0")
		equal(t, "count after the first flush", count(), "3")

		must(t, h.r.Client.HSet(ctx, shard.Windows(), strconv.FormatInt(end, 10), "x").Err())
		h.clock.Set(mustTime("2026-03-01T10:00:20Z"))
		touchRecorded(t, p, 4)
		ok, err := p.TouchAt(ctx, 5, mustTime("2026-03-01T09:59:20Z")) // a late touch: the merge script
		must(t, err)
		equal(t, "late touch of user 5 recorded", ok, true)
		equal(t, "flush after the count became \"x\"", flush("2026-03-01T10:00:20Z"), "drained 2 written 2 stale 0 rejected 0")
		equal(t, "count after it", count(), "4")

		for _, id := range []string{"1", "2"} {
			_, b := keys.Locate(id, 1)
			must(t, h.r.Client.Del(ctx, shard.Window(b, end)).Err())
		}
		h.clock.Set(mustTime("2026-03-01T10:00:30Z"))
		touchRecorded(t, p, 6)
		equal(t, "flush after two window hashes were lost", flush("2026-03-01T10:00:30Z"), "drained 1 written 1 stale 0 rejected 0")
		equal(t, "count after it", count(), "3")
		equal(t, "columns of users 1 to 6", columns(t, h, 6),
			"2026-03-01T10:00:10Z 2026-03-01T10:00:10Z 2026-03-01T10:00:10Z 2026-03-01T10:00:20Z 2026-03-01T09:59:20Z 2026-03-01T10:00:30Z")
		flush("2026-03-01T10:03:00Z")
		nothingLeft(t, h)
	})
}

// TestBufferedMarkNeitherUnreadableNorRejected: a throttle window's mark
// ("") that reaches a pending hash (a window renamed whole after its count
// was lost) is neither unreadable to Status nor rejected by the flush,
// beside a stored value that is both.
func TestBufferedMarkNeitherUnreadableNorRejected(t *testing.T) {
	forEachRedis(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		seedUsers(t, h.db, 2)
		h.clock.Set(mustTime("2026-03-01T10:00:10Z"))
		p, _ := h.plugin(oneShardUncached(h))
		shard := keys.ForShard(h.prefix, 0, 1)
		for id, v := range map[string]string{"1": "", "2": "junk"} {
			_, b := keys.Locate(id, 1)
			must(t, h.r.Client.HSet(ctx, shard.Pending(b), id, v).Err())
		}
		st, err := p.Status(ctx)
		must(t, err)
		equal(t, "status pending, unreadable", fmt.Sprint(st.Pending, " ", st.Unreadable), "2 1")
		res, err := p.Flush(ctx)
		must(t, err)
		equal(t, "flush", fmt.Sprintf("drained %d written %d rejected %d", res.Drained, res.Written, res.Rejected), "drained 1 written 0 rejected 1")
		nothingLeft(t, h)
	})
}

// flushAt flushes p with the harness's clock set to at and returns the
// result's counts as "drained N written N stale N rejected N".
func flushAt(t *testing.T, h *harness, p *lastseen.Plugin, at string) string {
	t.Helper()
	h.clock.Set(mustTime(at))
	res, err := p.Flush(context.Background())
	must(t, err)
	return fmt.Sprintf("drained %d written %d stale %d rejected %d", res.Drained, res.Written, res.Stale, res.Rejected)
}
