package tests

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/tests/testenv"
	"github.com/sony/gobreaker/v2"
)

// Nothing dropped without a count: every touch that never reaches Redis is
// either in the backlog (Backlogged) or counted in BacklogDropped and
// logged (rate-limited).

// TestBacklogDropsCountedDuringBlackhole: Redis accepts connections and
// never answers. 110 users touched with a backlog of 100: 10 dropped. A
// flush takes the backlog to replay it; meanwhile users 1-10 are touched
// again (newer) and 90 new users fill the backlog; the replay fails and
// puts its 100 entries back: users 1-10 keep their newer timestamps, the
// other 90 no longer fit and are counted. Close cannot write the backlog
// (100 dropped), and a touch after Close that fails is dropped too.
func TestBacklogDropsCountedDuringBlackhole(t *testing.T) {
	rs := startPrivateRedis(t)
	px := startFaultProxy(t, rs.Addr())
	h := newHarness(t, testenv.SQLite(), clientKind(newPrivateClient(t, px.Addr())))
	t.Cleanup(func() { px.Restore() }) // before the harness deletes its keys
	var logs testenv.Logs
	cfg := h.config()
	cfg.Logger = testenv.TextLogger(&logs)
	cfg.Buffer.TouchTimeout = 100 * time.Millisecond
	testenv.Seam(&cfg).BreakerCooldown = time.Hour
	testenv.Seam(&cfg).BacklogSize = 100
	p, _ := h.plugin(cfg)
	client, _, _ := buf(p).Client()
	waitForRedis(t, client)
	first, newer := mustTime("2026-03-01T09:20:00Z"), mustTime("2026-03-01T09:25:00Z")
	touch := func(id int, at time.Time) {
		t.Helper()
		if ok, err := p.TouchAt(context.Background(), id, at); ok || err == nil {
			t.Fatalf("touch %d during the black hole: recorded=%v err=%v, want an error", id, ok, err)
		}
	}

	px.SetDrop(true)
	for id := 1; id <= 110; id++ {
		touch(id, first)
	}
	equal(t, "breaker", buf(p).Breaker(), gobreaker.StateOpen)
	equal(t, "stats after 110 touches", p.Stats(), lastseen.Stats{Touches: 110, RedisErrors: 110, Backlogged: 100, BacklogDropped: 10, Backlog: 100})

	setHooks(p, &flushHooks{AfterBacklogTake: func(n int) {
		equal(t, "entries taken for the replay", n, 100)
		for id := 1; id <= 10; id++ {
			touch(id, newer)
		}
		for id := 201; id <= 290; id++ {
			touch(id, first)
		}
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, err := p.Flush(ctx)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("flush during the black hole: %v, want context.DeadlineExceeded", err)
	}
	setHooks(p, nil)
	equal(t, "stats after the failed replay", p.Stats(), lastseen.Stats{Touches: 210, RedisErrors: 210, Backlogged: 200, BacklogDropped: 100,
		Backlog: 100, Flushes: 1, FlushErrors: 1})
	at, ok := buf(p).Backlog("7")
	equal(t, "user 7 keeps its newer timestamp", ok && at == newer.UnixMicro(), true)
	_, ok = buf(p).Backlog("50")
	equal(t, "user 50 (put back, no room) in the backlog", ok, false)
	_, ok = buf(p).Backlog("250")
	equal(t, "user 250 (touched during the replay) in the backlog", ok, true)

	ctx, cancel = context.WithTimeout(context.Background(), 300*time.Millisecond)
	if err := p.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("close during the black hole: %v, want context.DeadlineExceeded", err)
	}
	cancel()
	touch(300, first) // after Close: nothing would flush it
	equal(t, "stats after Close", p.Stats(), lastseen.Stats{Touches: 211, RedisErrors: 211, Backlogged: 200, BacklogDropped: 201,
		Flushes: 2, FlushErrors: 2})
	// One line per reason per 10s, with the running total.
	equal(t, "drop log lines", logs.Count(`msg="lastseen: dropped touches that never reached redis: `), 4)
	for _, want := range []struct{ reason, counts string }{
		{"backlog full", "dropped=1 backlog_dropped_total=1"},
		{"backlog full when a failed replay put it back", "dropped=90 backlog_dropped_total=100"},
		{"backlog not written to redis by Close", "dropped=100 backlog_dropped_total=200"},
		{"redis unreachable after Close", "dropped=1 backlog_dropped_total=201"},
	} {
		line := logLine(&logs, `msg="lastseen: dropped touches that never reached redis: `+want.reason+`"`)
		equal(t, "logged: "+want.reason, strings.Contains(line, "level=WARN") && strings.HasSuffix(line, want.counts), true)
	}
}
