package lastseen

import (
	"context"
	"fmt"
	"time"

	"github.com/lastseen/lastseen/internal/buffer"
)

// ShardStatus is one shard's part of the buffer, as Status read it.
type ShardStatus struct {
	Shard int // 0 to Buffer.Shards-1
	// Pending counts the entries waiting for a flush: users touched since
	// a flush last took the shard, a user recorded in two throttle windows
	// since then counted twice.
	Pending  int64
	InFlight int64     // users taken by a running flush or left by a failed one; written first
	Oldest   time.Time // oldest timestamp of the shard (UTC); zero when empty
	// Unreadable counts entries a flush would drop as Rejected: an id not
	// fitting the key, or not a timestamp from 1970 to an hour past now.
	Unreadable int64
}

// Status is what the plugin accepted and has not yet written, read while
// touches and flushes go on (not one atomic snapshot).
type Status struct {
	At                            time.Time     // the plugin's clock when the read started (UTC)
	Shards                        []ShardStatus // one per shard, in shard order
	Backlog                       int           // users this process holds because Redis did not answer
	Pending, InFlight, Unreadable int64         // sums over Shards
	Oldest                        time.Time     // oldest timestamp of all (UTC); zero when empty

	// EvictionPolicy is Redis's maxmemory-policy, read at db.Use and once a
	// minute at most: "unknown" when unreadable, a cluster's differing ones
	// joined by ",", "" without Redis. EvictionRisk: it can evict pending
	// touches silently (fix: CONFIG SET maxmemory-policy noeviction).
	EvictionPolicy string
	EvictionRisk   bool
}

// OldestAge is At minus Oldest, or 0 when the buffer is empty: how far the
// table lags the truth for the buffered users.
func (s Status) OldestAge() time.Duration {
	return oldestAge(s.At, s.Oldest)
}

// oldestAge is at minus oldest, or 0 when oldest is zero (nothing
// buffered): the OldestAge of Status and BufferSample.
func oldestAge(at, oldest time.Time) time.Duration {
	if oldest.IsZero() {
		return 0
	}
	return at.Sub(oldest)
}

// Status reads the whole buffer for operators (the lastseen CLI's status
// command); it takes no lock and changes nothing. It costs O(buffered
// users): one pipelined round trip for the sizes, then HSCAN in pages of
// Flush.BatchSize to find the oldest timestamps (without Redis, a copy of
// each set under its shard's lock), so call it on demand. Errors:
// ErrNotInitialized, or the first Redis error prefixed "lastseen: status".
func (p *Plugin) Status(ctx context.Context) (Status, error) {
	t := p.tracker
	if t == nil {
		return Status{}, p.notReady()
	}
	sizes, err := t.buf.Sizes(ctx)
	if err != nil {
		return Status{}, fmt.Errorf("lastseen: status: %w", err)
	}
	st := Status{At: p.now().UTC(), Shards: make([]ShardStatus, len(sizes)), Backlog: t.buf.BacklogLen()}
	p.eviction.MaybeCheck(ctx)
	st.EvictionPolicy, st.EvictionRisk = p.eviction.State()
	for i, z := range sizes {
		s := &st.Shards[i]
		s.Shard, s.Pending, s.InFlight = i, z.Pending, z.InFlight
		for _, h := range []struct {
			inflight bool
			n        int64
		}{{false, s.Pending}, {true, s.InFlight}} {
			if h.n == 0 {
				continue
			}
			if err := p.scanOldest(ctx, i, h.inflight, st.At, s); err != nil {
				return Status{}, fmt.Errorf("lastseen: status shard %d: %w", i, err)
			}
		}
		st.Pending += s.Pending
		st.InFlight += s.InFlight
		st.Unreadable += s.Unreadable
		if !s.Oldest.IsZero() && (st.Oldest.IsZero() || s.Oldest.Before(st.Oldest)) {
			st.Oldest = s.Oldest
		}
	}
	return st, nil
}

// scanOldest walks one hash (Buffer.Walk: HSCAN with Redis) and folds its
// oldest readable timestamp and its unreadable entries into s. HSCAN may
// return an entry twice; unreadable fields are deduplicated per hash.
func (p *Plugin) scanOldest(ctx context.Context, n int, inflight bool, now time.Time, s *ShardStatus) error {
	var unreadable map[string]struct{}
	err := p.tracker.buf.Walk(ctx, n, inflight, p.cfg.BatchSize, func(kv []string) {
		for i := 0; i+1 < len(kv); i += 2 {
			if kv[i+1] == "" { // a throttle window's mark, which the flush skips
				continue
			}
			_, errID := p.users.ids.Parse(kv[i])
			at, ok := buffer.ParseMicros(kv[i+1], now)
			if errID != nil || !ok {
				if unreadable == nil {
					unreadable = map[string]struct{}{}
				}
				unreadable[kv[i]] = struct{}{}
				continue
			}
			if s.Oldest.IsZero() || at.Before(s.Oldest) {
				s.Oldest = at
			}
		}
	})
	s.Unreadable += int64(len(unreadable))
	return err
}

// maxBufferSample bounds SampleBuffer's perHash: HRANDFIELD returns that
// many entries per hash, so a larger value would approach Status's cost.
const maxBufferSample = 1000

// BufferSample is a cheap reading of the buffer for metrics and health
// checks: exact sizes, the oldest timestamp from a bounded random sample.
type BufferSample struct {
	At                time.Time // the plugin's clock when the read started (UTC)
	Pending, InFlight int64     // entries in all shards' pending and in-flight sets (a user recorded in two throttle windows since the last flush counted twice)
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
		return BufferSample{}, p.notReady()
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
		if z.Pending > int64(perHash) || z.InFlight > int64(perHash) || z.Partial {
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
