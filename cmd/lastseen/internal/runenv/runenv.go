// Package runenv is what the demo, the benchmark and the CLI's tests set up
// around a run: random names for its own table, schema and Redis key
// prefix, the removal of its Redis keys, a settable clock, and a Redis
// client from the --redis flag's forms.
package runenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// RandomName returns prefix followed by 10 random hex digits (40 bits), for
// a table, schema, database or key prefix of a run's own.
func RandomName(prefix string) string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// RedisOptions reads the --redis flag: host:port, or a redis:// or
// rediss:// URL with password and database number (go-redis ParseURL).
func RedisOptions(addr string) (*redis.Options, error) {
	if !strings.Contains(addr, "://") {
		return &redis.Options{Addr: addr}, nil
	}
	opt, err := redis.ParseURL(addr)
	if err != nil {
		return nil, fmt.Errorf("lastseen: --redis: %w", err)
	}
	return opt, nil
}

// eachNode runs fn on rdb, or on every master of a Redis Cluster (one at a
// time: the callers' counters need no lock).
func eachNode(ctx context.Context, rdb redis.UniversalClient, fn func(context.Context, redis.Cmdable) error) error {
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		var mu sync.Mutex
		return cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			mu.Lock()
			defer mu.Unlock()
			return fn(ctx, m)
		})
	}
	return fn(ctx, rdb)
}

// DeleteKeys removes every key matching the Redis glob pattern (SCAN,
// then UNLINK in batches of up to 500), on every master of a cluster.
func DeleteKeys(ctx context.Context, rdb redis.UniversalClient, pattern string) error {
	return eachNode(ctx, rdb, func(ctx context.Context, c redis.Cmdable) error {
		iter := c.Scan(ctx, 0, pattern, 1000).Iterator()
		var batch []string
		for iter.Next(ctx) {
			if batch = append(batch, iter.Val()); len(batch) == 500 {
				if err := unlink(ctx, c, batch); err != nil {
					return err
				}
				batch = batch[:0]
			}
		}
		if err := iter.Err(); err != nil {
			return err
		}
		return unlink(ctx, c, batch)
	})
}

// unlink removes keys with one UNLINK each, pipelined: on a cluster master
// the keys of a batch may sit in different slots (CROSSSLOT).
func unlink(ctx context.Context, c redis.Cmdable, keys []string) error {
	if len(keys) == 0 {
		return nil
	}
	_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, k := range keys {
			p.Unlink(ctx, k)
		}
		return nil
	})
	return err
}

// CountKeys counts the keys matching pattern, on every master of a cluster.
func CountKeys(ctx context.Context, rdb redis.UniversalClient, pattern string) (int, error) {
	n := 0
	err := eachNode(ctx, rdb, func(ctx context.Context, c redis.Cmdable) error {
		iter := c.Scan(ctx, 0, pattern, 1000).Iterator()
		for iter.Next(ctx) {
			n++
		}
		return iter.Err()
	})
	return n, err
}

// ScanKeys calls fn with every key matching pattern (SCAN), on every master
// of a cluster.
func ScanKeys(ctx context.Context, rdb redis.UniversalClient, pattern string, fn func(key string)) error {
	return eachNode(ctx, rdb, func(ctx context.Context, c redis.Cmdable) error {
		iter := c.Scan(ctx, 0, pattern, 1000).Iterator()
		for iter.Next(ctx) {
			fn(iter.Val())
		}
		return iter.Err()
	})
}

// AnyKey reports whether at least one key matches pattern; it stops
// scanning at the first.
func AnyKey(ctx context.Context, rdb redis.UniversalClient, pattern string) (bool, error) {
	found := false
	err := eachNode(ctx, rdb, func(ctx context.Context, c redis.Cmdable) error {
		if found {
			return nil
		}
		iter := c.Scan(ctx, 0, pattern, 1000).Iterator()
		found = iter.Next(ctx)
		return iter.Err()
	})
	return found, err
}

// Clock is a settable clock for Config.Now: the demo moves it along its
// simulated timeline, tests pin it. Safe for concurrent use.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// NewClock returns a clock reading t.
func NewClock(t time.Time) *Clock { return &Clock{t: t} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Set moves the clock to t.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

// UsageError is a mistake on the command line found before anything is
// opened (a flag value out of range, a missing or contradictory flag, a
// --sqlite file that does not exist). The CLI exits 2 for it, as for a flag
// its parser refuses; every other error exits 1.
type UsageError struct{ msg string }

func (e *UsageError) Error() string { return e.msg }

// Usagef returns a *UsageError with the formatted message, which starts
// with "lastseen:".
func Usagef(format string, args ...any) error {
	return &UsageError{msg: fmt.Sprintf(format, args...)}
}
