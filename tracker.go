package lastseen

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/maypok86/otter/v2"
	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"
	"golang.org/x/time/rate"
)

// MaxClockSkew is how far in the future a timestamp may lie, against the
// plugin's clock, and still be accepted by TouchAt or by a flush reading it
// back from Redis.
const MaxClockSkew = time.Hour

// Redis keys. Every key of shard N carries the hash tag "{N}", so one Lua
// script or RENAME only ever touches keys of one Redis Cluster slot:
//
//	<prefix>:{N}:pending       hash: user id -> Unix microseconds (UTC)
//	<prefix>:{N}:inflight      hash: the pending hash a flush is writing
//	<prefix>:{N}:lock          redislock lock of the shard's flusher
//	<prefix>:{N}:seen:<user>   throttle marker, PX = throttle window
type shardKeys struct {
	pending, inflight, lock, marker string
}

func newShardKeys(prefix string, n int) shardKeys {
	tag := prefix + ":{" + strconv.Itoa(n) + "}:"
	return shardKeys{pending: tag + "pending", inflight: tag + "inflight", lock: tag + "lock", marker: tag + "seen:"}
}

// touchScript records one touch atomically: it sets the throttle marker if
// it is absent and, only then, raises the user's pending timestamp (never
// lowers it; a stored value that a flush would refuse, not a number or
// beyond ARGV[4], is replaced rather than kept as "newer").
//
//	KEYS[1] marker key, KEYS[2] pending hash
//	ARGV[1] user id, ARGV[2] Unix microseconds, ARGV[3] throttle window in ms,
//	ARGV[4] the latest acceptable value (ceiling, see parseMicros)
//
// It returns {1, window ms} when the touch was recorded and {0, marker PTTL
// in ms} when the user was throttled (Redis SET NX PX and PTTL semantics).
var touchScript = redis.NewScript(`
if redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[3]) then
  local cur = tonumber(redis.call('HGET', KEYS[2], ARGV[1]))
  if not cur or cur < tonumber(ARGV[2]) or cur > tonumber(ARGV[4]) then
    redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
  end
  return {1, tonumber(ARGV[3])}
end
return {0, redis.call('PTTL', KEYS[1])}
`)

// mergeScript raises pending timestamps without touching throttle markers
// (replacing stored values a flush would refuse, as touchScript does); it
// replays the in-process backlog after an outage.
//
//	KEYS[1] pending hash
//	ARGV[1] the latest acceptable value (ceiling, see parseMicros)
//	ARGV[2..] user id, Unix microseconds, user id, Unix microseconds, ...
//
// It returns the number of pairs.
var mergeScript = redis.NewScript(`
local ceiling = tonumber(ARGV[1])
for i = 2, #ARGV, 2 do
  local cur = tonumber(redis.call('HGET', KEYS[1], ARGV[i]))
  if not cur or cur < tonumber(ARGV[i + 1]) or cur > ceiling then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  end
end
return (#ARGV - 1) / 2
`)

// ceiling is the latest stored value a flush at now accepts (parseMicros):
// Unix microseconds of now+MaxClockSkew, at most 9999-12-31.
func ceiling(now time.Time) int64 { return min(micros(now.Add(MaxClockSkew)), maxMicros) }

// tracker is the request path: it normalizes ids, answers from the local
// throttle cache, runs touchScript under a time budget and a circuit
// breaker, and keeps what it could not send in a bounded backlog.
type tracker struct {
	rdb      redis.UniversalClient
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
}

// newTracker builds the request path. With realClock (Config.Now unset) the
// local cache's deadlines run on the monotonic clock alone, one vDSO read
// where time.Now makes two: it is most of the cost of a cached Touch.
func newTracker(cfg Config, realClock bool, ids idCodec, log *slog.Logger, stats *counters) (*tracker, error) {
	t := &tracker{
		rdb:      cfg.Redis,
		throttle: cfg.Throttle,
		timeout:  cfg.TouchTimeout,
		ids:      ids,
		now:      cfg.Now,
		backlog:  backlog{max: cfg.BacklogSize, m: map[string]int64{}},
		stats:    stats,
		log:      log,
		warn:     rate.Sometimes{Interval: 10 * time.Second},
	}
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
		IsExcluded: func(err error) bool { return errors.Is(err, context.Canceled) },
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
	s     string
	n     uint64
	isNum bool
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
	}
	return cacheKey{}, false
}

func (t *tracker) shard(uid string) shardKeys {
	h := fnv.New32a()
	h.Write([]byte(uid))
	return t.shards[h.Sum32()%uint32(len(t.shards))]
}

// micros converts a time to the stored form: Unix microseconds, UTC.
func micros(at time.Time) int64 { return at.UnixMicro() }

// maxMicros is 9999-12-31T23:59:59.999999Z, the last instant every dialect
// stores.
var maxMicros = time.Date(9999, 12, 31, 23, 59, 59, 999999000, time.UTC).UnixMicro()

// parseMicros reads a stored timestamp back. It accepts a decimal integer of
// Unix microseconds from 1970 up to now+MaxClockSkew and reports anything
// else (garbage, negative, far future, written by hand or by another
// version) as not ok.
func parseMicros(s string, now time.Time) (time.Time, bool) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 || n > maxMicros || n > now.Add(MaxClockSkew).UnixMicro() {
		return time.Time{}, false
	}
	return time.UnixMicro(n).UTC(), true
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
// such as a UUID type.
//
// It returns recorded == true when this call opened a new throttle window
// for the user and raised the pending timestamp (never lowering it), and
// false when the user was already recorded inside the current window: then
// the local cache answered without any I/O, or Redis did in one round trip.
//
// Errors: ErrInvalidUserID for an id of another type, empty, zero, longer
// than 128 bytes or not of the primary key's type; ErrInvalidTime; and,
// when Redis did not answer within TouchTimeout or the circuit breaker is
// open, an error wrapping the cause: the timestamp is then kept in the
// in-process backlog (up to BacklogSize users) and written to Redis by the
// next flush, so callers may ignore that error.
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
	reply, err := t.call(ctx, func(ctx context.Context) ([]any, error) {
		return touchScript.Run(ctx, t.rdb, []string{keys.marker + uid, keys.pending}, uid, ts, t.throttle.Milliseconds(), ceiling(now)).Slice()
	})
	if err != nil {
		p.stats.redisErrors.Add(1)
		if t.backlog.add(uid, ts) {
			p.stats.backlogged.Add(1)
		} else {
			p.stats.backlogDropped.Add(1)
		}
		t.warn.Do(func() {
			t.log.Warn("lastseen: redis unavailable, touches kept in memory", "err", err, "backlog", t.backlog.len())
		})
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
// the touch timeout even when the client itself would wait longer (go-redis
// honours context deadlines on sockets only with ContextTimeoutEnabled).
func (t *tracker) call(ctx context.Context, fn func(context.Context) ([]any, error)) ([]any, error) {
	return t.breaker.Execute(func() ([]any, error) {
		ctx, cancel := context.WithTimeout(ctx, t.timeout)
		defer cancel()
		type result struct {
			v   []any
			err error
		}
		done := make(chan result, 1)
		go func() {
			v, err := fn(ctx)
			done <- result{v, err}
		}()
		select {
		case r := <-done:
			return r.v, r.err
		case <-ctx.Done():
			return nil, fmt.Errorf("redis did not answer within %v: %w", t.timeout, ctx.Err())
		}
	})
}

// Pending returns the user's timestamp that is not yet in the database: the
// newer of the pending and the in-flight entry. ok is false when there is
// none. Errors: ErrInvalidUserID, or Redis's error wrapped.
func (p *Plugin) Pending(ctx context.Context, userID any) (at time.Time, ok bool, err error) {
	t := p.tracker
	if t == nil {
		return time.Time{}, false, ErrNotInitialized
	}
	uid, err := t.ids.normalize(userID)
	if err != nil {
		return time.Time{}, false, err
	}
	keys := t.shard(uid)
	var pending, inflight *redis.StringCmd
	_, err = t.rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		pending = pipe.HGet(ctx, keys.pending, uid)
		inflight = pipe.HGet(ctx, keys.inflight, uid)
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return time.Time{}, false, fmt.Errorf("lastseen: pending user %s: %w", uid, err)
	}
	now := t.now()
	for _, cmd := range []*redis.StringCmd{pending, inflight} {
		if v, err := cmd.Result(); err == nil {
			if ts, valid := parseMicros(v, now); valid && ts.After(at) {
				at, ok = ts, true
			}
		}
	}
	if b, found := t.backlog.get(uid); found {
		if ts := time.UnixMicro(b).UTC(); ts.After(at) {
			at, ok = ts, true
		}
	}
	return at, ok, nil
}

// replayBacklog writes the backlog of touches that could not reach Redis
// into the pending hashes, one script call per shard. What it cannot write
// goes back into the backlog.
func (t *tracker) replayBacklog(ctx context.Context) (int, error) {
	m := t.backlog.take()
	if len(m) == 0 {
		return 0, nil
	}
	byShard := map[string][]any{}
	top := ceiling(t.now())
	for uid, ts := range m {
		k := t.shard(uid).pending
		if byShard[k] == nil {
			byShard[k] = []any{top}
		}
		byShard[k] = append(byShard[k], uid, ts)
	}
	written := 0
	var errs []error
	for key, args := range byShard {
		if err := mergeScript.Run(ctx, t.rdb, []string{key}, args...).Err(); err != nil {
			for i := 1; i < len(args); i += 2 {
				t.backlog.add(args[i].(string), args[i+1].(int64))
			}
			errs = append(errs, err)
			continue
		}
		written += (len(args) - 1) / 2
	}
	if err := errors.Join(errs...); err != nil {
		return written, fmt.Errorf("lastseen: replay backlog: %w", err)
	}
	return written, nil
}

// backlog keeps the newest timestamp per user for touches that could not
// reach Redis, up to max users.
type backlog struct {
	mu  sync.Mutex
	max int
	m   map[string]int64
}

// add keeps ts if it is newer than what the backlog has for uid; it reports
// false when uid is new and the backlog is full.
func (b *backlog) add(uid string, ts int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	cur, ok := b.m[uid]
	if !ok && len(b.m) >= b.max {
		return false
	}
	if !ok || ts > cur {
		b.m[uid] = ts
	}
	return true
}

func (b *backlog) get(uid string) (int64, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	ts, ok := b.m[uid]
	return ts, ok
}

func (b *backlog) len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.m)
}

func (b *backlog) take() map[string]int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	m := b.m
	b.m = make(map[string]int64, min(len(m), 1024))
	return m
}
