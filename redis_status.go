package lastseen

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// The Redis buffer's side of Status and SampleBuffer: HLEN, HSCAN and
// HRANDFIELD on the shards' pending and in-flight hashes.

// sizes is one pipelined round trip of HLEN for the 2 × Shards hashes.
func (b *redisBuffer) sizes(ctx context.Context) ([]shardSizes, error) {
	pending := make([]*redis.IntCmd, len(b.shards))
	inflight := make([]*redis.IntCmd, len(b.shards))
	err := b.redis(ctx, func(ctx context.Context, rdb *redisClient) error {
		_, err := rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
			for i, k := range b.shards {
				pending[i] = pipe.HLen(ctx, k.pending)
				inflight[i] = pipe.HLen(ctx, k.inflight)
			}
			return nil
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("hlen: %w", err)
	}
	out := make([]shardSizes, len(b.shards))
	for i := range out {
		out[i] = shardSizes{pending: pending[i].Val(), inflight: inflight[i].Val()}
	}
	return out, nil
}

// walk reads one hash with HSCAN in pages of page entries (never HGETALL).
func (b *redisBuffer) walk(ctx context.Context, n int, inflight bool, page int, fn func(kv []string)) error {
	key := b.shards[n].pending
	if inflight {
		key = b.shards[n].inflight
	}
	var cursor uint64
	for {
		var kv []string
		var next uint64
		err := b.redis(ctx, func(ctx context.Context, rdb *redisClient) (err error) {
			kv, next, err = rdb.HScan(ctx, key, cursor, "", int64(page)).Result()
			return err
		})
		if err != nil {
			return fmt.Errorf("hscan %s: %w", key, err)
		}
		fn(kv)
		if cursor = next; cursor == 0 {
			return nil
		}
	}
}

// sample is one pipelined round trip: HLEN and, with perHash > 0,
// HRANDFIELD key perHash WITHVALUES (Redis 6.2 or later) on each hash.
func (b *redisBuffer) sample(ctx context.Context, perHash int) ([]shardSizes, []string, error) {
	lens := make([]*redis.IntCmd, 0, 2*len(b.shards))
	samples := make([]*redis.Cmd, 0, 2*len(b.shards))
	err := b.redis(ctx, func(ctx context.Context, rdb *redisClient) error {
		lens, samples = lens[:0], samples[:0] // run again after close swapped clients
		_, err := rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
			for _, k := range b.shards {
				for _, key := range []string{k.pending, k.inflight} {
					lens = append(lens, pipe.HLen(ctx, key))
					if perHash > 0 {
						samples = append(samples, pipe.Do(ctx, "HRANDFIELD", key, perHash, "WITHVALUES"))
					}
				}
			}
			return nil
		})
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	sizes := make([]shardSizes, len(b.shards))
	for i := range sizes {
		sizes[i] = shardSizes{pending: lens[2*i].Val(), inflight: lens[2*i+1].Val()}
	}
	var values []string
	for _, c := range samples {
		values = append(values, sampledValues(c.Val())...)
	}
	return sizes, values, nil
}

// sampledValues returns the values of an HRANDFIELD ... WITHVALUES reply in
// each shape it comes in: a flat field, value, ... array (RESP2), an array
// of [field, value] pairs (RESP3), or a map (miniredis under RESP3).
func sampledValues(reply any) []string {
	var out []string
	switch r := reply.(type) {
	case []any:
		for i, e := range r {
			switch e := e.(type) {
			case []any:
				if len(e) == 2 {
					if v, ok := e[1].(string); ok {
						out = append(out, v)
					}
				}
			case string:
				if i%2 == 1 {
					out = append(out, e)
				}
			}
		}
	case map[any]any:
		for _, v := range r {
			if v, ok := v.(string); ok {
				out = append(out, v)
			}
		}
	}
	return out
}
