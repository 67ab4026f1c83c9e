package tests

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/lastseen/lastseen"
)

// memoryKeys lists, sorted, the Redis keys (prefix cut off) that would hold
// the state of the harness's in-process buffers: ":{N}:pending",
// ":{N}:inflight" and ":{N}:refusals" for non-empty maps, ":{N}:seen:<id>" for throttle windows
// still open on the harness's clock.
func (h *harness) memoryKeys() []string {
	now := h.clock.Now()
	set := map[string]bool{}
	for _, p := range h.plugins {
		for _, k := range buf(p).StateKeys(now) {
			set[k] = true
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
func (h *harness) leaveInFlight(p *lastseen.Plugin, n int) {
	h.t.Helper()
	ctx := context.Background()
	if !h.memory() {
		must(h.t, h.r.Client.Rename(ctx, fmt.Sprintf("%s:{%d}:pending", h.prefix, n), fmt.Sprintf("%s:{%d}:inflight", h.prefix, n)).Err())
		return
	}
	must(h.t, buf(p).LeaveInFlight(ctx, n))
}

// inFlightLen is the number of entries in shard n's in-flight set.
func (h *harness) inFlightLen(p *lastseen.Plugin, n int) int64 {
	h.t.Helper()
	n64, err := buf(p).InFlightLen(context.Background(), n)
	must(h.t, err)
	return n64
}

// markerTime lets d pass for the throttle markers only: miniredis
// fast-forwards, the in-process buffer's clock (the plugin's) moves; a real
// Redis's markers expire in real time.
func (h *harness) markerTime(d time.Duration) {
	switch {
	case h.memory():
		h.clock.Add(d)
	case h.r.Mini != nil:
		h.r.Mini.FastForward(d)
	}
}

// putInFlight stores uid's timestamp at in its shard's in-flight set, as a
// flush that failed after its swap leaves it.
func putInFlight(t testing.TB, p *lastseen.Plugin, uid string, at time.Time) {
	t.Helper()
	must(t, buf(p).PutInFlight(context.Background(), uid, at))
}

// putBacklog keeps uid's timestamp at in the Redis buffer's backlog, as a
// touch during an outage does; the in-process buffer has no backlog, and
// the nearest state there is a pending entry.
func putBacklog(t testing.TB, p *lastseen.Plugin, uid string, at time.Time) {
	t.Helper()
	must(t, buf(p).PutBacklog(context.Background(), uid, at))
}
