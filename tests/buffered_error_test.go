package tests

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/tests/testenv"
)

// TestTouchErrorSaysKeptOrDropped: when Redis does not take a touch, its
// error says what became of the timestamp: ErrBuffered when the backlog
// kept it (the next flush writes it; callers may ignore the error),
// ErrDropped when the backlog was full; the cause stays wrapped.
func TestTouchErrorSaysKeptOrDropped(t *testing.T) {
	h := newHarness(t, testenv.SQLite(), testenv.Miniredis())
	ctx := context.Background()
	cfg := h.config()
	cfg.Buffer.TouchTimeout = time.Second
	testenv.Seam(&cfg).BacklogSize = 1
	p, db := h.plugin(cfg)
	seedUsers(t, db, 2)
	h.r.Mini.Close()

	_, err := p.Touch(ctx, 1)
	equal(t, "user 1: ErrBuffered", errors.Is(err, lastseen.ErrBuffered), true)
	equal(t, "user 1: not ErrDropped", errors.Is(err, lastseen.ErrDropped), false)
	_, err = p.Touch(ctx, 2)
	equal(t, "user 2: ErrDropped", errors.Is(err, lastseen.ErrDropped), true)
	equal(t, "user 2: not ErrBuffered", errors.Is(err, lastseen.ErrBuffered), false)
	s := p.Stats()
	equal(t, "backlogged", s.Backlogged, 1)
	equal(t, "backlog dropped", s.BacklogDropped, 1)

	must(t, h.r.Mini.Restart())
	res, err := p.Flush(ctx)
	must(t, err)
	equal(t, "written after redis is back", res.Written, 1)
	equal(t, "user 1", lastSeenColumn(t, db, "users", "id", "last_seen_at", 1), "2026-03-01T09:30:00Z")
	equal(t, "user 2", lastSeenColumn(t, db, "users", "id", "last_seen_at", 2), "")
}

// TestCloseWritesBacklogWhileRedisDown: touches Redis never took reach the
// table at Close even while Redis is still down (the final flush writes the
// backlog directly); Close reports Redis's error. Before, they were lost.
func TestCloseWritesBacklogWhileRedisDown(t *testing.T) {
	for _, d := range servers.Dialects() {
		t.Run(d.Name, func(t *testing.T) {
			h := newHarness(t, d, testenv.Miniredis())
			ctx := context.Background()
			cfg := h.config()
			cfg.Buffer.TouchTimeout = time.Second
			p, db := h.plugin(cfg)
			seedUsers(t, db, 3)
			h.r.Mini.Close()
			for id, at := range map[int]string{1: "2026-03-01T09:10:00Z", 2: "2026-03-01T09:20:00Z"} {
				_, err := p.TouchAt(ctx, id, mustTime(at))
				equal(t, "kept", errors.Is(err, lastseen.ErrBuffered), true)
			}
			if err := p.Close(ctx); err == nil {
				t.Fatal("Close with Redis down returned no error")
			}
			equal(t, "user 1", lastSeenColumn(t, db, "users", "id", "last_seen_at", 1), "2026-03-01T09:10:00Z")
			equal(t, "user 2", lastSeenColumn(t, db, "users", "id", "last_seen_at", 2), "2026-03-01T09:20:00Z")
			equal(t, "user 3", lastSeenColumn(t, db, "users", "id", "last_seen_at", 3), "")
			equal(t, "backlog dropped", p.Stats().BacklogDropped, 0)
		})
	}
}
