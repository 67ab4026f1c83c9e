package lastseen

import (
	"context"
	"errors"
	"fmt"

	"github.com/bsm/redislock"
	"github.com/lastseen/lastseen/internal/keys"
	"github.com/redis/go-redis/v9"
)

// The Redis buffer's side of the flush and the purge: which shards have
// work, the redislock locks (kept alive by a keeper while work runs under
// them, lockkeeper.go), and the scripts a shard's flush runs under its lock
// (lua/swap.lua, ack.lua, fail.lua), each checking the lock's token. Every
// call is bounded by its context (redisBuffer.redis).

// active asks Redis with one pipeline of EXISTS.
func (b *redisBuffer) active(ctx context.Context) ([]int, error) {
	cmds := make([]*redis.IntCmd, len(b.shards))
	err := b.redis(ctx, func(ctx context.Context, rdb *redisClient) error {
		_, err := rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
			for i, k := range b.shards {
				cmds[i] = pipe.Exists(ctx, k.pending, k.inflight)
			}
			return nil
		})
		return err
	})
	if err != nil {
		return nil, err
	}
	var active []int
	for i, c := range cmds {
		if c.Val() > 0 {
			active = append(active, i)
		}
	}
	return active, nil
}

// obtain takes the redislock lock key for LockTTL, without retrying,
// bounded by ctx.
func (b *redisBuffer) obtain(ctx context.Context, key string) (*redisLease, error) {
	var lock *redislock.Lock
	err := b.redis(ctx, func(ctx context.Context, _ *redisClient) (err error) {
		lock, err = b.locker.Obtain(ctx, key, b.lockTTL, nil)
		return err
	})
	if errors.Is(err, redislock.ErrNotObtained) {
		return nil, fmt.Errorf("%w: %w", errNotObtained, err)
	}
	if err != nil {
		return nil, err
	}
	return &redisLease{b: b, lock: lock}, nil
}

func (b *redisBuffer) lockPurge(ctx context.Context) (lease, error) {
	l, err := b.obtain(ctx, keys.PurgeLock(b.prefix))
	if err != nil {
		return nil, err
	}
	return l, nil
}

func (b *redisBuffer) lockShard(ctx context.Context, n int) (shardLease, error) {
	k := b.shards[n]
	l, err := b.obtain(ctx, k.lock)
	if err != nil {
		return nil, err
	}
	return &redisShard{redisLease: l, keys: k}, nil
}

// redisLease is a redislock lock.
type redisLease struct {
	b    *redisBuffer
	lock *redislock.Lock
}

// refresh extends the lock to LockTTL (redislock Refresh: PEXPIRE if the
// token still matches), bounded by ctx.
func (l *redisLease) refresh(ctx context.Context) error {
	err := l.b.redis(ctx, func(ctx context.Context, _ *redisClient) error {
		return l.lock.Refresh(ctx, l.b.lockTTL, nil)
	})
	if errors.Is(err, redislock.ErrNotObtained) {
		return fmt.Errorf("%w: %w", errLockLost, err)
	}
	return err
}

// release gives the lock up (redislock Release: DEL if the token still
// matches), bounded by ctx, or by releaseGrace when ctx has already ended:
// on a Redis that does not answer the lock expires by its TTL instead.
func (l *redisLease) release(ctx context.Context) {
	cancel := context.CancelFunc(func() {})
	if ctx.Err() != nil {
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), releaseGrace)
	}
	defer cancel()
	_ = l.b.redis(ctx, func(ctx context.Context, _ *redisClient) error { return l.lock.Release(ctx) })
}

// redisShard is a shard's lock with the scripts run under it.
type redisShard struct {
	*redisLease
	keys shardKeys
}

func (s *redisShard) swap(ctx context.Context) (int, error) {
	var moved int
	err := s.b.redis(ctx, func(ctx context.Context, rdb *redisClient) (err error) {
		moved, err = swapScript.Run(ctx, rdb, []string{s.keys.lock, s.keys.pending, s.keys.inflight}, s.lock.Token()).Int()
		return err
	})
	switch {
	case err != nil:
		return 0, err
	case moved == -1:
		return 0, errLockLost
	}
	return moved, nil
}

func (s *redisShard) scan(ctx context.Context, cursor uint64, n int) (kv []string, next uint64, err error) {
	err = s.b.redis(ctx, func(ctx context.Context, rdb *redisClient) (err error) {
		kv, next, err = rdb.HScan(ctx, s.keys.inflight, cursor, "", int64(n)).Result()
		return err
	})
	if err != nil {
		return nil, 0, err // a call cut short may still fill kv in: read none of it
	}
	return kv, next, nil
}

// ack: see lua/ack.lua.
func (s *redisShard) ack(ctx context.Context, fields []string, final bool) error {
	args := make([]any, 0, len(fields)+3)
	args = append(args, s.lock.Token(), s.b.lockTTL.Milliseconds(), map[bool]string{true: "1", false: "0"}[final])
	for _, f := range fields {
		args = append(args, f)
	}
	var n int
	err := s.b.redis(ctx, func(ctx context.Context, rdb *redisClient) (err error) {
		n, err = ackScript.Run(ctx, rdb, []string{s.keys.lock, s.keys.inflight, s.keys.refusals}, args...).Int()
		return err
	})
	if err != nil {
		return err
	}
	if n < 0 {
		return errLockLost
	}
	return nil
}

// requeue: see lua/fail.lua.
func (s *redisShard) requeue(ctx context.Context, refused []refusal, ceiling int64, limit int) ([]string, error) {
	args := make([]any, 0, 3+2*len(refused))
	args = append(args, s.lock.Token(), ceiling, limit)
	for _, f := range refused {
		args = append(args, f.field, f.value)
	}
	keys := []string{s.keys.lock, s.keys.inflight, s.keys.pending, s.keys.refusals}
	var reply []any
	err := s.b.redis(ctx, func(ctx context.Context, rdb *redisClient) (err error) {
		reply, err = failScript.Run(ctx, rdb, keys, args...).Slice()
		return err
	})
	if err != nil {
		return nil, err
	}
	if n, _ := reply[0].(int64); n < 0 {
		return nil, errLockLost
	}
	var dropped []string
	for _, v := range reply[1:] {
		field, _ := v.(string)
		dropped = append(dropped, field)
	}
	return dropped, nil
}
