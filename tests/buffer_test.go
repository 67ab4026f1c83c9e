package tests

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/tests/testenv"
)

// TestSampleBuffer: sizes are exact; the oldest timestamp is exact while
// each hash holds at most perHash entries, else one of the buffered
// timestamps (never older than the true oldest); an in-flight hash counts;
// perHash 0 skips the sample; a perHash out of range is refused.
func TestSampleBuffer(t *testing.T) {
	forEachEnv(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		cfg := h.config()
		cfg.Buffer.Shards = 2
		p, _ := h.plugin(cfg)

		s, err := p.SampleBuffer(ctx, 16)
		must(t, err)
		equal(t, "empty", s, lastseen.BufferSample{At: mustTime("2026-03-01T09:30:00Z"), Exact: true})
		equal(t, "empty: oldest age", s.OldestAge(), 0)

		times := map[int]string{1: "2026-03-01T09:10:00Z", 2: "2026-03-01T09:20:00Z", 3: "2026-03-01T09:25:00Z"}
		for id, at := range times { // users 1 and 3 in shard 0, user 2 in shard 1
			_, err := p.TouchAt(ctx, id, mustTime(at))
			must(t, err)
		}
		// Shard 1's pending hash becomes its in-flight hash, as a flush
		// that failed after its swap leaves it.
		h.leaveInFlight(p, 1)

		s, err = p.SampleBuffer(ctx, 16)
		must(t, err)
		equal(t, "exact", s, lastseen.BufferSample{At: mustTime("2026-03-01T09:30:00Z"), Pending: 2, InFlight: 1,
			Oldest: mustTime("2026-03-01T09:10:00Z"), Exact: true})
		equal(t, "exact: oldest age", s.OldestAge(), 20*time.Minute)

		s, err = p.SampleBuffer(ctx, 1) // shard 0's pending hash holds 2 users
		must(t, err)
		equal(t, "sampled: exact", s.Exact, false)
		equal(t, "sampled: pending", s.Pending, 2)
		equal(t, "sampled: in flight", s.InFlight, 1)
		if o := s.Oldest.Format(time.RFC3339); o != times[1] && o != times[2] {
			t.Errorf("sampled oldest = %s, want %s or %s (the oldest sampled entry of either shard)", o, times[1], times[2])
		}

		s, err = p.SampleBuffer(ctx, 0)
		must(t, err)
		equal(t, "no sample", s, lastseen.BufferSample{At: mustTime("2026-03-01T09:30:00Z"), Pending: 2, InFlight: 1})

		for _, n := range []int{-1, 1001} {
			_, err := p.SampleBuffer(ctx, n)
			want := "lastseen: sample buffer: perHash is " + strconv.Itoa(n) + ", want 0 to 1000"
			if err == nil || err.Error() != want {
				t.Errorf("SampleBuffer(%d): err = %v, want %q", n, err, want)
			}
		}
		if _, err := lastseen.New(cfg).SampleBuffer(ctx, 1); err != lastseen.ErrNotInitialized {
			t.Errorf("before db.Use: err = %v, want ErrNotInitialized", err)
		}
	})
}

// TestBreakerState: the breaker is closed before and after db.Use, and
// open after 5 touches in a row failed.
func TestBreakerState(t *testing.T) {
	h := newHarness(t, testenv.SQLite(), testenv.Miniredis())
	ctx := context.Background()
	cfg := h.config()
	testenv.Seam(&cfg).BreakerCooldown = time.Hour
	equal(t, "before db.Use", lastseen.New(cfg).Breaker(), "closed")
	p, _ := h.plugin(cfg)
	equal(t, "after db.Use", p.Breaker(), "closed")
	h.r.Mini.SetError("LOADING Redis is loading the dataset in memory")
	for id := 1; id <= 5; id++ {
		if _, err := p.Touch(ctx, id); err == nil {
			t.Fatalf("touch %d: no error from a failing Redis", id)
		}
	}
	equal(t, "after 5 failures", p.Breaker(), "open")
	h.r.Mini.SetError("")
}
