package lastseen

import (
	"context"
	"fmt"
	"time"

	"github.com/lastseen/lastseen/internal/buffer"
)

// maxBufferSample bounds SampleBuffer's perHash: HRANDFIELD returns that
// many entries per hash, so a larger value would approach Status's cost.
const maxBufferSample = 1000

// BufferSample is a cheap reading of the buffer for metrics and health
// checks: exact sizes, the oldest timestamp from a bounded random sample.
type BufferSample struct {
	At                time.Time // the plugin's clock when the read started (UTC)
	Pending, InFlight int64     // users in all shards' pending and in-flight sets
	Backlog           int       // users in this process's in-process backlog
	Oldest            time.Time // oldest sampled timestamp (UTC; zero if none), never older than the true one
	Exact             bool      // every set held at most perHash entries: Oldest is the true oldest
}

// OldestAge is At minus Oldest, or 0 when Oldest is zero.
func (s BufferSample) OldestAge() time.Duration {
	return oldestAge(s.At, s.Oldest)
}

// SampleBuffer reads the buffer's sizes and about perHash random entries
// (0 to 1000; 0 skips the sample) of each shard's pending and in-flight
// set, in one pipelined round trip (Redis HLEN and HRANDFIELD, Redis 6.2
// or later). Beyond perHash users per set, Oldest understates the true age
// by about 1/(perHash+1) of it (about 6% with 16). Errors:
// ErrNotInitialized, a perHash out of range, or Redis's error prefixed
// "lastseen: sample buffer".
func (p *Plugin) SampleBuffer(ctx context.Context, perHash int) (BufferSample, error) {
	t := p.tracker
	if t == nil {
		return BufferSample{}, ErrNotInitialized
	}
	if perHash < 0 || perHash > maxBufferSample {
		return BufferSample{}, fmt.Errorf("lastseen: sample buffer: perHash is %d, want 0 to %d", perHash, maxBufferSample)
	}
	s := BufferSample{At: p.now().UTC(), Backlog: t.buf.BacklogLen(), Exact: true}
	sizes, values, err := t.buf.Sample(ctx, perHash)
	if err != nil {
		return BufferSample{}, fmt.Errorf("lastseen: sample buffer: %w", err)
	}
	for _, z := range sizes {
		s.Pending += z.Pending
		s.InFlight += z.InFlight
		if z.Pending > int64(perHash) || z.InFlight > int64(perHash) {
			s.Exact = false
		}
	}
	for _, v := range values {
		if at, ok := buffer.ParseMicros(v, s.At); ok && (s.Oldest.IsZero() || at.Before(s.Oldest)) {
			s.Oldest = at
		}
	}
	return s, nil
}

// Breaker returns the state of the touch path's circuit breaker in front
// of Redis (sony/gobreaker's): "closed" (touches call Redis), "open"
// (touches go straight to the in-process backlog; Redis is tried again 5s
// after opening) or "half-open" (up to 64 touches probe Redis). Always
// "closed" without Redis.
func (p *Plugin) Breaker() string {
	if p.tracker == nil {
		return "closed"
	}
	return string(p.tracker.buf.Breaker())
}
