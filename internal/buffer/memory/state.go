package memory

import (
	"maps"
	"time"

	"github.com/lastseen/lastseen/internal/keys"
)

// State is a copy of one shard's state, for tests and diagnostics.
type State struct {
	// Pending and InFlight map user ids to Unix microseconds.
	Pending, InFlight map[string]int64
	// Refusals maps user ids to the flushes in a row that refused the
	// entry.
	Refusals map[string]int
	// Markers maps user ids to the end of their throttle window on the
	// plugin's clock, ended windows not yet swept included.
	Markers map[string]time.Time
}

// The functions below are for tests, not methods, so that a binary that
// never calls them leaves them out.

// ShardState returns a copy of b's shard n's state (never nil maps).
func ShardState(b *Buffer, n int) State {
	s := b.shards[n]
	s.mu.Lock()
	defer s.mu.Unlock()
	st := State{Pending: maps.Clone(s.pending.m), InFlight: maps.Clone(s.inflight.m), Refusals: maps.Clone(s.refusals), Markers: maps.Clone(s.markers)}
	if st.Pending == nil {
		st.Pending = map[string]int64{}
	}
	if st.InFlight == nil {
		st.InFlight = map[string]int64{}
	}
	return st
}

// ShardOf returns b's shard that holds uid (keys.ShardOf).
func ShardOf(b *Buffer, uid string) int { return keys.ShardOf(uid, len(b.shards)) }

// PutInFlight stores uid's timestamp ts (Unix microseconds) in its shard's
// in-flight set of b, as a flush that stopped after its swap leaves it.
func PutInFlight(b *Buffer, uid string, ts int64) {
	s := b.shard(uid)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inflight.put(uid, ts)
}
