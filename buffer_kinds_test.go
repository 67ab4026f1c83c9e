package lastseen

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"
)

// redisBuf returns p's Redis buffer, for tests about Redis itself; it
// panics on a plugin without Redis.
func redisBuf(p *Plugin) *redisBuffer { return p.tracker.buf.(*redisBuffer) }

// memoryKeys lists, sorted, the Redis keys (prefix cut off) that would hold
// the state of the harness's in-process buffers: ":{N}:pending",
// ":{N}:inflight" and ":{N}:refusals" for non-empty maps, ":{N}:seen:<id>" for throttle windows
// still open on the harness's clock.
func (h *harness) memoryKeys() []string {
	now := h.clock.Now()
	set := map[string]bool{}
	for _, p := range h.plugins {
		b, ok := p.tracker.buf.(*memoryBuffer)
		if !ok {
			continue
		}
		for n, s := range b.shards {
			tag := ":{" + strconv.Itoa(n) + "}:"
			s.mu.Lock()
			if len(s.pending) > 0 {
				set[tag+"pending"] = true
			}
			if len(s.inflight) > 0 {
				set[tag+"inflight"] = true
			}
			if len(s.refusals) > 0 {
				set[tag+"refusals"] = true
			}
			for uid, end := range s.markers {
				if now.Before(end) {
					set[tag+"seen:"+uid] = true
				}
			}
			s.mu.Unlock()
		}
	}
	out := make([]string, 0, len(set))
	for k := range set {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// leaveInFlight turns shard n's pending set into its in-flight set, as a
// flush that failed after its swap leaves it: a RENAME in Redis, a swap
// under the shard's lock in memory.
func (h *harness) leaveInFlight(p *Plugin, n int) {
	h.t.Helper()
	ctx := context.Background()
	if !h.memory() {
		must(h.t, h.r.client.Rename(ctx, fmt.Sprintf("%s:{%d}:pending", h.prefix, n), fmt.Sprintf("%s:{%d}:inflight", h.prefix, n)).Err())
		return
	}
	l, err := p.tracker.buf.lockShard(ctx, n)
	must(h.t, err)
	defer l.release(ctx)
	_, err = l.swap(ctx)
	must(h.t, err)
}

// inFlightLen is the number of entries in shard n's in-flight set.
func (h *harness) inFlightLen(p *Plugin, n int) int64 {
	h.t.Helper()
	sizes, err := p.tracker.buf.sizes(context.Background())
	must(h.t, err)
	return sizes[n].inflight
}

// markerTime lets d pass for the throttle markers only: miniredis
// fast-forwards, the in-process buffer's clock (the plugin's) moves; a real
// Redis's markers expire in real time.
func (h *harness) markerTime(d time.Duration) {
	switch {
	case h.memory():
		h.clock.Add(d)
	case h.r.mr != nil:
		h.r.mr.FastForward(d)
	}
}

// putInFlight stores uid's timestamp at in its shard's in-flight set, as a
// flush that failed after its swap leaves it.
func putInFlight(t testing.TB, p *Plugin, uid string, at time.Time) {
	t.Helper()
	switch b := p.tracker.buf.(type) {
	case *redisBuffer:
		must(t, b.rdb.Load().HSet(context.Background(), b.shard(uid).inflight, uid, micros(at)).Err())
	case *memoryBuffer:
		s := b.shard(uid)
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.inflight == nil {
			s.inflight = map[string]int64{}
		}
		s.inflight[uid] = micros(at)
	}
}

// putBacklog keeps uid's timestamp at in the Redis buffer's backlog, as a
// touch during an outage does; the in-process buffer has no backlog, and
// the nearest state there is a pending entry.
func putBacklog(t testing.TB, p *Plugin, uid string, at time.Time) {
	t.Helper()
	switch b := p.tracker.buf.(type) {
	case *redisBuffer:
		b.backlog.add(uid, micros(at))
	case *memoryBuffer:
		if _, _, err := b.touch(context.Background(), uid, at, p.now(), p.cfg.Throttle); err != nil {
			t.Fatal(err)
		}
	}
}
