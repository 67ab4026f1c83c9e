package tests

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/tests/testenv"
)

// Micro-benchmarks of the request path. Run them with
//
//	go test -bench . -benchmem -run '^$'
//
// The real-Redis ones need LASTSEEN_REDIS_ADDR (they skip without it, or fail
// under LASTSEEN_REQUIRE_SERVICES). Each benchmark checks after its loop that
// it measured the path its name says (cache hits, recorded or throttled
// touches), so a figure can not silently come from another path.

// benchIDs returns n user ids 1..n boxed as any, as a middleware's userID
// function hands them to Touch: boxing a uint64 above 255 allocates, and
// that allocation belongs to the app, not to Touch.
func benchIDs(n int) []any {
	ids := make([]any, n)
	for i := range ids {
		ids[i] = uint64(i + 1)
	}
	return ids
}

// benchPlugin registers a plugin on a fresh SQLite database with the given
// Redis kind, on the real clock (the harness's fake clock takes a mutex per
// call, which a real app does not pay).
func benchPlugin(b *testing.B, r testenv.RedisKind, localCache int) *lastseen.Plugin {
	b.Helper()
	h := newHarness(b, testenv.SQLite(), r)
	cfg := h.config()
	cfg.Test.Now = nil // time.Now
	cfg.Buffer.LocalCacheSize = localCache
	p, db := h.plugin(cfg)
	if err := db.AutoMigrate(&lastseen.User{}); err != nil {
		b.Fatal(err)
	}
	return p
}

// warm touches every id once so that each has a throttle window open (in
// Redis and, with the cache on, in the local cache).
func warm(b *testing.B, p *lastseen.Plugin, ids []any) {
	b.Helper()
	for _, id := range ids {
		if _, err := p.Touch(context.Background(), id); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkTouchCached is the common case: the user is inside the throttle
// window and the in-process cache answers without I/O. Target:
// under 100 ns/op and 0 allocs/op.
func BenchmarkTouchCached(b *testing.B) {
	p := benchPlugin(b, testenv.Miniredis(), 0)
	ids := benchIDs(1024)
	warm(b, p, ids)
	ctx := context.Background()
	before := p.Stats().CacheHits
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if rec, err := p.Touch(ctx, ids[i&1023]); rec || err != nil {
			b.Fatalf("touch: recorded=%v err=%v, want a cache hit", rec, err)
		}
	}
	b.StopTimer()
	if got := p.Stats().CacheHits - before; got != int64(b.N) {
		b.Fatalf("cache hits = %d, want %d: the loop did not measure the cached path", got, b.N)
	}
}

// BenchmarkTimeNow is the floor under BenchmarkTouchCached: the cached path
// reads the plugin's clock (time.Now by default) once. On a VM whose clock
// source is kvm-clock it costs ~60 ns, far more than on bare metal.
func BenchmarkTimeNow(b *testing.B) {
	var sink int64
	for i := 0; i < b.N; i++ {
		sink += time.Now().UnixNano()
	}
	if sink == 0 {
		b.Fatal("clock returned zero")
	}
}

// BenchmarkTouchCachedParallel is BenchmarkTouchCached from GOMAXPROCS
// goroutines at once, as concurrent requests would call it.
func BenchmarkTouchCachedParallel(b *testing.B) {
	p := benchPlugin(b, testenv.Miniredis(), 0)
	ids := benchIDs(1024)
	warm(b, p, ids)
	before := p.Stats().CacheHits
	var bad sync.Once
	var badErr error
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		i := 0
		for pb.Next() {
			if rec, err := p.Touch(ctx, ids[i&1023]); rec || err != nil {
				bad.Do(func() { badErr = fmt.Errorf("recorded=%v err=%v, want a cache hit", rec, err) })
			}
			i++
		}
	})
	b.StopTimer()
	if badErr != nil {
		b.Fatal(badErr)
	}
	if got := p.Stats().CacheHits - before; got != int64(b.N) {
		b.Fatalf("cache hits = %d, want %d", got, b.N)
	}
}

// benchRedisTouch runs the two Redis paths of Touch against one Redis kind:
// "recorded" opens a new throttle window per op (a new user each time:
// script sets the marker and the pending entry), "throttled" asks Redis
// about a user already inside the window with the local cache off (script
// finds the marker and returns its PTTL). Both are one round trip.
func benchRedisTouch(b *testing.B, r testenv.RedisKind) {
	b.Run("recorded", func(b *testing.B) {
		p := benchPlugin(b, r, -1)
		ids := benchIDs(b.N)
		ctx := context.Background()
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if rec, err := p.Touch(ctx, ids[i]); !rec || err != nil {
				b.Fatalf("touch %v: recorded=%v err=%v, want recorded", ids[i], rec, err)
			}
		}
	})
	b.Run("throttled-nocache", func(b *testing.B) {
		p := benchPlugin(b, r, -1)
		ids := benchIDs(256)
		warm(b, p, ids)
		ctx := context.Background()
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if rec, err := p.Touch(ctx, ids[i&255]); rec || err != nil {
				b.Fatalf("touch: recorded=%v err=%v, want throttled", rec, err)
			}
		}
		b.StopTimer()
		if s := p.Stats(); s.CacheHits != 0 || s.Throttled != int64(b.N) {
			b.Fatalf("cache hits %d, throttled %d; want 0 and %d", s.CacheHits, s.Throttled, b.N)
		}
	})
}

// BenchmarkTouchMiniredis measures Touch's Redis path against the in-process
// miniredis: the library's own cost plus a loopback round trip to a Go server.
func BenchmarkTouchMiniredis(b *testing.B) { benchRedisTouch(b, testenv.Miniredis()) }

// BenchmarkTouchRedis measures Touch's Redis path against the real Redis at
// LASTSEEN_REDIS_ADDR.
func BenchmarkTouchRedis(b *testing.B) { benchRedisTouch(b, testenv.RedisServer()) }
