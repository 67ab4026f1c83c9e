package redisbuf

import (
	"context"
	"fmt"
	"slices"
	"strconv"

	"github.com/lastseen/lastseen/internal/buffer"
	"github.com/redis/go-redis/v9"
)

// The buffer's side of the plugin's status and sample reads: HLEN, HSCAN
// and HRANDFIELD on the shards' pending and in-flight hashes and their
// throttle windows (lua/sample.lua).

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
// HSCAN returned a cursor, page by page. The pending set also holds the
// entries of the shard's throttle windows that no flush moved yet (the
// windows' hashes are read the same way, their moved entries left out).
func (b *Buffer) Walk(ctx context.Context, n int, inflight bool, page int, fn func(kv []string)) error {
	page = max(page, 1)
	k := b.shards[n]
	names := k.pending
	if inflight {
		names = k.inflight
	} else {
		var ends []string
		err := b.redis(ctx, func(ctx context.Context, rdb *client) (err error) {
			ends, err = rdb.HKeys(ctx, k.Windows()).Result()
			return err
		})
		if err != nil {
			return fmt.Errorf("hkeys: %w", err)
		}
		names = slices.Clone(names)
		for _, e := range ends {
			if end, err := strconv.ParseInt(e, 10, 64); err == nil {
				for bucket := range k.pending {
					names = append(names, k.Window(bucket, end))
				}
			}
		}
		fn = withoutMoved(fn)
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

// withoutMoved calls fn with the entries of kv whose value is not "" (a
// window's moved entries), if any.
func withoutMoved(fn func(kv []string)) func(kv []string) {
	var buf []string
	return func(kv []string) {
		buf = buf[:0]
		for i := 0; i+1 < len(kv); i += 2 {
			if kv[i+1] != "" {
				buf = append(buf, kv[i], kv[i+1])
			}
		}
		if len(buf) > 0 {
			fn(buf)
		}
	}
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
		if len(reply) < 3 {
			return nil, nil, fmt.Errorf("sample shard %d: unexpected reply %v", i, reply)
		}
		p, _ := reply[0].(int64)
		f, _ := reply[1].(int64)
		w, _ := reply[2].(int64)
		sizes[i] = buffer.Sizes{Pending: p, InFlight: f, Partial: w == 1}
		for _, v := range reply[3:] {
			if v, ok := v.(string); ok {
				values = append(values, v)
			}
		}
	}
	return sizes, values, nil
}
