package tests

import (
	"context"
	"runtime/metrics"
	"strconv"
	"testing"
	"time"

	"github.com/lastseen/lastseen/tests/testenv"
	"github.com/redis/go-redis/v9"
)

// BenchmarkUncachedTouch compares an uncached, throttled Touch on the real
// Redis at LASTSEEN_REDIS_ADDR with the seed design's throttled call on the
// same server and the same kind of client: SET <marker> 1 NX PX <throttle>,
// one plain command (its HSET runs only for a new marker). Both report the
// goroutines the runtime started per call (runtime/metrics
// /sched/goroutines-created, Go 1.26 or later; absent before).
func BenchmarkUncachedTouch(b *testing.B) {
	ids := benchIDs(256)
	b.Run("lastseen", func(b *testing.B) {
		p := benchPlugin(b, testenv.RedisServer(), -1)
		warm(b, p, ids)
		ctx := context.Background()
		b.ReportAllocs()
		start := goroutinesCreated()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if rec, err := p.Touch(ctx, ids[i&255]); rec || err != nil {
				b.Fatalf("touch: recorded=%v err=%v, want throttled", rec, err)
			}
		}
		b.StopTimer()
		b.ReportMetric(float64(goroutinesCreated()-start)/float64(b.N), "goroutines/op")
	})
	b.Run("seed", func(b *testing.B) {
		c := redis.NewClient(&redis.Options{Addr: testenv.Need(b, testenv.EnvRedis), ContextTimeoutEnabled: true})
		b.Cleanup(func() { c.Close() })
		ctx := context.Background()
		prefix := "lastseen-bench-seed-" + strconv.FormatInt(time.Now().UnixNano(), 36)
		b.Cleanup(func() { _ = testenv.DeleteKeys(context.Background(), c, prefix+":*") })
		marker := make([]string, len(ids))
		for i, id := range ids {
			marker[i] = prefix + ":seen:" + strconv.FormatUint(id.(uint64), 10)
			if err := c.SetNX(ctx, marker[i], 1, time.Hour).Err(); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportAllocs()
		start := goroutinesCreated()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			ok, err := c.SetNX(ctx, marker[i&255], 1, time.Hour).Result()
			if ok || err != nil {
				b.Fatalf("seed: set=%v err=%v, want throttled", ok, err)
			}
		}
		b.StopTimer()
		b.ReportMetric(float64(goroutinesCreated()-start)/float64(b.N), "goroutines/op")
	})
	b.Run("hsetnx", benchWindowHSetNX)
}

// benchWindowHSetNX is a throttled touch's command alone: HSETNX into a
// window hash that holds the field, from a plain client (no breaker, no
// timeout): the floor under lastseen's call.
func benchWindowHSetNX(b *testing.B) {
	c := redis.NewClient(&redis.Options{Addr: testenv.Need(b, testenv.EnvRedis)})
	b.Cleanup(func() { c.Close() })
	ctx := context.Background()
	prefix := "lastseen-bench-hsetnx-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	b.Cleanup(func() { _ = testenv.DeleteKeys(context.Background(), c, prefix+":*") })
	key := prefix + ":{0}:window:1:1772357700000"
	if err := c.HSetNX(ctx, key, "42", 1772357400000000).Err(); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		ok, err := c.HSetNX(ctx, key, "42", 1772357400000000).Result()
		if err != nil || ok {
			b.Fatalf("hsetnx: %v %v, want throttled", ok, err)
		}
	}
}

// goroutinesCreated reads /sched/goroutines-created (0 when the runtime
// does not have it).
func goroutinesCreated() uint64 {
	s := []metrics.Sample{{Name: "/sched/goroutines-created:goroutines"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}
