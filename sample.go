package lastseen

import (
	"context"
	"fmt"
	"time"

	"github.com/lastseen/lastseen/internal/buffer"
)

// MaxBufferSample bounds SampleBuffer's perHash: HRANDFIELD returns that
// many entries per hash, so a larger value would approach Status's cost.
const MaxBufferSample = 1000

// BufferSample is a cheap reading of the Redis buffer, made for metrics
// scrapes and health checks: sizes exactly, the oldest timestamp from a
// bounded random sample. Status reads the same figures exactly at a cost
// that grows with the buffer.
type BufferSample struct {
	// At is the plugin's clock when the read started (UTC).
	At time.Time
	// Pending and InFlight are the numbers of users in all shards' pending
	// and in-flight hashes (HLEN); see ShardStatus.
	Pending, InFlight int64
	// Oldest is the oldest readable timestamp among the sampled entries
	// (UTC), the zero time when the buffer is empty or perHash was 0. It
	// is the true oldest when Exact; otherwise it is no older than the true
	// oldest, so OldestAge never overstates the lag.
	Oldest time.Time
	// Exact reports that every hash held at most perHash entries, so that
	// the sample was the whole buffer.
	Exact bool
	// Backlog is the number of users in this process's in-process backlog.
	Backlog int
}

// OldestAge is At minus Oldest, or 0 when Oldest is zero.
func (s BufferSample) OldestAge() time.Duration {
	return oldestAge(s.At, s.Oldest)
}

// SampleBuffer reads the buffer's size and samples its oldest timestamp in
// one pipelined round trip: one EVALSHA of the sample script per shard, which
// sums HLEN over the shard's bucket hashes and takes about perHash random
// entries of its pending set and as many of its in-flight set (HRANDFIELD
// key n WITHVALUES, Redis 6.2 or later; distinct random entries), from each
// bucket in proportion to its size. perHash is 0 to MaxBufferSample; 0
// skips the sample.
//
// Accuracy of Oldest: exact while each shard's pending and in-flight sets
// hold at most perHash users each. Beyond that it is the oldest of about
// perHash random entries per set, a lower bound of the true age: for
// entries spread evenly over the age of a set, the sampled age falls short
// of the true one by about 1/(perHash+1) of it on average (about 6% with
// 16). An in-flight hash left by a failed flush is
// sampled like any other, so a stuck flush shows at once. Errors:
// ErrNotInitialized before db.Use, a perHash out of range, or Redis's
// error prefixed "lastseen: sample buffer". Without Redis it reads the
// in-process buffer's sizes and up to perHash entries of each set (in Go's
// randomized map order), with no I/O and the same accuracy.
func (p *Plugin) SampleBuffer(ctx context.Context, perHash int) (BufferSample, error) {
	t := p.tracker
	if t == nil {
		return BufferSample{}, ErrNotInitialized
	}
	if perHash < 0 || perHash > MaxBufferSample {
		return BufferSample{}, fmt.Errorf("lastseen: sample buffer: perHash is %d, want 0 to %d", perHash, MaxBufferSample)
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

// BreakerState is the state of the circuit breaker in front of Redis on
// the touch path (sony/gobreaker's states; see Config.BreakerCooldown).
type BreakerState string

// The breaker's states.
const (
	BreakerClosed   BreakerState = "closed"    // touches call Redis
	BreakerHalfOpen BreakerState = "half-open" // one touch probes Redis
	BreakerOpen     BreakerState = "open"      // touches go straight to the backlog
)

// Breaker returns the circuit breaker's state now; BreakerClosed before
// db.Use, and always without Redis (the in-process buffer has no breaker).
func (p *Plugin) Breaker() BreakerState {
	if p.tracker == nil {
		return BreakerClosed
	}
	return BreakerState(p.tracker.buf.Breaker())
}
