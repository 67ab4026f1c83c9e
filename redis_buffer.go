package lastseen

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/bsm/redislock"
	"github.com/lastseen/lastseen/internal/keys"
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
type redisBuffer struct {
	cfg      Config // OnlineWindow, ActiveUsersRetention (presenceArgs)
	rdb      redis.UniversalClient
	prefix   string
	shards   []shardKeys
	throttle time.Duration
	timeout  time.Duration // TouchTimeout
	lockTTL  time.Duration
	now      func() time.Time
	locker   *redislock.Client
	cb       *gobreaker.CircuitBreaker[[]any]
	backlog  backlog
	stats    *counters
	log      *slog.Logger
	warn     rate.Sometimes
}

var _ buffer = (*redisBuffer)(nil)

func newRedisBuffer(cfg Config, log *slog.Logger, stats *counters) *redisBuffer {
	b := &redisBuffer{
		cfg:      cfg,
		rdb:      cfg.Redis,
		prefix:   cfg.Prefix,
		throttle: cfg.Throttle,
		timeout:  cfg.TouchTimeout,
		lockTTL:  cfg.LockTTL,
		now:      cfg.Now,
		locker:   redislock.New(cfg.Redis),
		backlog:  backlog{max: cfg.BacklogSize, m: map[string]int64{}},
		stats:    stats,
		log:      log,
		warn:     rate.Sometimes{Interval: 10 * time.Second},
	}
	for n := range cfg.Shards {
		b.shards = append(b.shards, newShardKeys(cfg.Prefix, n))
	}
	b.cb = gobreaker.NewCircuitBreaker[[]any](gobreaker.Settings{
		Name:    "lastseen-redis",
		Timeout: cfg.BreakerCooldown,
		ReadyToTrip: func(c gobreaker.Counts) bool {
			return c.ConsecutiveFailures >= 5
		},
		IsExcluded: func(err error) bool { return errors.Is(err, context.Canceled) },
	})
	return b
}

func (b *redisBuffer) shard(uid string) shardKeys {
	return b.shards[keys.ShardOf(uid, len(b.shards))]
}

// touch runs touchScript (one EVALSHA) through the breaker within
// TouchTimeout; on failure it keeps the timestamp in the backlog, counts it
// and returns the cause.
func (b *redisBuffer) touch(ctx context.Context, uid string, at, now time.Time) (bool, time.Duration, error) {
	k := b.shard(uid)
	ts := micros(at)
	hk, ha := presenceArgs(&b.cfg, k, at, now) // presence.go: HyperLogLogs, same EVALSHA
	reply, err := b.call(ctx, func(ctx context.Context) ([]any, error) {
		return touchScript.Run(ctx, b.rdb, append([]string{k.marker + uid, k.pending}, hk...),
			append([]any{uid, ts, b.throttle.Milliseconds(), ceiling(now)}, ha...)...).Slice()
	})
	if err != nil {
		b.stats.redisErrors.Add(1)
		if b.backlog.add(uid, ts) {
			b.stats.backlogged.Add(1)
		} else {
			b.stats.backlogDropped.Add(1)
		}
		b.warn.Do(func() {
			b.log.Warn("lastseen: redis unavailable, touches kept in memory", "err", err, "backlog", b.backlog.len())
		})
		return false, 0, err
	}
	recorded, ttl := parseTouchReply(reply, b.throttle)
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
// the touch timeout even when the client itself would wait longer (go-redis
// honours context deadlines on sockets only with ContextTimeoutEnabled).
func (b *redisBuffer) call(ctx context.Context, fn func(context.Context) ([]any, error)) ([]any, error) {
	return b.cb.Execute(func() ([]any, error) {
		ctx, cancel := context.WithTimeout(ctx, b.timeout)
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
			return nil, fmt.Errorf("redis did not answer within %v: %w", b.timeout, ctx.Err())
		}
	})
}

// newest reads uids' pending and in-flight values in one pipeline, HMGET
// of both hashes of each shard holding some of them (with guard through the
// breaker within TouchTimeout, as a touch), and folds in the backlog. When
// some commands failed it returns what the others read, with the error.
func (b *redisBuffer) newest(ctx context.Context, uids []string, now time.Time, guard bool) ([]time.Time, error) {
	out := make([]time.Time, len(uids))
	byShard := map[shardKeys][]int{}
	for i, uid := range uids {
		if ts, ok := b.backlog.get(uid); ok {
			out[i] = time.UnixMicro(ts).UTC()
		}
		k := b.shard(uid)
		byShard[k] = append(byShard[k], i)
	}
	type read struct {
		idx               []int
		pending, inflight *redis.SliceCmd
	}
	var reads []read
	pipeline := func(ctx context.Context) ([]any, error) {
		reads = make([]read, 0, len(byShard))
		_, err := b.rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
			for k, idx := range byShard {
				fields := make([]string, len(idx))
				for j, i := range idx {
					fields[j] = uids[i]
				}
				reads = append(reads, read{idx, pipe.HMGet(ctx, k.pending, fields...), pipe.HMGet(ctx, k.inflight, fields...)})
			}
			return nil
		})
		return nil, err
	}
	var err error
	if guard {
		if _, err = b.call(ctx, pipeline); err != nil {
			return out, err // the pipeline may still be running: read nothing of it
		}
	} else {
		_, err = pipeline(ctx)
	}
	for _, r := range reads {
		for _, cmd := range []*redis.SliceCmd{r.pending, r.inflight} {
			for j, v := range cmd.Val() { // nil Val when the command failed
				if s, ok := v.(string); ok && j < len(r.idx) {
					if at, valid := parseMicros(s, now); valid && at.After(out[r.idx[j]]) {
						out[r.idx[j]] = at
					}
				}
			}
		}
	}
	return out, err
}

// count sends one PFCOUNT per shard, of the keys keysOf names, in one
// pipeline and returns their sum.
func (b *redisBuffer) count(ctx context.Context, keysOf func(shardKeys) []string) (int64, error) {
	cmds := make([]*redis.IntCmd, len(b.shards))
	_, err := b.rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for i, k := range b.shards {
			cmds[i] = pipe.PFCount(ctx, keysOf(k)...)
		}
		return nil
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

func (b *redisBuffer) ping(ctx context.Context) error { return b.rdb.Ping(ctx).Err() }
func (b *redisBuffer) shared() string                 { return b.prefix }
func (b *redisBuffer) backlogLen() int                { return b.backlog.len() }
func (b *redisBuffer) breaker() BreakerState          { return BreakerState(b.cb.State().String()) }
func (b *redisBuffer) close()                         {}
