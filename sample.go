package lastseen

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
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
	if s.Oldest.IsZero() {
		return 0
	}
	return s.At.Sub(s.Oldest)
}

// SampleBuffer reads the buffer's size and samples its oldest timestamp in
// one pipelined round trip: HLEN and HRANDFIELD key perHash WITHVALUES
// (Redis 6.2 or later; distinct random entries) on each shard's pending and
// in-flight hash, 4 × Shards commands. perHash is 0 to MaxBufferSample; 0
// skips the sample.
//
// Accuracy of Oldest: exact while each hash holds at most perHash users.
// Beyond that it is the oldest of perHash random entries per hash, a lower
// bound of the true age: for entries spread evenly over the age of a hash,
// the sampled age falls short of the true one by 1/(perHash+1) of it on
// average (about 6% with 16). An in-flight hash left by a failed flush is
// sampled like any other, so a stuck flush shows at once. Errors:
// ErrNotInitialized before db.Use, a perHash out of range, or Redis's
// error prefixed "lastseen: sample buffer".
func (p *Plugin) SampleBuffer(ctx context.Context, perHash int) (BufferSample, error) {
	t := p.tracker
	if t == nil {
		return BufferSample{}, ErrNotInitialized
	}
	if perHash < 0 || perHash > MaxBufferSample {
		return BufferSample{}, fmt.Errorf("lastseen: sample buffer: perHash is %d, want 0 to %d", perHash, MaxBufferSample)
	}
	s := BufferSample{At: p.now().UTC(), Backlog: t.backlog.len(), Exact: true}
	lens := make([]*redis.IntCmd, 0, 2*len(t.shards))
	samples := make([]*redis.Cmd, 0, 2*len(t.shards))
	err := t.redis(ctx, func(ctx context.Context, rdb *redisClient) error {
		lens, samples = lens[:0], samples[:0] // run again after Close swapped clients
		_, err := rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
			for _, k := range t.shards {
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
		return BufferSample{}, fmt.Errorf("lastseen: sample buffer: %w", err)
	}
	for i, c := range lens {
		n := c.Val()
		if i%2 == 0 {
			s.Pending += n
		} else {
			s.InFlight += n
		}
		if n > int64(perHash) {
			s.Exact = false
		}
	}
	for _, c := range samples {
		for _, v := range sampledValues(c.Val()) {
			if at, ok := parseMicros(v, s.At); ok && (s.Oldest.IsZero() || at.Before(s.Oldest)) {
				s.Oldest = at
			}
		}
	}
	return s, nil
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
// db.Use.
func (p *Plugin) Breaker() BreakerState {
	if p.tracker == nil {
		return BreakerClosed
	}
	return BreakerState(p.tracker.breaker.State().String())
}
