package lastseen

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync/atomic"
	"time"

	"github.com/maypok86/otter/v2"
	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"
	"golang.org/x/time/rate"
)

// tracker is the request path: it normalizes ids, answers from the local
// throttle cache, runs touchScript under a time budget and a circuit
// breaker, and keeps what it could not send in a bounded backlog.
type tracker struct {
	rdb      atomic.Pointer[redisClient] // the plugin's client; after Close the app's (Plugin.Close)
	shards   []shardKeys
	throttle time.Duration
	timeout  time.Duration
	ids      idCodec
	now      func() time.Time
	ticks    func() int64                  // nanoseconds on the clock of the local cache's deadlines
	cache    *otter.Cache[cacheKey, int64] // value: deadline in ticks()
	breaker  *gobreaker.CircuitBreaker[[]any]
	backlog  backlog
	stats    *counters
	log      *slog.Logger
	warn     rate.Sometimes
	drops    dropLog     // counts and logs every timestamp dropped (backlog.go)
	closed   atomic.Bool // Close ran: nothing will flush the backlog any more
}

// newTracker builds the request path. With realClock (Config.Now unset) the
// local cache's deadlines run on the monotonic clock alone, one vDSO read
// where time.Now makes two: it is most of the cost of a cached Touch.
func newTracker(cfg Config, rdb *redisClient, realClock bool, ids idCodec, log *slog.Logger, stats *counters) (*tracker, error) {
	t := &tracker{
		throttle: cfg.Throttle,
		timeout:  cfg.TouchTimeout,
		ids:      ids,
		now:      cfg.Now,
		backlog:  backlog{max: cfg.BacklogSize, m: map[string]int64{}},
		stats:    stats,
		log:      log,
		warn:     rate.Sometimes{Interval: 10 * time.Second},
		drops:    dropLog{log: log, stats: stats},
	}
	t.rdb.Store(rdb)
	if realClock {
		epoch := time.Now()
		t.ticks = func() int64 { return int64(time.Since(epoch)) }
	} else {
		t.ticks = func() int64 { return cfg.Now().UnixNano() }
	}
	for n := range cfg.Shards {
		t.shards = append(t.shards, newShardKeys(cfg.Prefix, n))
	}
	if cfg.LocalCacheSize > 0 {
		// No otter expiry: the value is the entry's deadline on the plugin's
		// clock, checked on every hit (an entry set from a marker's PTTL
		// ends before a full window), and otter's own expiry would read the
		// real clock on every lookup. Stale entries are overwritten on the
		// next miss or evicted by size.
		c, err := otter.New(&otter.Options[cacheKey, int64]{
			MaximumSize: cfg.LocalCacheSize,
		})
		if err != nil {
			return nil, fmt.Errorf("local cache: %v", err)
		}
		t.cache = c
	}
	t.breaker = gobreaker.NewCircuitBreaker[[]any](gobreaker.Settings{
		Name:    "lastseen-redis",
		Timeout: cfg.BreakerCooldown,
		ReadyToTrip: func(c gobreaker.Counts) bool {
			return c.ConsecutiveFailures >= 5
		},
		// The caller's own deadline or cancellation says nothing about Redis.
		IsExcluded: func(err error) bool { return errors.Is(err, errCallerEnded) },
	})
	return t, nil
}

func (t *tracker) close() {
	if t.cache != nil {
		t.cache.StopAllGoroutines()
	}
}

// cacheKey identifies a user in the local cache without allocating: integer
// ids by value, string ids by their text.
type cacheKey struct {
	s       string
	n       uint64
	isNum   bool
	isFloat bool // a float64 id: its own entry, as a float may be refused where the integer is not
}

// Negative integers take the slow path: as a uint64 key they would collide
// with a large unsigned id that the primary key type may refuse.
func quickKey(id any) (cacheKey, bool) {
	switch v := id.(type) {
	case string:
		return cacheKey{s: v}, true
	case int:
		return cacheKey{n: uint64(v), isNum: true}, v > 0
	case int64:
		return cacheKey{n: uint64(v), isNum: true}, v > 0
	case uint64:
		return cacheKey{n: v, isNum: true}, true
	case uint:
		return cacheKey{n: uint64(v), isNum: true}, true
	case int32:
		return cacheKey{n: uint64(v), isNum: true}, v > 0
	case uint32:
		return cacheKey{n: uint64(v), isNum: true}, true
	case float64: // JSON-decoded claims: whole numbers only, as fromFloat takes them
		return cacheKey{n: uint64(v), isNum: true, isFloat: true}, v >= 1 && v <= maxExactFloat && v == math.Trunc(v)
	}
	return cacheKey{}, false
}

func (t *tracker) checkTime(at, now time.Time) error {
	if at.IsZero() || at.Unix() <= 0 {
		return fmt.Errorf("%w: %s is before 1970", ErrInvalidTime, at.Format(time.RFC3339Nano))
	}
	if limit := now.Add(MaxClockSkew); at.After(limit) {
		return fmt.Errorf("%w: %s is more than %v ahead of the clock", ErrInvalidTime, at.UTC().Format(time.RFC3339Nano), MaxClockSkew)
	}
	return nil
}

// Touch records that userID was seen now. It is TouchAt with the plugin's
// clock.
func (p *Plugin) Touch(ctx context.Context, userID any) (recorded bool, err error) {
	if t := p.tracker; t != nil && t.cached(userID) { // at is the plugin's own clock: nothing to validate
		p.stats.touches.Add(1)
		p.stats.throttled.Add(1)
		p.stats.cacheHits.Add(1)
		return false, nil
	}
	now := p.now()
	return p.touch(ctx, userID, now, now)
}

// TouchAt records that userID was seen at at. userID is the user's primary
// key in its natural Go type: any integer kind, a string, or a fmt.Stringer
// such as a UUID type; for an integer key also a whole float64 of magnitude
// at most 2^53 or a json.Number, as encoding/json decodes a JWT claim.
//
// It returns recorded == true when this call opened a new throttle window
// for the user and raised the pending timestamp (never lowering it), and
// false when the user was already recorded inside the current window: then
// the local cache answered without any I/O, or Redis did in one round trip.
//
// Errors: ErrInvalidUserID for an id of another type, empty, zero, longer
// than MaxIDLength bytes or not of the primary key's type; ErrInvalidTime; and,
// when Redis did not answer within TouchTimeout, the circuit breaker is
// open, or ctx ended first (an error wrapping ctx's, which the breaker does
// not count as a Redis failure), an error wrapping the cause: the timestamp
// is then kept in the in-process backlog (up to BacklogSize users) and
// written to Redis by the next flush, so callers may ignore that error.
func (p *Plugin) TouchAt(ctx context.Context, userID any, at time.Time) (recorded bool, err error) {
	return p.touch(ctx, userID, at, p.now())
}

// touch is TouchAt with one reading of the plugin's clock, now, used both to
// validate at and to check the local cache's deadline: on the cached path a
// clock read costs more than the cache lookup itself.
func (p *Plugin) touch(ctx context.Context, userID any, at, now time.Time) (recorded bool, err error) {
	t := p.tracker
	if t == nil {
		return false, ErrNotInitialized
	}
	p.stats.touches.Add(1)
	if err := t.checkTime(at, now); err != nil { // before the cache: a cached user's bad time is still an error
		p.stats.invalid.Add(1)
		return false, err
	}
	if t.cached(userID) {
		p.stats.throttled.Add(1)
		p.stats.cacheHits.Add(1)
		return false, nil
	}
	qk, quick := quickKey(userID)
	uid, err := t.ids.normalize(userID)
	if err != nil {
		p.stats.invalid.Add(1)
		return false, err
	}
	keys := t.shard(uid)
	ts := micros(at)
	hk, ha := presenceArgs(&p.cfg, keys, at, now) // presence.go: HyperLogLogs, same EVALSHA
	reply, err := t.call(ctx, func(ctx context.Context, rdb *redisClient) ([]any, error) {
		return touchScript.Run(ctx, rdb, append([]string{keys.marker + uid, keys.pending}, hk...),
			append([]any{uid, ts, t.throttle.Milliseconds(), ceiling(now)}, ha...)...).Slice()
	})
	if err != nil {
		if errors.Is(err, errCallerEnded) {
			p.stats.canceled.Add(1)
		} else {
			p.stats.redisErrors.Add(1)
			t.warn.Do(func() {
				t.log.Warn("lastseen: redis unavailable, touches kept in memory", "err", err, "backlog", t.backlog.len())
			})
		}
		t.keep(uid, ts)
		return false, fmt.Errorf("lastseen: touch user %s: %w", uid, err)
	}
	recorded, ttl := parseTouchReply(reply, t.throttle)
	if quick && t.cache != nil && ttl > 0 {
		t.cache.Set(qk, t.ticks()+int64(ttl))
	}
	if recorded {
		p.stats.recorded.Add(1)
	} else {
		p.stats.throttled.Add(1)
	}
	return recorded, nil
}

// cached reports whether the local cache knows the user is inside a
// throttle window. It does no I/O and no allocation.
func (t *tracker) cached(userID any) bool {
	if t.cache == nil {
		return false
	}
	qk, quick := quickKey(userID)
	if !quick {
		return false
	}
	deadline, ok := t.cache.GetIfPresent(qk)
	return ok && t.ticks() < deadline
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
func (t *tracker) call(ctx context.Context, fn func(context.Context, *redisClient) ([]any, error)) ([]any, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%w: %w", errCallerEnded, err)
	}
	return t.breaker.Execute(func() ([]any, error) {
		tctx, cancel := context.WithTimeout(ctx, t.timeout)
		defer cancel()
		var v []any
		err := t.redis(tctx, func(ctx context.Context, rdb *redisClient) (err error) {
			v, err = fn(ctx, rdb)
			return err
		})
		switch {
		case err == nil:
			return v, nil
		case ctx.Err() != nil:
			return nil, fmt.Errorf("%w: %w", errCallerEnded, err)
		case tctx.Err() != nil:
			return nil, fmt.Errorf("redis did not answer within %v: %w", t.timeout, err)
		}
		return nil, err
	})
}

// redis runs fn, one Redis call or pipeline, on the tracker's client,
// bounded by ctx (redisClient.do). When Close swapped the plugin's own
// client for the app's while fn ran, fn fails with redis.ErrClosed and runs
// once more on the app's client.
func (t *tracker) redis(ctx context.Context, fn func(context.Context, *redisClient) error) error {
	for {
		c := t.rdb.Load()
		err := c.do(ctx, func(ctx context.Context) error { return fn(ctx, c) })
		if err == nil || !errors.Is(err, redis.ErrClosed) || t.rdb.Load() == c {
			return err
		}
	}
}
