package tests

import (
	"context"
	"testing"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/internal/idcodec"
	"github.com/lastseen/lastseen/internal/keys"
	"github.com/lastseen/lastseen/internal/testhooks"
	"github.com/lastseen/lastseen/internal/timecol"
	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"
	"gorm.io/gorm/schema"
)

// The library's internals these tests reach go through internal/testhooks
// (registered by the lastseen package), or, for the id codec, the time
// column codec and the dialects, their internal packages: the short names
// below keep the tests readable.

type flushHooks = testhooks.FlushHooks

func internals() *testhooks.Internals { return testhooks.Get() }

// buf returns p's buffer as the tests see it.
func buf(p *lastseen.Plugin) testhooks.Buffer { return internals().Buffer(p) }

// setHooks installs (nil: removes) flush hooks on p.
func setHooks(p *lastseen.Plugin, h *flushHooks) { internals().SetFlushHooks(p, h) }

func flushJob(p *lastseen.Plugin, ctx context.Context) { internals().FlushJob(p, ctx) }
func purgeJob(p *lastseen.Plugin, ctx context.Context) { internals().PurgeJob(p, ctx) }

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

// loadTouchScript loads the touch script into h's Redis, so that the next
// touch runs EVALSHA alone.
func loadTouchScript(t testing.TB, h *harness) {
	t.Helper()
	must(t, internals().LoadTouch(context.Background(), h.r.Client))
}

// pluginDB returns p's own database handle.
func pluginDB(t testing.TB, p *lastseen.Plugin) *gorm.DB {
	t.Helper()
	db, err := internals().Handle(p)
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
	enc, _ := internals().UsersColumn(p)
	return timecol.Encoding(enc)
}

// usersNaive reports a tracked column without time zone.
func usersNaive(p *lastseen.Plugin) bool {
	_, naive := internals().UsersColumn(p)
	return naive
}

// fieldEncoding is the Encoding the plugin reads field f with, given the
// configured one, and how it decided.
var fieldEncoding = timecol.FieldEncoding

// generation returns the throttle-marker generation of p at its clock's
// now: Unix ms / Throttle in ms (markers.go).
func generation(p *lastseen.Plugin) int64 {
	cfg := p.Config()
	return cfg.Test.Now().UnixMilli() / max(cfg.Throttle.Milliseconds(), 1)
}

// markersKey returns the key of the marker hash of generation g that holds
// uid's throttle marker in p: the hash is named by the generation's start,
// g × Throttle in Unix ms.
func markersKey(p *lastseen.Plugin, uid string, g int64) string {
	n, b := keys.Locate(uid, p.Config().Buffer.Shards)
	return shardKeys(p, n).Markers(b, g*max(p.Config().Throttle.Milliseconds(), 1))
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

// pendingValue reads uid's pending entry from Redis as stored.
func (h *harness) pendingValue(t testing.TB, p *lastseen.Plugin, uid string) string {
	t.Helper()
	v, err := h.r.Client.HGet(context.Background(), pendingKey(p, uid), uid).Result()
	must(t, err)
	return v
}

// pendingLen counts the entries of shard n's pending hashes in Redis.
func (h *harness) pendingLen(t testing.TB, p *lastseen.Plugin, n int) int64 {
	t.Helper()
	ctx := context.Background()
	var cmds []*redis.IntCmd
	_, err := h.r.Client.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for _, key := range shardKeys(p, n).AllPending() {
			cmds = append(cmds, pipe.HLen(ctx, key))
		}
		return nil
	})
	must(t, err)
	var sum int64
	for _, c := range cmds {
		sum += c.Val()
	}
	return sum
}
