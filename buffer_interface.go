package lastseen

import (
	"context"
	"errors"
	"github.com/lastseen/lastseen/internal/testhooks"
	"time"
)

// buffer is where touches wait for the flush: the one seam between the
// plugin and where it keeps pending timestamps, in the spirit of
// alexedwards/scs's stores. Initialize picks the implementation once
// (openBuffer); everything else talks to this interface:
//
//   - redisBuffer (redis_buffer.go): Config.Redis set. Shared by every
//     instance of the app: throttle markers, pending and in-flight hashes
//     and locks live in Redis; a circuit breaker and an in-process backlog
//     absorb Redis outages.
//   - memoryBuffer (memory_buffer.go): Config.Redis nil. One process only:
//     the same shards, maps and locks in memory, no breaker, no backlog.
//
// Both keep the same contract, which the flush engine (shardRun), the reads
// and the purge rely on: a user is recorded at most once per throttle
// window; the pending value only moves forward; a flush swaps a shard's
// pending set to in-flight atomically, so touches made meanwhile land in a
// new pending set; entries leave in-flight only when acknowledged after the
// database committed them; refused entries go back to pending (newest
// wins). Values are Unix microseconds (UTC) in their stored decimal form.
//
// It is unexported: an app chooses the buffer through Config.Redis, and a
// third implementation would have to honour the flush's crash semantics,
// which no exported contract could check for it.
type buffer interface {
	// touch records uid seen at at, the plugin's clock reading now: when no
	// throttle window is open for uid it opens one, window long (what is
	// left of at's own window, tracker.window), and raises uid's pending
	// value to at (never lowering it), returning recorded == true and ttl
	// == window; inside a window it returns false and the time left in the
	// window. An error means the touch did not reach the buffer (the Redis
	// buffer then kept it in its backlog).
	touch(ctx context.Context, uid string, at, now time.Time, window time.Duration) (recorded bool, ttl time.Duration, err error)
	// newest returns, for each of uids, the newest readable timestamp the
	// buffer holds (pending, in-flight, or kept aside in process), the zero
	// time when none. On an error the result still holds what could be
	// read (at least what the process itself keeps: the Redis buffer's
	// backlog). With guard the read is bounded as a touch is (the Redis
	// buffer's breaker and TouchTimeout): the read overlay runs on the
	// query path.
	newest(ctx context.Context, uids []string, now time.Time, guard bool) ([]time.Time, error)
	// count returns the number of distinct users in the presence sets
	// keysOf names for each shard (presence.go), summed over the shards:
	// PFCOUNT with Redis, exact in memory.
	count(ctx context.Context, keysOf func(shardKeys) []string) (int64, error)
	// replay moves what the buffer kept aside into its shards before a
	// flush (the Redis buffer's backlog; nothing in memory).
	replay(ctx context.Context) error
	// active returns the shards with a pending or an in-flight set.
	active(ctx context.Context) ([]int, error)
	// lockShard takes shard n's flush lock, or returns errNotObtained when
	// another flusher holds it.
	lockShard(ctx context.Context, n int) (shardLease, error)
	// lockPurge takes the purge lock, or returns errNotObtained.
	lockPurge(ctx context.Context) (lease, error)
	// sizes returns each shard's pending and in-flight counts, in shard
	// order.
	sizes(ctx context.Context) ([]shardSizes, error)
	// walk calls fn with shard n's pending (or in-flight) entries, field,
	// value, field, value, ..., page entries at a time at most; an entry
	// may come twice (HSCAN).
	walk(ctx context.Context, n int, inflight bool, page int, fn func(kv []string)) error
	// sample returns the sizes and up to perHash values of every pending
	// and in-flight set (perHash 0: sizes only).
	sample(ctx context.Context, perHash int) ([]shardSizes, []string, error)
	// ping checks that the buffer answers (Initialize logs a failure).
	ping(ctx context.Context) error
	// shared names what the buffer shares with other plugins (the Redis
	// key prefix), "" when it is the plugin's own (memory): two plugins on
	// one *gorm.DB must not share one.
	shared() string
	// backlogLen is the number of users kept in process because the
	// buffer did not answer (0 in memory).
	backlogLen() int
	// breaker is the state of the circuit breaker in front of the buffer
	// (always BreakerClosed in memory).
	breaker() BreakerState
	// close releases what the buffer holds (Close calls it last): the Redis
	// buffer drops, counts and logs what is left in its backlog and closes
	// the client it opened for itself (redisclient.go).
	close() error
}

// lease is a held lock: the purge's, or a shard's (shardLease).
type lease interface {
	// refresh extends the lock; errLockLost when it is no longer held.
	refresh(ctx context.Context) error
	// release gives the lock up; it is bounded even when ctx has ended.
	release(ctx context.Context)
	// keep keeps the lock alive while work under it runs (the Redis locks
	// are refreshed every LockTTL/3, lockkeeper.go; the in-process ones
	// never expire). It returns the context the work runs under, canceled
	// with cause lost when the lock is lost, and stop, to call when the
	// work returns, before release.
	keep(ctx context.Context, lost error) (context.Context, func())
}

// shardLease is one shard's flush lock with the operations a flush runs
// under it; each returns errLockLost when the lock is no longer held.
type shardLease interface {
	lease
	// swap turns the pending set into the in-flight set: it returns the
	// number of entries moved, 0 when nothing was pending, or
	// swapLeftOver when an in-flight set from an earlier flush is still
	// there (it must be drained first).
	swap(ctx context.Context) (int, error)
	// scan returns up to about n in-flight entries (field, value, ...)
	// from cursor and the next cursor, 0 at the end; buckets holds the
	// bucket each entry was read from (one per field), or is nil when the
	// buffer has no buckets (memory).
	scan(ctx context.Context, cursor uint64, n int) (kv []string, buckets []int, next uint64, err error)
	// ack removes fields from the in-flight set, clears their refusal
	// counts and refreshes the lock; final also removes the in-flight set
	// itself.
	ack(ctx context.Context, fields []heldField, final bool) error
	// requeue moves refused entries from in-flight back to pending, newest
	// wins (a pending value above ceiling is replaced), and counts each
	// entry's refusals: an entry refused the limit-th time (0: never) is
	// dropped instead and returned.
	requeue(ctx context.Context, refused []refusal, ceiling int64, limit int) (dropped []string, err error)
}

// heldField is an in-flight field with the bucket scan read it from, so
// that ack and requeue name its hash without hashing the field again;
// bucket -1 (or out of range) has them locate it (keys.Locate).
type heldField struct {
	field  string
	bucket int
}

// swapLeftOver is what shardLease.swap returns when an in-flight set is
// left from an earlier flush (swap.lua's -2).
const swapLeftOver = -2

// shardSizes is one shard's pending and in-flight counts.
type shardSizes struct {
	pending, inflight int64
}

// errNotObtained: another flusher or purge holds the lock (redislock's
// ErrNotObtained for the Redis buffer).
var errNotObtained = errors.New("lastseen: lock held by another flusher or purge")

// openBuffer returns the plugin's buffer: Redis when Config.Redis holds a
// client, else in process. It is the one place that chooses.
func (p *Plugin) openBuffer() buffer {
	if hasRedis(p.cfg) {
		return newRedisBuffer(p.cfg, p.log, &p.stats, func() *testhooks.FlushHooks { return p.hooks })
	}
	return newMemoryBuffer(p.cfg)
}
