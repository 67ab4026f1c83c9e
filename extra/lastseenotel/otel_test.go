package lastseenotel

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/bsm/redislock"
	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/internal/testseam"
	"github.com/lastseen/lastseen/tests/testenv"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"gorm.io/gorm"
)

var start = time.Date(2026, 3, 1, 9, 30, 0, 0, time.UTC)

var must = testenv.Must

// env is one plugin on a SQLite file and a miniredis, instrumented with an
// in-memory reader and span recorder.
type env struct {
	p      *lastseen.Plugin
	db     *gorm.DB
	rdb    redis.UniversalClient
	clock  *testenv.Clock
	reader *sdkmetric.ManualReader
	spans  *tracetest.SpanRecorder
	inst   *Instrumentation
}

// newEnv opens the plugin of lastseen.User with rules (Config.Rules).
func newEnv(t *testing.T, rules ...lastseen.Rule) *env {
	t.Helper()
	rdb := testenv.Miniredis().Open(t).Client
	db := testenv.SQLite().New(t).Open(t)
	must(t, db.AutoMigrate(&lastseen.User{}, &lastseen.Session{}))
	c := testenv.NewClock(start)
	p := testenv.Use(t, db, lastseen.Config{
		Redis:    rdb,
		Logger:   testenv.Discard,
		Buffer:   lastseen.BufferConfig{Shards: 2, TouchTimeout: 2 * time.Second},
		Flush:    lastseen.FlushConfig{Concurrency: 1, Schedule: "off"},
		Sessions: lastseen.SessionConfig{Schedule: "off", BatchSize: 2},
		Rules:    rules,
		Test:     lastseen.TestConfig{Now: c.Now, Seam: &testseam.Seam{PurgePause: -1}},
	})

	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	t.Cleanup(func() {
		_ = mp.Shutdown(context.Background())
		_ = tp.Shutdown(context.Background())
	})
	// A collection timeout of a minute: a loaded machine must not leave the
	// buffer gauges out (as the Prometheus collector's tests do).
	inst, err := New(p, WithMeterProvider(mp), WithTracerProvider(tp), WithCollectTimeout(time.Minute))
	must(t, err)
	inst.now = testenv.SteppingClock(start, 250*time.Millisecond).Now // every run lasts 0.25s
	return &env{p: p, db: db, rdb: rdb, clock: c, reader: reader, spans: spans, inst: inst}
}

// metrics collects and renders every data point as one sorted line:
// "name unit {attributes} value", histograms with count, sum and the
// non-empty buckets' upper bounds and counts.
func (e *env) metrics(t *testing.T) string {
	t.Helper()
	var rm metricdata.ResourceMetrics
	must(t, e.reader.Collect(context.Background(), &rm))
	var lines []string
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != ScopeName {
			t.Errorf("scope %q, want %q", sm.Scope.Name, ScopeName)
		}
		for _, m := range sm.Metrics {
			head := m.Name + " " + m.Unit + " "
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				if !d.IsMonotonic || d.Temporality != metricdata.CumulativeTemporality {
					t.Errorf("%s: not a cumulative monotonic sum", m.Name)
				}
				for _, p := range d.DataPoints {
					lines = append(lines, head+attrs(p.Attributes)+" "+fmt.Sprint(p.Value))
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					lines = append(lines, head+attrs(p.Attributes)+" "+fmt.Sprint(p.Value))
				}
			case metricdata.Gauge[float64]:
				for _, p := range d.DataPoints {
					lines = append(lines, head+attrs(p.Attributes)+" "+fmt.Sprint(p.Value))
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					var buckets []string
					for i, n := range p.BucketCounts {
						if n > 0 {
							le := "+Inf"
							if i < len(p.Bounds) {
								le = fmt.Sprint(p.Bounds[i])
							}
							buckets = append(buckets, fmt.Sprintf("le%s:%d", le, n))
						}
					}
					lines = append(lines, fmt.Sprintf("%s%s count=%d sum=%v %s", head, attrs(p.Attributes), p.Count, p.Sum, strings.Join(buckets, ",")))
				}
			default:
				t.Errorf("%s: unexpected data %T", m.Name, m.Data)
			}
		}
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

// attrs renders a set without the two attributes every point has, after
// checking them.
func attrs(s attribute.Set) string {
	var out []string
	for _, kv := range s.ToSlice() {
		switch {
		case kv.Key == "db.system.name" && kv.Value.AsString() == "sqlite":
		case kv.Key == "db.collection.name" && kv.Value.AsString() == "users":
		default:
			out = append(out, string(kv.Key)+"="+kv.Value.Emit())
		}
	}
	if len(out) != s.Len()-2 {
		return "{MISSING db.system.name=sqlite or db.collection.name=users: " + s.Encoded(attribute.DefaultEncoder()) + "}"
	}
	return "{" + strings.Join(out, ",") + "}"
}

// spanLines renders the ended spans in the order they ended: name, kind,
// parent's name, attributes, status and events.
func (e *env) spanLines() string {
	ended := e.spans.Ended()
	names := map[string]string{}
	for _, s := range ended {
		names[s.SpanContext().SpanID().String()] = s.Name()
	}
	var lines []string
	for _, s := range ended {
		parent := names[s.Parent().SpanID().String()]
		var kv []string
		for _, a := range s.Attributes() {
			kv = append(kv, string(a.Key)+"="+a.Value.Emit())
		}
		slices.Sort(kv)
		line := fmt.Sprintf("%q kind=%s parent=%q [%s] status=%s", s.Name(), s.SpanKind(), parent, strings.Join(kv, " "), s.Status().Code)
		if d := s.Status().Description; d != "" {
			line += " " + fmt.Sprintf("%q", d)
		}
		for _, ev := range s.Events() {
			line += " event=" + ev.Name
		}
		lines = append(lines, line)
	}
	return strings.Join(lines, "\n")
}

// TestMetricsAndSpans runs a known sequence of touches, a flush and purges
// and checks every metric data point and every span exactly.
func TestMetricsAndSpans(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	must(t, e.db.Create(&[]lastseen.User{{ID: 1}, {ID: 2}}).Error)
	for _, id := range []int{1, 1, 2, 3} { // recorded, cached, recorded, recorded (3 has no row)
		_, err := e.p.Touch(ctx, id)
		must(t, err)
	}
	e.clock.Add(90 * time.Second)

	equalText(t, "metrics before the flush", e.metrics(t), `
lastseen.backlog.dropped {touch} {} 0
lastseen.backlog.size {user} {} 0
lastseen.breaker.state 1 {lastseen.state=closed} 1
lastseen.breaker.state 1 {lastseen.state=half-open} 0
lastseen.breaker.state 1 {lastseen.state=open} 0
lastseen.buffer.inflight {user} {} 0
lastseen.buffer.oldest_age s {} 90
lastseen.buffer.pending {user} {} 3
lastseen.buffer.read_errors {error} {} 0
lastseen.flush.dropped {entry} {} 0
lastseen.flush.entries {entry} {lastseen.outcome=ambiguous} 0
lastseen.flush.entries {entry} {lastseen.outcome=failed} 0
lastseen.flush.entries {entry} {lastseen.outcome=rejected} 0
lastseen.flush.entries {entry} {lastseen.outcome=stale} 0
lastseen.flush.entries {entry} {lastseen.outcome=uncomparable} 0
lastseen.flush.entries {entry} {lastseen.outcome=unknown} 0
lastseen.flush.entries {entry} {lastseen.outcome=written} 0
lastseen.flush.runs {run} {lastseen.result=error} 0
lastseen.flush.runs {run} {lastseen.result=ok} 0
lastseen.flush.skipped_shards {shard} {} 0
lastseen.purge.deleted {session} {} 0
lastseen.purge.refused {session} {} 0
lastseen.purge.runs {run} {lastseen.result=error} 0
lastseen.purge.runs {run} {lastseen.result=locked} 0
lastseen.purge.runs {run} {lastseen.result=ok} 0
lastseen.redis.errors {error} {lastseen.operation=touch} 0
lastseen.redis.evicted_keys {key} {} 0
lastseen.touches {touch} {lastseen.result=cached} 1
lastseen.touches {touch} {lastseen.result=error} 0
lastseen.touches {touch} {lastseen.result=invalid} 0
lastseen.touches {touch} {lastseen.result=recorded} 3
lastseen.touches {touch} {lastseen.result=throttled} 0`)

	_, err := e.p.Flush(ctx)
	must(t, err)
	must(t, e.db.Create(&[]lastseen.Session{
		{ID: "a", UserID: 1, ExpiresAt: start}, {ID: "b", UserID: 1, ExpiresAt: start},
		{ID: "c", UserID: 1, ExpiresAt: start}, {ID: "z", UserID: 1, ExpiresAt: start.Add(time.Hour)},
	}).Error)
	_, err = e.p.PurgeExpiredSessions(ctx) // a, b in batch 1; c in batch 2
	must(t, err)
	lock, err := redislock.New(e.rdb).Obtain(ctx, e.p.Config().Buffer.Prefix+":purge:lock", time.Minute, nil) // the derived prefix
	must(t, err)
	if _, err := e.p.PurgeExpiredSessions(ctx); err != lastseen.ErrLocked {
		t.Fatalf("purge under another's lock: %v, want ErrLocked", err)
	}
	must(t, lock.Release(ctx))
	must(t, e.db.Migrator().DropTable(&lastseen.Session{}))
	_, purgeErr := e.p.PurgeExpiredSessions(ctx)
	if purgeErr == nil {
		t.Fatal("purge without a sessions table: no error")
	}

	equalText(t, "metrics after the flush and purges", e.metrics(t), `
lastseen.backlog.dropped {touch} {} 0
lastseen.backlog.size {user} {} 0
lastseen.breaker.state 1 {lastseen.state=closed} 1
lastseen.breaker.state 1 {lastseen.state=half-open} 0
lastseen.breaker.state 1 {lastseen.state=open} 0
lastseen.buffer.inflight {user} {} 0
lastseen.buffer.oldest_age s {} 0
lastseen.buffer.pending {user} {} 0
lastseen.buffer.read_errors {error} {} 0
lastseen.flush.dropped {entry} {} 0
lastseen.flush.duration s {lastseen.result=ok} count=1 sum=0.25 le0.25:1
lastseen.flush.entries {entry} {lastseen.outcome=ambiguous} 0
lastseen.flush.entries {entry} {lastseen.outcome=failed} 0
lastseen.flush.entries {entry} {lastseen.outcome=rejected} 0
lastseen.flush.entries {entry} {lastseen.outcome=stale} 0
lastseen.flush.entries {entry} {lastseen.outcome=uncomparable} 0
lastseen.flush.entries {entry} {lastseen.outcome=unknown} 1
lastseen.flush.entries {entry} {lastseen.outcome=written} 2
lastseen.flush.last_success s {} 1.77235749e+09
lastseen.flush.runs {run} {lastseen.result=error} 0
lastseen.flush.runs {run} {lastseen.result=ok} 1
lastseen.flush.skipped_shards {shard} {} 0
lastseen.purge.deleted {session} {} 3
lastseen.purge.duration s {lastseen.result=error} count=1 sum=0.25 le0.5:1
lastseen.purge.duration s {lastseen.result=ok} count=1 sum=0.25 le0.5:1
lastseen.purge.refused {session} {} 0
lastseen.purge.runs {run} {lastseen.result=error} 1
lastseen.purge.runs {run} {lastseen.result=locked} 1
lastseen.purge.runs {run} {lastseen.result=ok} 1
lastseen.redis.errors {error} {lastseen.operation=touch} 0
lastseen.redis.evicted_keys {key} {} 0
lastseen.touches {touch} {lastseen.result=cached} 1
lastseen.touches {touch} {lastseen.result=error} 0
lastseen.touches {touch} {lastseen.result=invalid} 0
lastseen.touches {touch} {lastseen.result=recorded} 3
lastseen.touches {touch} {lastseen.result=throttled} 0`)

	flushAttrs := "db.collection.name=users db.operation.name=flush db.system.name=sqlite"
	purgeAttrs := "db.collection.name=sessions db.operation.name=purge db.system.name=sqlite"
	equalText(t, "spans", e.spanLines(), `
"flush users shard" kind=internal parent="flush users" [`+flushAttrs+` lastseen.batches=1 lastseen.drained=2 lastseen.failed=0 lastseen.rejected=0 lastseen.shard=0 lastseen.skipped=false lastseen.stale=0 lastseen.unknown=1 lastseen.written=1] status=Unset
"flush users shard" kind=internal parent="flush users" [`+flushAttrs+` lastseen.batches=1 lastseen.drained=1 lastseen.failed=0 lastseen.rejected=0 lastseen.shard=1 lastseen.skipped=false lastseen.stale=0 lastseen.unknown=0 lastseen.written=1] status=Unset
"flush users" kind=internal parent="" [`+flushAttrs+` lastseen.batches=2 lastseen.drained=3 lastseen.failed=0 lastseen.rejected=0 lastseen.shards=2 lastseen.skipped_shards=0 lastseen.stale=0 lastseen.unknown=1 lastseen.written=2] status=Unset
"purge sessions batch" kind=internal parent="purge sessions" [`+purgeAttrs+` lastseen.batch=1 lastseen.deleted=2] status=Unset
"purge sessions batch" kind=internal parent="purge sessions" [`+purgeAttrs+` lastseen.batch=2 lastseen.deleted=1] status=Unset
"purge sessions" kind=internal parent="" [`+purgeAttrs+` lastseen.batches=2 lastseen.deleted=3 lastseen.result=ok lastseen.retries=0] status=Unset
"purge sessions" kind=internal parent="" [`+purgeAttrs+` lastseen.batches=0 lastseen.deleted=0 lastseen.result=locked lastseen.retries=0] status=Unset
"purge sessions" kind=internal parent="" [`+purgeAttrs+` lastseen.batches=0 lastseen.deleted=0 lastseen.result=error lastseen.retries=0] status=Error `+fmt.Sprintf("%q", purgeErr.Error())+` event=exception`)
}

// equalText compares got with want less its leading newline.
func equalText(t *testing.T, what, got, want string) {
	t.Helper()
	if want = strings.TrimPrefix(want, "\n"); got != want {
		t.Errorf("%s:\n got:\n%s\nwant:\n%s", what, got, want)
	}
}

// TestNewRefuses: an uninitialized plugin and options out of range are
// refused; Close unregisters the metrics callback.
func TestNewRefuses(t *testing.T) {
	if _, err := New(lastseen.New(lastseen.Config{})); err == nil || err.Error() != "lastseenotel: "+lastseen.ErrNotInitialized.Error() {
		t.Errorf("uninitialized plugin: err = %v", err)
	}
	e := newEnv(t)
	for _, o := range []struct {
		opt  Option
		want string
	}{
		{WithBufferSample(-1), "lastseenotel: buffer sample is -1, want 0 to 1000"},
		{WithBufferSample(1001), "lastseenotel: buffer sample is 1001, want 0 to 1000"},
		{WithCollectTimeout(0), "lastseenotel: collect timeout is 0s, want a positive duration"},
	} {
		if _, err := New(e.p, o.opt); err == nil || err.Error() != o.want {
			t.Errorf("option: err = %v, want %q", err, o.want)
		}
	}
	must(t, e.inst.Close())
	equalText(t, "metrics after Close", e.metrics(t), "")
}

// TestDBSystem: GORM dialector names map to db.system.name values.
func TestDBSystem(t *testing.T) {
	for in, want := range map[string]string{"postgres": "postgresql", "mysql": "mysql", "sqlite": "sqlite"} {
		if got := DBSystem(in); got != want {
			t.Errorf("DBSystem(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestRuleMetricsAndSpans runs the rule "idle" (90 days, batches of 2) on
// users 1 to 3, last seen 2025-11-01, and 4, seen 2026-02-20: batch 1
// deletes 1 and 2; 3, touched before the run, is held back by the buffer,
// so batch 2 opens no transaction. A run under another instance's lock
// and one without the users table follow. The rule's instruments carry
// lastseen.rule; its spans the rule's table and name.
func TestRuleMetricsAndSpans(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, lastseen.Rule{Name: "idle", After: 90 * 24 * time.Hour, BatchSize: 2, Schedule: "off"})
	old, recent := time.Date(2025, 11, 1, 0, 0, 0, 0, time.UTC), time.Date(2026, 2, 20, 0, 0, 0, 0, time.UTC)
	must(t, e.db.Create(&[]lastseen.User{{ID: 1, LastSeenAt: &old}, {ID: 2, LastSeenAt: &old}, {ID: 3, LastSeenAt: &old}, {ID: 4, LastSeenAt: &recent}}).Error)
	_, err := e.p.Touch(ctx, 3)
	must(t, err)

	res, err := e.p.RunRule(ctx, "idle")
	must(t, err)
	if res.Deleted != 2 || res.Batches != 1 || res.Kept != 1 {
		t.Fatalf("run: %+v, want 2 deleted in 1 batch, 1 kept", res)
	}
	lock, err := redislock.New(e.rdb).Obtain(ctx, e.p.Config().Buffer.Prefix+":rule:idle:lock", time.Minute, nil)
	must(t, err)
	if _, err := e.p.RunRule(ctx, "idle"); err != lastseen.ErrLocked {
		t.Fatalf("run under another's lock: %v, want ErrLocked", err)
	}
	must(t, lock.Release(ctx))
	must(t, e.db.Migrator().DropTable(&lastseen.User{}))
	_, ruleErr := e.p.RunRule(ctx, "idle")
	if ruleErr == nil {
		t.Fatal("run without the users table: no error")
	}

	var rule []string
	for _, l := range strings.Split(e.metrics(t), "\n") {
		if strings.HasPrefix(l, "lastseen.rule.") {
			rule = append(rule, l)
		}
	}
	equalText(t, "rule metrics", strings.Join(rule, "\n"), `
lastseen.rule.acted {row} {lastseen.rule=idle} 2
lastseen.rule.batches {batch} {lastseen.rule=idle} 1
lastseen.rule.duration s {lastseen.result=error,lastseen.rule=idle} count=1 sum=0.25 le0.5:1
lastseen.rule.duration s {lastseen.result=ok,lastseen.rule=idle} count=1 sum=0.25 le0.5:1
lastseen.rule.kept {row} {lastseen.rule=idle} 1
lastseen.rule.last_success s {lastseen.rule=idle} 1.7723574e+09
lastseen.rule.refused {row} {lastseen.rule=idle} 0
lastseen.rule.runs {run} {lastseen.result=error,lastseen.rule=idle} 1
lastseen.rule.runs {run} {lastseen.result=locked,lastseen.rule=idle} 1
lastseen.rule.runs {run} {lastseen.result=ok,lastseen.rule=idle} 1`)

	ruleAttrs := "db.collection.name=users db.operation.name=rule db.system.name=sqlite"
	equalText(t, "spans", e.spanLines(), `
"rule users batch" kind=internal parent="rule users" [`+ruleAttrs+` lastseen.acted=2 lastseen.batch=1 lastseen.rule=idle] status=Unset
"rule users batch" kind=internal parent="rule users" [`+ruleAttrs+` lastseen.acted=0 lastseen.batch=2 lastseen.rule=idle] status=Unset
"rule users" kind=internal parent="" [`+ruleAttrs+` lastseen.acted=2 lastseen.batches=1 lastseen.kept=1 lastseen.result=ok lastseen.retries=0 lastseen.rule=idle] status=Unset
"rule users" kind=internal parent="" [`+ruleAttrs+` lastseen.acted=0 lastseen.batches=0 lastseen.kept=0 lastseen.result=locked lastseen.retries=0 lastseen.rule=idle] status=Unset
"rule users" kind=internal parent="" [`+ruleAttrs+` lastseen.acted=0 lastseen.batches=0 lastseen.kept=0 lastseen.result=error lastseen.retries=0 lastseen.rule=idle] status=Error `+fmt.Sprintf("%q", ruleErr.Error())+` event=exception`)
}
