package testenv

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// RedisKind makes Redis clients of one kind: miniredis, a Redis server or
// a Redis Cluster.
type RedisKind struct {
	// Name is "miniredis", "redis" or "cluster".
	Name string
	// Open returns a client, closed at cleanup; on a server whose variable
	// is unset it skips the test (see Need).
	Open func(t testing.TB) *Redis
}

// Redis is one test's Redis. Its client sets ContextTimeoutEnabled, so the
// plugin sends on it as it is and hooks a test adds to it (command
// counters, recorders) see the plugin's commands; with the go-redis
// default (false) the plugin opens a client of its own.
type Redis struct {
	// Client is nil for a test's stand-in for no Redis at all (the
	// plugin's in-process buffer), which the tests module adds.
	Client redis.UniversalClient
	// Mini is the in-process server of the miniredis kind, nil on a real
	// server.
	Mini *miniredis.Miniredis
	// Addr is what the CLI's --redis flag takes: host:port; for a cluster,
	// its comma-separated seeds.
	Addr string
}

// RedisKinds returns every Redis kind: miniredis, a Redis server and a
// Redis Cluster.
func RedisKinds() []RedisKind { return []RedisKind{Miniredis(), RedisServer(), RedisCluster()} }

// Miniredis starts an in-process miniredis for the test (always runs).
func Miniredis() RedisKind {
	return RedisKind{Name: "miniredis", Open: func(t testing.TB) *Redis {
		mr := miniredis.RunT(t)
		c := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
		t.Cleanup(func() { c.Close() })
		return &Redis{Client: c, Mini: mr, Addr: mr.Addr()}
	}}
}

// RedisServer connects to the Redis of LASTSEEN_REDIS_ADDR.
func RedisServer() RedisKind {
	return RedisKind{Name: "redis", Open: func(t testing.TB) *Redis {
		addr := Need(t, EnvRedis)
		c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
		t.Cleanup(func() { c.Close() })
		return &Redis{Client: c, Addr: addr}
	}}
}

// RedisCluster connects to the Redis Cluster of LASTSEEN_REDIS_CLUSTER.
func RedisCluster() RedisKind {
	return RedisKind{Name: "cluster", Open: func(t testing.TB) *Redis {
		seeds := Need(t, EnvRedisCluster)
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(seeds, ","), ContextTimeoutEnabled: true})
		t.Cleanup(func() { c.Close() })
		return &Redis{Client: c, Addr: seeds}
	}}
}

// KeyPrefix returns a random key prefix of the test's own and deletes
// every key under it (prefix + ":*") from c at cleanup.
func KeyPrefix(t testing.TB, c redis.UniversalClient) string {
	prefix := RandomName("ls")
	t.Cleanup(func() { _ = DeleteKeys(context.Background(), c, prefix+":*") })
	return prefix
}

// eachMaster runs fn on c, or on every master of a Redis Cluster, one at a
// time.
func eachMaster(ctx context.Context, c redis.UniversalClient, fn func(context.Context, redis.Cmdable) error) error {
	cc, ok := c.(*redis.ClusterClient)
	if !ok {
		return fn(ctx, c)
	}
	var mu sync.Mutex
	return cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		return fn(ctx, m)
	})
}

// Keys returns the keys matching the Redis glob pattern, sorted, from
// every master of a cluster.
func Keys(ctx context.Context, c redis.UniversalClient, pattern string) ([]string, error) {
	var out []string
	err := eachMaster(ctx, c, func(ctx context.Context, m redis.Cmdable) error {
		iter := m.Scan(ctx, 0, pattern, 1000).Iterator()
		for iter.Next(ctx) {
			out = append(out, iter.Val())
		}
		return iter.Err()
	})
	slices.Sort(out)
	return out, err
}

// DeleteKeys removes every key matching the Redis glob pattern, on every
// master of a cluster.
func DeleteKeys(ctx context.Context, c redis.UniversalClient, pattern string) error {
	return eachMaster(ctx, c, func(ctx context.Context, m redis.Cmdable) error {
		iter := m.Scan(ctx, 0, pattern, 1000).Iterator()
		for iter.Next(ctx) {
			if err := m.Del(ctx, iter.Val()).Err(); err != nil {
				return err
			}
		}
		return iter.Err()
	})
}
