package lastseen

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/bsm/redislock"
	"github.com/lastseen/lastseen/internal/keys"
	"github.com/lastseen/lastseen/internal/testhooks"
	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"
	"golang.org/x/time/rate"
)

// redisBuffer is the buffer in Redis (Config.Redis), shared by every
// instance of the app: one touchScript round trip per recorded touch, an
// atomic RENAME of a shard's pending hash for the flush, and bsm/redislock
// locks; key layout in buffer.go and internal/keys. The circuit breaker and
// the in-process backlog exist because Redis can fail: a touch Redis does
// not answer within TouchTimeout, or while the breaker is open, is kept in
// the backlog and replayed into Redis by the next flush.
//
// Every Redis call goes through rdb, the plugin's bounded client
// (redisclient.go): opened from Config.Redis by newRedisBuffer, closed by
// close, after which calls go on on the app's client.
type redisBuffer struct {
	cfg          settings // OnlineWindow, ActiveUsersRetention (presenceArgs)
	app          redis.UniversalClient
	rdb          atomic.Pointer[redisClient] // the plugin's client; after close the app's
	prefix       string
	shards       []shardKeys
	throttle     time.Duration
	timeout      time.Duration // TouchTimeout
	lockTTL      time.Duration
	now          func() time.Time
	locker       *redislock.Client
	cb           *gobreaker.CircuitBreaker[[]any]
	backlog      backlog
	stats        *counters
	log          *slog.Logger
	warn         rate.Sometimes
	drops        dropLog                      // counts and logs every timestamp dropped (backlog.go)
	closed       atomic.Bool                  // close ran: nothing will flush the backlog any more
	manifestGone atomic.Bool                  // the last active() found no manifest (manifest.go, restoreManifest)
	hooks        func() *testhooks.FlushHooks // the plugin's test hooks (hooks.go), nil in production
}

var _ buffer = (*redisBuffer)(nil)

// breakerProbes is how many touches the half-open circuit breaker lets
// through to Redis after BreakerCooldown (sony/gobreaker's MaxRequests): as
// many succeeding in a row close it, one failing opens it again. With one,
// a burst of concurrent touches on a recovered Redis would all but one be
// refused (gobreaker.ErrTooManyRequests) and kept in the backlog.
const breakerProbes = 64

// newRedisBuffer opens the buffer on cfg.Redis: its own bounded client
// (newRedisClient), which close closes. hooks returns the plugin's test
// hooks.
func newRedisBuffer(cfg settings, log *slog.Logger, stats *counters, hooks func() *testhooks.FlushHooks) *redisBuffer {
	rdb := newRedisClient(cfg.Redis)
	b := &redisBuffer{
		cfg:      cfg,
		app:      cfg.Redis,
		prefix:   cfg.Prefix,
		throttle: cfg.Throttle,
		timeout:  cfg.TouchTimeout,
		lockTTL:  cfg.LockTTL,
		now:      cfg.Now,
		locker:   redislock.New(rdb.UniversalClient),
		backlog:  backlog{max: cfg.BacklogSize, m: map[string]int64{}},
		stats:    stats,
		log:      log,
		warn:     rate.Sometimes{Interval: 10 * time.Second},
		drops:    dropLog{log: log, stats: stats},
		hooks:    hooks,
	}
	b.rdb.Store(rdb)
	for n := range cfg.Shards {
		b.shards = append(b.shards, newShardKeys(cfg.Prefix, n, cfg.Shards))
	}
	b.cb = gobreaker.NewCircuitBreaker[[]any](gobreaker.Settings{
		Name:        "lastseen-redis",
		Timeout:     cfg.BreakerCooldown,
		MaxRequests: breakerProbes,
		ReadyToTrip: func(c gobreaker.Counts) bool {
			return c.ConsecutiveFailures >= 5
		},
		// The caller's own deadline or cancellation says nothing about Redis.
		IsExcluded: func(err error) bool { return errors.Is(err, errCallerEnded) },
	})
	return b
}

// testHooks returns the plugin's test hooks, nil in production.
func (b *redisBuffer) testHooks() *testhooks.FlushHooks {
	if b.hooks == nil {
		return nil
	}
	return b.hooks()
}

// redis runs fn, one Redis call or pipeline, on the buffer's client,
// bounded by ctx (redisClient.do). When close swapped the plugin's own
// client for the app's while fn ran, fn fails with redis.ErrClosed and runs
// once more on the app's client.
func (b *redisBuffer) redis(ctx context.Context, fn func(context.Context, *redisClient) error) error {
	for {
		c := b.rdb.Load()
		err := c.do(ctx, func(ctx context.Context) error { return fn(ctx, c) })
		if err == nil || !errors.Is(err, redis.ErrClosed) || b.rdb.Load() == c {
			return err
		}
	}
}

// locate returns the keys of uid's shard and uid's bucket in it
// (keys.Locate).
func (b *redisBuffer) locate(uid string) (shardKeys, int) {
	n, bucket := keys.Locate(uid, len(b.shards))
	return b.shards[n], bucket
}

// touch runs touchScript (one EVALSHA) through the breaker within
// TouchTimeout; on failure it keeps the timestamp in the backlog (keep),
// counts it (RedisErrors, or Canceled when the caller's ctx ended first)
// and returns the cause.
func (b *redisBuffer) touch(ctx context.Context, uid string, at, now time.Time, window time.Duration) (bool, time.Duration, error) {
	k, bucket := b.locate(uid)
	ts := micros(at)
	g := b.generation(now)
	hk, ha := presenceArgs(&b.cfg, k, at, now) // presence.go: HyperLogLogs, same EVALSHA
	reply, err := b.call(ctx, func(ctx context.Context, rdb *redisClient) ([]any, error) {
		return touchScript.Run(ctx, rdb,
			append([]string{k.Markers(bucket, g.start), k.Markers(bucket, g.start-g.length), k.Markers(bucket, g.start+g.length), k.pending[bucket]}, hk...),
			append([]any{uid, ts, window.Milliseconds(), ceiling(now), g.into, g.length}, ha...)...).Slice()
	})
	if err != nil {
		kept := b.keep(uid, ts)
		if errors.Is(err, errCallerEnded) {
			b.stats.canceled.Add(1)
		} else {
			b.stats.redisErrors.Add(1)
			msg := "lastseen: redis unavailable, touches kept in memory"
			if errors.Is(err, gobreaker.ErrOpenState) || errors.Is(err, gobreaker.ErrTooManyRequests) {
				msg = "lastseen: circuit breaker open after redis failed, touches kept in memory"
			}
			b.warn.Do(func() { b.log.Warn(msg, "err", err, "backlog", b.backlog.len()) })
		}
		if kept {
			return false, 0, fmt.Errorf("%w: %w", ErrBuffered, err)
		}
		return false, 0, fmt.Errorf("%w: %w", ErrDropped, err)
	}
	recorded, ttl := parseTouchReply(reply, window)
	return recorded, ttl, nil
}

func parseTouchReply(reply []any, window time.Duration) (recorded bool, ttl time.Duration) {
	if len(reply) != 2 {
		return false, 0
	}
	flag, _ := reply[0].(int64)
	ms, _ := reply[1].(int64)
	if ms > window.Milliseconds() {
		ms = window.Milliseconds()
	}
	return flag == 1, time.Duration(ms) * time.Millisecond
}

// call runs fn against Redis through the circuit breaker, giving up after
// the touch timeout. On a client that enforces context deadlines (see
// redisClient) it runs on the caller's goroutine; otherwise on one of its
// own. When the caller's ctx has ended, before the call or during it, the
// error wraps errCallerEnded and ctx's error, and the breaker does not count
// it: the caller gave up, Redis did not fail.
func (b *redisBuffer) call(ctx context.Context, fn func(context.Context, *redisClient) ([]any, error)) ([]any, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%w: %w", errCallerEnded, err)
	}
	return b.cb.Execute(func() ([]any, error) {
		tctx, cancel := context.WithTimeout(ctx, b.timeout)
		defer cancel()
		var v []any
		err := b.redis(tctx, func(ctx context.Context, rdb *redisClient) (err error) {
			v, err = fn(ctx, rdb)
			return err
		})
		switch {
		case err == nil:
			return v, nil
		case ctx.Err() != nil:
			return nil, fmt.Errorf("%w: %w", errCallerEnded, err)
		case tctx.Err() != nil:
			return nil, fmt.Errorf("redis did not answer within %v: %w", b.timeout, err)
		}
		return nil, err
	})
}

// newest reads uids' pending and in-flight values in one pipeline of
// readScript, one call per shard holding some of them (HMGET of both hashes
// of each bucket; with guard through the breaker within TouchTimeout, as a
// touch), and folds in the backlog. When some calls failed it returns what
// the others read, with the error.
func (b *redisBuffer) newest(ctx context.Context, uids []string, now time.Time, guard bool) ([]time.Time, error) {
	out := make([]time.Time, len(uids))
	reads := make(map[int]*shardRead)
	for i, uid := range uids {
		if ts, ok := b.backlog.get(uid); ok {
			out[i] = time.UnixMicro(ts).UTC()
		}
		n, bucket := keys.Locate(uid, len(b.shards))
		r := reads[n]
		if r == nil {
			r = &shardRead{byBucket: map[int][]int{}}
			reads[n] = r
		}
		r.byBucket[bucket] = append(r.byBucket[bucket], i)
	}
	calls := make([]scriptCall, 0, len(reads))
	order := make([][]int, 0, len(reads)) // uids' indexes in each call's reply order
	for n, r := range reads {
		c, idx := r.call(b.shards[n], uids)
		calls = append(calls, c)
		order = append(order, idx)
	}
	var cmds []*redis.Cmd
	pipeline := func(ctx context.Context, rdb *redisClient) (_ []any, err error) {
		cmds, err = evalPipelined(ctx, rdb, readScript, calls)
		return nil, err
	}
	var err error
	if guard {
		if _, err = b.call(ctx, pipeline); err != nil {
			return out, err // the pipeline may still be running: read nothing of it
		}
	} else {
		err = b.redis(ctx, func(ctx context.Context, rdb *redisClient) error {
			_, err := pipeline(ctx, rdb)
			return err
		})
		if err != nil && ctx.Err() != nil { // cut short: the pipeline may still be running (redisClient.do)
			return out, err
		}
	}
	for c, cmd := range cmds {
		reply, _ := cmd.Val().([]any) // nil when the call failed
		for j, v := range reply {
			if s, ok := v.(string); ok && j/2 < len(order[c]) {
				i := order[c][j/2]
				if at, valid := parseMicros(s, now); valid && at.After(out[i]) {
					out[i] = at
				}
			}
		}
	}
	return out, err
}

// shardRead is one shard's part of newest: the indexes of the uids it
// holds, by bucket.
type shardRead struct {
	byBucket map[int][]int
}

// call returns readScript's call for the shard (lua/read.lua) and the uids'
// indexes in the order of its reply.
func (r *shardRead) call(k shardKeys, uids []string) (scriptCall, []int) {
	var c scriptCall
	var order []int
	for bucket, idx := range r.byBucket {
		c.keys = append(c.keys, k.pending[bucket], k.inflight[bucket])
		c.args = append(c.args, len(idx))
		for _, i := range idx {
			c.args = append(c.args, uids[i])
			order = append(order, i)
		}
	}
	return c, order
}

// count sends one PFCOUNT per shard, of the keys keysOf names, in one
// pipeline and returns their sum.
func (b *redisBuffer) count(ctx context.Context, keysOf func(shardKeys) []string) (int64, error) {
	cmds := make([]*redis.IntCmd, len(b.shards))
	err := b.redis(ctx, func(ctx context.Context, rdb *redisClient) error {
		_, err := rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
			for i, k := range b.shards {
				cmds[i] = pipe.PFCount(ctx, keysOf(k)...)
			}
			return nil
		})
		return err
	})
	if err != nil {
		return 0, err
	}
	var sum int64
	for _, cmd := range cmds {
		sum += cmd.Val()
	}
	return sum, nil
}

func (b *redisBuffer) replay(ctx context.Context) error {
	_, err := b.replayBacklog(ctx)
	return err
}

func (b *redisBuffer) ping(ctx context.Context) error {
	return b.redis(ctx, func(ctx context.Context, rdb *redisClient) error { return rdb.Ping(ctx).Err() })
}
func (b *redisBuffer) shared() string        { return b.prefix }
func (b *redisBuffer) backlogLen() int       { return b.backlog.len() }
func (b *redisBuffer) breaker() BreakerState { return BreakerState(b.cb.State().String()) }

// close drops what is left in the backlog (Close's final flush could not
// replay it: nothing will flush it any more), counted in BacklogDropped and
// logged, and closes the client the plugin opened for itself, if any: touches
// and reads after Close go on, on the app's client.
func (b *redisBuffer) close() error {
	b.closed.Store(true)
	b.drops.backlog(len(b.backlog.take()), dropAtClose)
	own := b.rdb.Load()
	if !own.own {
		return nil
	}
	b.rdb.Store(&redisClient{UniversalClient: b.app, kind: "the app's client after Close"})
	if err := own.close(); err != nil {
		return fmt.Errorf("redis client: %w", err)
	}
	return nil
}

// shardCount is Config.Shards.
func (b *redisBuffer) shardCount() int { return len(b.shards) }
