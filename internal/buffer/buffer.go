// Package buffer is the seam between the lastseen plugin and where it keeps
// pending timestamps until a flush writes them to the database: the Buffer
// interface, the leases a flush and a purge hold, the types and sentinel
// errors they share, and the stored form of a timestamp. In the manner of
// one store per package, two packages implement it:
//
//   - redisbuf: the buffer in Redis, shared by every instance of an app.
//     Throttle windows, pending and in-flight sets and locks live in Redis;
//     a circuit breaker and an in-process backlog absorb Redis outages.
//   - memory: the buffer in process, for an app that runs as one instance:
//     the same shards, sets and locks in maps and mutexes, no breaker, no
//     backlog.
//
// Package buffertest is the contract suite both run.
//
// The contract, which the plugin's flush engine, its reads and its purge
// rely on: a user is recorded at most once per throttle window; the pending
// value only moves forward; a flush swaps a shard's pending set to in-flight
// atomically, so touches made meanwhile land in a new pending set; entries
// leave in-flight only when acknowledged after the database committed them;
// refused entries go back to pending (newest wins), and an entry refused
// the limit-th time is dropped. Values are Unix microseconds (UTC) in their
// stored decimal form (Micros, ParseMicros).
//
// Users are spread over shards by keys.Locate, so both implementations hold
// the same users in the same shard; every shard is flushed under its own
// lock.
package buffer

import (
	"context"
	"errors"
	"time"
)

// Buffer is where touches wait for the flush. Every method is safe for
// concurrent use. Shard numbers n are 0 <= n < the shard count the buffer
// was opened with.
type Buffer interface {
	// Touch records uid seen at at, the plugin's clock reading now, in the
	// throttle window that ends at end (the plugin's fixed windows: every
	// instance names the same window by the same end). When end is after
	// now and uid has no entry in that window yet, it records at there
	// (the flush raises uid's pending value to it, never lowering it) and
	// returns recorded == true; when uid has one, false. ttl is the time
	// left until end in both cases. When end is not after now (a late
	// touch: its window is over), it raises uid's pending value to at at
	// once, opens no window, and returns true and 0. A non-nil error means
	// the touch did not reach the store: it is then a *TouchError, which
	// says whether the timestamp was kept in process for the next flush
	// (the Redis buffer's backlog) or lost.
	Touch(ctx context.Context, uid string, at, now, end time.Time) (recorded bool, ttl time.Duration, err error)
	// Newest sets out[i] to the newest readable timestamp the buffer holds
	// for uids[i] (pending, in-flight, or kept aside in process), or to the
	// zero time when none; out is as long as uids (the caller's, so that a
	// read on the query path need not allocate it); values past
	// ParseMicros's limit at now are not readable. uids may repeat an id.
	// On an error out still holds what could be read (at least what the
	// process itself keeps). With guard the read is bounded as a touch is
	// (the Redis buffer's breaker and touch timeout): the read overlay runs
	// on the query path.
	Newest(ctx context.Context, uids []string, out []time.Time, now time.Time, guard bool) error
	// Count returns the number of distinct users in the union of the
	// presence sets names names (the names Presence gives: each set holds
	// the users of every shard): approximate (HyperLogLog, 0.81% standard
	// error) with Redis, one PFCOUNT; exact in memory. A set whose time to
	// live has passed counts as empty; no names count 0.
	Count(ctx context.Context, names []string) (int64, error)
	// Rename copies oldUID's buffered timestamp to newUID, for a user whose
	// primary key changes: the newest of oldUID's pending, in-flight and
	// kept-aside (backlog) values raises newUID's pending value (newest
	// wins; a pending value beyond Ceiling(now) is replaced, as a touch
	// does). oldUID's entries and refusal count stay: a flush that runs
	// before the app's UPDATE of the key writes them to the old row, which
	// the UPDATE carries to the new key, and finds no row for newUID yet
	// (Unknown); one after it writes newUID's copy and finds no row for
	// oldUID. Either way the row gets the timestamp. It returns the
	// timestamp copied, the zero time when oldUID had none. Throttle
	// windows are not copied: newUID's next touch opens a window of its
	// own. oldUID and newUID differ.
	Rename(ctx context.Context, oldUID, newUID string, now time.Time) (time.Time, error)
	// Replay moves what the buffer kept aside in process into its shards
	// before a flush (the Redis buffer's backlog); nil when there was
	// nothing to move. Entries it could not move stay kept aside.
	Replay(ctx context.Context) error
	// Active returns, in ascending order, the shards with a pending or an
	// in-flight set.
	Active(ctx context.Context) ([]int, error)
	// LockShard takes shard n's flush lock, or returns an error wrapping
	// ErrNotObtained when another holder has it.
	LockShard(ctx context.Context, n int) (ShardLease, error)
	// LockPurge takes the purge lock, or returns an error wrapping
	// ErrNotObtained when another holder has it.
	LockPurge(ctx context.Context) (Lease, error)
	// LockRule takes the lock of the inactivity rule name (one per rule,
	// apart from the purge lock and from each other), or returns an error
	// wrapping ErrNotObtained when another holder has it.
	LockRule(ctx context.Context, name string) (Lease, error)
	// Sizes returns each shard's pending and in-flight counts, in shard
	// order.
	Sizes(ctx context.Context) ([]Sizes, error)
	// Walk calls fn with shard n's pending (or, with inflight, in-flight)
	// entries as field, value, field, value, ..., about page entries a call
	// (page < 1 counts as 1; a Redis hash small enough for its compact
	// encoding comes whole); an entry may come twice (Redis HSCAN), none is
	// left out. fn must not keep kv.
	Walk(ctx context.Context, n int, inflight bool, page int, fn func(kv []string)) error
	// Sample returns every shard's sizes, as Sizes does, and up to about
	// perHash values (stored form) of each shard's pending and of its
	// in-flight set, chosen at random: the whole set when it holds at most
	// perHash entries; perHash 0 returns sizes only.
	Sample(ctx context.Context, perHash int) ([]Sizes, []string, error)
	// Ping checks that the buffer's store answers.
	Ping(ctx context.Context) error
	// Shared names what the buffer shares with other plugins (the Redis key
	// prefix), or "" when it is its plugin's own (memory): two plugins on
	// one database handle must not share one.
	Shared() string
	// BacklogLen is the number of users kept in process because the store
	// did not answer (always 0 in memory).
	BacklogLen() int
	// Breaker is the state of the circuit breaker in front of the store:
	// "closed", "half-open" or "open" (always "closed" in memory).
	Breaker() string
	// Close releases what the buffer holds; the plugin calls it last.
	// Touches and reads after Close still work (the Redis buffer drops, counts
	// and logs what is left of its backlog, and goes on on the app's client).
	Close() error
}

// Lease is a held lock: the purge's, or a shard's (ShardLease).
type Lease interface {
	// Refresh extends the lock; it returns ErrLockLost when the lock is no
	// longer held.
	Refresh(ctx context.Context) error
	// Release gives the lock up; it is bounded even when ctx has ended, and
	// a second call does nothing.
	Release(ctx context.Context)
	// Keep keeps the lock alive while work under it runs (the Redis locks
	// are refreshed every third of their time to live; the in-process ones
	// never expire). It returns the context the work runs under, canceled
	// with cause lost when the lock is lost, and stop, to call when the work
	// returns, before Release.
	Keep(ctx context.Context, lost error) (context.Context, func())
}

// ShardLease is one shard's flush lock with the operations a flush runs
// under it; each returns ErrLockLost when the lock is no longer held.
type ShardLease interface {
	Lease
	// Swap turns the pending set into the in-flight set atomically: touches
	// after it land in a new pending set. It returns the number of entries
	// moved, 0 when nothing was pending, or ErrLeftOver (and moves nothing)
	// when an in-flight set from an earlier flush is still there: drain that
	// one first.
	Swap(ctx context.Context) (int, error)
	// Scan returns up to about n in-flight entries (field, value, ...) from
	// cursor and the next cursor, 0 at the end; start at 0. A scan from 0 to
	// the end returns every entry in flight for the whole scan at least
	// once, whatever Ack removes in between. buckets holds the bucket each
	// field was read from (one per field), or is nil when the buffer has no
	// buckets (memory).
	Scan(ctx context.Context, cursor uint64, n int) (kv []string, buckets []int, next uint64, err error)
	// Ack removes fields from the in-flight set, clears their refusal counts
	// and refreshes the lock; final also removes the in-flight set itself,
	// with whatever it still holds.
	Ack(ctx context.Context, fields []Held, final bool) error
	// Requeue moves refused entries from in-flight back to pending, newest
	// wins (a pending value above ceiling, Unix microseconds, is replaced),
	// and counts each entry's refusals: an entry refused the limit-th time
	// (limit 0: never) is dropped instead, its count cleared, and its field
	// returned in dropped, in the order given. An entry no longer in flight
	// (its hash lost meanwhile) is skipped: neither requeued nor counted.
	Requeue(ctx context.Context, refused []Refused, ceiling int64, limit int) (dropped []string, err error)
}

// Held is an in-flight field with the bucket Scan read it from, so that Ack
// names its set without locating the field again; a Bucket of -1 (or out
// of range) has the buffer locate it (keys.Locate).
type Held struct {
	Field  string
	Bucket int
}

// Refused is an in-flight entry the database refused: its field, its value
// in the stored form, and the bucket Scan read it from (-1: unknown, as in
// Held).
type Refused struct {
	Field, Value string
	Bucket       int
}

// Sizes is one shard's pending and in-flight counts. Pending counts the
// entries of the pending set and those recorded in throttle windows that
// no flush moved to it yet (the Redis buffer's), so a user recorded in two
// windows since the last flush counts twice until the next one. Partial
// reports that a Sample's values left out some of those window entries.
type Sizes struct {
	Pending, InFlight int64
	Partial           bool
}

// Backlog is what a buffer that keeps touches in process when its store did
// not answer (the Redis buffer's backlog) offers a flush whose Replay
// failed: the flush then writes those entries to the database itself. The
// memory buffer does not implement it.
type Backlog interface {
	// TakeBacklog empties the backlog and returns it: user id -> Unix
	// microseconds.
	TakeBacklog() map[string]int64
	// ReturnBacklog puts entries back (newest per user wins), counting and
	// logging those that no longer fit.
	ReturnBacklog(m map[string]int64)
}

// The sentinel errors of the contract; test with errors.Is.
var (
	// ErrNotObtained: another flusher or purge holds the lock (LockShard,
	// LockPurge, LockRule).
	ErrNotObtained = errors.New("lastseen: lock held by another flusher or purge")
	// ErrLockLost: a lease's lock expired or was taken over; the work under
	// it must stop (its shard's in-flight set stays for the next flush).
	ErrLockLost = errors.New("lastseen: lost the shard lock to another flusher")
	// ErrLeftOver: Swap found an in-flight set left by an earlier flush.
	ErrLeftOver = errors.New("lastseen: an in-flight set is left from an earlier flush")
)

// TouchError is the error of a touch that did not reach the buffer's store
// (Redis did not answer in time, the breaker was open, the caller's context
// ended): Kept reports that the timestamp was kept in process, for the next
// flush to write, rather than dropped (the backlog was full, or closed); Err
// is the cause.
type TouchError struct {
	Kept bool
	Err  error
}

// Error returns "kept in process: <cause>" or "dropped: <cause>".
func (e *TouchError) Error() string {
	if e.Kept {
		return "kept in process: " + e.Err.Error()
	}
	return "dropped: " + e.Err.Error()
}

// Unwrap returns the cause.
func (e *TouchError) Unwrap() error { return e.Err }
