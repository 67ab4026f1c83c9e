package tests

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/internal/keys"
	"github.com/lastseen/lastseen/tests/testenv"
	"github.com/redis/go-redis/v9"
)

// Redis Cluster, against the real three-master
// cluster of LASTSEEN_REDIS_CLUSTER (.ci/run creates it with
// `redis-cli --cluster create`). miniredis checks no slots, so only a real
// cluster shows a CROSSSLOT.

// crc16 is CRC16-CCITT (XMODEM), the checksum Redis Cluster takes a key's
// slot from (cluster specification, "Key distribution model").
func crc16(b []byte) uint16 {
	var crc uint16
	for _, c := range b {
		crc ^= uint16(c) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// keySlot is the slot of key: CRC16 of its hash tag (the text between the
// first "{" and the next "}", when not empty) or of the whole key, mod 16384.
func keySlot(key string) int64 {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return int64(crc16([]byte(key)) % 16384)
}

// defaultShardSlots are the slots of the hash tags {0} to {15}, the
// default 16 shards, whatever the prefix.
var defaultShardSlots = []int64{13907, 9842, 5649, 1584, 14039, 9974, 5781, 1716, 14171, 10106, 247, 4310, 8373, 12436, 115, 4178}

func clusterClient(t *testing.T) *redis.ClusterClient {
	t.Helper()
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(testenv.Need(t, testenv.EnvRedisCluster), ",")})
	t.Cleanup(func() { c.Close() })
	return c
}

// TestClusterShardSlots: every key of a shard (pending, in-flight, lock,
// markers) carries the shard's hash tag, so it is in the tag's slot (by our
// CRC16 and by CLUSTER KEYSLOT), and the default 16 shards spread over the
// three masters as 6, 6 and 4 (CLUSTER SHARDS), each master owning some.
func TestClusterShardSlots(t *testing.T) {
	for n, want := range defaultShardSlots {
		equal(t, fmt.Sprintf("CRC16 slot of {%d}", n), keySlot(fmt.Sprintf("{%d}", n)), want)
	}
	c := clusterClient(t)
	ctx := context.Background()
	for _, prefix := range []string{lastseen.DefaultPrefix, "app:presence"} {
		for n := range lastseen.DefaultShards {
			k := keys.ForShard(prefix, n, lastseen.DefaultShards)
			last := k.Buckets - 1
			for _, key := range []string{k.Pending(0), k.Pending(last), k.InFlight(0), k.InFlight(last), k.Lock, k.Refusals,
				k.Window(0, 0), k.Window(last, 29_651_337), k.Windows()} {
				got, err := c.ClusterKeySlot(ctx, key).Result()
				must(t, err)
				equal(t, "CLUSTER KEYSLOT "+key, got, defaultShardSlots[n])
				equal(t, "CRC16 slot of "+key, keySlot(key), defaultShardSlots[n])
			}
		}
	}

	shards, err := c.ClusterShards(ctx).Result()
	must(t, err)
	type master struct {
		addr   string
		ranges []redis.SlotRange
		count  int
	}
	var masters []*master
	for _, s := range shards {
		for _, node := range s.Nodes {
			if node.Role == "master" && len(s.Slots) > 0 {
				masters = append(masters, &master{addr: fmt.Sprintf("%s:%d", node.IP, node.Port), ranges: s.Slots})
			}
		}
	}
	slices.SortFunc(masters, func(a, b *master) int { return int(a.ranges[0].Start - b.ranges[0].Start) })
	var layout []string
	for _, m := range masters {
		for _, r := range m.ranges {
			layout = append(layout, fmt.Sprintf("%d-%d", r.Start, r.End))
		}
	}
	equal(t, "masters", len(masters), 3)
	equal(t, "slot layout (redis-cli --cluster create, 3 masters)", strings.Join(layout, " "), "0-5460 5461-10922 10923-16383")
	for _, slot := range defaultShardSlots {
		for _, m := range masters {
			for _, r := range m.ranges {
				if slot >= r.Start && slot <= r.End {
					m.count++
				}
			}
		}
	}
	var counts []string
	for _, m := range masters {
		if m.count == 0 {
			t.Errorf("master %s owns none of the %d shards", m.addr, lastseen.DefaultShards)
		}
		counts = append(counts, fmt.Sprint(m.count))
	}
	equal(t, "shards per master, in slot order", strings.Join(counts, " "), "6 6 4")
}

// errorRecorder is a go-redis hook that records every error reply,
// pipelined or not, but redis.Nil (a missing key or field) and NOSCRIPT
// (a script not yet cached on that master; go-redis falls back to EVAL),
// which it counts.
type errorRecorder struct {
	mu       sync.Mutex
	errs     []string
	noscript int
}

func (r *errorRecorder) DialHook(next redis.DialHook) redis.DialHook { return next }

func (r *errorRecorder) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		r.record(cmd)
		return err
	}
}

func (r *errorRecorder) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			r.record(c)
		}
		return err
	}
}

func (r *errorRecorder) record(c redis.Cmder) {
	err := c.Err()
	if err == nil || errors.Is(err, redis.Nil) {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if strings.HasPrefix(err.Error(), "NOSCRIPT") {
		r.noscript++
		return
	}
	r.errs = append(r.errs, fmt.Sprintf("%s: %v", c.Name(), err))
}

// TestClusterFullCycle runs every Redis path of the plugin on the real
// cluster with users in all 16 shards: touches, Pending, LastSeen, Status,
// the backlog replay, a flush in batches with a refused entry requeued,
// two instances flushing at once, a purge, Close. No command may fail:
// no CROSSSLOT, no other error; the database ends exact.
func TestClusterFullCycle(t *testing.T) {
	for _, d := range servers.Dialects() {
		t.Run(d.Name, func(t *testing.T) {
			h := newHarness(t, d, testenv.RedisCluster())
			rec := &errorRecorder{}
			h.r.Client.AddHook(rec)
			ctx := context.Background()
			// The recorder sees a CROSSSLOT when there is one.
			if err := h.r.Client.MGet(ctx, h.prefix+":{0}:a", h.prefix+":{1}:b").Err(); err == nil || !strings.HasPrefix(err.Error(), "CROSSSLOT") {
				t.Fatalf("MGET over two slots: %v, want CROSSSLOT", err)
			}
			equal(t, "recorded", strings.Join(rec.errs, ""), "mget: CROSSSLOT Keys in request don't hash to the same slot")
			rec.errs = nil
			h.clock.Set(mustTime("2026-03-01T10:00:00Z"))
			cfg := h.config()
			cfg.Flush.BatchSize = 2
			cfg.Throttle = time.Minute
			p, db := h.plugin(cfg)
			other, _ := h.plugin(cfg)
			want := seedFaultUsers(t, db, 60)
			allow := refuseUser(t, db, h.dialect, 7)
			touchFaultUsers(t, p, 60, "2026-03-01T10:00:00Z", want)
			shards := map[string]bool{}
			for id := 1; id <= 60; id++ {
				shards[shardOf(p, fmt.Sprint(id)).Lock] = true
			}
			equal(t, "shards with users", len(shards), lastseen.DefaultShards)

			equal(t, "pending(5)", pendingValue(t, p, 5), "2026-03-01T10:00:05Z")
			at, ok, err := p.LastSeen(ctx, 6)
			must(t, err)
			equal(t, "last seen(6)", ok && at.Equal(mustTime("2026-03-01T10:00:06Z")), true)
			st, err := p.Status(ctx)
			must(t, err)
			equal(t, "status pending", st.Pending, 60)

			for _, id := range []int{1, 2, 3} { // as if kept through an outage
				must(t, buf(p).PutBacklog(ctx, fmt.Sprint(id), mustTime("2026-03-01T10:05:00Z")))
				want[id] = "2026-03-01T10:05:00Z"
			}
			res, err := p.Flush(ctx)
			if !errors.Is(err, lastseen.ErrRefused) {
				t.Fatalf("flush: %v, want ErrRefused for user 7", err)
			}
			equal(t, "written", res.Written, 59)
			equal(t, "failed", res.Failed, 1)
			equal(t, "pending(7) requeued", pendingValue(t, p, 7), want[7])
			allow()

			// Two instances flush at once, over new touches.
			h.expireThrottle(time.Minute)
			touchFaultUsers(t, other, 60, "2026-03-01T10:10:00Z", want)
			var wg sync.WaitGroup
			var results [2]lastseen.FlushResult
			var errs [2]error
			for i, inst := range []*lastseen.Plugin{p, other} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					results[i], errs[i] = inst.Flush(ctx)
				}()
			}
			wg.Wait()
			must(t, errors.Join(errs[:]...))
			res, err = p.Flush(ctx) // the shards one skipped while the other held them
			must(t, err)
			equal(t, "written by the instances together", results[0].Written+results[1].Written+res.Written, 60)
			checkFaultColumns(t, db, "after the flushes", want)
			equal(t, "redis buffers left", len(h.pendingKeys()), 0)

			must(t, db.AutoMigrate(&lastseen.Session{}))
			var sessions []lastseen.Session
			for i := range 30 {
				sessions = append(sessions, lastseen.Session{ID: fmt.Sprintf("x%d", i), UserID: 1, ExpiresAt: mustTime("2026-03-01T09:00:00Z")})
			}
			for i := range 5 {
				sessions = append(sessions, lastseen.Session{ID: fmt.Sprintf("l%d", i), UserID: 1, ExpiresAt: mustTime("2026-03-01T12:00:00Z")})
			}
			must(t, db.Create(&sessions).Error)
			pr, err := p.PurgeExpiredSessions(ctx)
			must(t, err)
			equal(t, "sessions purged", pr.Deleted, 30)
			must(t, p.Close(ctx))
			must(t, other.Close(ctx))
			rec.mu.Lock()
			defer rec.mu.Unlock()
			equal(t, "failed Redis commands", strings.Join(rec.errs, "; "), "")
			t.Logf("NOSCRIPT replies answered by EVAL: %d", rec.noscript)
		})
	}
}

// TestSuiteRunsOnCluster guards the harness: forEachEnv, which the main
// last-seen and purge tests use, includes the real cluster, through a
// *redis.ClusterClient.
func TestSuiteRunsOnCluster(t *testing.T) {
	var names []string
	for _, r := range testenv.RedisKinds() {
		names = append(names, r.Name)
	}
	equal(t, "Redis kinds of forEachEnv", strings.Join(names, " "), "miniredis redis cluster")
	if _, ok := testenv.RedisCluster().Open(t).Client.(*redis.ClusterClient); !ok { // skips without a cluster
		t.Fatal("the cluster kind does not use a *redis.ClusterClient")
	}
}
