package redisbuf

import (
	"context"
	"fmt"

	"github.com/lastseen/lastseen/internal/buffer"
	"github.com/redis/go-redis/v9"
)

// The buffer's side of the plugin's status and sample reads: HLEN, HSCAN
// and HRANDFIELD on the shards' pending and in-flight hashes
// (lua/sample.lua).

// Sizes is Sample without values.
func (b *Buffer) Sizes(ctx context.Context) ([]buffer.Sizes, error) {
	sizes, _, err := b.Sample(ctx, 0)
	if err != nil {
		return nil, fmt.Errorf("hlen: %w", err)
	}
	return sizes, nil
}

// Walk reads one set of shard n with HSCAN in pages of page entries (never
// HGETALL): the first page of every bucket in one pipeline (a
// listpack-encoded hash comes whole), then the rest of any bucket whose
// HSCAN returned a cursor, page by page.
func (b *Buffer) Walk(ctx context.Context, n int, inflight bool, page int, fn func(kv []string)) error {
	page = max(page, 1)
	names := b.shards[n].pending
	if inflight {
		names = b.shards[n].inflight
	}
	first := make([]*redis.ScanCmd, len(names))
	err := b.redis(ctx, func(ctx context.Context, rdb *client) error {
		_, err := rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
			for i, key := range names {
				first[i] = pipe.HScan(ctx, key, 0, "", int64(page))
			}
			return nil
		})
		return err
	})
	if err != nil {
		return fmt.Errorf("hscan: %w", err)
	}
	for i, key := range names {
		kv, cursor := first[i].Val()
		for {
			if len(kv) > 0 {
				fn(kv)
			}
			if cursor == 0 {
				break
			}
			err := b.redis(ctx, func(ctx context.Context, rdb *client) (err error) {
				kv, cursor, err = rdb.HScan(ctx, key, cursor, "", int64(page)).Result()
				return err
			})
			if err != nil {
				return fmt.Errorf("hscan %s: %w", key, err)
			}
		}
	}
	return nil
}

// Sample is one pipelined round trip of the sample script, one call per
// shard: the sizes of each shard's pending and in-flight sets
// and, with perHash > 0, about perHash random values of each set.
func (b *Buffer) Sample(ctx context.Context, perHash int) ([]buffer.Sizes, []string, error) {
	calls := make([]scriptCall, len(b.shards))
	for i, k := range b.shards {
		calls[i] = scriptCall{keys: k.buffered, args: []any{perHash}}
	}
	var cmds []*redis.Cmd
	err := b.redis(ctx, func(ctx context.Context, rdb *client) (err error) {
		cmds, err = evalPipelined(ctx, rdb, sampleScript, calls)
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	sizes := make([]buffer.Sizes, len(b.shards))
	var values []string
	for i, c := range cmds {
		reply, _ := c.Slice()
		if len(reply) < 2 {
			return nil, nil, fmt.Errorf("sample shard %d: unexpected reply %v", i, reply)
		}
		p, _ := reply[0].(int64)
		f, _ := reply[1].(int64)
		sizes[i] = buffer.Sizes{Pending: p, InFlight: f}
		for _, v := range reply[2:] {
			if v, ok := v.(string); ok {
				values = append(values, v)
			}
		}
	}
	return sizes, values, nil
}
