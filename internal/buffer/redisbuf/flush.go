package redisbuf

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/bsm/redislock"
	"github.com/lastseen/lastseen/internal/buffer"
	"github.com/lastseen/lastseen/internal/keys"
	"github.com/redis/go-redis/v9"
)

// The buffer's side of the flush and the purge: which shards have work, the
// redislock locks (kept alive by a keeper while work runs under them), and
// the scripts a shard's flush runs under its lock (lua/swap.lua, ack.lua,
// fail.lua), each checking the lock's token. Every call is bounded by its
// context (Buffer.redis).

// Active asks Redis with one pipeline of the active script, one call per
// shard (lua/active.lua: a pending or in-flight hash, a throttle window
// with entries to move, or one to delete; it deletes the registrations of
// windows long over whose hashes are gone), after an HSETNX registering
// again each window this process's touches of the shard wrote to since the
// last call and the last two it registered (see the package doc; given
// back when the pipeline fails), and an EXISTS of the manifest
// (ManifestGone: Redis lost its data); when Redis does not know the script
// (NOSCRIPT) it loads it and sends the pipeline once more. It also reads
// INFO stats evicted_keys for the eviction watch
// (EvictionWatch.TakeEvicted): in the same pipeline on one server; on a
// cluster from every master, alongside the pipeline. A failed read of it is
// not an error.
func (b *Buffer) Active(ctx context.Context) ([]int, error) {
	cmds := make([]*redis.Cmd, len(b.shards))
	var manifest *redis.IntCmd
	var evicted []nodeEviction
	now := b.now().UnixMilli()
	keep := b.throttle.Milliseconds()
	ends := make([][]int64, len(b.shards))
	for i, k := range b.shards {
		ends[i] = k.reg.take(now, keep)
	}
	err := b.redis(ctx, func(ctx context.Context, rdb *client) error {
		single, ok := rdb.UniversalClient.(*redis.Client)
		var info *redis.StringCmd
		var others chan []nodeEviction
		if !ok { // a cluster, or a client whose pipeline routes by key
			others = make(chan []nodeEviction, 1)
			go func() { others <- readEvicted(ctx, rdb.UniversalClient) }()
		}
		run := func() error {
			_, err := rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
				for i, k := range b.shards {
					for _, e := range ends[i] {
						pipe.HSetNX(ctx, k.Windows(), strconv.FormatInt(e, 10), 0)
					}
					cmds[i] = activeScript.EvalSha(ctx, pipe, k.buffered, now, keep)
				}
				manifest = pipe.Exists(ctx, keys.Manifest(b.prefix))
				if single != nil {
					info = pipe.Info(ctx, "stats")
				}
				return nil
			})
			if info != nil {
				err = firstError(cmds, manifest)
			}
			return err
		}
		err := run()
		if err != nil && isNoScript(err) {
			if lerr := activeScript.Load(ctx, rdb).Err(); lerr != nil {
				err = errors.Join(err, lerr)
			} else {
				err = run()
			}
		}
		if info != nil {
			k, counted := evictedKeys(info)
			evicted = []nodeEviction{{evicted: k, counted: counted}}
		} else {
			evicted = <-others
		}
		return err
	})
	if err != nil {
		for i, k := range b.shards {
			k.reg.restore(ends[i])
		}
		return nil, err
	}
	b.eviction.counted(evicted)
	b.manifestGone.Store(manifest.Val() == 0)
	var active []int
	for i, c := range cmds {
		if n, _ := c.Int64(); n > 0 {
			active = append(active, i)
		}
	}
	return active, nil
}

// firstError is the first error of cmds and manifest, the pipeline's error
// without its INFO (which a proxy or miniredis may refuse).
func firstError(cmds []*redis.Cmd, manifest *redis.IntCmd) error {
	for _, c := range cmds {
		if err := c.Err(); err != nil {
			return err
		}
	}
	return manifest.Err()
}

// obtain takes the redislock lock key for LockTTL, without retrying,
// bounded by ctx; buffer.ErrNotObtained (wrapping redislock's) when
// another holder has it.
func (b *Buffer) obtain(ctx context.Context, key string) (*redisLease, error) {
	var lock *redislock.Lock
	err := b.redis(ctx, func(ctx context.Context, _ *client) (err error) {
		lock, err = b.locker.Obtain(ctx, key, b.lockTTL, nil)
		return err
	})
	if errors.Is(err, redislock.ErrNotObtained) {
		return nil, fmt.Errorf("%w: %w", buffer.ErrNotObtained, err)
	}
	if err != nil {
		return nil, err
	}
	return &redisLease{b: b, lock: lock}, nil
}

// LockPurge takes the purge lock.
func (b *Buffer) LockPurge(ctx context.Context) (buffer.Lease, error) {
	l, err := b.obtain(ctx, keys.PurgeLock(b.prefix))
	if err != nil {
		return nil, err
	}
	return l, nil
}

// LockRule takes the lock of the inactivity rule name
// (keys.RuleLock).
func (b *Buffer) LockRule(ctx context.Context, name string) (buffer.Lease, error) {
	l, err := b.obtain(ctx, keys.RuleLock(b.prefix, name))
	if err != nil {
		return nil, err
	}
	return l, nil
}

// LockShard takes shard n's flush lock.
func (b *Buffer) LockShard(ctx context.Context, n int) (buffer.ShardLease, error) {
	k := b.shards[n]
	l, err := b.obtain(ctx, k.Lock)
	if err != nil {
		return nil, err
	}
	return &redisShard{redisLease: l, keys: k, total: -1}, nil
}

// redisLease is a redislock lock.
type redisLease struct {
	b    *Buffer
	lock *redislock.Lock
}

// Refresh extends the lock to LockTTL (redislock Refresh: PEXPIRE if the
// token still matches), bounded by ctx.
func (l *redisLease) Refresh(ctx context.Context) error {
	err := l.b.redis(ctx, func(ctx context.Context, _ *client) error {
		return l.lock.Refresh(ctx, l.b.lockTTL, nil)
	})
	if errors.Is(err, redislock.ErrNotObtained) {
		return fmt.Errorf("%w: %w", buffer.ErrLockLost, err)
	}
	return err
}

// Release gives the lock up (redislock Release: DEL if the token still
// matches), bounded by ctx, or by releaseGrace when ctx has already ended:
// on a Redis that does not answer the lock expires by its TTL instead.
func (l *redisLease) Release(ctx context.Context) {
	cancel := context.CancelFunc(func() {})
	if ctx.Err() != nil {
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), releaseGrace)
	}
	defer cancel()
	_ = l.b.redis(ctx, func(ctx context.Context, _ *client) error { return l.lock.Release(ctx) })
}

// redisShard is a shard's lock with the scripts run under it.
type redisShard struct {
	*redisLease
	keys  shardKeys
	total int   // entries in the in-flight hashes when the drain began; -1 unknown (left over)
	held  []int // the buckets whose in-flight hash the drain reads, ascending; nil unknown
}

// Swap: see lua/swap.lua. It keeps the number of entries moved and the
// buckets they are in, so that the drain reads and unlinks those alone.
func (s *redisShard) Swap(ctx context.Context) (int, error) {
	names := append([]string{s.keys.Lock}, s.keys.buffered...)
	now := s.b.now()
	var reply []int64
	err := s.b.redis(ctx, func(ctx context.Context, rdb *client) (err error) {
		reply, err = swapScript.Run(ctx, rdb, names, s.lock.Token(), now.UnixMilli(), s.b.throttle.Milliseconds(),
			buffer.Ceiling(now)).Int64Slice()
		return err
	})
	switch {
	case err != nil:
		return 0, err
	case len(reply) == 0:
		return 0, fmt.Errorf("swap: empty reply")
	case reply[0] == -1:
		return 0, buffer.ErrLockLost
	case reply[0] == -2: // the drain finds the left-over hashes (inflightLen)
		s.total, s.held = -1, nil
		return 0, buffer.ErrLeftOver
	}
	s.total = int(reply[0])
	s.held = make([]int, 0, len(reply)-1)
	for _, b := range reply[1:] {
		s.held = append(s.held, int(b))
	}
	return s.total, nil
}

// The scan cursor of the shard's in-flight hashes: the position in held in
// the top 16 bits, that bucket's HSCAN cursor in the other 48 (Redis
// cursors of a hash never come near 2^48 entries). 0 is both the start and
// the end.
const cursorBucketShift = 48

// Scan reads the in-flight hashes of the held buckets in bucket order, in
// one pipeline of HSCAN, one per bucket from the cursor's on, as many
// buckets as hold about n entries at their mean size: a listpack-encoded
// hash comes whole in one HSCAN reply. A bucket whose HSCAN returns a
// cursor (a hash too large for listpack) ends the page: the next scan
// resumes it, and the buckets after it in the pipeline are read again then.
// of holds each field's bucket. When presence sets are on, the page's
// users join the sets of their timestamps (presence) before it returns.
func (s *redisShard) Scan(ctx context.Context, cursor uint64, n int) (kv []string, of []int, next uint64, err error) {
	if s.total < 0 || s.held == nil {
		if err = s.inflightLen(ctx); err != nil {
			return nil, nil, 0, err
		}
	}
	buckets := len(s.held)
	if buckets == 0 {
		return nil, nil, 0, nil
	}
	first, hc := int(cursor>>cursorBucketShift), cursor&(1<<cursorBucketShift-1)
	count := 1
	if hc == 0 && s.total > 0 {
		count = max(1, n*buckets/s.total)
	}
	count = min(count, buckets-first)
	cmds := make([]*redis.ScanCmd, count)
	err = s.b.redis(ctx, func(ctx context.Context, rdb *client) error {
		_, err := rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
			for i := range cmds {
				c := uint64(0)
				if i == 0 {
					c = hc
				}
				cmds[i] = pipe.HScan(ctx, s.keys.inflight[s.held[first+i]], c, "", int64(n))
			}
			return nil
		})
		return err
	})
	if err != nil {
		return nil, nil, 0, err // a call cut short may still fill replies in: read none of them
	}
	size := 0
	for _, cmd := range cmds {
		page, _ := cmd.Val()
		size += len(page)
	}
	kv, of = make([]string, 0, size), make([]int, 0, size/2)
	for i, cmd := range cmds {
		page, c := cmd.Val()
		kv = append(kv, page...)
		for range len(page) / 2 {
			of = append(of, s.held[first+i])
		}
		if c != 0 {
			next = uint64(first+i)<<cursorBucketShift | c
			break
		}
	}
	if next == 0 && first+count < buckets {
		next = uint64(first+count) << cursorBucketShift
	}
	s.presence(ctx, kv)
	return kv, of, next, nil
}

// presence adds the users of kv, a page of in-flight entries, to the
// presence sets of their timestamps (buffer.Presence.Joins): one pipeline
// of a PFADD of every user of a set and its EXPIRE, the sets of a page
// being the few minutes and days its timestamps fall in. The sets are the
// whole buffer's (keys.Presence), which every shard's flush adds to, in a
// cluster slot of their own, not the shard's. The counts are
// best effort, as the touch path is: a failure is logged (rate-limited)
// and the flush goes on; a page read again (an entry may come twice, a
// flush that stopped is drained again) adds nothing new.
func (s *redisShard) presence(ctx context.Context, kv []string) {
	joins := s.b.presence.Joins(s.b.presenceKeys, kv, s.b.now())
	if len(joins) == 0 {
		return
	}
	err := s.b.redis(ctx, func(ctx context.Context, rdb *client) error {
		_, err := rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
			for _, j := range joins {
				users := make([]any, len(j.Users))
				for i, u := range j.Users {
					users[i] = u
				}
				pipe.PFAdd(ctx, j.Name, users...)
				pipe.Expire(ctx, j.Name, time.Duration(j.TTL)*time.Second)
			}
			return nil
		})
		return err
	})
	if err != nil {
		s.b.drops.log(slog.LevelWarn, "lastseen: presence counts not updated for a page of the flush", "set", joins[0].Name, "users", len(kv)/2, "err", err)
	}
}

// inflightLen finds the shard's in-flight hashes left by an earlier flush
// and their number of entries (one pipeline of HLEN) for the scan: total
// and held.
func (s *redisShard) inflightLen(ctx context.Context) error {
	cmds := make([]*redis.IntCmd, len(s.keys.inflight))
	err := s.b.redis(ctx, func(ctx context.Context, rdb *client) error {
		_, err := rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
			for i, key := range s.keys.inflight {
				cmds[i] = pipe.HLen(ctx, key)
			}
			return nil
		})
		return err
	})
	if err != nil {
		return err
	}
	s.total, s.held = 0, []int{}
	for b, c := range cmds {
		if n := int(c.Val()); n > 0 {
			s.total += n
			s.held = append(s.held, b)
		}
	}
	return nil
}

// bucketOf is the bucket of an in-flight field: the one Scan read it from,
// else keys.Locate's.
func (s *redisShard) bucketOf(field string, bucket int) int {
	if bucket >= 0 && bucket < len(s.keys.inflight) {
		return bucket
	}
	_, b := keys.Locate(field, len(s.b.shards))
	return b
}

// Ack: see lua/ack.lua. The fields are grouped by bucket, in bucket order
// (a counting sort on Held.Bucket); final also names the in-flight hash of
// every held bucket (every bucket when held is unknown), to unlink them.
func (s *redisShard) Ack(ctx context.Context, fields []buffer.Held, final bool) error {
	counts := make([]int, len(s.keys.inflight))
	for _, f := range fields {
		counts[s.bucketOf(f.Field, f.Bucket)]++
	}
	names := []string{s.keys.Lock, s.keys.Refusals}
	flag := "0"
	if final {
		flag = "1"
	}
	args := make([]any, 3, 3+len(fields)+len(counts))
	args[0], args[1], args[2] = s.lock.Token(), s.b.lockTTL.Milliseconds(), flag
	unlink := make([]bool, len(counts))
	if final {
		for b := range unlink {
			unlink[b] = s.held == nil
		}
		for _, b := range s.held {
			unlink[b] = true
		}
	}
	at := make([]int, len(counts)) // where each bucket's next field goes in args
	for b, key := range s.keys.inflight {
		if counts[b] == 0 && !unlink[b] {
			continue
		}
		names = append(names, key)
		args = append(args, counts[b])
		at[b] = len(args)
		args = args[:len(args)+counts[b]]
	}
	for _, f := range fields {
		b := s.bucketOf(f.Field, f.Bucket)
		args[at[b]] = f.Field
		at[b]++
	}
	var n int
	err := s.b.redis(ctx, func(ctx context.Context, rdb *client) (err error) {
		n, err = ackScript.Run(ctx, rdb, names, args...).Int()
		return err
	})
	if err != nil {
		return err
	}
	if n < 0 {
		return buffer.ErrLockLost
	}
	return nil
}

// Requeue: see lua/fail.lua.
func (s *redisShard) Requeue(ctx context.Context, refused []buffer.Refused, ceiling int64, limit int) ([]string, error) {
	names := []string{s.keys.Lock, s.keys.Refusals}
	index := map[int]int{} // bucket -> index in fail.lua's pairs of keys, from 1
	args := make([]any, 0, 3+3*len(refused))
	args = append(args, s.lock.Token(), ceiling, limit)
	for _, f := range refused {
		b := s.bucketOf(f.Field, f.Bucket)
		i, ok := index[b]
		if !ok {
			names = append(names, s.keys.inflight[b], s.keys.pending[b])
			i = len(index) + 1
			index[b] = i
		}
		args = append(args, i, f.Field, f.Value)
	}
	var reply []any
	err := s.b.redis(ctx, func(ctx context.Context, rdb *client) (err error) {
		reply, err = failScript.Run(ctx, rdb, names, args...).Slice()
		return err
	})
	if err != nil {
		return nil, err
	}
	if n, _ := reply[0].(int64); n < 0 {
		return nil, buffer.ErrLockLost
	}
	var dropped []string
	for _, v := range reply[1:] {
		field, _ := v.(string)
		dropped = append(dropped, field)
	}
	return dropped, nil
}
