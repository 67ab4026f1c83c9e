package tests

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// TestPastTouchDoesNotHoldBackCurrentTouch: the throttle window is anchored
// at the time the user was seen. A late TouchAt of a time whose window has
// already ended is recorded without opening a window, so the user's
// current touch right after it is recorded too and the column ends at the
// current time; a TouchAt inside its window opens only what is left of it.
func TestPastTouchDoesNotHoldBackCurrentTouch(t *testing.T) {
	forEachEnv(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		cfg := h.config()
		cfg.Throttle = 5 * time.Minute
		p, db := h.plugin(cfg)
		seedUsers(t, db, 2)

		// User 1: an event from an hour ago, then the user's request now.
		ok, err := p.TouchAt(ctx, 1, mustTime("2026-03-01T08:30:00Z"))
		must(t, err)
		equal(t, "late touch recorded", ok, true)
		h.clock.Add(time.Millisecond) // the late touch's 1ms window ends (miniredis: PX)
		if h.r != nil && h.r.Mini != nil {
			h.r.Mini.FastForward(time.Millisecond)
		} else if !h.memory() {
			time.Sleep(5 * time.Millisecond) // a real Redis expires the 1ms marker on its own clock
		}
		ok, err = p.Touch(ctx, 1)
		must(t, err)
		equal(t, "current touch recorded", ok, true)

		// User 2: seen 3 minutes ago: its window has 2 minutes left.
		ok, err = p.TouchAt(ctx, 2, mustTime("2026-03-01T09:27:00Z"))
		must(t, err)
		equal(t, "touch 3m ago recorded", ok, true)
		ok, err = p.Touch(ctx, 2)
		must(t, err)
		equal(t, "touch inside the rest of its window", ok, false)

		_, err = p.Flush(ctx)
		must(t, err)
		equal(t, "user 1", lastSeenColumn(t, db, "users", "id", "last_seen_at", 1), "2026-03-01T09:30:00.001Z")
		equal(t, "user 2", lastSeenColumn(t, db, "users", "id", "last_seen_at", 2), "2026-03-01T09:27:00Z")
	})
}

// TestFutureTouchOpensWholeWindow: a touch ahead of the clock (within the
// hour allowed) opens a whole throttle window, also with the largest
// Throttle, 31 days (the window's arithmetic must not overflow).
func TestFutureTouchOpensWholeWindow(t *testing.T) {
	forEachEnv(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		cfg := h.config()
		cfg.Throttle = 31 * 24 * time.Hour
		cfg.Presence.OnlineWindow, cfg.Presence.ActiveUsersRetention = -1, -1
		p, db := h.plugin(cfg)
		seedUsers(t, db, 1)
		ahead := h.clock.Now().Add(30 * time.Minute)
		for i, want := range []bool{true, false, false} {
			ok, err := p.TouchAt(ctx, 1, ahead)
			must(t, err)
			equal(t, fmt.Sprint("future touch ", i), ok, want)
		}
	})
}
