package tests

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// TestPastTouchDoesNotHoldBackCurrentTouch: throttle windows are fixed
// periods of the clock. A late TouchAt of a time whose window has already
// ended is recorded without opening a window, so the user's current touch
// right after it is recorded too and the column ends at the current time;
// a TouchAt of a time in the current window records the user in it, after
// which any touch of the user is throttled until the window ends.
func TestPastTouchDoesNotHoldBackCurrentTouch(t *testing.T) {
	forEachEnv(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		cfg := h.config()
		cfg.Throttle = 5 * time.Minute
		p, db := h.plugin(cfg)
		seedUsers(t, db, 2)
		h.clock.Add(time.Millisecond) // 09:30:00.001, in the window 09:30-09:35

		// User 1: an event from an hour ago, then the user's request now.
		ok, err := p.TouchAt(ctx, 1, mustTime("2026-03-01T08:30:00Z"))
		must(t, err)
		equal(t, "late touch recorded", ok, true)
		ok, err = p.Touch(ctx, 1)
		must(t, err)
		equal(t, "current touch recorded", ok, true)

		// User 2: seen 1ms ago, in the current window; then 3 minutes ago,
		// in the window before, older than what the current window holds:
		// throttled like any touch of a user recorded in it; then now.
		ok, err = p.TouchAt(ctx, 2, mustTime("2026-03-01T09:30:00Z"))
		must(t, err)
		equal(t, "touch 1ms ago recorded", ok, true)
		ok, err = p.TouchAt(ctx, 2, mustTime("2026-03-01T09:27:00Z"))
		must(t, err)
		equal(t, "touch in the window before", ok, false)
		ok, err = p.Touch(ctx, 2)
		must(t, err)
		equal(t, "touch inside the current window", ok, false)

		_, err = p.Flush(ctx)
		must(t, err)
		equal(t, "user 1", lastSeenColumn(t, db, "users", "id", "last_seen_at", 1), "2026-03-01T09:30:00.001Z")
		equal(t, "user 2", lastSeenColumn(t, db, "users", "id", "last_seen_at", 2), "2026-03-01T09:30:00Z")
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
