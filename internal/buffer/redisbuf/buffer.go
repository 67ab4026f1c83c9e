// Package redisbuf is the Redis buffer of lastseen, shared by every instance
// of an app: one plain HSETNX per touch, an atomic RENAME of a shard's
// pending hashes for the flush, and bsm/redislock locks. A circuit
// breaker and an in-process backlog exist because Redis can fail: a touch
// Redis does not answer within the touch timeout, or while the breaker is
// open, is kept in the backlog and replayed into Redis by the next flush.
// Besides the buffer.Buffer contract it keeps the buffer's manifest (what
// the buffer under a prefix belongs to) and watches Redis's eviction
// policy.
//
// Keys (internal/keys names them; the CLI and the benchmark use it too).
// Every key of shard N carries the hash tag "{N}", so on a Redis Cluster
// one Lua script or RENAME only ever touches keys of one slot (on a single
// server a read of buffered values takes several shards at once); inside a
// shard a user's entries live in one of keys.Buckets(shards) buckets, so
// that each hash stays listpack-encoded (small and compact). The presence
// HyperLogLogs are the whole buffer's, under a hash tag of their own, so
// that a count over several of them is one PFCOUNT:
//
//	<prefix>:{N}:pending:<b>        hash: user id -> Unix microseconds (UTC)
//	<prefix>:{N}:inflight:<b>       hash: the pending hash a flush is writing
//	<prefix>:{N}:window:<b>:<e>     hash: user id -> Unix microseconds of the
//	                                touch that opened the user's throttle window
//	                                ending at e (Unix ms); "" once moved
//	<prefix>:{N}:windows            hash: window end e -> entries moved out
//	<prefix>:{N}:lock               redislock lock of the shard's flusher
//	<prefix>:{N}:refusals           hash: user id -> times the database refused its entry
//	<prefix>:{presence}:online:<m>  HyperLogLog of the users whose entry a flush
//	                                of any shard drained with a timestamp in
//	                                Unix minute m
//	<prefix>:{presence}:active:<d>  HyperLogLog of the same per UTC day
//	<prefix>:purge:lock             redislock lock of the session purge
//	<prefix>:rule:<name>:lock       redislock lock of the inactivity rule <name>
//	<prefix>:manifest               hash: what the buffer is
//
// Throttle windows. Windows are fixed periods of the clock (the plugin
// names each by its end), so a touch is one plain command: HSETNX of the
// user's timestamp into the hash of its window and bucket, whose reply
// tells a recorded touch (1: the field was new) from a throttled one (0).
// The field is both the throttle marker and the pending timestamp, about
// 20 bytes of a listpack-encoded hash. A process's first touch of a window
// in a shard (and one a second after, in case Redis lost it) also
// registers the window in the shard's hash of windows, in the same
// pipelined round trip, and every flush tick of every instance (Active)
// registers again each window that instance's touches wrote to (or may
// have: a reply lost) since its last tick, and the last two it registered
// until they have been over for a throttle window, so that entries written
// after Redis lost its data, or after a flush deleted their window, are
// moved too. The flush's swap moves a window's new entries to
// the pending hashes (newest wins) and leaves "" in their place, so the
// user stays throttled until the window ends; the first swap after the
// window ends deletes its hashes, and its registration once it has been
// over for a throttle window, the tolerance for clocks of other instances
// running behind (their touches are still found, and may record a user a
// second time). A recorded touch that returns when its
// window has been over for that long (its command may have reached Redis
// after the swap deleted the window, and recreated its hash) registers the
// window again. A late touch, whose window is already
// over, raises the pending value at once (merge script) and opens none.
//
// Every Redis call goes through the buffer's bounded client: opened from
// Options.Client by New (a copy with ContextTimeoutEnabled, or the app's
// client as it is), closed by Close, after which calls go on on the app's
// client.
package redisbuf

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/bsm/redislock"
	"github.com/lastseen/lastseen/internal/buffer"
	"github.com/lastseen/lastseen/internal/keys"
	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"
	"golang.org/x/time/rate"
)

// Options configure a Buffer. Zero values take the defaults given.
type Options struct {
	// Client is the app's Redis client (required). A *redis.Client or
	// *redis.ClusterClient without ContextTimeoutEnabled is copied with it
	// set (its own connection pool, closed by Close); any other client is
	// used as it is, each call on a goroutine bounded by its context.
	Client redis.UniversalClient
	// Prefix starts every key (required).
	Prefix string
	// Shards is the number of shards, 1 to keys.MaxShards. Default 16.
	Shards int
	// Throttle is the throttle window: how long the swap keeps a window
	// after its end. Default 5m.
	Throttle time.Duration
	// TouchTimeout bounds a touch's (and a guarded read's) call. Default
	// 20ms.
	TouchTimeout time.Duration
	// LockTTL is the time to live of the locks, refreshed every third of it
	// while work runs under them. Default 30s.
	LockTTL time.Duration
	// BacklogSize caps the backlog, in users. Default 100,000.
	BacklogSize int
	// BreakerCooldown is how long the circuit breaker stays open after 5
	// touches in a row failed. Default 5s.
	BreakerCooldown time.Duration
	// RequireNoEviction makes the eviction watch warn about a policy it
	// cannot read.
	RequireNoEviction bool
	// Presence is which presence sets the entries a flush drains join
	// (Scan adds them).
	Presence buffer.Presence
	// Now is the plugin's clock. Default time.Now.
	Now func() time.Time
	// Logger receives the buffer's warnings. Default slog.Default().
	Logger *slog.Logger
	// LogLimited logs a warning that may repeat often (touches dropped),
	// rate-limited per message. Default: Logger at the given level, every
	// time.
	LogLimited func(level slog.Level, msg string, args ...any)
	// Counters are the plugin's counters the buffer adds to; a nil one is
	// the buffer's own.
	Counters Counters
	// Hooks are called at fixed points, for tests; nil ones are skipped.
	Hooks Hooks
}

// Counters are the cumulative counters the buffer adds to.
type Counters struct {
	// RedisErrors counts touches Redis did not answer in time, or refused
	// by the open breaker.
	RedisErrors *atomic.Int64
	// Canceled counts touches whose caller's context ended first.
	Canceled *atomic.Int64
	// Backlogged counts touches kept in the backlog.
	Backlogged *atomic.Int64
	// BacklogDropped counts touches that never reached Redis and were
	// dropped: the backlog was full, closed, or a failed replay's entries
	// no longer fitted.
	BacklogDropped *atomic.Int64
	// Evictions counts the keys Redis evicted between two checks of the
	// eviction watch.
	Evictions *atomic.Int64
}

// Hooks are called at fixed points of a flush and of a lock's keeper, to
// stop a test exactly there.
type Hooks struct {
	// BacklogTaken: Replay took n entries out of the backlog; touches that
	// fail now find an empty backlog.
	BacklogTaken func(n int)
	// LockRefreshed: the lock under key was refreshed by its keeper.
	LockRefreshed func(key string)
}

// Buffer is the Redis buffer. Create it with New.
type Buffer struct {
	presence     buffer.Presence
	presenceKeys keys.Presence
	app          redis.UniversalClient
	rdb          atomic.Pointer[client] // the buffer's client; after Close the app's
	prefix       string
	shards       []shardKeys
	throttle     time.Duration
	timeout      atomic.Int64 // TouchTimeout, ns
	lockTTL      time.Duration
	now          func() time.Time
	locker       *redislock.Client
	cb           *gobreaker.CircuitBreaker[[]any]
	backlog      backlog
	stats        Counters
	log          *slog.Logger
	warn         rate.Sometimes
	drops        dropLog     // counts and logs every timestamp dropped
	closed       atomic.Bool // Close ran: nothing will flush the backlog any more
	manifestGone atomic.Bool // the last Active found no manifest
	eviction     *EvictionWatch
	hooks        Hooks
	perShard     atomic.Bool // the server refused a read across shards: reads go one shard per call (read.go)
}

var (
	_ buffer.Buffer  = (*Buffer)(nil)
	_ buffer.Backlog = (*Buffer)(nil)
)

// breakerProbes is how many touches the half-open circuit breaker lets
// through to Redis after BreakerCooldown (sony/gobreaker's MaxRequests): as
// many succeeding in a row close it, one failing opens it again. With one,
// a burst of concurrent touches on a recovered Redis would all but one be
// refused (gobreaker.ErrTooManyRequests) and kept in the backlog.
const breakerProbes = 64

// ErrCallerEnded is wrapped by the error of a call whose caller's context
// ended before Redis answered (with the context's error): the touch was
// kept in the backlog, and the circuit breaker did not count it.
var ErrCallerEnded = errors.New("the caller's context ended")

// New opens the buffer on o.Client: its own bounded client, which Close
// closes. It does no I/O.
func New(o Options) *Buffer {
	o = withDefaults(o)
	rdb := newClient(o.Client)
	b := &Buffer{
		presence:     o.Presence,
		presenceKeys: keys.ForPresence(o.Prefix),
		app:          o.Client,
		prefix:       o.Prefix,
		throttle:     o.Throttle,
		lockTTL:      o.LockTTL,
		now:          o.Now,
		locker:       redislock.New(rdb.UniversalClient),
		backlog:      backlog{max: o.BacklogSize, m: map[string]int64{}},
		stats:        o.Counters,
		log:          o.Logger,
		warn:         rate.Sometimes{Interval: 10 * time.Second},
		drops:        dropLog{log: o.LogLimited, dropped: o.Counters.BacklogDropped},
		hooks:        o.Hooks,
	}
	b.timeout.Store(int64(o.TouchTimeout))
	b.rdb.Store(rdb)
	for n := range o.Shards {
		b.shards = append(b.shards, newShardKeys(o.Prefix, n, o.Shards))
	}
	b.cb = gobreaker.NewCircuitBreaker[[]any](gobreaker.Settings{
		Name:        "lastseen-redis",
		Timeout:     o.BreakerCooldown,
		MaxRequests: breakerProbes,
		ReadyToTrip: func(c gobreaker.Counts) bool {
			return c.ConsecutiveFailures >= 5
		},
		// The caller's own deadline or cancellation says nothing about Redis.
		IsExcluded: func(err error) bool { return errors.Is(err, ErrCallerEnded) },
	})
	b.eviction = newEvictionWatch(b.rdb.Load, o.Logger, o.Now, o.Counters.Evictions, o.RequireNoEviction)
	return b
}

// withDefaults fills o's zero values.
func withDefaults(o Options) Options {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	if o.Shards <= 0 {
		o.Shards = 16
	}
	def(&o.Throttle, 5*time.Minute)
	def(&o.TouchTimeout, 20*time.Millisecond)
	def(&o.LockTTL, 30*time.Second)
	def(&o.BreakerCooldown, 5*time.Second)
	if o.BacklogSize <= 0 {
		o.BacklogSize = 100_000
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.LogLimited == nil {
		l := o.Logger
		o.LogLimited = func(level slog.Level, msg string, args ...any) { l.Log(context.Background(), level, msg, args...) }
	}
	for _, c := range []**atomic.Int64{&o.Counters.RedisErrors, &o.Counters.Canceled, &o.Counters.Backlogged,
		&o.Counters.BacklogDropped, &o.Counters.Evictions} {
		if *c == nil {
			*c = new(atomic.Int64)
		}
	}
	return o
}

// redis runs fn, one Redis call or pipeline, on the buffer's client,
// bounded by ctx (client.do). When Close swapped the buffer's own client
// for the app's while fn ran, fn fails with whatever the closing client
// gives (redis.ErrClosed before the call took a connection, net.ErrClosed
// for a connection closed under it, a Cluster's "connection marked for
// handoff") and runs once more on the app's client, unless Redis itself
// answered with an error or ctx ended.
func (b *Buffer) redis(ctx context.Context, fn func(context.Context, *client) error) error {
	_, err := send(b, ctx, fn, func(ctx context.Context, c *client, fn func(context.Context, *client) error) (struct{}, error) {
		return struct{}{}, fn(ctx, c)
	})
	return err
}

// send is redis for fn(ctx, rdb, a), a function of a value rather than a
// closure (run).
func send[A, R any](b *Buffer, ctx context.Context, a A, fn func(context.Context, *client, A) (R, error)) (R, error) {
	for {
		c := b.rdb.Load()
		r, err := run(ctx, c, a, fn)
		var reply redis.Error
		if err == nil || b.rdb.Load() == c || ctx.Err() != nil || errors.As(err, &reply) {
			return r, err
		}
	}
}

// locate returns the keys of uid's shard and uid's bucket in it
// (keys.Locate).
func (b *Buffer) locate(uid string) (*shardKeys, int) {
	n, bucket := keys.Locate(uid, len(b.shards))
	return &b.shards[n], bucket
}

// touchTimeout is TouchTimeout now.
func (b *Buffer) touchTimeout() time.Duration { return time.Duration(b.timeout.Load()) }

// Touch sends HSETNX of uid's timestamp into the hash of the window ending
// at end (pipelined with the window's registration when due; see the
// package doc), or, for a late touch, one merge script call, through the
// breaker within TouchTimeout. It writes no presence set: the flush adds
// the entries it drains (Scan). On failure it keeps the timestamp in the
// backlog (or drops it when the backlog is full or closed), counts it
// (Counters.RedisErrors, or Canceled when the caller's ctx ended first) and
// returns a *buffer.TouchError wrapping the cause.
func (b *Buffer) Touch(ctx context.Context, uid string, at, now, end time.Time) (bool, time.Duration, error) {
	k, bucket := b.locate(uid)
	cmd := touchCmd{uid: uid, ts: buffer.Micros(at)}
	ttl := end.Sub(now)
	e := end.UnixMilli()
	var register bool
	if ttl <= 0 {
		cmd.late, cmd.key, cmd.ceiling = true, k.pending[bucket], buffer.Ceiling(now)
	} else {
		w := k.window(e)
		cmd.key = k.WindowKey(bucket, w.end)
		if register = k.reg.due(e, now); register {
			cmd.windows, cmd.end = k.windows, w.end
		}
	}
	reply, err := call(b, ctx, cmd, sendTouch)
	if ttl > 0 {
		k.reg.wrote(e)
	}
	if err != nil {
		kept := b.keep(uid, cmd.ts)
		if errors.Is(err, ErrCallerEnded) {
			b.stats.Canceled.Add(1)
		} else {
			b.stats.RedisErrors.Add(1)
			msg := "lastseen: redis unavailable, touches kept in memory"
			if errors.Is(err, gobreaker.ErrOpenState) || errors.Is(err, gobreaker.ErrTooManyRequests) {
				msg = "lastseen: circuit breaker open after redis failed, touches kept in memory"
			}
			b.warn.Do(func() { b.log.Warn(msg, "err", err, "backlog", b.backlog.len()) })
		}
		return false, 0, &buffer.TouchError{Kept: kept, Err: err}
	}
	if ttl <= 0 {
		return true, 0, nil
	}
	if register {
		k.reg.done(e, now)
	}
	if reply != nil && b.now().UnixMilli() >= e+b.throttle.Milliseconds() {
		b.strayed(ctx, k, e, uid, cmd.ts)
	}
	return reply != nil, ttl, nil
}

// touchCmd is a touch's Redis command: an HSETNX of uid's timestamp ts
// (Unix µs) into key, the hash of uid's bucket in the current window,
// pipelined after HSETNX windows end 0 (the window's registration) when
// windows is set; or, for a late touch, the merge script on key, the
// bucket's pending hash, with the flush's ceiling.
type touchCmd struct {
	uid, key     string
	ts, ceiling  int64
	late         bool
	windows, end string
}

// sendTouch sends c on rdb; the reply is non-nil when the touch was
// recorded.
func sendTouch(ctx context.Context, rdb *client, c touchCmd) ([]any, error) {
	switch {
	case c.late:
		return nil, mergeScript.Run(ctx, rdb, []string{c.key}, c.ceiling, 1, c.uid, c.ts).Err()
	case c.windows == "":
		ok, err := rdb.HSetNX(ctx, c.key, c.uid, c.ts).Result()
		return touchReply(ok), err
	}
	// The registration first: a server that keeps the entry (an AOF or RDB
	// cut between the two) keeps its registration too.
	pipe := rdb.Pipeline()
	pipe.HSetNX(ctx, c.windows, c.end, 0)
	set := pipe.HSetNX(ctx, c.key, c.uid, c.ts)
	_, err := pipe.Exec(ctx)
	return touchReply(set.Val()), err
}

// strayed handles a recorded touch whose command may have reached Redis
// after a flush's swap deleted its window: the touch was in flight until
// the window had been over for a throttle window (the swap's criterion, on
// this process's clock). Its HSETNX then recreated the window's hash, which
// no registration names: the window is registered again, so that the next
// flush moves the entry and deletes the hash; when Redis does not take the
// registration the timestamp goes to the backlog, as in an outage.
func (b *Buffer) strayed(ctx context.Context, k *shardKeys, e int64, uid string, ts int64) {
	_, err := b.call(ctx, func(ctx context.Context, rdb *client) ([]any, error) {
		return nil, rdb.HSetNX(ctx, k.windows, strconv.FormatInt(e, 10), 0).Err()
	})
	if err != nil {
		b.keep(uid, ts)
	}
}

// The replies of Touch's call: non-nil when the touch was recorded.
var recordedReply = []any{}

func touchReply(recorded bool) []any {
	if recorded {
		return recordedReply
	}
	return nil
}

// call runs fn against Redis through the circuit breaker, giving up after
// the touch timeout (callFn).
func (b *Buffer) call(ctx context.Context, fn func(context.Context, *client) ([]any, error)) ([]any, error) {
	return call(b, ctx, fn, func(ctx context.Context, rdb *client, fn func(context.Context, *client) ([]any, error)) ([]any, error) {
		return fn(ctx, rdb)
	})
}

// call runs fn(ctx, rdb, a) against Redis through the circuit breaker,
// giving up after the touch timeout. On a client that enforces context
// deadlines (see client) it runs on the caller's goroutine; otherwise on
// one of its own. When the caller's ctx has ended, before the call or
// during it, the error wraps ErrCallerEnded and ctx's error, and the
// breaker does not count it: the caller gave up, Redis did not fail.
func call[A any](b *Buffer, ctx context.Context, a A, fn func(context.Context, *client, A) ([]any, error)) ([]any, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCallerEnded, err)
	}
	return b.cb.Execute(func() ([]any, error) {
		timeout := b.touchTimeout()
		tctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		v, err := send(b, tctx, a, fn)
		switch {
		case err == nil:
			return v, nil
		case ctx.Err() != nil:
			return nil, fmt.Errorf("%w: %w", ErrCallerEnded, err)
		case tctx.Err() != nil:
			return nil, fmt.Errorf("redis did not answer within %v: %w", timeout, err)
		}
		return nil, err
	})
}

// Count sends one PFCOUNT of names (keys.Presence's, all in one cluster
// slot).
func (b *Buffer) Count(ctx context.Context, names []string) (int64, error) {
	if len(names) == 0 {
		return 0, nil
	}
	var n int64
	err := b.redis(ctx, func(ctx context.Context, rdb *client) (err error) {
		n, err = rdb.PFCount(ctx, names...).Result()
		return err
	})
	return n, err
}

// Replay writes the backlog into the pending hashes, one merge script call
// per shard, newest wins; what it could not write goes back into the
// backlog, and after a call that timed out the other shards wait for the
// next flush. The error names every failed call (a timeout once).
func (b *Buffer) Replay(ctx context.Context) error {
	_, err := b.replayBacklog(ctx)
	return err
}

// Ping sends PING.
func (b *Buffer) Ping(ctx context.Context) error {
	return b.redis(ctx, func(ctx context.Context, rdb *client) error { return rdb.Ping(ctx).Err() })
}

// Shared returns the key prefix: plugins sharing it share the buffer.
func (b *Buffer) Shared() string { return b.prefix }

// BacklogLen returns the number of users in the backlog.
func (b *Buffer) BacklogLen() int { return b.backlog.len() }

// Breaker returns the circuit breaker's state: "closed", "half-open" or
// "open".
func (b *Buffer) Breaker() string { return b.cb.State().String() }

// Close drops what is left in the backlog (the plugin's final flush could
// not replay it: nothing will flush it any more), counted in
// Counters.BacklogDropped and logged, and closes the client the buffer
// opened for itself, if any: touches and reads after Close go on, on the
// app's client.
func (b *Buffer) Close() error {
	b.closed.Store(true)
	b.drops.backlog(len(b.backlog.take()), dropAtClose)
	own := b.rdb.Load()
	if !own.own {
		return nil
	}
	b.rdb.Store(&client{UniversalClient: b.app, kind: "the app's client after Close"})
	if err := own.close(); err != nil {
		return fmt.Errorf("redis client: %w", err)
	}
	return nil
}

// The functions below are for tests, not methods, so that a binary that
// never calls them leaves them out.

// Client returns the client b sends on now: own when b opened it (a copy
// of the app's options, closed by Close), deadlines when it enforces
// context deadlines on its sockets.
func Client(b *Buffer) (c redis.UniversalClient, own, deadlines bool) {
	cl := b.rdb.Load()
	return cl.UniversalClient, cl.own, cl.deadlines
}

// BreakerCounts returns b's circuit breaker's counts (sony/gobreaker's).
func BreakerCounts(b *Buffer) gobreaker.Counts { return b.cb.Counts() }

// SetTouchTimeout changes b's TouchTimeout from the next touch on.
func SetTouchTimeout(b *Buffer, d time.Duration) { b.timeout.Store(int64(d)) }
