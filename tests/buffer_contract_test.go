package tests

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/lastseen/lastseen/internal/buffer"
	"github.com/lastseen/lastseen/internal/buffer/buffertest"
	"github.com/lastseen/lastseen/internal/buffer/redisbuf"
	"github.com/lastseen/lastseen/tests/testenv"
)

// TestRedisBufferContract runs the buffer contract suite (the one the
// in-process buffer runs in its own package) on the Redis buffer, on every
// Redis kind: miniredis, a Redis server and a Redis Cluster. Each check has
// a key prefix of its own, deleted at cleanup. miniredis v2.40.0 answers a
// PFCOUNT of several keys with the sum of their counts, not the union's
// cardinality: only a real server checks the union.
func TestRedisBufferContract(t *testing.T) {
	for _, kind := range testenv.RedisKinds() {
		t.Run(kind.Name, func(t *testing.T) {
			var quirks []buffertest.Quirk
			if kind.Name == "miniredis" {
				quirks = append(quirks, buffertest.CountSumsKeys)
			}
			buffertest.Exercise(t, func(t *testing.T, s buffertest.Setup) buffer.Buffer {
				r := kind.Open(t)
				b := redisbuf.New(redisbuf.Options{
					Client:       r.Client,
					Prefix:       testenv.KeyPrefix(t, r.Client),
					Shards:       s.Shards,
					Throttle:     s.Throttle,
					TouchTimeout: 5 * time.Second, // a slow machine must not send a touch to the backlog
					Presence:     s.Presence,
					Now:          s.Now,
					Logger:       slog.New(slog.NewTextHandler(io.Discard, nil)),
				})
				t.Cleanup(func() { _ = b.Close() })
				return b
			}, quirks...)
		})
	}
}
