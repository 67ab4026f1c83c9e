package lastseen

import (
	"context"
	"fmt"
	"time"

	"github.com/lastseen/lastseen/internal/buffer"
)

// ShardStatus is one shard's part of the Redis buffer, as Status read it.
type ShardStatus struct {
	// Shard is the shard number, 0 to Config.Shards-1 (the N of the
	// "<prefix>:{N}:pending" key).
	Shard int
	// Pending is the number of users in the shard's pending hash (HLEN):
	// touched since a flush last took this shard.
	Pending int64
	// InFlight is the number of users in the shard's in-flight hash (HLEN):
	// taken by a flush that is running now, or left by a flush whose
	// database write failed; the next flush writes them first.
	InFlight int64
	// Oldest is the oldest timestamp in the pending and in-flight hashes, in
	// UTC; the zero time when there is none.
	Oldest time.Time
	// Unreadable counts entries a flush would drop as Rejected: an id that
	// does not fit the user model's primary key, or a value that is not a
	// timestamp (Unix microseconds, 1970 to the clock plus MaxClockSkew).
	Unreadable int64
}

// Redis maxmemory policies (redis.conf "maxmemory-policy") as the buffer
// sees them (Status.EvictionPolicy): only noeviction never drops a key to
// make room. The allkeys-* policies can evict the pending and in-flight
// hashes; the volatile-* ones evict keys with a time-to-live only, the
// throttle markers and the locks (a lost lock lets two flushers take one
// shard). Every policy but noeviction counts as a risk.
const (
	// PolicyNoEviction is the only maxmemory-policy under which Redis never
	// evicts the buffer: at maxmemory it refuses writes instead (OOM), which
	// touches answer by keeping the timestamp in the backlog.
	PolicyNoEviction = "noeviction"
	// PolicyUnknown is reported when neither CONFIG GET maxmemory-policy nor
	// INFO memory answered (managed Redis often renames or disables CONFIG;
	// miniredis has neither).
	PolicyUnknown = "unknown"
)

// Status is what the plugin has accepted and not yet written to the
// database: the Redis buffer shard by shard, and this process's in-process
// backlog. It is read shard by shard while touches and flushes go on, so
// it is not one atomic snapshot.
type Status struct {
	// At is the plugin's clock when the read started (UTC).
	At time.Time
	// Shards has one entry per shard, in shard order.
	Shards []ShardStatus
	// Pending, InFlight and Unreadable are the sums over Shards.
	Pending, InFlight, Unreadable int64
	// Oldest is the oldest timestamp over all shards (UTC); the zero time
	// when the buffer is empty.
	Oldest time.Time
	// Backlog is the number of users this process kept in memory because
	// Redis did not answer; the next flush moves them to Redis. Other
	// processes' backlogs are not visible here.
	Backlog int

	// EvictionPolicy is Redis's maxmemory-policy as last read (CONFIG GET
	// maxmemory-policy, else INFO memory): "noeviction", another policy
	// such as "allkeys-lru", PolicyUnknown when neither answered, or on a
	// cluster whose masters disagree their policies sorted and joined by
	// ",". Read at Initialize and at most once a minute after. "" without
	// Redis (the in-process buffer evicts nothing).
	EvictionPolicy string
	// EvictionRisk reports that some master's policy can evict keys: the
	// pending and in-flight hashes can vanish, and the touches in them with
	// them, without an error. Fix: CONFIG SET maxmemory-policy noeviction.
	EvictionRisk bool
}

// OldestAge is how long the oldest buffered timestamp has waited: At minus
// Oldest, or 0 when the buffer is empty. It bounds how far the database
// lags behind the truth for the users in the buffer.
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

// Status reads the Redis buffer for operators (the lastseen CLI's status
// command prints it). It only reads; it takes no lock and never changes
// what a flush will do.
//
// Cost: one pipelined round trip for the sizes (the sample script, one call
// per shard), then every non-empty set is read with HSCAN in pages of
// BatchSize entries (never HGETALL): one pipeline of the first page of each
// of the set's bucket hashes, then page by page for a bucket too large for
// one reply, to find the oldest timestamp: O(buffered users) work in Redis
// and here. Call it on demand, not on every request. Errors: ErrNotInitialized before db.Use, or the first Redis
// error, prefixed "lastseen: status". Without Redis it reads the
// in-process buffer the same way, with no I/O; each set is copied under
// its shard's mutex, so touches of that shard wait for the copy.
func (p *Plugin) Status(ctx context.Context) (Status, error) {
	t := p.tracker
	if t == nil {
		return Status{}, ErrNotInitialized
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
