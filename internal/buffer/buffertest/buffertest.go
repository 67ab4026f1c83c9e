// Package buffertest is the contract suite of package buffer: one suite
// that every implementation runs, so that the in-process buffer and the
// Redis buffer keep the same contract (in the manner of a driver test suite
// run by every driver). The memory buffer runs it in its own package test;
// the Redis buffer runs it from the tests module, on miniredis, a Redis
// server and a Redis Cluster.
//
// Every check asserts exact values: counts, timestamps, the fields a scan
// returns, the fields a requeue drops. Nothing depends on timing: the
// buffer's clock is the suite's, and every touch passes its own now.
package buffertest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/lastseen/lastseen/internal/buffer"
	"github.com/lastseen/lastseen/internal/keys"
)

// Setup is what the suite opens each buffer with.
type Setup struct {
	// Shards is the number of shards: 4.
	Shards int
	// Throttle is the plugin's throttle window: 1 minute. Every touch
	// passes the end of its fixed window as the plugin computes it: the
	// next whole minute after the time seen (or after now, when that is
	// sooner).
	Throttle time.Duration
	// Presence is which presence sets a recorded touch joins: online sets
	// kept 1 hour, active sets kept 35 days.
	Presence buffer.Presence
	// Now is the buffer's clock, 2026-03-01T09:30:00Z at the start; the
	// suite moves it forward with the touches' now.
	Now func() time.Time
}

// Quirk names a part of the contract that a stand-in for a store cannot
// keep; the suite leaves that part out. The real stores have none.
type Quirk string

// CountSumsKeys: the store answers a count of several presence sets with
// the sum of their counts, not the size of their union (miniredis's
// multi-key PFCOUNT). The suite then counts disjoint sets only.
const CountSumsKeys Quirk = "count sums keys"

// Exercise runs the contract suite as subtests of t, each on a fresh, empty
// buffer that open returns for s, with the key prefix it opened the buffer
// under (one of its own per buffer; the in-process buffer names its
// presence sets by it too). open must register with t.Cleanup whatever
// closes the buffer and removes its state (for Redis: Close, then the keys
// under its prefix). quirks leave out what the store under the buffer
// cannot do.
func Exercise(t *testing.T, open func(t *testing.T, s Setup) (b buffer.Buffer, prefix string), quirks ...Quirk) {
	checks := []struct {
		name string
		run  func(c *check)
	}{
		{"ThrottleWindow", throttleWindow},
		{"ConcurrentTouches", concurrentTouches},
		{"PendingForwardOnly", pendingForwardOnly},
		{"SwapIsolatesTouches", swapIsolatesTouches},
		{"LeftOverInFlight", leftOverInFlight},
		{"AckRemovesOnlyAcknowledged", ackRemovesOnlyAcknowledged},
		{"RequeueNewestWins", requeueNewestWins},
		{"RefusalLimit", refusalLimit},
		{"Renames", renames},
		{"RenameDuringFlush", renameDuringFlush},
		{"LocksExclusive", locksExclusive},
		{"Reads", reads},
		{"NewestMany", newestMany},
		{"PresenceCount", presenceCount},
		{"Idle", idle},
	}
	for _, ck := range checks {
		t.Run(ck.name, func(t *testing.T) {
			clock := &clock{now: at(0)}
			s := Setup{Shards: 4, Throttle: time.Minute,
				Presence: buffer.Presence{OnlineWindow: time.Hour, ActiveRetention: 35 * 24 * time.Hour}, Now: clock.Now}
			b, prefix := open(t, s)
			ck.run(&check{t: t, b: b, prefix: prefix, s: s, clock: clock, ctx: context.Background(), quirks: quirks})
		})
	}
}

// clock is the buffer's settable clock.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

// check is one subtest's buffer and helpers.
type check struct {
	t      *testing.T
	b      buffer.Buffer
	prefix string
	s      Setup
	clock  *clock
	ctx    context.Context
	quirks []Quirk
}

// at returns the suite's start, 2026-03-01T09:30:00Z, plus d.
func at(d time.Duration) time.Time { return time.Date(2026, 3, 1, 9, 30, 0, 0, time.UTC).Add(d) }

// micros is at(d) in the stored form.
func micros(d time.Duration) string { return strconv.FormatInt(buffer.Micros(at(d)), 10) }

// users returns n user ids of shard n, in order: "u1", "u2", ... that
// keys.ShardOf puts there.
func (c *check) users(shard, n int) []string {
	var out []string
	for i := 1; len(out) < n; i++ {
		if uid := "u" + strconv.Itoa(i); keys.ShardOf(uid, c.s.Shards) == shard {
			out = append(out, uid)
		}
	}
	return out
}

func (c *check) must(err error) {
	c.t.Helper()
	if err != nil {
		c.t.Fatal(err)
	}
}

func equal[T comparable](t *testing.T, what string, got, want T) {
	t.Helper()
	if got != want {
		t.Fatalf("%s = %v, want %v", what, got, want)
	}
}

func equalSlices[T comparable](t *testing.T, what string, got, want []T) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Fatalf("%s = %v, want %v", what, got, want)
	}
}

// end is the end of the throttle window of a touch seen at at(seen) at
// at(now), as the plugin computes it: windows are fixed periods of
// Throttle from the Unix epoch, and a time ahead of now falls in now's.
func (c *check) end(seen, now time.Duration) time.Time {
	t := at(min(seen, now))
	ms := c.s.Throttle.Milliseconds()
	return time.UnixMilli((t.UnixMilli()/ms + 1) * ms)
}

// touch touches uid at at(seen), the clock set to at(now), in the window
// end gives, and checks the result.
func (c *check) touch(uid string, seen, now time.Duration, recorded bool, ttl time.Duration) {
	c.t.Helper()
	c.clock.set(at(now))
	got, left, err := c.b.Touch(c.ctx, uid, at(seen), at(now), c.end(seen, now))
	c.must(err)
	equal(c.t, fmt.Sprintf("touch %s at +%v (now +%v) recorded", uid, seen, now), got, recorded)
	equal(c.t, fmt.Sprintf("touch %s at +%v (now +%v) ttl", uid, seen, now), left, ttl)
}

// record touches uid at at(d), now at(d), expecting it recorded, the ttl
// the rest of its window.
func (c *check) record(uid string, d time.Duration) {
	c.t.Helper()
	c.touch(uid, d, d, true, c.end(d, d).Sub(at(d)))
}

// newest checks Newest of uids (both unguarded and guarded): want holds
// each one's offset from the start, or -1 for none.
func (c *check) newest(uids []string, want ...time.Duration) {
	c.t.Helper()
	for _, guard := range []bool{false, true} {
		got := make([]time.Time, len(uids))
		for i := range got {
			got[i] = at(time.Hour) // Newest sets every one, found or not
		}
		c.must(c.b.Newest(c.ctx, uids, got, c.clock.Now(), guard))
		equal(c.t, "newest: results", len(got), len(uids))
		for i, uid := range uids {
			w := time.Time{}
			if want[i] >= 0 {
				w = at(want[i])
			}
			if !got[i].Equal(w) || (!w.IsZero() && got[i].Location() != time.UTC) {
				c.t.Fatalf("newest(%s, guard %v) = %v, want %v (UTC)", uid, guard, got[i], w)
			}
		}
	}
}

// sizes checks every shard's sizes: want is pending, in-flight, pending,
// in-flight, ... in shard order.
func (c *check) sizes(want ...int64) {
	c.t.Helper()
	got, err := c.b.Sizes(c.ctx)
	c.must(err)
	flat := make([]int64, 0, 2*len(got))
	for _, z := range got {
		flat = append(flat, z.Pending, z.InFlight)
	}
	equalSlices(c.t, "sizes (pending, in-flight by shard)", flat, want)
}

// active checks Active.
func (c *check) active(want ...int) {
	c.t.Helper()
	got, err := c.b.Active(c.ctx)
	c.must(err)
	equalSlices(c.t, "active shards", got, want)
}

// lockShard takes shard n's lock, released at cleanup (a second release
// does nothing).
func (c *check) lockShard(n int) buffer.ShardLease {
	c.t.Helper()
	l, err := c.b.LockShard(c.ctx, n)
	c.must(err)
	c.t.Cleanup(func() { l.Release(context.Background()) })
	return l
}

// swap checks Swap's count.
func (c *check) swap(l buffer.ShardLease, want int) {
	c.t.Helper()
	n, err := l.Swap(c.ctx)
	c.must(err)
	equal(c.t, "swap: entries moved", n, want)
}

// scanned is one in-flight entry as Scan returned it.
type scanned struct {
	value  string
	bucket int
}

// scan reads the whole in-flight set, n entries a page, acknowledging
// nothing; each field must come with one value (duplicates allowed).
func (c *check) scan(l buffer.ShardLease, n int) map[string]scanned {
	c.t.Helper()
	return c.scanAcking(l, n, false)
}

// scanAcking is scan, and with ack it acknowledges every page before
// reading the next (as the flush does): every field in flight for the
// whole scan still comes at least once.
func (c *check) scanAcking(l buffer.ShardLease, n int, ack bool) map[string]scanned {
	c.t.Helper()
	out := map[string]scanned{}
	var cursor uint64
	for pages := 0; ; pages++ {
		if pages > 1000 {
			c.t.Fatal("scan: no end after 1000 pages")
		}
		kv, buckets, next, err := l.Scan(c.ctx, cursor, n)
		c.must(err)
		if len(kv)%2 != 0 || (buckets != nil && len(buckets) != len(kv)/2) {
			c.t.Fatalf("scan: %d strings, %d buckets", len(kv), len(buckets))
		}
		var held []buffer.Held
		for i := 0; i < len(kv); i += 2 {
			b := -1
			if buckets != nil {
				b = buckets[i/2]
			}
			if prev, ok := out[kv[i]]; ok && prev.value != kv[i+1] {
				c.t.Fatalf("scan: %s came with %s and %s", kv[i], prev.value, kv[i+1])
			}
			out[kv[i]] = scanned{kv[i+1], b}
			held = append(held, buffer.Held{Field: kv[i], Bucket: b})
		}
		if ack {
			c.must(l.Ack(c.ctx, held, false))
		}
		if next == 0 {
			return out
		}
		cursor = next
	}
}

// values returns the fields and values of m, sorted by field, as field=value.
func values(m map[string]scanned) []string {
	out := make([]string, 0, len(m))
	for f, s := range m {
		out = append(out, f+"="+s.value)
	}
	slices.Sort(out)
	return out
}

// entries returns field=value for each pair, sorted.
func entries(pairs ...string) []string {
	out := make([]string, 0, len(pairs)/2)
	for i := 0; i+1 < len(pairs); i += 2 {
		out = append(out, pairs[i]+"="+pairs[i+1])
	}
	slices.Sort(out)
	return out
}

// walk reads shard n's pending (or in-flight) set about page entries at a
// time and returns field=value sorted (duplicates folded).
func (c *check) walk(n int, inflight bool, page int) []string {
	c.t.Helper()
	set := map[string]string{}
	err := c.b.Walk(c.ctx, n, inflight, page, func(kv []string) {
		if len(kv) == 0 || len(kv)%2 != 0 {
			c.t.Errorf("walk: a call with %d strings, want field and value pairs", len(kv))
		}
		for i := 0; i+1 < len(kv); i += 2 {
			set[kv[i]] = kv[i+1]
		}
	})
	c.must(err)
	out := make([]string, 0, len(set))
	for f, v := range set {
		out = append(out, f+"="+v)
	}
	slices.Sort(out)
	return out
}

// requeue requeues the refused entries with ceiling and limit and checks
// what it dropped.
func (c *check) requeue(l buffer.ShardLease, refused []buffer.Refused, ceiling int64, limit int, dropped ...string) {
	c.t.Helper()
	got, err := l.Requeue(c.ctx, refused, ceiling, limit)
	c.must(err)
	if len(got) == 0 {
		got = nil
	}
	equalSlices(c.t, "requeue: dropped", got, dropped)
}

// refused returns the Refused entries of fields as scan read them.
func refused(in map[string]scanned, fields ...string) []buffer.Refused {
	out := make([]buffer.Refused, 0, len(fields))
	for _, f := range fields {
		s, ok := in[f]
		if !ok {
			panic("buffertest: " + f + " was not scanned")
		}
		out = append(out, buffer.Refused{Field: f, Value: s.value, Bucket: s.bucket})
	}
	return out
}

// throttleWindow: a user is recorded at most once per throttle window, a
// fixed period of the clock (here whole minutes); the ttl of a touch is
// what is left of its window; users have windows of their own; a late
// touch, whose window is over, raises the pending value, opens no window
// and does not hold back the user's current touch.
func throttleWindow(c *check) {
	u := c.users(0, 1)[0]
	v := c.users(1, 1)[0]
	w := c.users(0, 2)[1]
	c.record(u, 0)
	c.touch(u, 10*time.Second, 10*time.Second, false, 50*time.Second)
	c.touch(u, 59*time.Second, 59*time.Second, false, time.Second)
	c.record(v, 10*time.Second) // its window ends with u's: at the minute
	c.touch(v, 30*time.Second, 30*time.Second, false, 30*time.Second)
	c.newest([]string{u, v, w}, 0, 10*time.Second, -1) // throttled touches did not move pending
	c.sizes(1, 0, 1, 0, 0, 0, 0, 0)
	c.record(u, time.Minute) // the next window
	c.touch(u, time.Minute+time.Second, time.Minute+time.Second, false, 59*time.Second)
	c.newest([]string{u, v, w}, time.Minute, 10*time.Second, -1)
	// A late touch: seen at +0, its window ended at +1m.
	c.touch(w, 0, 70*time.Second, true, 0)
	c.newest([]string{w}, 0)
	c.touch(w, 70*time.Second, 70*time.Second, true, 50*time.Second)
	c.touch(w, 0, 80*time.Second, true, 0) // late again: never lowers pending
	c.touch(w, 119*time.Second, 119*time.Second, false, time.Second)
	c.newest([]string{u, v, w}, time.Minute, 10*time.Second, 70*time.Second)
	c.drain()
	c.sizes(0, 0, 0, 0, 0, 0, 0, 0)
	c.touch(w, 119*time.Second, 119*time.Second, false, time.Second) // still throttled after the flush
	c.record(w, 2*time.Minute)
	c.newest([]string{u, v, w}, -1, -1, 2*time.Minute)
}

// concurrentTouches: of many touches of one user at once, exactly one is
// recorded.
func concurrentTouches(c *check) {
	u := c.users(2, 1)[0]
	c.clock.set(at(0))
	var wg sync.WaitGroup
	var mu sync.Mutex
	recorded, errs := 0, []error(nil)
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ok, _, err := c.b.Touch(c.ctx, u, at(time.Duration(i)*time.Millisecond), at(0), c.end(0, 0))
			mu.Lock()
			defer mu.Unlock()
			if ok {
				recorded++
			}
			if err != nil {
				errs = append(errs, err)
			}
		}()
	}
	wg.Wait()
	c.must(errors.Join(errs...))
	equal(c.t, "recorded of 20 concurrent touches", recorded, 1)
	c.sizes(0, 0, 0, 0, 1, 0, 0, 0)
}

// pendingForwardOnly: a recorded touch raises the pending value, never
// lowers it, whichever order a flush meets its entries in.
func pendingForwardOnly(c *check) {
	u := c.users(3, 1)[0]
	c.touch(u, 30*time.Second, 0, true, time.Minute) // ahead of the clock: now's window
	c.newest([]string{u}, 30*time.Second)
	// After the window, an older time (a late touch) does not lower the
	// pending value.
	c.touch(u, 0, 2*time.Minute, true, 0)
	c.newest([]string{u}, 30*time.Second)
	c.record(u, 3*time.Minute)
	c.newest([]string{u}, 3*time.Minute)
	l := c.lockShard(3)
	c.swap(l, 1)
	equalSlices(c.t, "in flight", values(c.scan(l, 10)), entries(u, micros(3*time.Minute)))
	c.must(l.Ack(c.ctx, nil, true))
	c.sizes(0, 0, 0, 0, 0, 0, 0, 0)
}

// swapIsolatesTouches: a swap moves the pending set to in-flight at once;
// touches during the flush land in a new pending set; Newest sees the
// newer of both; a scan that acknowledges page by page still returns every
// entry; the final ack removes the in-flight set; a swap with nothing
// pending moves nothing.
func swapIsolatesTouches(c *check) {
	us := c.users(0, 6)
	for _, u := range us[:5] {
		c.record(u, 0)
	}
	c.active(0)
	l := c.lockShard(0)
	c.swap(l, 5)
	c.sizes(0, 5, 0, 0, 0, 0, 0, 0)
	c.active(0)
	c.record(us[5], time.Second)       // a new user during the flush
	c.record(us[0], 2*time.Minute)     // a user in flight, after its window
	c.sizes(2, 5, 0, 0, 0, 0, 0, 0)    // pending: the two new touches
	c.newest(us[:2], 2*time.Minute, 0) // us[0]: the newer of pending and in-flight
	got := c.scanAcking(l, 2, true)
	equalSlices(c.t, "in flight", values(got),
		entries(us[0], micros(0), us[1], micros(0), us[2], micros(0), us[3], micros(0), us[4], micros(0)))
	c.sizes(2, 0, 0, 0, 0, 0, 0, 0)
	c.must(l.Ack(c.ctx, nil, true))
	c.newest(us, 2*time.Minute, -1, -1, -1, -1, time.Second)
	c.swap(l, 2)
	equalSlices(c.t, "in flight, second swap", values(c.scan(l, 1000)), entries(us[0], micros(2*time.Minute), us[5], micros(time.Second)))
	c.must(l.Ack(c.ctx, nil, true))
	c.sizes(0, 0, 0, 0, 0, 0, 0, 0)
	c.active()
	c.swap(l, 0)
	c.sizes(0, 0, 0, 0, 0, 0, 0, 0)
	equal(c.t, "scan of nothing", len(c.scan(l, 10)), 0)
}

// leftOverInFlight: a flush that stopped after its swap leaves the
// in-flight set; the next swap refuses with ErrLeftOver, moves nothing, and
// the left-over set can be drained first.
func leftOverInFlight(c *check) {
	us := c.users(1, 2)
	c.record(us[0], 0)
	l := c.lockShard(1)
	c.swap(l, 1)
	l.Release(c.ctx) // stopped before the ack
	c.record(us[1], time.Second)
	l = c.lockShard(1)
	n, err := l.Swap(c.ctx)
	if !errors.Is(err, buffer.ErrLeftOver) {
		c.t.Fatalf("swap over a left-over in-flight set: %d, %v, want ErrLeftOver", n, err)
	}
	c.sizes(0, 0, 1, 1, 0, 0, 0, 0)
	equalSlices(c.t, "left over", values(c.scan(l, 10)), entries(us[0], micros(0)))
	c.must(l.Ack(c.ctx, nil, true))
	c.swap(l, 1)
	equalSlices(c.t, "in flight", values(c.scan(l, 10)), entries(us[1], micros(time.Second)))
	c.must(l.Ack(c.ctx, nil, true))
	c.sizes(0, 0, 0, 0, 0, 0, 0, 0)
}

// ackRemovesOnlyAcknowledged: an ack removes the fields it names, and only
// them, located by the bucket the scan gave or, with bucket -1, by the
// buffer; the final ack removes the in-flight set with what is left.
func ackRemovesOnlyAcknowledged(c *check) {
	us := c.users(2, 3)
	for _, u := range us {
		c.record(u, 0)
	}
	l := c.lockShard(2)
	c.swap(l, 3)
	got := c.scan(l, 10)
	c.must(l.Ack(c.ctx, []buffer.Held{{Field: us[0], Bucket: -1}}, false))
	c.sizes(0, 0, 0, 0, 0, 2, 0, 0)
	equalSlices(c.t, "in flight after one ack", values(c.scan(l, 10)), entries(us[1], micros(0), us[2], micros(0)))
	c.newest(us, -1, 0, 0)
	c.must(l.Ack(c.ctx, []buffer.Held{{Field: us[1], Bucket: got[us[1]].bucket}, {Field: "not-in-flight", Bucket: -1}}, false))
	c.sizes(0, 0, 0, 0, 0, 1, 0, 0)
	c.active(2)
	c.must(l.Ack(c.ctx, nil, true))
	c.sizes(0, 0, 0, 0, 0, 0, 0, 0)
	c.active()
	c.newest(us, -1, -1, -1)
}

// requeueNewestWins: a refused entry goes back to pending unless pending
// holds a newer value; a pending value above the ceiling is replaced.
func requeueNewestWins(c *check) {
	us := c.users(3, 3)
	for _, u := range us {
		c.record(u, 0)
	}
	l := c.lockShard(3)
	c.swap(l, 3)
	got := c.scan(l, 10)
	c.record(us[0], 2*time.Minute) // newer, during the flush
	c.record(us[2], 2*time.Minute)
	c.requeue(l, refused(got, us[0], us[1]), buffer.Ceiling(at(2*time.Minute)), 0)
	c.requeue(l, refused(got, us[2]), buffer.Micros(at(time.Minute)), 0) // us[2]'s pending value is past this ceiling
	c.sizes(0, 0, 0, 0, 0, 0, 3, 0)
	equalSlices(c.t, "pending after requeue", c.walk(3, false, 10),
		entries(us[0], micros(2*time.Minute), us[1], micros(0), us[2], micros(0)))
	c.must(l.Ack(c.ctx, nil, true))
}

// refusalLimit: an entry refused the limit-th time in a row is dropped and
// its count cleared; limit 0 never drops; an ack clears the count.
func refusalLimit(c *check) {
	us := c.users(1, 3)
	drop, never, acked := us[0], us[1], us[2]
	for _, u := range us {
		c.record(u, 0)
	}
	l := c.lockShard(1)
	ceiling := func() int64 { return buffer.Ceiling(c.clock.Now()) }
	// Round 1: all three refused, counts 1.
	c.swap(l, 3)
	got := c.scan(l, 10)
	c.requeue(l, refused(got, drop, acked), ceiling(), 3)
	c.requeue(l, refused(got, never), ceiling(), 0)
	c.must(l.Ack(c.ctx, nil, true))
	// Round 2: drop and never refused again (counts 2); acked written: its
	// count clears.
	c.swap(l, 3)
	got = c.scan(l, 10)
	c.requeue(l, refused(got, drop), ceiling(), 3)
	c.requeue(l, refused(got, never), ceiling(), 0)
	c.must(l.Ack(c.ctx, []buffer.Held{{Field: acked, Bucket: got[acked].bucket}}, true))
	c.sizes(0, 0, 2, 0, 0, 0, 0, 0)
	// Round 3: drop's third refusal drops it; acked's count is 1 again;
	// never's 3, under limit 0.
	c.record(acked, 2*time.Minute)
	c.swap(l, 3)
	got = c.scan(l, 10)
	c.requeue(l, refused(got, drop, acked), ceiling(), 3, drop)
	c.requeue(l, refused(got, never), ceiling(), 0)
	c.must(l.Ack(c.ctx, nil, true))
	equalSlices(c.t, "pending after the limit", c.walk(1, false, 10), entries(never, micros(0), acked, micros(2*time.Minute)))
	c.sizes(0, 0, 2, 0, 0, 0, 0, 0)
	// Round 4: the dropped user, seen again, starts a count of its own: 1,
	// and acked's is 2, both under 3.
	c.record(drop, 3*time.Minute)
	c.swap(l, 3)
	got = c.scan(l, 10)
	c.requeue(l, refused(got, drop, acked), ceiling(), 3)
	c.requeue(l, refused(got, never), ceiling(), 0)
	c.must(l.Ack(c.ctx, nil, true))
	// Round 5: with limit 2, drop's second refusal drops it; never's fifth
	// with limit 0 does not.
	c.swap(l, 3)
	got = c.scan(l, 10)
	c.requeue(l, refused(got, drop), ceiling(), 2, drop)
	c.requeue(l, refused(got, never, acked), ceiling(), 0)
	c.must(l.Ack(c.ctx, nil, true))
	equalSlices(c.t, "pending at the end", c.walk(1, false, 10), entries(never, micros(0), acked, micros(2*time.Minute)))
	c.sizes(0, 0, 2, 0, 0, 0, 0, 0)
}

// locksExclusive: a shard's lock, the purge lock and a rule's lock have
// one holder at a time (ErrNotObtained for a second); each shard's and
// each rule's lock is its own; a
// released lock can be taken again; a held lock refreshes; Keep's context
// runs until the work stops.
func locksExclusive(c *check) {
	l0, err := c.b.LockShard(c.ctx, 0)
	c.must(err)
	if _, err := c.b.LockShard(c.ctx, 0); !errors.Is(err, buffer.ErrNotObtained) {
		c.t.Fatalf("second lock of shard 0: %v, want ErrNotObtained", err)
	}
	l1, err := c.b.LockShard(c.ctx, 1)
	c.must(err)
	p, err := c.b.LockPurge(c.ctx)
	c.must(err)
	if _, err := c.b.LockPurge(c.ctx); !errors.Is(err, buffer.ErrNotObtained) {
		c.t.Fatalf("second purge lock: %v, want ErrNotObtained", err)
	}
	r1, err := c.b.LockRule(c.ctx, "warn")
	c.must(err)
	if _, err := c.b.LockRule(c.ctx, "warn"); !errors.Is(err, buffer.ErrNotObtained) {
		c.t.Fatalf("second lock of rule warn: %v, want ErrNotObtained", err)
	}
	r2, err := c.b.LockRule(c.ctx, "revoke") // each rule's lock is its own, apart from the purge's
	c.must(err)
	c.must(r1.Refresh(c.ctx))
	r1.Release(c.ctx)
	r1, err = c.b.LockRule(c.ctx, "warn")
	c.must(err)
	for _, l := range []buffer.Lease{r1, r2} {
		l.Release(c.ctx)
	}
	c.must(l0.Refresh(c.ctx))
	c.must(p.Refresh(c.ctx))
	lost := errors.New("lost")
	run, stop := l0.Keep(c.ctx, lost)
	if run.Err() != nil || context.Cause(run) != nil {
		c.t.Fatalf("Keep's context: %v (cause %v), want running", run.Err(), context.Cause(run))
	}
	stop()
	l0.Release(c.ctx)
	l0.Release(c.ctx) // a second release does nothing
	l0, err = c.b.LockShard(c.ctx, 0)
	c.must(err)
	if _, err := c.b.LockShard(c.ctx, 1); !errors.Is(err, buffer.ErrNotObtained) {
		c.t.Fatalf("lock of shard 1 while held: %v, want ErrNotObtained", err)
	}
	p.Release(c.ctx)
	p, err = c.b.LockPurge(c.ctx)
	c.must(err)
	for _, l := range []buffer.Lease{l0, l1, p} {
		l.Release(c.ctx)
	}
	for n := range c.s.Shards {
		l := c.lockShard(n)
		l.Release(c.ctx)
	}
}

// reads: Sizes, Active, Walk, Sample and Newest over pending and in-flight
// sets.
func reads(c *check) {
	a := c.users(0, 3)
	b := c.users(2, 1)[0]
	for _, u := range a {
		c.record(u, 0)
	}
	c.record(b, time.Second)
	c.sizes(3, 0, 0, 0, 1, 0, 0, 0)
	c.active(0, 2)
	l := c.lockShard(2)
	c.swap(l, 1)
	c.sizes(3, 0, 0, 0, 0, 1, 0, 0)
	c.active(0, 2)
	c.record(b, 2*time.Minute)
	c.sizes(3, 0, 0, 0, 1, 1, 0, 0)

	equalSlices(c.t, "walk shard 0 pending", c.walk(0, false, 2), entries(a[0], micros(0), a[1], micros(0), a[2], micros(0)))
	equalSlices(c.t, "walk shard 0 in flight", c.walk(0, true, 2), entries())
	equalSlices(c.t, "walk shard 1 pending", c.walk(1, false, 2), entries())
	equalSlices(c.t, "walk shard 2 pending", c.walk(2, false, 1), entries(b, micros(2*time.Minute)))
	equalSlices(c.t, "walk shard 2 in flight", c.walk(2, true, 1), entries(b, micros(time.Second)))

	sizes, vals, err := c.b.Sample(c.ctx, 0)
	c.must(err)
	equal(c.t, "sample 0: values", len(vals), 0)
	equalSlices(c.t, "sample 0: sizes", sizes, []buffer.Sizes{{Pending: 3}, {}, {Pending: 1, InFlight: 1}, {}})
	sizes, vals, err = c.b.Sample(c.ctx, 10)
	c.must(err)
	slices.Sort(vals)
	equalSlices(c.t, "sample 10: sizes", sizes, []buffer.Sizes{{Pending: 3}, {}, {Pending: 1, InFlight: 1}, {}})
	equalSlices(c.t, "sample 10: values (every set whole)", vals,
		[]string{micros(0), micros(0), micros(0), micros(time.Second), micros(2 * time.Minute)})

	c.newest([]string{a[0], b, "never-seen", a[2], b}, 0, 2*time.Minute, -1, 0, 2*time.Minute)
	c.must(l.Ack(c.ctx, nil, true))
	c.newest([]string{b}, 2*time.Minute)
}

// newestMany: Newest of 2,500 ids over every shard (more than one call of
// the Redis buffer's read takes), a third of them recorded, one shard's in
// flight with nothing pending, then one of them newer in pending than in
// flight, and the first ten asked twice, gives each id its own value.
func newestMany(c *check) {
	uids := make([]string, 0, 2510)
	want := make([]time.Duration, 0, 2510)
	for i := 1; i <= 2500; i++ {
		uid := "m" + strconv.Itoa(i)
		d := time.Duration(-1)
		if i%3 == 0 {
			d = time.Duration(i) * time.Millisecond
			c.record(uid, d)
		}
		uids, want = append(uids, uid), append(want, d)
	}
	l := c.lockShard(1)
	defer l.Release(c.ctx)
	_, err := l.Swap(c.ctx)
	c.must(err)
	c.newest(uids, want...) // shard 1: in flight only
	newer := 0
	for want[newer] < 0 || keys.ShardOf(uids[newer], c.s.Shards) != 1 { // a user now in flight
		newer++
	}
	c.record(uids[newer], 2*time.Minute)
	want[newer] = 2 * time.Minute
	uids, want = append(uids, uids[:10]...), append(want, want[:10]...)
	c.newest(uids, want...)
}

// drain flushes every active shard as the plugin's flush does: lock, swap,
// scan acknowledging each page, final Ack, release.
func (c *check) drain() {
	c.t.Helper()
	active, err := c.b.Active(c.ctx)
	c.must(err)
	for _, n := range active {
		l, err := c.b.LockShard(c.ctx, n)
		c.must(err)
		_, err = l.Swap(c.ctx)
		if err == nil {
			c.scanAcking(l, 1000, true)
			err = l.Ack(c.ctx, nil, true)
		}
		l.Release(c.ctx)
		c.must(err)
	}
}

// presenceCount: Count gives the distinct users of the union of the
// presence sets named, each set the whole buffer's (users of every shard),
// named <prefix>:{presence}:online:<Unix minute> and
// <prefix>:{presence}:active:<UTC day>: only touches that opened a window
// join them, in their minute and their day, at the latest when a flush
// drained their entries; turned-off sets are not written.
func presenceCount(c *check) {
	x, y, z := c.users(0, 2), c.users(3, 1)[0], c.users(2, 1)[0]
	c.record(x[0], 0)
	c.record(x[1], 10*time.Second)
	c.touch(x[0], 20*time.Second, 20*time.Second, false, 40*time.Second)
	c.record(z, 30*time.Second)
	c.record(y, time.Minute+5*time.Second) // the next minute
	c.drain()
	// 2026-03-01T09:30:00Z is Unix minute 29539290.
	online := func(m int) string { return c.prefix + ":{presence}:online:" + strconv.Itoa(29539290+m) }
	day := c.prefix + ":{presence}:active:2026-03-01"
	count := func(want int64, names ...string) {
		c.t.Helper()
		n, err := c.b.Count(c.ctx, names)
		c.must(err)
		equal(c.t, fmt.Sprint("count of ", names), n, want)
	}
	count(0)
	count(3, online(0)) // shards 0 and 2
	count(1, online(1)) // shard 3
	count(4, online(0), online(1))
	count(0, online(2))
	count(0, online(-1), online(2))
	count(4, day)
	count(0, c.prefix+":{presence}:active:2026-03-02")
	count(0, c.prefix+":{0}:online:29539290", c.prefix+":{0}:active:2026-03-01") // the per-shard sets are gone
	c.record(x[0], 2*time.Minute)                                                // one user in two minutes counts once over both
	c.drain()
	if !slices.Contains(c.quirks, CountSumsKeys) {
		count(3, online(0), online(2))
		count(4, online(0), online(1), online(2), day)
	}
	count(1, online(2))
	count(4, day)
}

// idle: a fresh buffer holds nothing, kept nothing aside, has nothing to
// replay, answers, and its breaker is closed.
func idle(c *check) {
	c.sizes(0, 0, 0, 0, 0, 0, 0, 0)
	c.active()
	c.must(c.b.Replay(c.ctx))
	c.must(c.b.Ping(c.ctx))
	equal(c.t, "backlog", c.b.BacklogLen(), 0)
	equal(c.t, "breaker", c.b.Breaker(), "closed")
	c.record(c.users(1, 1)[0], 0)
	c.must(c.b.Replay(c.ctx))
	c.sizes(0, 0, 1, 0, 0, 0, 0, 0)
}

// rename renames oldUID to newUID at the clock's now and checks the
// timestamp moved (an offset from the start, or -1 for none).
func (c *check) rename(oldUID, newUID string, want time.Duration) {
	c.t.Helper()
	got, err := c.b.Rename(c.ctx, oldUID, newUID, c.clock.Now())
	c.must(err)
	w := time.Time{}
	if want >= 0 {
		w = at(want)
	}
	if !got.Equal(w) {
		c.t.Fatalf("rename %s to %s moved %v, want %v", oldUID, newUID, got, w)
	}
}

// renames: Rename copies the old id's pending value to the new id's,
// across shards and within one; the new id keeps a newer value of its own
// and takes a newer one (newest wins); the old id's entry stays (a flush
// before the app's UPDATE of the key writes it to the old row); an id with
// nothing buffered copies nothing.
func renames(c *check) {
	s0, s1, s2 := c.users(0, 2), c.users(1, 2), c.users(2, 2)
	c.record(s0[0], 10*time.Second)
	c.rename(s0[0], s1[0], 10*time.Second) // to another shard, with nothing buffered
	c.newest([]string{s0[0], s1[0]}, 10*time.Second, 10*time.Second)
	c.sizes(1, 0, 1, 0, 0, 0, 0, 0)
	c.record(s1[1], 30*time.Second)
	c.record(s0[1], 20*time.Second)
	c.rename(s0[1], s1[1], 20*time.Second) // onto a newer value: kept
	c.newest([]string{s0[1], s1[1]}, 20*time.Second, 30*time.Second)
	c.rename(s1[1], s1[0], 30*time.Second) // within a shard, onto an older value: raised
	c.newest([]string{s1[0], s1[1]}, 30*time.Second, 30*time.Second)
	c.sizes(2, 0, 2, 0, 0, 0, 0, 0)
	c.rename(s2[0], s2[1], -1) // nothing buffered
	c.newest([]string{s2[0], s2[1]}, -1, -1)
	c.sizes(2, 0, 2, 0, 0, 0, 0, 0)
}

// renameDuringFlush: a flush swapped the old id's entry to in-flight and
// scanned it, and the user was touched again (a newer pending value). The
// rename copies the newest of both to the new id and leaves the old id's
// entries where they are: the flush's requeue of a refused write and its
// acknowledgement go on as without the rename (the refusal counted, the
// older in-flight value not raising the newer pending one), and remove
// nothing of the new id's.
func renameDuringFlush(c *check) {
	old, other := c.users(2, 1)[0], c.users(3, 1)[0]
	c.record(old, 0)
	l := c.lockShard(2)
	ceiling := func() int64 { return buffer.Ceiling(c.clock.Now()) }
	c.swap(l, 1)
	got := c.scan(l, 10)
	equalSlices(c.t, "in flight", values(got), entries(old, micros(0)))
	c.record(old, 2*time.Minute) // pending again, newer
	c.rename(old, other, 2*time.Minute)
	c.newest([]string{old, other}, 2*time.Minute, 2*time.Minute)
	c.sizes(0, 0, 0, 0, 1, 1, 1, 0)
	equal(c.t, "in flight after the rename", len(c.scan(l, 10)), 1)
	c.requeue(l, refused(got, old), ceiling(), 1, old) // refused at a limit of 1: dropped
	c.must(l.Ack(c.ctx, nil, true))
	c.newest([]string{old, other}, 2*time.Minute, 2*time.Minute)
	c.sizes(0, 0, 0, 0, 1, 0, 1, 0)
}
