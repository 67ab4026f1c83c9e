package tests

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bsm/redislock"
	"github.com/lastseen/lastseen"
)

type ctxKey string

// recorder is an Observer that writes one line per call; it puts its name
// in the context it returns and reports the names it was given, so the
// lines show how the contexts nest.
type recorder struct {
	name  string
	mu    *sync.Mutex
	lines *[]string
}

func (r recorder) log(ctx context.Context, format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var chain []string
	for _, k := range []ctxKey{"a", "b"} {
		if v, ok := ctx.Value(k).(string); ok {
			chain = append(chain, v)
		}
	}
	*r.lines = append(*r.lines, r.name+" "+fmt.Sprintf(format, args...)+" ctx="+strings.Join(chain, ">"))
}

func (r recorder) with(ctx context.Context, what string) context.Context {
	return context.WithValue(ctx, ctxKey(r.name), what)
}

func errText(err error) string {
	if err == nil {
		return "nil"
	}
	return err.Error()
}

func (r recorder) StartFlush(ctx context.Context) (context.Context, func(lastseen.FlushResult, error)) {
	r.log(ctx, "flush start")
	ctx = r.with(ctx, "flush")
	return ctx, func(res lastseen.FlushResult, err error) {
		r.log(ctx, "flush end drained=%d written=%d shards=%d err=%s", res.Drained, res.Written, res.Shards, errText(err))
	}
}

func (r recorder) StartFlushShard(ctx context.Context, shard int) (context.Context, func(lastseen.FlushResult, error)) {
	r.log(ctx, "shard %d start", shard)
	ctx = r.with(ctx, fmt.Sprint("shard", shard))
	return ctx, func(res lastseen.FlushResult, err error) {
		r.log(ctx, "shard %d end drained=%d written=%d err=%s", shard, res.Drained, res.Written, errText(err))
	}
}

func (r recorder) StartPurge(ctx context.Context) (context.Context, func(lastseen.PurgeResult, error)) {
	r.log(ctx, "purge start")
	ctx = r.with(ctx, "purge")
	return ctx, func(res lastseen.PurgeResult, err error) {
		r.log(ctx, "purge end deleted=%d batches=%d locked=%v err=%s", res.Deleted, res.Batches, errors.Is(err, lastseen.ErrLocked), errText(err))
	}
}

func (r recorder) StartPurgeBatch(ctx context.Context, batch int) (context.Context, func(int, error)) {
	r.log(ctx, "batch %d start", batch)
	ctx = r.with(ctx, fmt.Sprint("batch", batch))
	return ctx, func(n int, err error) { r.log(ctx, "batch %d end deleted=%d err=%s", batch, n, errText(err)) }
}

func (r recorder) StartRule(ctx context.Context, rule string) (context.Context, func(lastseen.PurgeResult, error)) {
	r.log(ctx, "rule %s start", rule)
	ctx = r.with(ctx, "rule")
	return ctx, func(res lastseen.PurgeResult, err error) {
		r.log(ctx, "rule %s end acted=%d batches=%d kept=%d locked=%v err=%s", rule, res.Deleted, res.Batches, res.Kept, errors.Is(err, lastseen.ErrLocked), errText(err))
	}
}

func (r recorder) StartRuleBatch(ctx context.Context, rule string, batch int) (context.Context, func(int, error)) {
	r.log(ctx, "rule %s batch %d start", rule, batch)
	ctx = r.with(ctx, fmt.Sprint("batch", batch))
	return ctx, func(n int, err error) {
		r.log(ctx, "rule %s batch %d end acted=%d err=%s", rule, batch, n, errText(err))
	}
}

// TestObserverSeesFlushAndPurge: two observers see every flush (with its
// shards) and purge (with its batches) in the order added, end in reverse
// order, with the counts and errors the runs returned, and the contexts
// they return nest: a shard's context carries its flush's values.
func TestObserverSeesFlushAndPurge(t *testing.T) {
	forEachDialect(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		var mu sync.Mutex
		var lines []string
		cfg := purgeConfig(h, 2)
		cfg.Buffer.Shards, cfg.Flush.Concurrency = 2, 1
		p, db := h.plugin(cfg)
		p.AddObserver(nil) // ignored
		p.AddObserver(recorder{"a", &mu, &lines})
		p.AddObserver(recorder{"b", &mu, &lines})
		seedUsers(t, db, 3)
		seedSessions(t, db, sess("s1", "2026-03-01T09:00:00Z"), sess("s2", "2026-03-01T09:01:00Z"),
			sess("s3", "2026-03-01T09:02:00Z"), sess("z", "2026-03-02T00:00:00Z"))
		for id := 1; id <= 3; id++ { // users 1 and 3 hash to shard 0, user 2 to shard 1 (FNV-1a mod 2)
			_, err := p.Touch(ctx, id)
			must(t, err)
		}

		res, err := p.Flush(ctx)
		must(t, err)
		equal(t, "written", res.Written, 3)
		_, err = p.PurgeExpiredSessions(ctx)
		must(t, err)
		lock, err := redislock.New(h.r.Client).Obtain(ctx, h.prefix+":purge:lock", time.Minute, nil)
		must(t, err)
		if _, err := p.PurgeExpiredSessions(ctx); err != lastseen.ErrLocked {
			t.Fatalf("purge under another's lock: err = %v, want ErrLocked", err)
		}
		must(t, lock.Release(ctx))

		want := []string{
			"a flush start ctx=",
			"b flush start ctx=flush",
			"a shard 0 start ctx=flush>flush",
			"b shard 0 start ctx=shard0>flush",
			"b shard 0 end drained=2 written=2 err=nil ctx=shard0>shard0",
			"a shard 0 end drained=2 written=2 err=nil ctx=shard0>flush",
			"a shard 1 start ctx=flush>flush",
			"b shard 1 start ctx=shard1>flush",
			"b shard 1 end drained=1 written=1 err=nil ctx=shard1>shard1",
			"a shard 1 end drained=1 written=1 err=nil ctx=shard1>flush",
			"b flush end drained=3 written=3 shards=2 err=nil ctx=flush>flush",
			"a flush end drained=3 written=3 shards=2 err=nil ctx=flush",
			"a purge start ctx=",
			"b purge start ctx=purge",
			"a batch 1 start ctx=purge>purge",
			"b batch 1 start ctx=batch1>purge",
			"b batch 1 end deleted=2 err=nil ctx=batch1>batch1",
			"a batch 1 end deleted=2 err=nil ctx=batch1>purge",
			"a batch 2 start ctx=purge>purge",
			"b batch 2 start ctx=batch2>purge",
			"b batch 2 end deleted=1 err=nil ctx=batch2>batch2",
			"a batch 2 end deleted=1 err=nil ctx=batch2>purge",
			"b purge end deleted=3 batches=2 locked=false err=nil ctx=purge>purge",
			"a purge end deleted=3 batches=2 locked=false err=nil ctx=purge",
			"a purge start ctx=",
			"b purge start ctx=purge",
			"b purge end deleted=0 batches=0 locked=true err=lastseen: another instance holds the lock ctx=purge>purge",
			"a purge end deleted=0 batches=0 locked=true err=lastseen: another instance holds the lock ctx=purge",
		}
		mu.Lock()
		got := slices.Clone(lines)
		mu.Unlock()
		equal(t, "observer calls", strings.Join(got, "\n"), strings.Join(want, "\n"))
		s := p.Stats()
		equal(t, "stats purges", s.Purges, 1)
		equal(t, "stats purge skipped", s.PurgeSkipped, 1)
		equal(t, "stats last flush", s.LastFlush, mustTime("2026-03-01T09:30:00Z"))
	})
}

// TestTarget: Target names the dialect, both tables and the prefix once
// the plugin is initialized, and only the prefix before.
func TestTarget(t *testing.T) {
	forEachDialect(t, func(t *testing.T, h *harness) {
		before := lastseen.New(lastseen.Config{Redis: h.r.Client, Buffer: lastseen.BufferConfig{Prefix: "pfx"}})
		got, err := before.Target()
		equal(t, "before db.Use: error", err, lastseen.ErrNotInitialized)
		equal(t, "before db.Use", got, lastseen.Target{Prefix: "pfx"})

		p, _ := h.plugin(h.config())
		got, err = p.Target()
		must(t, err)
		equal(t, "target", got, lastseen.Target{Dialect: h.dialect, Table: "users", SessionTable: "sessions", Prefix: h.prefix})
	})
}

// TestObserverSeesRuleRuns: an observer sees each run of a rule with its
// batches, in selection order, their rows acted on and the run's counts; a
// batch whose rows are all held back by buffered activity (6, buffered
// before the run, and 7, touched after its batch was selected) is seen
// acting on none and opens no transaction; a run under another instance's
// lock is seen ending with ErrLocked; a name without a rule is not seen.
func TestObserverSeesRuleRuns(t *testing.T) {
	forEachEnv(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		users, tokens, _ := rulesSetup(t, h, &actionLog{})
		var mu sync.Mutex
		var lines, txs []string
		users.AddObserver(recorder{"a", &mu, &lines})
		seam(users).Purge.AfterSelect = func(rule string, batch int, ids []any) {
			if batch == 3 {
				_, err := tokens.TouchAt(ctx, uint64(7), mustTime("2026-03-01T09:29:00Z"))
				must(t, err)
			}
		}
		setHooks(users, &flushHooks{BeforeDelete: func(ids []any) { txs = append(txs, fmt.Sprint(ids)) }})

		res, err := users.RunRule(ctx, "warn-80d")
		must(t, err)
		equal(t, "acted", res.Deleted, 5)
		equal(t, "transactions", strings.Join(txs, " "), "[1 2] [3 4] [10]")
		lock, err := internals(users).Buffer.LockRule(ctx, "warn-80d")
		must(t, err)
		if _, err := users.RunRule(ctx, "warn-80d"); err != lastseen.ErrLocked {
			t.Fatalf("run under another's lock: err = %v, want ErrLocked", err)
		}
		lock.Release(ctx)
		if _, err := users.RunRule(ctx, "no-such-rule"); err == nil {
			t.Fatal("run of no rule: no error")
		}

		want := []string{
			"a rule warn-80d start ctx=",
			"a rule warn-80d batch 1 start ctx=rule",
			"a rule warn-80d batch 1 end acted=2 err=nil ctx=batch1",
			"a rule warn-80d batch 2 start ctx=rule",
			"a rule warn-80d batch 2 end acted=2 err=nil ctx=batch2",
			"a rule warn-80d batch 3 start ctx=rule",
			"a rule warn-80d batch 3 end acted=0 err=nil ctx=batch3",
			"a rule warn-80d batch 4 start ctx=rule",
			"a rule warn-80d batch 4 end acted=1 err=nil ctx=batch4",
			"a rule warn-80d end acted=5 batches=3 kept=2 locked=false err=nil ctx=rule",
			"a rule warn-80d start ctx=",
			"a rule warn-80d end acted=0 batches=0 kept=0 locked=true err=lastseen: another instance holds the lock ctx=rule",
		}
		mu.Lock()
		defer mu.Unlock()
		if !slices.Equal(lines, want) {
			t.Errorf("observed:\n%s\nwant:\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
		}
		equal(t, "RuleStats", fmt.Sprintf("%+v", users.RuleStats()[0]),
			"{Name:warn-80d Table:api_tokens Runs:1 Errors:0 Skipped:1 Rows:5 Batches:3 Kept:2 Refused:0 LastRun:2026-03-01 09:30:00 +0000 UTC}")
	})
}
