package tests

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/tests/testenv"
	"github.com/redis/go-redis/v9"
)

// cmdLog is a go-redis hook that records every command a client sends,
// pipelined or not, by name and arguments.
type cmdLog struct {
	mu   sync.Mutex
	cmds [][]any
}

// recordCommands adds a recording hook to c. Hooks cannot be removed: call
// reset before the part of a test that is measured.
func recordCommands(c redis.UniversalClient) *cmdLog {
	l := &cmdLog{}
	c.AddHook(l)
	return l
}

func (l *cmdLog) DialHook(next redis.DialHook) redis.DialHook { return next }

func (l *cmdLog) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		l.add(cmd)
		return next(ctx, cmd)
	}
}

func (l *cmdLog) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			l.add(c)
		}
		return next(ctx, cmds)
	}
}

func (l *cmdLog) add(c redis.Cmder) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cmds = append(l.cmds, slices.Clone(c.Args()))
}

func (l *cmdLog) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cmds = nil
}

// names returns the commands sent since the last reset, lower case, joined
// by spaces ("" for none).
func (l *cmdLog) names() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]string, len(l.cmds))
	for i, c := range l.cmds {
		out[i] = strings.ToLower(fmt.Sprint(c[0]))
	}
	return strings.Join(out, " ")
}

// all returns the arguments of every command named name since the last reset.
func (l *cmdLog) all(name string) [][]any {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out [][]any
	for _, c := range l.cmds {
		if strings.EqualFold(fmt.Sprint(c[0]), name) {
			out = append(out, c)
		}
	}
	return out
}

// forEachRedis runs fn on SQLite with miniredis, a real Redis and a Redis
// Cluster: for behaviour of the Redis side alone, where the dialect does not
// matter.
func forEachRedis(t *testing.T, fn func(t *testing.T, h *harness)) {
	for _, r := range testenv.RedisKinds() {
		t.Run(r.Name, func(t *testing.T) { fn(t, newHarness(t, testenv.SQLite(), r)) })
	}
}

// TestTouchIsOneRoundTrip: a touch is one HSETNX of the user's entry into
// its throttle window's hash, pipelined with the window's registration on
// the process's first touch of the window (one round trip either way); a
// touch inside the window is answered by the local cache with no command
// at all, or, with the cache disabled, by one HSETNX that reports "not
// recorded"; a late touch (its window over) is one EVALSHA of the merge
// script.
func TestTouchIsOneRoundTrip(t *testing.T) {
	forEachRedis(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		cfg := h.config()
		cfg.Throttle = time.Minute
		cfg.Buffer.Shards = 1
		p, _ := h.plugin(cfg)
		loadMergeScript(t, h)
		rec := recordCommands(h.r.Client)

		rec.reset()
		ok, err := p.TouchAt(ctx, 1, mustTime("2026-03-01T09:30:00Z"))
		must(t, err)
		equal(t, "first touch recorded", ok, true)
		equal(t, "first touch commands (pipelined)", rec.names(), "hsetnx hsetnx")

		for _, id := range []any{1, int64(1), uint64(1), uint32(1)} {
			rec.reset()
			ok, err = p.TouchAt(ctx, id, mustTime("2026-03-01T09:30:10Z"))
			must(t, err)
			equal(t, fmt.Sprintf("throttled touch %T recorded", id), ok, false)
			equal(t, fmt.Sprintf("throttled touch %T commands", id), rec.names(), "")
		}

		nc := cfg
		nc.Buffer.LocalCacheSize = -1
		noCache, _ := h.plugin(nc)
		rec.reset()
		ok, err = noCache.TouchAt(ctx, 1, mustTime("2026-03-01T09:30:20Z"))
		must(t, err)
		equal(t, "uncached throttled touch recorded", ok, false)
		equal(t, "uncached throttled touch commands (this process's first of the window)", rec.names(), "hsetnx hsetnx")
		rec.reset()
		ok, err = noCache.TouchAt(ctx, 1, mustTime("2026-03-01T09:30:21Z"))
		must(t, err)
		equal(t, "uncached throttled touch recorded", ok, false)
		equal(t, "uncached throttled touch commands", rec.names(), "hsetnx")
		rec.reset()
		ok, err = noCache.TouchAt(ctx, 2, mustTime("2026-03-01T09:30:20Z"))
		must(t, err)
		equal(t, "uncached new user recorded", ok, true)
		equal(t, "uncached new user commands", rec.names(), "hsetnx")
		rec.reset()
		ok, err = noCache.TouchAt(ctx, 3, mustTime("2026-03-01T09:29:00Z")) // its window ended at 09:30:00
		must(t, err)
		equal(t, "late touch recorded", ok, true)
		equal(t, "late touch commands", rec.names(), "evalsha")

		s := p.Stats()
		equal(t, "stats touches", s.Touches, 5)
		equal(t, "stats recorded", s.Recorded, 1)
		equal(t, "stats throttled", s.Throttled, 4)
		equal(t, "stats cache hits", s.CacheHits, 4)
		s = noCache.Stats()
		equal(t, "no-cache stats cache hits", s.CacheHits, 0)
		equal(t, "no-cache stats throttled", s.Throttled, 2)
		equal(t, "no-cache stats recorded", s.Recorded, 2)
	})
}

// TestTouchNoScriptFallback: when the server lost its scripts (SCRIPT FLUSH,
// restart, failover) the EVALSHA of a late touch fails with NOSCRIPT and
// exactly one EVAL follows; after that EVALSHA alone works again.
func TestTouchNoScriptFallback(t *testing.T) {
	h := newHarness(t, testenv.SQLite(), testenv.Miniredis())
	ctx := context.Background()
	p, _ := h.plugin(h.config())
	rec := recordCommands(h.r.Client)
	late := mustTime("2026-03-01T09:00:00Z") // its window ended at 09:05:00, before the clock's 09:30

	must(t, h.r.Client.ScriptFlush(ctx).Err())
	rec.reset()
	ok, err := p.TouchAt(ctx, 1, late)
	must(t, err)
	equal(t, "recorded", ok, true)
	equal(t, "commands after SCRIPT FLUSH", rec.names(), "evalsha eval")

	rec.reset()
	ok, err = p.TouchAt(ctx, 2, late)
	must(t, err)
	equal(t, "recorded", ok, true)
	equal(t, "commands once loaded", rec.names(), "evalsha")

	must(t, h.r.Client.ScriptFlush(ctx).Err())
	rec.reset()
	_, err = p.TouchAt(ctx, 3, late)
	must(t, err)
	equal(t, "commands after a second SCRIPT FLUSH", rec.names(), "evalsha eval")
}

// TestTouchPendingNeverMovesBackwards: a recorded touch with an older time
// (a delayed request) leaves the newer pending timestamp in place.
func TestTouchPendingNeverMovesBackwards(t *testing.T) {
	forEachRedis(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		cfg := h.config()
		cfg.Throttle = time.Minute
		cfg.Buffer.Shards = 1
		p, _ := h.plugin(cfg)
		pending := func(want string) {
			t.Helper()
			at, ok, err := p.Pending(ctx, 5)
			must(t, err)
			equal(t, "pending ok", ok, true)
			equal(t, "pending", at.Format(time.RFC3339Nano), want)
			equal(t, "pending location", at.Location(), time.UTC)
		}
		raw := func(want string) {
			t.Helper()
			equal(t, "stored value", h.pendingValue(t, p, "5"), want)
		}

		ok, err := p.TouchAt(ctx, 5, mustTime("2026-03-01T09:40:00Z"))
		must(t, err)
		equal(t, "newer recorded", ok, true)
		pending("2026-03-01T09:40:00Z")
		raw("1772358000000000")

		h.expireThrottle(time.Minute)
		ok, err = p.TouchAt(ctx, 5, mustTime("2026-03-01T09:35:00Z"))
		must(t, err)
		equal(t, "older recorded (opens a window)", ok, true)
		pending("2026-03-01T09:40:00Z")
		raw("1772358000000000")

		h.expireThrottle(time.Minute)
		ok, err = p.TouchAt(ctx, 5, mustTime("2026-03-01T09:40:00.000001Z"))
		must(t, err)
		equal(t, "newer by 1µs recorded", ok, true)
		pending("2026-03-01T09:40:00.000001Z")
		raw("1772358000000001")
	})
}

// TestTouchStoredForm: the window's hash holds Unix microseconds in UTC as
// a decimal integer (sub-microsecond digits cut off, the location ignored),
// and "" once a flush moved it; the presence HyperLogLogs (the touch's Unix
// minute, its UTC day) are written by the flush, not the touch.
func TestTouchStoredForm(t *testing.T) {
	forEachRedis(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		cfg := h.config()
		cfg.Buffer.Shards = 1
		cfg.Throttle = 90 * time.Second
		p, db := h.plugin(cfg)
		tokyo := time.FixedZone("JST", 9*3600)
		at := time.Date(2026, 3, 1, 18, 30, 0, 123456789, tokyo) // 09:30:00.123456789Z
		ok, err := p.TouchAt(ctx, uint16(42), at)
		must(t, err)
		equal(t, "recorded", ok, true)

		equal(t, "keys", strings.Join(h.keys(), " "), ":manifest :{0}:pending :{0}:seen:42")
		equal(t, "stored value", h.pendingValue(t, p, "42"), "1772357400123456")
		equal(t, "pending entries", h.pendingLen(t, p, 0), int64(1))
		// The entry is a field of its bucket's hash of the throttle window
		// (09:30:00Z is the start of one: the window ends 90s later, at
		// 1772357490000 Unix ms), registered in the shard's hash of windows
		// (0 entries moved yet); neither expires: the flush deletes a
		// window one throttle window after its end.
		window := windowKey(p, "42", mustTime("2026-03-01T09:31:30Z"))
		equal(t, "window hash: named by the window's end, Unix ms", strings.TrimPrefix(window, p.Config().Buffer.Prefix),
			fmt.Sprintf(":{0}:window:%d:1772357490000", bucketOf(p, "42")))
		v, err := h.r.Client.HGet(ctx, window, "42").Result()
		must(t, err)
		equal(t, "window entry: Unix µs", v, "1772357400123456")
		pttl, err := h.r.Client.PTTL(ctx, window).Result()
		must(t, err)
		equal(t, "window hash PTTL (none)", pttl, time.Duration(-1))
		windows, err := h.r.Client.HGetAll(ctx, shardKeys(p, 0).Windows()).Result()
		must(t, err)
		equal(t, "windows", fmt.Sprint(windows), "map[1772357490000:0]")
		pend, _, err := p.Pending(ctx, "42")
		must(t, err)
		equal(t, "pending", pend.Format(time.RFC3339Nano), "2026-03-01T09:30:00.123456Z")

		// The flush drains the entry (no such user: unknown) and adds it to
		// the presence sets of its minute and day.
		must(t, db.AutoMigrate(&lastseen.User{}))
		res, err := p.Flush(ctx)
		must(t, err)
		equal(t, "drained, unknown", [2]int{res.Drained, res.Unknown}, [2]int{1, 1})
		equal(t, "keys after the flush", strings.Join(h.keys(), " "), ":manifest :{0}:seen:42 :{presence}:active:2026-03-01 :{presence}:online:29539290")
		v, err = h.r.Client.HGet(ctx, window, "42").Result()
		must(t, err)
		equal(t, "window entry after the flush: moved", v, "")
		windows, err = h.r.Client.HGetAll(ctx, shardKeys(p, 0).Windows()).Result()
		must(t, err)
		equal(t, "windows after the flush", fmt.Sprint(windows), "map[1772357490000:1]")
	})
}

// TestTouchKeysShareHashTag: with the default 16 shards, the keys a user's
// touch writes (its marker and its pending hash) carry the same hash tag
// {N}, N in 0..15.
func TestTouchKeysShareHashTag(t *testing.T) {
	forEachRedis(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		p, _ := h.plugin(h.config())
		re := regexp.MustCompile(`^:\{(\d+)\}:(pending|seen:(\d+))$`)
		for _, id := range []int{42, 7, 1000} {
			before := h.keys()
			_, err := p.Touch(ctx, id)
			must(t, err)
			var tags []string
			markers := 0
			for _, k := range h.keys() {
				if slices.Contains(before, k) {
					continue
				}
				m := re.FindStringSubmatch(k)
				if m == nil {
					t.Fatalf("key %q does not follow <prefix>:{N}:pending or :seen:<id>", k)
				}
				tags = append(tags, m[1])
				if m[3] != "" {
					equal(t, "marker user", m[3], fmt.Sprint(id))
					markers++
				}
			}
			equal(t, fmt.Sprintf("user %d markers", id), markers, 1)
			if len(tags) == 0 { // the pending hash may already exist
				t.Fatalf("user %d: no new keys", id)
			}
			for _, tag := range tags[1:] {
				equal(t, fmt.Sprintf("user %d tags", id), tag, tags[0])
			}
			var shard int
			fmt.Sscan(tags[0], &shard)
			if shard < 0 || shard >= lastseen.DefaultShards {
				t.Errorf("user %d: shard %d, want 0..%d", id, shard, lastseen.DefaultShards-1)
			}
			equal(t, fmt.Sprintf("user %d pending key", id), pendingKey(p, fmt.Sprint(id)), h.prefix+":{"+tags[0]+"}:pending:"+
				fmt.Sprint(bucketOf(p, fmt.Sprint(id))))
			equal(t, fmt.Sprintf("user %d stored", id), h.pendingValue(t, p, fmt.Sprint(id)), "1772357400000000")
		}
	})
}

// TestTouchSpreadsOverShards: 1000 users over Shards=4 land in exactly four
// pending hashes, each with a fair share.
func TestTouchSpreadsOverShards(t *testing.T) {
	forEachRedis(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		cfg := h.config()
		cfg.Buffer.Shards = 4
		p, _ := h.plugin(cfg)
		for id := 1; id <= 1000; id++ {
			ok, err := p.Touch(ctx, id)
			must(t, err)
			if !ok {
				t.Fatalf("user %d not recorded", id)
			}
		}
		equal(t, "pending hashes", strings.Join(h.pendingKeys(), " "), ":{0}:pending :{1}:pending :{2}:pending :{3}:pending")
		total := int64(0)
		for n := range 4 {
			c := h.pendingLen(t, p, n)
			if c < 150 {
				t.Errorf("shard %d holds %d users, want a fair share of 1000 (at least 150)", n, c)
			}
			total += c
		}
		equal(t, "users over all shards", total, int64(1000))
	})
}

// TestLocalCacheFollowsWindow: the local cache keeps a user until the end
// of the throttle window Redis throttled or recorded it in, whichever
// instance recorded it: a fixed window ends at the same time for all.
// Miniredis so that the clock is the plugin's alone.
func TestLocalCacheFollowsWindow(t *testing.T) {
	h := newHarness(t, testenv.SQLite(), testenv.Miniredis())
	ctx := context.Background()
	cfg := h.config()
	cfg.Throttle = time.Minute
	a, _ := h.plugin(cfg)
	b, _ := h.plugin(cfg)
	rec := recordCommands(h.r.Client)
	step := func(name string, p *lastseen.Plugin, wantRecorded bool, wantCmds string) {
		t.Helper()
		rec.reset()
		ok, err := p.Touch(ctx, 9)
		must(t, err)
		equal(t, name+": recorded", ok, wantRecorded)
		equal(t, name+": commands", rec.names(), wantCmds)
	}

	step("a records in the window ending at 09:31", a, true, "hsetnx hsetnx")
	h.expireThrottle(time.Minute - time.Millisecond)
	step("a 1ms before the window ends", a, false, "")
	h.expireThrottle(time.Millisecond)
	step("a in the next window", a, true, "hsetnx hsetnx") // 09:31:00

	h.expireThrottle(40 * time.Second)
	step("b, user recorded by a 40s ago", b, false, "hsetnx hsetnx")
	step("b again", b, false, "")
	h.expireThrottle(20*time.Second - time.Millisecond)
	step("b 1ms before the window ends", b, false, "")
	h.expireThrottle(time.Millisecond)
	step("b in the next window", b, true, "hsetnx hsetnx") // 09:32:00
	step("b inside it", b, false, "")
	step("a, cached until its window ended", a, false, "hsetnx hsetnx")
	step("a inside it", a, false, "")

	at, _, err := a.Pending(ctx, 9)
	must(t, err)
	equal(t, "pending", at.Format(time.RFC3339), "2026-03-01T09:32:00Z")
}

type (
	namedInt  int64
	namedUint uint16
	handle    string
)

type signedUser struct {
	ID         int64 `gorm:"primaryKey"`
	LastSeenAt *time.Time
}

func (signedUser) TableName() string { return "signed_users" }

type int32User struct {
	ID         int32 `gorm:"primaryKey"`
	LastSeenAt *time.Time
}

func (int32User) TableName() string { return "int32_users" }

type stringUser struct {
	ID         string `gorm:"primaryKey;size:64"`
	LastSeenAt *time.Time
}

func (stringUser) TableName() string { return "string_users" }

type uuidUser struct {
	ID         uuid.UUID `gorm:"primaryKey"`
	LastSeenAt *time.Time
}

func (uuidUser) TableName() string { return "uuid_users" }

// TestTouchUserIDs: every id kind Touch accepts, its canonical form in
// Redis, and the exact error for every id it refuses, per primary key type.
func TestTouchUserIDs(t *testing.T) {
	h := newHarness(t, testenv.SQLite(), testenv.Miniredis())
	ctx := context.Background()
	u := uuid.MustParse("6ba7b810-9dad-11d1-80b4-00c04fd430c8")
	long := strings.Repeat("9", 129)
	cases := []struct {
		model any
		id    any
		want  string // canonical id, or the exact error
	}{
		{&lastseen.User{}, int8(5), "5"},
		{&lastseen.User{}, int16(6), "6"},
		{&lastseen.User{}, int32(7), "7"},
		{&lastseen.User{}, int64(8), "8"},
		{&lastseen.User{}, 9, "9"},
		{&lastseen.User{}, uint8(10), "10"},
		{&lastseen.User{}, uint16(11), "11"},
		{&lastseen.User{}, uint32(12), "12"},
		{&lastseen.User{}, uint64(math.MaxInt64), "9223372036854775807"}, // SQLite: signed 64-bit integers
		{&lastseen.User{}, uint64(math.MaxInt64 + 1), `lastseen: invalid user id: uint64 "9223372036854775808": over 9223372036854775807, the largest key the database stores`},
		{&lastseen.User{}, uint(14), "14"},
		{&lastseen.User{}, namedInt(15), "15"},
		{&lastseen.User{}, namedUint(16), "16"},
		{&lastseen.User{}, "17", "17"},
		{&lastseen.User{}, "0018", "18"},
		{&lastseen.User{}, " 19", `lastseen: invalid user id: string " 19": leading or trailing spaces are not allowed for an integer key`},
		{&lastseen.User{}, "19 ", `lastseen: invalid user id: string "19 ": leading or trailing spaces are not allowed for an integer key`},
		{&lastseen.User{}, "19\n", `lastseen: invalid user id: string "19\n": leading or trailing spaces are not allowed for an integer key`},
		{&lastseen.User{}, handle(" 19"), `lastseen: invalid user id: tests.handle " 19": leading or trailing spaces are not allowed for an integer key`},
		{&lastseen.User{}, handle("20"), "20"},
		{&lastseen.User{}, strings.Repeat("0", 127) + "1", "1"},
		{&lastseen.User{}, nil, "lastseen: invalid user id: nil"},
		{&lastseen.User{}, "", "lastseen: invalid user id: empty string"},
		{&lastseen.User{}, handle(""), "lastseen: invalid user id: empty tests.handle"},
		{&lastseen.User{}, long, "lastseen: invalid user id: string of 129 bytes (at most 128)"},
		{&lastseen.User{}, 0, "lastseen: invalid user id: int is zero, which GORM treats as no primary key"},
		{&lastseen.User{}, uint8(0), "lastseen: invalid user id: uint8 is zero, which GORM treats as no primary key"},
		{&lastseen.User{}, "0", "lastseen: invalid user id: string is zero, which GORM treats as no primary key"},
		{&lastseen.User{}, -1, "lastseen: invalid user id: int -1 is negative but the primary key is unsigned"},
		{&lastseen.User{}, int8(-3), "lastseen: invalid user id: int8 -3 is negative but the primary key is unsigned"},
		{&lastseen.User{}, namedInt(-4), "lastseen: invalid user id: tests.namedInt -4 is negative but the primary key is unsigned"},
		{&lastseen.User{}, "abc", `lastseen: invalid user id: string "abc": not an unsigned 64-bit integer`},
		{&lastseen.User{}, "-5", `lastseen: invalid user id: string "-5": not an unsigned 64-bit integer`},
		{&lastseen.User{}, "18446744073709551616", `lastseen: invalid user id: string "18446744073709551616": not an unsigned 64-bit integer`},
		{&lastseen.User{}, []byte("1"), "lastseen: invalid user id: unsupported type []uint8 (want an integer, a string or a fmt.Stringer)"},
		{&lastseen.User{}, struct{}{}, "lastseen: invalid user id: unsupported type struct {} (want an integer, a string or a fmt.Stringer)"},
		{&lastseen.User{}, 1.5, "lastseen: invalid user id: float64 1.5 is not a whole number"},
		{&lastseen.User{}, true, "lastseen: invalid user id: unsupported type bool (want an integer, a string or a fmt.Stringer)"},
		{&lastseen.User{}, true, "lastseen: invalid user id: unsupported type bool (want an integer, a string or a fmt.Stringer)"},
		{&lastseen.User{}, u, `lastseen: invalid user id: uuid.UUID "6ba7b810-9dad-11d1-80b4-00c04fd430c8": not an unsigned 64-bit integer`},
		{&lastseen.User{}, (*uuid.UUID)(nil), "lastseen: invalid user id: nil *uuid.UUID"},

		{&signedUser{}, -7, "-7"},
		{&signedUser{}, int64(math.MinInt64), "-9223372036854775808"},
		{&signedUser{}, "abc", `lastseen: invalid user id: string "abc": not a 64-bit integer`},
		{&signedUser{}, uint64(math.MaxUint64), `lastseen: invalid user id: uint64 "18446744073709551615": not a 64-bit integer`},
		{&int32User{}, int32(math.MaxInt32), "2147483647"},
		{&int32User{}, int64(math.MaxInt32 + 1), `lastseen: invalid user id: int64 "2147483648": not a 32-bit integer`},
		{&int32User{}, "-2147483649", `lastseen: invalid user id: string "-2147483649": not a 32-bit integer`},

		{&stringUser{}, "Alice", "Alice"},
		{&stringUser{}, " Alice\n", " Alice\n"}, // a string key's spaces are part of the id
		{&stringUser{}, 42, "42"},
		{&stringUser{}, u, "6ba7b810-9dad-11d1-80b4-00c04fd430c8"},
		{&stringUser{}, "", "lastseen: invalid user id: empty string"},
		{&stringUser{}, strings.Repeat("x", 128), strings.Repeat("x", 128)},
		{&stringUser{}, strings.Repeat("x", 129), "lastseen: invalid user id: string of 129 bytes (at most 128)"},

		{&uuidUser{}, u, "6ba7b810-9dad-11d1-80b4-00c04fd430c8"},
		{&uuidUser{}, &u, "6ba7b810-9dad-11d1-80b4-00c04fd430c8"},
		{&uuidUser{}, "6BA7B810-9DAD-11D1-80B4-00C04FD430C8", "6ba7b810-9dad-11d1-80b4-00c04fd430c8"},
		{&uuidUser{}, "{6ba7b810-9dad-11d1-80b4-00c04fd430c8}", "6ba7b810-9dad-11d1-80b4-00c04fd430c8"},
		{&uuidUser{}, "not-a-uuid", `lastseen: invalid user id: string "not-a-uuid": Scan: invalid UUID length: 10`},
		{&uuidUser{}, 5, `lastseen: invalid user id: int "5": Scan: invalid UUID length: 1`},
	}
	plugins := map[string]*lastseen.Plugin{}
	for _, c := range cases {
		name := fmt.Sprintf("%T", c.model)
		p := plugins[name]
		if p == nil {
			cfg := h.config()
			cfg.Model = c.model
			cfg.Buffer.Prefix = h.prefix + ":" + name // a buffer per model: the manifest names the table
			cfg.Buffer.Shards = 1
			p, _ = h.plugin(cfg)
			plugins[name] = p
		}
		label := fmt.Sprintf("%s %T(%v)", name, c.id, c.id)
		if len(label) > 80 {
			label = label[:80]
		}
		ok, err := p.Touch(ctx, c.id)
		if !strings.HasPrefix(c.want, "lastseen:") {
			if err != nil {
				t.Errorf("%s: %v", label, err)
				continue
			}
			equal(t, label+" recorded", ok, true)
			n, err := h.r.Client.HExists(ctx, windowKey(p, c.want, windowEnd(p)), c.want).Result()
			must(t, err)
			equal(t, label+" stored as "+c.want, n, true)
			must(t, h.r.Client.HDel(ctx, windowKey(p, c.want, windowEnd(p)), c.want).Err())
			continue
		}
		if err == nil {
			t.Errorf("%s: no error, want %q", label, c.want)
			continue
		}
		equal(t, label+" error", err.Error(), c.want)
		equal(t, label+" errors.Is ErrInvalidUserID", errors.Is(err, lastseen.ErrInvalidUserID), true)
		equal(t, label+" recorded", ok, false)
		_, _, err = p.Pending(ctx, c.id)
		equal(t, label+" Pending errors.Is ErrInvalidUserID", errors.Is(err, lastseen.ErrInvalidUserID), true)
		_, _, err = p.LastSeen(ctx, c.id)
		equal(t, label+" LastSeen errors.Is ErrInvalidUserID", errors.Is(err, lastseen.ErrInvalidUserID), true)
	}
	equal(t, "pending hash left", strings.Join(h.pendingKeys(), " "), "")
}

// TestTouchCacheKeepsValidation: the local cache never lets an id or a time
// through that Touch would refuse: an int64 -1 and a uint64 of the same bits
// are different ids, and a cached user with a bad time still gets
// ErrInvalidTime.
func TestTouchCacheKeepsValidation(t *testing.T) {
	forEachDialect(t, testTouchCacheKeepsValidation)
}

func testTouchCacheKeepsValidation(t *testing.T, h *harness) {
	ctx := context.Background()

	cfg := h.config()
	cfg.Model = &signedUser{}
	cfg.Buffer.Prefix = h.prefix + ":signed" // a buffer per table: the manifest names it
	signed, _ := h.plugin(cfg)
	ok, err := signed.Touch(ctx, int64(-1))
	must(t, err)
	equal(t, "signed -1 recorded", ok, true)
	_, err = signed.Touch(ctx, uint64(math.MaxUint64))
	equal(t, "uint64 max on a signed key", fmt.Sprint(err),
		`lastseen: invalid user id: uint64 "18446744073709551615": not a 64-bit integer`)

	unsigned, _ := h.plugin(h.config())
	big := uint64(math.MaxUint64) // BIGINT UNSIGNED on MySQL
	if h.dialect != "mysql" {
		big = math.MaxInt64 // a signed 64-bit column
	}
	ok, err = unsigned.Touch(ctx, big)
	must(t, err)
	equal(t, "largest key recorded", ok, true)
	_, err = unsigned.Touch(ctx, int64(big))
	if h.dialect == "mysql" {
		equal(t, "-1 on an unsigned key", fmt.Sprint(err),
			"lastseen: invalid user id: int64 -1 is negative but the primary key is unsigned")
	} else {
		equal(t, "int64 of the same value", err, nil)
	}

	_, err = unsigned.TouchAt(ctx, big, time.Time{})
	equal(t, "zero time for a cached user", fmt.Sprint(err), "lastseen: invalid time: 0001-01-01T00:00:00Z is before 1970-01-01T00:00:01Z")
	equal(t, "errors.Is ErrInvalidTime", errors.Is(err, lastseen.ErrInvalidTime), true)
	want := int64(1)
	if h.dialect == "mysql" {
		want = 2
	}
	equal(t, "invalid touches counted", unsigned.Stats().Invalid, want)
}

// TestTouchAtTimes: TouchAt refuses a zero time, a time before
// 1970-01-01T00:00:01Z and one more than an hour ahead of the clock, with
// ErrInvalidTime.
func TestTouchAtTimes(t *testing.T) {
	h := newHarness(t, testenv.SQLite(), testenv.Miniredis())
	ctx := context.Background()
	p, _ := h.plugin(h.config()) // clock 2026-03-01T09:30:00Z
	for i, c := range []struct {
		at   time.Time
		want string // "" for accepted
	}{
		{time.Time{}, "lastseen: invalid time: 0001-01-01T00:00:00Z is before 1970-01-01T00:00:01Z"},
		{mustTime("1969-12-31T23:59:59Z"), "lastseen: invalid time: 1969-12-31T23:59:59Z is before 1970-01-01T00:00:01Z"},
		{mustTime("1900-01-01T00:00:00Z"), "lastseen: invalid time: 1900-01-01T00:00:00Z is before 1970-01-01T00:00:01Z"},
		{mustTime("2026-03-01T10:30:00.000001Z"), "lastseen: invalid time: 2026-03-01T10:30:00.000001Z is more than 1h0m0s ahead of the clock"},
		{mustTime("9999-12-31T23:59:59Z"), "lastseen: invalid time: 9999-12-31T23:59:59Z is more than 1h0m0s ahead of the clock"},
		{time.Date(2026, 3, 1, 19, 30, 1, 0, time.FixedZone("JST", 9*3600)), "lastseen: invalid time: 2026-03-01T10:30:01Z is more than 1h0m0s ahead of the clock"},
		{mustTime("1970-01-01T00:00:00Z"), "lastseen: invalid time: 1970-01-01T00:00:00Z is before 1970-01-01T00:00:01Z"},
		{mustTime("1970-01-01T00:00:00.999999Z"), "lastseen: invalid time: 1970-01-01T00:00:00.999999Z is before 1970-01-01T00:00:01Z"},
		{mustTime("1970-01-01T00:00:01Z"), ""},
		{mustTime("2026-03-01T10:30:00Z"), ""},
	} {
		ok, err := p.TouchAt(ctx, i+1, c.at)
		if c.want == "" {
			must(t, err)
			equal(t, c.at.String()+" recorded", ok, true)
			continue
		}
		equal(t, c.at.String()+" error", fmt.Sprint(err), c.want)
		equal(t, c.at.String()+" errors.Is ErrInvalidTime", errors.Is(err, lastseen.ErrInvalidTime), true)
	}
	equal(t, "invalid", p.Stats().Invalid, 8)
}

// TestInitializeWithRedisDown: a Redis that is configured but unreachable at
// start is logged, not an error; touches are kept in memory and the first
// flush after Redis is back writes them.
func TestInitializeWithRedisDown(t *testing.T) {
	h := newHarness(t, testenv.SQLite(), testenv.Miniredis())
	ctx := context.Background()
	var logs testenv.Logs
	cfg := h.config()
	cfg.Logger = testenv.TextLogger(&logs)
	cfg.Buffer.TouchTimeout = 200 * time.Millisecond
	h.r.Mini.Close()
	p, db := h.plugin(cfg) // fails the test if Initialize returns an error
	equal(t, "start-up warning", logs.Count("lastseen: redis unreachable at start"), 1)
	seedUsers(t, db, 3)

	ok, err := p.TouchAt(ctx, 3, mustTime("2026-03-01T09:29:00Z"))
	if err == nil || !strings.HasPrefix(err.Error(), "lastseen: touch user 3: ") {
		t.Fatalf("touch with redis down: %v", err)
	}
	equal(t, "recorded", ok, false)
	equal(t, "backlog", p.Stats().Backlog, 1)

	must(t, h.r.Mini.Restart())
	res, err := p.Flush(ctx)
	must(t, err)
	equal(t, "written", res.Written, 1)
	equal(t, "column", lastSeenColumn(t, db, "users", "id", "last_seen_at", 3), "2026-03-01T09:29:00Z")
	equal(t, "backlog after flush", p.Stats().Backlog, 0)
}

// TestIntegerIDWithSpacesRefused: every path that takes an id refuses an
// integer key's id with white space around it, naming it: touches, reads,
// both middlewares (their warning); a string key keeps such an id as is.
func TestIntegerIDWithSpacesRefused(t *testing.T) {
	h := newHarness(t, testenv.SQLite(), testenv.Miniredis())
	ctx, now := context.Background(), h.clock.Now()
	var logs testenv.Logs
	cfg := h.config()
	cfg.Logger = testenv.TextLogger(&logs)
	p, db := h.plugin(cfg)
	seedUsers(t, db, 3)
	for _, id := range []string{"3 ", " 3", "3\n"} {
		want := fmt.Sprintf("lastseen: invalid user id: string %q: leading or trailing spaces are not allowed for an integer key", id)
		_, err := p.Touch(ctx, id)
		equal(t, fmt.Sprintf("Touch(%q)", id), fmt.Sprint(err), want)
		equal(t, fmt.Sprintf("Touch(%q) is ErrInvalidUserID", id), errors.Is(err, lastseen.ErrInvalidUserID), true)
		_, err = p.TouchAt(ctx, id, now)
		equal(t, fmt.Sprintf("TouchAt(%q)", id), fmt.Sprint(err), want)
		_, err = p.TouchKnown(ctx, id, now.Add(-time.Hour))
		equal(t, fmt.Sprintf("TouchKnown(%q)", id), fmt.Sprint(err), want)
		_, _, err = p.Pending(ctx, id)
		equal(t, fmt.Sprintf("Pending(%q)", id), fmt.Sprint(err), want)
		_, _, err = p.LastSeen(ctx, id)
		equal(t, fmt.Sprintf("LastSeen(%q)", id), fmt.Sprint(err), want)
		_, err = p.LastSeenMany(ctx, []any{"1", id})
		equal(t, fmt.Sprintf("LastSeenMany(%q)", id), fmt.Sprint(err), want+" (ids[1])")

		logs.Take()
		extract := func(*http.Request) (any, bool) { return id, true }
		setUser := http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) { lastseen.SetUser(r.Context(), id) })
		serve(t, p.Middleware(extract)(setUser), "")
		serve(t, p.DeferredMiddleware()(setUser), "")
		got := regexp.MustCompile(`(?m)^time=\S+ `).ReplaceAllString(logs.Take(), "")
		line := func(msg string) string { return fmt.Sprintf("level=WARN msg=%q %s err=%q\n", msg, logAttrs(h), want) }
		equal(t, fmt.Sprintf("middleware logs for %q", id), got, line("lastseen: middleware touch failed")+line("lastseen: deferred middleware touch failed"))
	}
	equal(t, "touches refused", p.Stats().Invalid, 3*5)
	equal(t, "buffered", len(h.pendingKeys()), 0)
}
