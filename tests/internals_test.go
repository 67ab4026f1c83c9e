package tests

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/internal/buffer"
	"github.com/lastseen/lastseen/internal/buffer/memory"
	"github.com/lastseen/lastseen/internal/buffer/redisbuf"
	"github.com/lastseen/lastseen/internal/idcodec"
	"github.com/lastseen/lastseen/internal/keys"
	"github.com/lastseen/lastseen/internal/testseam"
	"github.com/lastseen/lastseen/internal/timecol"
	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"
	"gorm.io/gorm"
	"gorm.io/gorm/schema"
)

// The library's internals these tests reach go through the plugin's test
// seam (internal/testseam: its flush hooks, and what the plugin publishes
// into it at db.Use), or, for the buffers, the id codec, the time column
// codec and the dialects, their internal packages' exported names: the
// short names below keep the tests readable.

type flushHooks = testseam.FlushHooks

// seam returns p's own test seam (testenv.Use gives every plugin one).
func seam(p *lastseen.Plugin) *testseam.Seam {
	s := p.Config().Test.Seam
	if s == nil {
		panic("lastseen plugin built without a test seam: use testenv.Use, or testenv.Seam(&cfg) before lastseen.New")
	}
	return s
}

// internals is what p published into its seam at db.Use.
func internals(p *lastseen.Plugin) *testseam.Published { return &seam(p).Published }

// isLockLost reports an error of a flush or purge that lost its lock.
func isLockLost(err error) bool { return errors.Is(err, buffer.ErrLockLost) }

// isCallerEnded reports a Redis call ended by its caller's context.
func isCallerEnded(err error) bool { return errors.Is(err, redisbuf.ErrCallerEnded) }

// buf returns p's buffer as the tests see it.
func buf(p *lastseen.Plugin) testBuffer { return testBuffer{p: p, b: internals(p).Buffer} }

// testBuffer is what tests read and write in a plugin's buffer, in the
// terms of the Redis key layout (internal/keys) whatever the buffer kind:
// the plugin's *memory.Buffer or *redisbuf.Buffer.
type testBuffer struct {
	p *lastseen.Plugin
	b buffer.Buffer
}

// Memory reports the in-process buffer (no Redis).
func (t testBuffer) Memory() bool { _, ok := t.b.(*memory.Buffer); return ok }

// StateKeys lists, unsorted, the Redis keys (prefix cut off) that would
// hold the in-process buffer's state at now: ":{N}:pending",
// ":{N}:inflight", ":{N}:refusals" for non-empty sets, ":{N}:seen:<id>" for
// throttle windows still open; nil for the Redis buffer.
func (t testBuffer) StateKeys(now time.Time) []string {
	b, ok := t.b.(*memory.Buffer)
	if !ok {
		return nil
	}
	sizes, _ := b.Sizes(context.Background()) // one per shard; the in-process buffer never fails
	var out []string
	for n := range sizes {
		tag := ":{" + strconv.Itoa(n) + "}:"
		s := memory.ShardState(b, n)
		for name, size := range map[string]int{"pending": len(s.Pending), "inflight": len(s.InFlight), "refusals": len(s.Refusals)} {
			if size > 0 {
				out = append(out, tag+name)
			}
		}
		for uid, end := range s.Markers {
			if now.Before(end) {
				out = append(out, tag+"seen:"+uid)
			}
		}
	}
	return out
}

// LeaveInFlight swaps shard n's pending set to in-flight under the shard's
// lock, as a flush that failed after its swap leaves it.
func (t testBuffer) LeaveInFlight(ctx context.Context, n int) error {
	l, err := t.b.LockShard(ctx, n)
	if err != nil {
		return err
	}
	defer l.Release(ctx)
	_, err = l.Swap(ctx)
	if errors.Is(err, buffer.ErrLeftOver) {
		return nil // already in flight
	}
	return err
}

// InFlightLen is the number of entries in shard n's in-flight set.
func (t testBuffer) InFlightLen(ctx context.Context, n int) (int64, error) {
	sizes, err := t.b.Sizes(ctx)
	if err != nil {
		return 0, err
	}
	return sizes[n].InFlight, nil
}

// PutInFlight stores uid's timestamp at in its shard's in-flight set.
func (t testBuffer) PutInFlight(ctx context.Context, uid string, at time.Time) error {
	switch b := t.b.(type) {
	case *redisbuf.Buffer:
		c, _, _ := redisbuf.Client(b)
		return c.HSet(ctx, inflightKey(t.p, uid), uid, buffer.Micros(at)).Err()
	case *memory.Buffer:
		memory.PutInFlight(b, uid, buffer.Micros(at))
	}
	return nil
}

// PutBacklog keeps uid's timestamp in the Redis buffer's backlog, as a
// touch during an outage does; in memory (no backlog) it touches.
func (t testBuffer) PutBacklog(ctx context.Context, uid string, at time.Time) error {
	switch b := t.b.(type) {
	case *redisbuf.Buffer:
		b.ReturnBacklog(map[string]int64{uid: buffer.Micros(at)})
	case *memory.Buffer:
		cfg := t.p.Config()
		_, _, err := b.Touch(ctx, uid, at, cfg.Test.Now(), cfg.Test.Now()) // late: pending only, as the backlog
		return err
	}
	return nil
}

// Backlog returns uid's Unix microseconds in the backlog.
func (t testBuffer) Backlog(uid string) (int64, bool) {
	if b, ok := t.b.(*redisbuf.Buffer); ok {
		return redisbuf.InBacklog(b, uid)
	}
	return 0, false
}

// Breaker is the Redis buffer's circuit breaker state.
func (t testBuffer) Breaker() gobreaker.State {
	for _, s := range []gobreaker.State{gobreaker.StateHalfOpen, gobreaker.StateOpen} {
		if t.b.Breaker() == s.String() {
			return s
		}
	}
	return gobreaker.StateClosed
}

// BreakerCounts are the Redis buffer's breaker counts.
func (t testBuffer) BreakerCounts() gobreaker.Counts {
	if b, ok := t.b.(*redisbuf.Buffer); ok {
		return redisbuf.BreakerCounts(b)
	}
	return gobreaker.Counts{}
}

// SetTouchTimeout changes the Redis buffer's TouchTimeout.
func (t testBuffer) SetTouchTimeout(d time.Duration) {
	if b, ok := t.b.(*redisbuf.Buffer); ok {
		redisbuf.SetTouchTimeout(b, d)
	}
}

// Client is the Redis buffer's client: own when the plugin opened it,
// deadlines when it enforces context deadlines on its sockets.
func (t testBuffer) Client() (c redis.UniversalClient, own, deadlines bool) {
	if b, ok := t.b.(*redisbuf.Buffer); ok {
		return redisbuf.Client(b)
	}
	return nil, false, false
}

// Refusals is the number of flushes in a row that refused uid's entry.
func (t testBuffer) Refusals(ctx context.Context, uid string) (int, error) {
	switch b := t.b.(type) {
	case *redisbuf.Buffer:
		c, _, _ := redisbuf.Client(b)
		return c.HGet(ctx, shardOf(t.p, uid).Refusals, uid).Int()
	case *memory.Buffer:
		return memory.ShardState(b, memory.ShardOf(b, uid)).Refusals[uid], nil
	}
	return 0, nil
}

// LockShard takes shard n's flush lock (as a flusher would) and returns
// its release.
func (t testBuffer) LockShard(ctx context.Context, n int) (func(context.Context), error) {
	l, err := t.b.LockShard(ctx, n)
	if err != nil {
		return nil, err
	}
	return l.Release, nil
}

// LockPurge takes the purge lock and returns its release.
func (t testBuffer) LockPurge(ctx context.Context) (func(context.Context), error) {
	l, err := t.b.LockPurge(ctx)
	if err != nil {
		return nil, err
	}
	return l.Release, nil
}

// Markers is the number of throttle markers the in-process buffer keeps
// for shard n, expired ones not yet swept included.
func (t testBuffer) Markers(n int) int {
	if b, ok := t.b.(*memory.Buffer); ok {
		return len(memory.ShardState(b, n).Markers)
	}
	return 0
}

// pluginsOn counts the lastseen plugins registered on db (GORM registers a
// plugin once its Initialize succeeded).
func pluginsOn(db *gorm.DB) int {
	n := 0
	for _, v := range db.Config.Plugins {
		if _, ok := v.(*lastseen.Plugin); ok {
			n++
		}
	}
	return n
}

// setHooks installs (nil: removes) flush hooks on p.
func setHooks(p *lastseen.Plugin, h *flushHooks) {
	if h == nil {
		h = &flushHooks{}
	}
	seam(p).Flush = *h
}

func flushJob(p *lastseen.Plugin, ctx context.Context) { internals(p).FlushJob(ctx) }
func purgeJob(p *lastseen.Plugin, ctx context.Context) { internals(p).PurgeJob(ctx) }

// shardKeys returns the Redis keys of p's shard n.
func shardKeys(p *lastseen.Plugin, n int) keys.Shard {
	return keys.ForShard(p.Config().Buffer.Prefix, n, p.Config().Buffer.Shards)
}

// shardOf returns the Redis keys of uid's shard in p.
func shardOf(p *lastseen.Plugin, uid string) keys.Shard {
	return shardKeys(p, keys.ShardOf(uid, p.Config().Buffer.Shards))
}

// pendingKey returns the key of the pending hash that holds uid in p.
func pendingKey(p *lastseen.Plugin, uid string) string {
	n, b := keys.Locate(uid, p.Config().Buffer.Shards)
	return shardKeys(p, n).Pending(b)
}

// bucketOf returns uid's bucket in its shard in p (keys.Locate).
func bucketOf(p *lastseen.Plugin, uid string) int {
	_, b := keys.Locate(uid, p.Config().Buffer.Shards)
	return b
}

// inflightKey returns the key of the in-flight hash that holds uid in p.
func inflightKey(p *lastseen.Plugin, uid string) string {
	n, b := keys.Locate(uid, p.Config().Buffer.Shards)
	return shardKeys(p, n).InFlight(b)
}

// allShardKeys returns the Redis keys of every shard of p, in shard order.
func allShardKeys(p *lastseen.Plugin) []keys.Shard {
	out := make([]keys.Shard, p.Config().Buffer.Shards)
	for n := range out {
		out[n] = shardKeys(p, n)
	}
	return out
}

// loadMergeScript loads the merge script into h's Redis, so that the next
// late touch runs EVALSHA alone.
func loadMergeScript(t testing.TB, h *harness) {
	t.Helper()
	must(t, redisbuf.LoadMergeScript(context.Background(), h.r.Client))
}

// pluginDB returns p's own database handle.
func pluginDB(t testing.TB, p *lastseen.Plugin) *gorm.DB {
	t.Helper()
	db, err := internals(p).Handle()
	must(t, err)
	return db
}

// idCodec is the library's user-id codec of one primary key field.
type idCodec struct {
	normalize func(any) (string, error)
	parse     func(string) (any, error)
}

func newIDCodec(pk *schema.Field) (idCodec, error) {
	c, err := idcodec.New(pk)
	return idCodec{normalize: c.Normalize, parse: c.Parse}, err
}

// columnTime scans a time column as the library reads it on every dialect
// (SQLite may return text).
type columnTime = timecol.NullTime

// usersEncoding is the Encoding the plugin chose for its tracked column.
func usersEncoding(p *lastseen.Plugin) timecol.Encoding {
	return timecol.Encoding(internals(p).UsersEncoding)
}

// usersNaive reports a tracked column without time zone.
func usersNaive(p *lastseen.Plugin) bool { return internals(p).UsersNaive }

// fieldEncoding is the Encoding the plugin reads field f with, given the
// configured one, and how it decided.
var fieldEncoding = timecol.FieldEncoding

// windowKey returns the key of the hash of p's throttle window that ends at
// end, in uid's bucket.
func windowKey(p *lastseen.Plugin, uid string, end time.Time) string {
	n, b := keys.Locate(uid, p.Config().Buffer.Shards)
	return shardKeys(p, n).Window(b, end.UnixMilli())
}

// windowEnd is the end of p's throttle window open at its clock's now:
// the next multiple of Throttle since the Unix epoch.
func windowEnd(p *lastseen.Plugin) time.Time {
	cfg := p.Config()
	ms := max(cfg.Throttle.Milliseconds(), 1)
	return time.UnixMilli((cfg.Test.Now().UnixMilli()/ms + 1) * ms).UTC()
}

// putPending writes pending entries by hand, each field into the pending
// hash of its bucket (one HSET per bucket, in one pipeline): pairs of
// field and value.
func (h *harness) putPending(t testing.TB, p *lastseen.Plugin, pairs ...string) {
	t.Helper()
	if len(pairs)%2 != 0 {
		t.Fatalf("putPending: %d arguments, want field and value pairs", len(pairs))
	}
	byKey := map[string][]any{}
	var order []string
	for i := 0; i < len(pairs); i += 2 {
		k := pendingKey(p, pairs[i])
		if _, ok := byKey[k]; !ok {
			order = append(order, k)
		}
		byKey[k] = append(byKey[k], pairs[i], pairs[i+1])
	}
	ctx := context.Background()
	_, err := h.r.Client.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for _, k := range order {
			pipe.HSet(ctx, k, byKey[k]...)
		}
		return nil
	})
	must(t, err)
}

// pendingValue reads uid's entry waiting for a flush, as stored: the
// newest of its pending entry and its entries in the throttle windows that
// no flush moved yet (redis.Nil when there is none).
func (h *harness) pendingValue(t testing.TB, p *lastseen.Plugin, uid string) string {
	t.Helper()
	ctx := context.Background()
	vals := h.windowValues(t, p, uid)
	v, err := h.r.Client.HGet(ctx, pendingKey(p, uid), uid).Result()
	if err != redis.Nil {
		must(t, err)
		vals = append(vals, v)
	}
	if len(vals) == 0 {
		must(t, redis.Nil)
	}
	newest := vals[0]
	for _, v := range vals[1:] {
		a, errA := strconv.ParseInt(newest, 10, 64)
		b, errB := strconv.ParseInt(v, 10, 64)
		if errA != nil || (errB == nil && b > a) {
			newest = v
		}
	}
	return newest
}

// windowValues reads uid's entries in the throttle windows of its shard
// that no flush moved yet, oldest window first.
func (h *harness) windowValues(t testing.TB, p *lastseen.Plugin, uid string) []string {
	t.Helper()
	ctx := context.Background()
	n, b := keys.Locate(uid, p.Config().Buffer.Shards)
	k := shardKeys(p, n)
	ends, err := h.r.Client.HKeys(ctx, k.Windows()).Result()
	must(t, err)
	slices.Sort(ends)
	var out []string
	for _, e := range ends {
		end, err := strconv.ParseInt(e, 10, 64)
		must(t, err)
		v, err := h.r.Client.HGet(ctx, k.Window(b, end), uid).Result()
		if err == redis.Nil || v == "" {
			continue
		}
		must(t, err)
		out = append(out, v)
	}
	return out
}

// pendingLen counts the entries of shard n waiting for a flush in Redis:
// those of its pending hashes and those of its throttle windows that no
// flush moved yet.
func (h *harness) pendingLen(t testing.TB, p *lastseen.Plugin, n int) int64 {
	t.Helper()
	ctx := context.Background()
	k := shardKeys(p, n)
	var cmds []*redis.IntCmd
	_, err := h.r.Client.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for _, key := range k.AllPending() {
			cmds = append(cmds, pipe.HLen(ctx, key))
		}
		return nil
	})
	must(t, err)
	var sum int64
	for _, c := range cmds {
		sum += c.Val()
	}
	ends, err := h.r.Client.HKeys(ctx, k.Windows()).Result()
	must(t, err)
	for _, e := range ends {
		end, err := strconv.ParseInt(e, 10, 64)
		must(t, err)
		for b := range k.Buckets {
			m, err := h.r.Client.HGetAll(ctx, k.Window(b, end)).Result()
			must(t, err)
			for _, v := range m {
				if v != "" {
					sum++
				}
			}
		}
	}
	return sum
}
