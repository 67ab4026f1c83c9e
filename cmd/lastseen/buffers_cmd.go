package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/lastseen/lastseen/cmd/lastseen/internal/runenv"
	"github.com/lastseen/lastseen/internal/keys"
	"github.com/redis/go-redis/v9"
)

// redisFlags are the connection flags of the commands that need only Redis.
type redisFlags struct {
	Redis        string   `help:"Redis address host:port, or a redis:// or rediss:// URL (password, database number)." xor:"redis" placeholder:"ADDR" group:"Connection"`
	RedisCluster []string `help:"Redis Cluster seed addresses, comma separated." xor:"redis" placeholder:"ADDRS" sep:"," group:"Connection"`
}

// withBuffers connects to the Redis the flags name and calls fn with it
// and every buffer it holds (listBuffers).
func (f *redisFlags) withBuffers(fn func(ctx context.Context, rdb redis.UniversalClient, all []bufferInfo) error) error {
	ctx := context.Background()
	c := connFlags{Redis: f.Redis, RedisCluster: f.RedisCluster}
	rdb, err := c.openRedis(ctx)
	if err != nil {
		return err
	}
	defer rdb.Close()
	all, err := listBuffers(ctx, rdb)
	if err != nil {
		return err
	}
	return fn(ctx, rdb, all)
}

// buffersCmd lists the buffers in a Redis, from their manifests. It
// writes nothing.
type buffersCmd struct {
	redisFlags `embed:""`

	out    io.Writer
	errOut io.Writer
}

func (c *buffersCmd) Run() error { return c.withBuffers(c.list) }

func (c *buffersCmd) list(ctx context.Context, rdb redis.UniversalClient, all []bufferInfo) error {
	if len(all) == 0 {
		fmt.Fprintln(c.out, "no lastseen buffer in this Redis")
		return nil
	}
	tw := tabwriter.NewWriter(c.out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "prefix\ttracks\tmodel\tkey\tshards\tpending\tin-flight\tsessions\tdatabase")
	for _, b := range all {
		pending, inflight, err := bufferedCounts(ctx, rdb, b)
		if err != nil {
			return err
		}
		sessions := "-"
		if b.hasSessions() {
			sessions = b.get("sessions_table")
			if idle := b.get("idle_timeout"); idle != "" && idle != "0s" {
				sessions += ", idle " + idle
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s %s\n", b.Prefix, b.target(), or(b.get("model"), "-"),
			b.get("key"), b.get("shards"), pending, inflight, sessions, b.get("dialect"), b.get("database"))
	}
	return tw.Flush()
}

// or returns s, or def when s is empty.
func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// dropCmd deletes an abandoned buffer: every key of its prefix.
type dropCmd struct {
	redisFlags `embed:""`
	Prefix     string `required:"" help:"The prefix of the buffer to delete (lastseen buffers lists them)."`
	Force      bool   `help:"Delete it even though it holds pending or in-flight timestamps, which are then lost."`

	out    io.Writer
	errOut io.Writer
}

func (c *dropCmd) Run() error { return c.withBuffers(c.drop) }

func (c *dropCmd) drop(ctx context.Context, rdb redis.UniversalClient, all []bufferInfo) error {
	var b bufferInfo
	for _, o := range all {
		if o.Prefix == c.Prefix {
			b = o
		}
	}
	if b.Prefix == "" {
		return fmt.Errorf("lastseen: no buffer at prefix %q in this Redis (lastseen buffers lists them)", c.Prefix)
	}
	pending, inflight, err := bufferedCounts(ctx, rdb, b)
	if err != nil {
		return err
	}
	if pending+inflight > 0 && !c.Force {
		return fmt.Errorf("lastseen: buffer %q holds %d pending and %d in-flight timestamps: flush them first (lastseen flush --prefix %s), or give --force to discard them",
			b.Prefix, pending, inflight, b.Prefix)
	}
	n, err := deleteOwned(ctx, rdb, b.Prefix)
	if err != nil {
		return err
	}
	fmt.Fprintf(c.out, "dropped buffer %q (%s): %d keys deleted, %d pending and %d in-flight timestamps discarded\n",
		b.Prefix, b.target(), n, pending, inflight)
	if pending+inflight > 0 {
		fmt.Fprintf(c.errOut, "lastseen: warning: %d timestamps discarded with buffer %q\n", pending+inflight, b.Prefix)
	}
	return nil
}

// deleteOwned deletes the keys of the buffer under prefix (keys.Owned),
// and no other buffer's, and returns how many it deleted.
func deleteOwned(ctx context.Context, rdb redis.UniversalClient, prefix string) (int, error) {
	var found []string
	for i, pattern := range keys.Owned(prefix) {
		last := i == len(keys.Owned(prefix))-1 // the rules' locks
		err := runenv.ScanKeys(ctx, rdb, pattern, func(key string) {
			_, shard := keys.ShardOfKey(prefix, key)
			_, rule := keys.RuleOfKey(prefix, key)
			if i == 0 && shard || last && rule || i > 0 && !last { // the first pattern is the shards'
				found = append(found, key)
			}
		})
		if err != nil {
			return 0, fmt.Errorf("lastseen: list the keys of buffer %q: %w", prefix, err)
		}
	}
	n := 0
	for _, key := range found { // one key per command: a cluster's keys live in many slots
		d, err := rdb.Del(ctx, key).Result()
		if err != nil {
			return n, fmt.Errorf("lastseen: delete %s: %w", key, err)
		}
		n += int(d)
	}
	return n, nil
}
