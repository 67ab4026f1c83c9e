package redisbuf

import (
	"sync/atomic"
	"time"

	"github.com/lastseen/lastseen/internal/keys"
)

// shardKeys are the keys of one shard (layout in the package doc and in
// internal/keys), with the lists the scripts and pipelines name built once.
type shardKeys struct {
	keys.Shard
	pending, inflight []string // by bucket
	buffered          []string // pending, in-flight, then the hash of windows: what swap.lua, sample.lua and active.lua name
	readArgs          []any    // pending and in-flight of bucket b at 2b and 2b+1, boxed once: the read script's KEYS (read.go)
	reg               *registration
}

func newShardKeys(prefix string, n, shards int) shardKeys {
	k := keys.ForShard(prefix, n, shards)
	pending, inflight := k.AllPending(), k.AllInFlight()
	readArgs := make([]any, 0, 2*len(pending))
	for b := range pending {
		readArgs = append(readArgs, pending[b], inflight[b])
	}
	buffered := append(append(pending[:len(pending):len(pending)], inflight...), k.Windows())
	return shardKeys{Shard: k, pending: pending, inflight: inflight, buffered: buffered, readArgs: readArgs, reg: new(registration)}
}

// reregister is how often a process registers again the window its touches
// of a shard write to, in case Redis lost the registration (a failover, a
// restart without persistence): the window's entries would otherwise never
// be moved to pending. Active also registers again, on every flush tick,
// the last two windows this process's touches of each shard wrote to.
const reregister = time.Second

// registration is the window of a shard this process last registered in
// the shard's hash of windows (HSETNX), when, on the plugin's clock, and
// the window it registered before that one.
type registration struct {
	end, at, prev atomic.Int64 // Unix ms
}

// due reports whether a touch of the window ending at end must register it.
func (r *registration) due(end int64, now time.Time) bool {
	ms := now.UnixMilli()
	return r.end.Load() != end || ms-r.at.Load() >= reregister.Milliseconds() || ms < r.at.Load()
}

// done records that the window ending at end was registered at now.
func (r *registration) done(end int64, now time.Time) {
	if old := r.end.Swap(end); old != end {
		r.prev.Store(old)
	}
	r.at.Store(now.UnixMilli())
}

// ends returns the windows this process registered last (0 for none): the
// ones its touches may have written to since Redis last saw them
// registered.
func (r *registration) ends() [2]int64 { return [2]int64{r.prev.Load(), r.end.Load()} }
