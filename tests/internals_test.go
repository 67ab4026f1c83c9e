package tests

import (
	"context"
	"testing"
	"time"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/internal/keys"
	"github.com/lastseen/lastseen/internal/testhooks"
	"gorm.io/gorm"
	"gorm.io/gorm/schema"
)

// The library's internals these tests reach go through internal/testhooks
// (registered by the lastseen package): the short names below keep the
// tests readable.

type flushHooks = testhooks.FlushHooks

func internals() *testhooks.Internals { return testhooks.Get() }

// buf returns p's buffer as the tests see it.
func buf(p *lastseen.Plugin) testhooks.Buffer { return internals().Buffer(p) }

// setHooks installs (nil: removes) flush hooks on p.
func setHooks(p *lastseen.Plugin, h *flushHooks) { internals().SetFlushHooks(p, h) }

func flushJob(p *lastseen.Plugin, ctx context.Context) { internals().FlushJob(p, ctx) }
func purgeJob(p *lastseen.Plugin, ctx context.Context) { internals().PurgeJob(p, ctx) }

// shardKeys returns the Redis keys of p's shard n.
func shardKeys(p *lastseen.Plugin, n int) keys.Shard { return keys.ForShard(p.Config().Prefix, n) }

// shardOf returns the Redis keys of uid's shard in p.
func shardOf(p *lastseen.Plugin, uid string) keys.Shard {
	return shardKeys(p, keys.ShardOf(uid, p.Config().Shards))
}

// allShardKeys returns the Redis keys of every shard of p, in shard order.
func allShardKeys(p *lastseen.Plugin) []keys.Shard {
	out := make([]keys.Shard, p.Config().Shards)
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
	n, p, err := internals().IDCodec(pk)
	return idCodec{normalize: n, parse: p}, err
}

// columnTime scans a time column as the library reads it on every dialect
// (SQLite may return text).
type columnTime struct {
	Time  time.Time
	Valid bool
}

// Scan implements sql.Scanner.
func (c *columnTime) Scan(v any) (err error) {
	c.Time, c.Valid, err = internals().ScanTime(v)
	return err
}

// usersEncoding is the Encoding the plugin chose for its tracked column.
func usersEncoding(p *lastseen.Plugin) lastseen.Encoding {
	enc, _ := internals().UsersColumn(p)
	return lastseen.Encoding(enc)
}

// usersNaive reports a tracked column without time zone.
func usersNaive(p *lastseen.Plugin) bool {
	_, naive := internals().UsersColumn(p)
	return naive
}

// fieldEncoding is the Encoding the plugin reads field f with, given the
// configured one, and how it decided.
func fieldEncoding(f *schema.Field, configured lastseen.Encoding) (lastseen.Encoding, string, error) {
	enc, how, err := internals().FieldEncoding(f, int(configured))
	return lastseen.Encoding(enc), how, err
}
