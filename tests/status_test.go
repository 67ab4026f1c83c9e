package tests

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lastseen/lastseen"
)

// TestStatus reads the buffer with pending entries, in-flight entries left
// by a failed flush, and unreadable entries written by hand, and checks
// every shard's counts and the oldest timestamp. User ids 9 and 10 fall in
// shard 4, 2 in shard 5 and 1 in shard 12 (FNV-1a of the decimal id, mod 16:
// every instance must agree on this mapping).
func TestStatus(t *testing.T) {
	forEachEnv(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		cfg := h.config()
		cfg.Throttle = time.Minute
		p, db := h.plugin(cfg)
		must(t, db.AutoMigrate(&lastseen.User{}))
		must(t, db.Create(&[]lastseen.User{{ID: 1}, {ID: 2}, {ID: 9}, {ID: 10}}).Error)

		empty, err := p.Status(ctx)
		must(t, err)
		equal(t, "empty: shards", len(empty.Shards), lastseen.DefaultShards)
		equal(t, "empty: pending", empty.Pending, 0)
		equal(t, "empty: in-flight", empty.InFlight, 0)
		equal(t, "empty: oldest is zero", empty.Oldest.IsZero(), true)
		equal(t, "empty: oldest age", empty.OldestAge(), 0)
		equal(t, "empty: at", empty.At.Format(time.RFC3339), "2026-03-01T09:30:00Z")

		for _, touch := range []struct {
			id int
			at string
		}{{9, "2026-03-01T09:00:00Z"}, {10, "2026-03-01T09:10:00Z"}, {2, "2026-03-01T09:20:00Z"}} {
			recorded, err := p.TouchAt(ctx, touch.id, mustTime(touch.at))
			must(t, err)
			equal(t, "recorded", recorded, true)
		}
		setFail := failWrites(t, db)
		setFail(true)
		if _, err := p.Flush(ctx); err == nil {
			t.Fatal("flush with failing writes returned no error")
		}
		setFail(false)

		h.expireThrottle(time.Minute) // clock 09:31
		for _, touch := range []struct {
			id int
			at string
		}{{9, "2026-03-01T09:25:00Z"}, {1, "2026-03-01T09:29:00Z"}} {
			recorded, err := p.TouchAt(ctx, touch.id, mustTime(touch.at))
			must(t, err)
			equal(t, "recorded", recorded, true)
		}
		// Two unreadable entries in shard 7, written past the plugin: a
		// Redis-only case (the in-process buffer holds only what touches
		// put there).
		junk := int64(2)
		if h.memory() {
			junk = 0
		} else {
			must(t, h.r.Client.HSet(ctx, h.prefix+":{7}:pending", "21", "not-a-time", "abc", "1772357400000000").Err())
		}

		st, err := p.Status(ctx)
		must(t, err)
		equal(t, "at", st.At.Format(time.RFC3339), "2026-03-01T09:31:00Z")
		equal(t, "pending", st.Pending, 2+junk)
		equal(t, "in-flight", st.InFlight, 3)
		equal(t, "unreadable", st.Unreadable, junk)
		equal(t, "oldest", st.Oldest.Format(time.RFC3339), "2026-03-01T09:00:00Z")
		equal(t, "oldest age", st.OldestAge(), 31*time.Minute)
		equal(t, "backlog", st.Backlog, 0)
		want := map[int]lastseen.ShardStatus{
			4:  {Shard: 4, Pending: 1, InFlight: 2, Oldest: mustTime("2026-03-01T09:00:00Z")},
			5:  {Shard: 5, Pending: 0, InFlight: 1, Oldest: mustTime("2026-03-01T09:20:00Z")},
			7:  {Shard: 7, Pending: 2, Unreadable: 2},
			12: {Shard: 12, Pending: 1, Oldest: mustTime("2026-03-01T09:29:00Z")},
		}
		if junk == 0 {
			delete(want, 7)
		}
		for i, s := range st.Shards {
			w, ok := want[i]
			if !ok {
				w = lastseen.ShardStatus{Shard: i}
			}
			if s != w {
				t.Errorf("shard %d = %+v, want %+v", i, s, w)
			}
		}

		// A flush finishes the in-flight hashes (9 and 10 at their first
		// times, 2), then the pending ones (9 again, 1), and drops the
		// unreadable entries as rejected: the buffer reads empty again.
		res, err := p.Flush(ctx)
		must(t, err)
		equal(t, "flush written", res.Written, 5)
		equal(t, "flush rejected", res.Rejected, int(junk))
		after, err := p.Status(ctx)
		must(t, err)
		equal(t, "after flush: pending", after.Pending, 0)
		equal(t, "after flush: in-flight", after.InFlight, 0)
		equal(t, "after flush: oldest is zero", after.Oldest.IsZero(), true)
	})
}

// TestStatusNotInitialized: a plugin not registered with db.Use says so.
func TestStatusNotInitialized(t *testing.T) {
	_, err := lastseen.New(lastseen.Config{}).Status(context.Background())
	equal(t, "error is ErrNotInitialized", errors.Is(err, lastseen.ErrNotInitialized), true)
}
