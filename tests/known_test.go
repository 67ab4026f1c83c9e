package tests

import (
	"context"
	"testing"
	"time"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/tests/testenv"
)

// TestTouchKnownInsideWindowIsFree: a known value inside the throttle window
// answers on a plugin whose local cache is empty (a restarted process) with
// no Redis command and no allocation; a value at or before the window's
// start, the zero time or one more than an hour ahead is a normal touch, one
// HSETNX each.
func TestTouchKnownInsideWindowIsFree(t *testing.T) {
	for _, r := range testenv.RedisKinds() {
		t.Run(r.Name, func(t *testing.T) {
			h := newHarness(t, testenv.SQLite(), r)
			ctx := context.Background()
			cfg := h.config()
			cfg.Buffer.Shards = 1
			p, _ := h.plugin(cfg)
			_, err := p.Touch(ctx, 99) // registers the window: later touches are one HSETNX
			must(t, err)
			cc := countCommands(h.r.Client)
			now := h.clock.Now() // 09:30:00Z; Throttle 5m

			cases := []struct {
				name     string
				id       uint64
				known    time.Time
				recorded bool
				commands int64
			}{
				{"3m ago", 1, now.Add(-3 * time.Minute), false, 0},
				{"1ns inside the window", 2, now.Add(-5*time.Minute + time.Nanosecond), false, 0},
				{"ahead within the hour", 3, now.Add(30 * time.Minute), false, 0},
				{"exactly one window ago", 4, now.Add(-5 * time.Minute), true, 1},
				{"a day ago", 5, now.Add(-24 * time.Hour), true, 1},
				{"zero time (NULL column)", 6, time.Time{}, true, 1},
				{"past the hour", 7, now.Add(time.Hour + time.Second), true, 1},
			}
			for _, c := range cases {
				before := cc.sent.Load()
				got, err := p.TouchKnown(ctx, c.id, c.known)
				must(t, err)
				equal(t, c.name+": recorded", got, c.recorded)
				equal(t, c.name+": redis commands", cc.sent.Load()-before, c.commands)
			}
			s := p.Stats()
			equal(t, "touches", s.Touches, 8)
			equal(t, "recorded", s.Recorded, 5)
			equal(t, "throttled", s.Throttled, 3)
			equal(t, "known", s.Known, 3)
			equal(t, "cache hits", s.CacheHits, 0)
			for id, want := range map[uint64]bool{1: false, 2: false, 3: false, 4: true, 5: true, 6: true, 7: true} {
				_, ok, err := p.Pending(ctx, id)
				must(t, err)
				equal(t, "pending", ok, want)
			}

			// A touch recorded by the known-outside path fills the local
			// cache as Touch does: the next plain Touch is a cache hit.
			before := cc.sent.Load()
			got, err := p.Touch(ctx, uint64(4))
			must(t, err)
			equal(t, "touch after known-outside: recorded", got, false)
			equal(t, "touch after known-outside: redis commands", cc.sent.Load()-before, 0)
			equal(t, "cache hits", p.Stats().CacheHits, 1)

			var id any = uint64(12345)
			known := now.Add(-time.Minute)
			allocs := testing.AllocsPerRun(100, func() { _, _ = p.TouchKnown(ctx, id, known) })
			equal(t, "allocations per known touch", allocs, 0)
			equal(t, "redis commands after 101 known touches", cc.sent.Load()-before, 0)
		})
	}
}

// TestTouchKnownBeforeInitialize: without db.Use it is ErrNotInitialized,
// like Touch.
func TestTouchKnownBeforeInitialize(t *testing.T) {
	p := lastseen.New(lastseen.Config{})
	_, err := p.TouchKnown(context.Background(), 1, time.Now())
	equal(t, "error", err, lastseen.ErrNotInitialized)
}
