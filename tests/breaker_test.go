package tests

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/tests/testenv"
	"github.com/sony/gobreaker/v2"
)

// The circuit breaker counts Redis's failures only: a touch whose caller's
// context had ended is kept in the backlog but is no Redis failure.

// TestBreakerIgnoresCallerEndedContexts: 100 touches with a canceled
// context and 100 with a deadline already past leave the breaker closed,
// are all kept in the backlog and counted in Canceled (not RedisErrors),
// and the next 100 touches on the healthy Redis are all recorded.
func TestBreakerIgnoresCallerEndedContexts(t *testing.T) {
	for _, r := range testenv.RedisKinds() {
		t.Run(r.Name, func(t *testing.T) {
			h := newHarness(t, testenv.SQLite(), r)
			cfg := h.config()
			cfg.Flush.Upsert = true // every id gets a row
			p, db := h.plugin(cfg)
			must(t, db.AutoMigrate(&lastseen.User{}))
			canceled, cancel := context.WithCancel(context.Background())
			cancel()
			expired, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
			defer cancel2()
			at := mustTime("2026-03-01T09:20:00Z")
			for id := 1; id <= 200; id++ {
				ctx, want := canceled, context.Canceled
				if id > 100 {
					ctx, want = expired, context.DeadlineExceeded
				}
				ok, err := p.TouchAt(ctx, id, at)
				if ok || !errors.Is(err, want) {
					t.Fatalf("touch %d: recorded=%v err=%v, want an error wrapping %v", id, ok, err, want)
				}
			}
			equal(t, "breaker after 200 ended contexts", buf(p).Breaker(), gobreaker.StateClosed)
			equal(t, "breaker's consecutive failures", buf(p).BreakerCounts().ConsecutiveFailures, uint32(0))
			for id := 201; id <= 300; id++ {
				ok, err := p.TouchAt(context.Background(), id, at)
				must(t, err)
				if !ok {
					t.Fatalf("touch %d on the healthy Redis was not recorded", id)
				}
			}
			equal(t, "stats", p.Stats(), lastseen.Stats{Touches: 300, Recorded: 100, Canceled: 200, Backlogged: 200, Backlog: 200})
			equal(t, "breaker at the end", buf(p).Breaker(), gobreaker.StateClosed)
			res, err := p.Flush(context.Background())
			must(t, err)
			equal(t, "drained: the 200 kept and the 100 recorded", res.Drained, 300)
			equal(t, "written", res.Written, 300)
		})
	}
}

// TestBreakerIgnoresCallerDeadlineDuringCall: with every reply delayed
// 300ms, touches whose caller's deadline (50ms) ends while they wait are
// caller-ended, not failures: 10 of them leave the breaker closed. Touches
// that hit TouchTimeout (50ms, the caller without a deadline) are Redis
// failures: the breaker opens after 5.
func TestBreakerIgnoresCallerDeadlineDuringCall(t *testing.T) {
	rs := startPrivateRedis(t)
	px := startFaultProxy(t, rs.Addr())
	h := newHarness(t, testenv.SQLite(), clientKind(newPrivateClient(t, px.Addr())))
	cfg := h.config()
	cfg.Buffer.TouchTimeout = time.Second
	testenv.Seam(&cfg).BreakerCooldown = time.Hour
	p, _ := h.plugin(cfg)
	at := mustTime("2026-03-01T09:20:00Z")
	ok, err := p.TouchAt(context.Background(), 1, at) // loads the script
	must(t, err)
	equal(t, "recorded before the delay", ok, true)

	px.SetDelay(300 * time.Millisecond)
	for id := 2; id <= 11; id++ {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		_, err := p.TouchAt(ctx, id, at)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) || !isCallerEnded(err) {
			t.Fatalf("touch %d: %v, want the caller's deadline", id, err)
		}
	}
	equal(t, "breaker after 10 caller deadlines", buf(p).Breaker(), gobreaker.StateClosed)
	equal(t, "stats after caller deadlines", p.Stats(), lastseen.Stats{Touches: 11, Recorded: 1, Canceled: 10, Backlogged: 10, Backlog: 10})

	buf(p).SetTouchTimeout(50 * time.Millisecond)
	for id := 12; id <= 16; id++ {
		_, err := p.TouchAt(context.Background(), id, at)
		if !errors.Is(err, context.DeadlineExceeded) || isCallerEnded(err) {
			t.Fatalf("touch %d: %v, want TouchTimeout's deadline", id, err)
		}
	}
	equal(t, "breaker after 5 TouchTimeouts", buf(p).Breaker(), gobreaker.StateOpen)
	equal(t, "stats after TouchTimeouts", p.Stats(), lastseen.Stats{Touches: 16, Recorded: 1, Canceled: 10, RedisErrors: 5, Backlogged: 15, Backlog: 15})
	must(t, px.Restore())
}

// TestBreakerHalfOpenLetsBurstThrough: after an outage opened the breaker
// and its cooldown passed, a burst of 40 concurrent touches on the
// recovered Redis is all recorded (the half-open breaker lets up to 64
// probe), no touch is refused as "too many requests", RedisErrors keeps the
// outage's 5 only, and 64 successes in a row close the breaker.
func TestBreakerHalfOpenLetsBurstThrough(t *testing.T) {
	rs := startPrivateRedis(t)
	px := startFaultProxy(t, rs.Addr())
	h := newHarness(t, testenv.SQLite(), clientKind(newPrivateClient(t, px.Addr())))
	cfg := h.config()
	cfg.Buffer.TouchTimeout = 50 * time.Millisecond
	testenv.Seam(&cfg).BreakerCooldown = 100 * time.Millisecond
	cfg.Buffer.LocalCacheSize = -1
	p, _ := h.plugin(cfg)
	at := mustTime("2026-03-01T09:20:00Z")
	ok, err := p.TouchAt(context.Background(), 1, at) // loads the script
	must(t, err)
	equal(t, "recorded before the outage", ok, true)

	px.SetDelay(300 * time.Millisecond)
	for id := 2; id <= 6; id++ {
		if _, err := p.TouchAt(context.Background(), id, at); !errors.Is(err, lastseen.ErrBuffered) {
			t.Fatalf("touch %d during the outage: %v, want ErrBuffered", id, err)
		}
	}
	equal(t, "breaker after 5 timeouts", buf(p).Breaker(), gobreaker.StateOpen)
	must(t, px.Restore())
	buf(p).SetTouchTimeout(time.Second) // a healthy Redis answers well within it
	time.Sleep(200 * time.Millisecond)  // the cooldown passes (gobreaker's own clock)

	const burst = 40
	errs := make(chan error, burst)
	recorded := make(chan bool, burst)
	start := make(chan struct{})
	for i := range burst {
		go func() {
			<-start
			ok, err := p.TouchAt(context.Background(), 100+i, at)
			recorded <- ok
			errs <- err
		}()
	}
	close(start)
	n := 0
	for range burst {
		must(t, <-errs)
		if <-recorded {
			n++
		}
	}
	equal(t, "burst recorded", n, burst)
	equal(t, "RedisErrors: the outage's only", p.Stats().RedisErrors, int64(5))
	// 64 successes in a row close it: the burst's 40, then 24 more.
	equal(t, "breaker after the burst", buf(p).Breaker(), gobreaker.StateHalfOpen)
	for id := 200; id < 224; id++ {
		ok, err := p.TouchAt(context.Background(), id, at)
		must(t, err)
		equal(t, "recorded after the burst", ok, true)
	}
	equal(t, "breaker after 64 successes", buf(p).Breaker(), gobreaker.StateClosed)
}
