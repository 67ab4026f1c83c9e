package tests

import (
	"context"
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
// flush that failed after its swap leaves it: the buffer's swap under the
// shard's lock (RENAMEs in Redis).
func (h *harness) leaveInFlight(p *lastseen.Plugin, n int) {
	h.t.Helper()
	ctx := context.Background()
	must(h.t, buf(p).LeaveInFlight(ctx, n))
}

// inFlightLen is the number of entries in shard n's in-flight set.
func (h *harness) inFlightLen(p *lastseen.Plugin, n int) int64 {
	h.t.Helper()
	n64, err := buf(p).InFlightLen(context.Background(), n)
	must(h.t, err)
	return n64
}

// markerTime lets d pass for the throttle windows: they are periods of the
// plugin's clock in both buffers (miniredis also fast-forwards its expiring
// keys).
func (h *harness) markerTime(d time.Duration) {
	h.clock.Add(d)
	if h.r != nil && h.r.Mini != nil {
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
