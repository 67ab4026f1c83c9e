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
// work, the redislock locks, and the scripts a shard's flush runs under its
// lock (lua/swap.lua, ack.lua, fail.lua), each checking the lock's token.

// active asks Redis with one pipeline of EXISTS.
func (b *redisBuffer) active(ctx context.Context) ([]int, error) {
	cmds := make([]*redis.IntCmd, len(b.shards))
	_, err := b.rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for i, k := range b.shards {
			cmds[i] = pipe.Exists(ctx, k.pending, k.inflight)
		}
		return nil
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

// obtain takes the redislock lock key for LockTTL, without retrying.
func (b *redisBuffer) obtain(ctx context.Context, key string) (*redisLease, error) {
	lock, err := b.locker.Obtain(ctx, key, b.lockTTL, nil)
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

func (l *redisLease) refresh(ctx context.Context) error {
	err := l.lock.Refresh(ctx, l.b.lockTTL, nil)
	if errors.Is(err, redislock.ErrNotObtained) {
		return fmt.Errorf("%w: %w", errLockLost, err)
	}
	return err
}

func (l *redisLease) release(ctx context.Context) { _ = l.lock.Release(context.WithoutCancel(ctx)) }

// redisShard is a shard's lock with the scripts run under it.
type redisShard struct {
	*redisLease
	keys shardKeys
}

func (s *redisShard) swap(ctx context.Context) (int, error) {
	moved, err := swapScript.Run(ctx, s.b.rdb, []string{s.keys.lock, s.keys.pending, s.keys.inflight}, s.lock.Token()).Int()
	switch {
	case err != nil:
		return 0, err
	case moved == -1:
		return 0, errLockLost
	}
	return moved, nil
}

func (s *redisShard) scan(ctx context.Context, cursor uint64, n int) ([]string, uint64, error) {
	return s.b.rdb.HScan(ctx, s.keys.inflight, cursor, "", int64(n)).Result()
}

// ack: see lua/ack.lua.
func (s *redisShard) ack(ctx context.Context, fields []string, final bool) error {
	args := make([]any, 0, len(fields)+3)
	args = append(args, s.lock.Token(), s.b.lockTTL.Milliseconds(), map[bool]string{true: "1", false: "0"}[final])
	for _, f := range fields {
		args = append(args, f)
	}
	n, err := ackScript.Run(ctx, s.b.rdb, []string{s.keys.lock, s.keys.inflight, s.keys.refusals}, args...).Int()
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
	reply, err := failScript.Run(ctx, s.b.rdb, keys, args...).Slice()
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
