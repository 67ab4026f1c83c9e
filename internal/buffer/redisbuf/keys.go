package redisbuf

import (
	"slices"
	"strconv"
	"sync"
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
	windows           string   // the hash of windows
	reg               *registration
	win               *atomic.Pointer[windowKeys] // the current window
}

// windowKeys is the window a shard's touches write to, its end in Unix ms
// and formatted in decimal (the registration's field and the tail of its
// hashes' keys), formatted once per window.
type windowKeys struct {
	at  int64
	end string
}

// window returns the window ending at end (Unix ms). The newest is kept;
// an older one (a late clock) is made each time.
func (k *shardKeys) window(end int64) *windowKeys {
	w := k.win.Load()
	if w != nil && w.at == end {
		return w
	}
	nw := &windowKeys{at: end, end: strconv.FormatInt(end, 10)}
	if w == nil || end > w.at {
		k.win.CompareAndSwap(w, nw)
	}
	return nw
}

func newShardKeys(prefix string, n, shards int) shardKeys {
	k := keys.ForShard(prefix, n, shards)
	pending, inflight := k.AllPending(), k.AllInFlight()
	readArgs := make([]any, 0, 2*len(pending))
	for b := range pending {
		readArgs = append(readArgs, pending[b], inflight[b])
	}
	buffered := append(append(pending[:len(pending):len(pending)], inflight...), k.Windows())
	return shardKeys{Shard: k, pending: pending, inflight: inflight, buffered: buffered, readArgs: readArgs,
		windows: k.Windows(), reg: new(registration), win: new(atomic.Pointer[windowKeys])}
}

// reregister is how often a process registers again the window its touches
// of a shard write to, in case Redis lost the registration (a failover, a
// restart without persistence): the window's entries would otherwise never
// be moved to pending. Active also registers again, on every flush tick,
// the last two windows this process's touches of each shard wrote to.
const reregister = time.Second

// registration is the window of a shard this process last registered in
// the shard's hash of windows (HSETNX), when, on the plugin's clock, and
// the window it registered before that one; and the windows its touches
// wrote to, or may have written to (a reply lost), since the last flush
// tick, so that the tick registers them again: a touch whose command
// reached Redis after a flush deleted its window (a stalled client, a
// flusher whose clock runs ahead or whose Throttle is shorter) recreated a
// hash no registration names.
type registration struct {
	end, at, prev atomic.Int64 // Unix ms
	last          atomic.Int64 // the window end last added to written (0 after take)
	mu            sync.Mutex
	written       []int64 // window ends, at most maxWritten, the oldest dropped first
}

// maxWritten bounds the windows a registration remembers between two
// flush ticks (a Throttle of a millisecond writes to thousands).
const maxWritten = 1024

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

// wrote records that a touch's command wrote, or may have written, to the
// window ending at end. Called after the command returned: a take after
// it names end.
func (r *registration) wrote(end int64) {
	if r.last.Load() == end {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.last.Store(end)
	if slices.Contains(r.written, end) {
		return
	}
	if len(r.written) == maxWritten {
		r.written = append(r.written[:0], r.written[1:]...)
	}
	r.written = append(r.written, end)
}

// take returns, and forgets, the windows touches wrote to since the last
// take, with the two windows registered last while they are not over for
// keep ms at now (Unix ms): what a flush tick registers again.
func (r *registration) take(now, keep int64) []int64 {
	r.mu.Lock()
	w := r.written
	r.written = nil
	r.last.Store(0)
	r.mu.Unlock()
	for _, e := range [2]int64{r.prev.Load(), r.end.Load()} {
		if e != 0 && e+keep > now && !slices.Contains(w, e) {
			w = append(w, e)
		}
	}
	return w
}

// restore gives back windows a take returned that a failed tick did not
// register.
func (r *registration) restore(ends []int64) {
	for _, e := range ends {
		r.wrote(e)
	}
}
