package tests

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lastseen/lastseen/internal/keys"
	"github.com/lastseen/lastseen/tests/testenv"
	"github.com/redis/go-redis/v9"
)

// TestLayoutHashesStayListpack: on a real Redis (a private redis-server,
// default hash-max-listpack-entries 512), 2,000 integer users touched with
// Shards 16, then the odd ones again one and a half throttle windows later,
// leave every window hash listpack-encoded, each user's entry in its
// bucket's hash of each window it was recorded in (the even users' in the
// window ending at 09:31, the odd users' in it and in the one ending at
// 09:32), 3,000 entries waiting (a user recorded in two windows counts
// twice until a flush moves them), and a flush writes each user's newest.
func TestLayoutHashesStayListpack(t *testing.T) {
	rs := startPrivateRedis(t)
	rdb := newPrivateClient(t, rs.Addr())
	h := newHarness(t, testenv.SQLite(), clientKind(rdb))
	ctx := context.Background()
	const users = 2000
	seedUsers(t, h.db, users)
	cfg := h.config()
	cfg.Buffer.Shards = 16
	cfg.Throttle = time.Minute
	p, db := h.plugin(cfg)

	first := windowEnd(p) // 09:31:00Z
	equal(t, "first window's end", first.Format(time.RFC3339), "2026-03-01T09:31:00Z")
	for id := 1; id <= users; id++ {
		ok, err := p.Touch(ctx, id)
		must(t, err)
		if !ok {
			t.Fatalf("user %d not recorded", id)
		}
	}
	h.clock.Add(90 * time.Second) // 09:31:30Z: the next window
	second := windowEnd(p)
	equal(t, "second window's end", second.Format(time.RFC3339), "2026-03-01T09:32:00Z")
	for id := 1; id <= users; id += 2 {
		ok, err := p.Touch(ctx, id)
		must(t, err)
		if !ok {
			t.Fatalf("user %d not recorded again", id)
		}
	}

	var windows []string
	iter := rdb.Scan(ctx, 0, h.prefix+":*", 1000).Iterator()
	for iter.Next(ctx) {
		switch k := iter.Val(); {
		case strings.Contains(k, ":pending:"):
			t.Fatalf("pending hash %s before a flush", k)
		case strings.Contains(k, ":window:"):
			windows = append(windows, k)
		}
	}
	must(t, iter.Err())
	encodings := map[string]int{}
	for _, k := range windows {
		enc, err := rdb.ObjectEncoding(ctx, k).Result()
		must(t, err)
		encodings[enc]++
	}
	equal(t, "hash encodings", fmt.Sprint(encodings), fmt.Sprintf("map[listpack:%d]", len(windows)))

	where := map[string][]string{}
	for _, k := range windows {
		fields, err := rdb.HKeys(ctx, k).Result()
		must(t, err)
		for _, f := range fields {
			where[f] = append(where[f], k)
		}
	}
	equal(t, "users with an entry", len(where), users)
	for id := 1; id <= users; id++ {
		uid := strconv.Itoa(id)
		want := []string{windowKey(p, uid, first)}
		if id%2 == 1 {
			want = append(want, windowKey(p, uid, second))
		}
		slices.Sort(where[uid])
		if got := strings.Join(where[uid], " "); got != strings.Join(want, " ") {
			t.Errorf("window hashes of user %d = %q, want %q", id, got, strings.Join(want, " "))
		}
	}
	st, err := p.Status(ctx)
	must(t, err)
	equal(t, "status pending (entries)", st.Pending, int64(users+users/2))

	res, err := p.Flush(ctx)
	must(t, err)
	equal(t, "drained", res.Drained, users)
	equal(t, "written", res.Written, users)
	for _, id := range []int{1, 2, 1999, 2000} {
		want := "2026-03-01T09:30:00Z"
		if id%2 == 1 {
			want = "2026-03-01T09:31:30Z"
		}
		equal(t, fmt.Sprintf("user %d", id), lastSeenColumn(t, db, "users", "id", "last_seen_at", id), want)
	}
}

// TestLayoutBucketKeysShareShardSlot: on a Redis Cluster, every bucket key
// of shard N (pending, in-flight, window of any end) and its lock, refusals
// hash and hash of windows hash to the slot of "{N}", for 1, 16 and 1024 shards:
// each script and RENAME of a shard stays in one slot.
func TestLayoutBucketKeysShareShardSlot(t *testing.T) {
	addrs := strings.Split(testenv.Need(t, testenv.EnvRedisCluster), ",")
	c := redis.NewClient(&redis.Options{Addr: addrs[0]}) // CLUSTER KEYSLOT is answered by any node
	t.Cleanup(func() { c.Close() })
	ctx := context.Background()
	for _, shards := range []int{1, 16, keys.MaxShards} {
		type check struct {
			key  string
			slot *redis.IntCmd
		}
		var checks []check
		tags := make([]*redis.IntCmd, shards)
		_, err := c.Pipelined(ctx, func(pipe redis.Pipeliner) error {
			for n := range shards {
				tags[n] = pipe.ClusterKeySlot(ctx, "{"+strconv.Itoa(n)+"}")
				k := keys.ForShard("ls:layout", n, shards)
				names := []string{k.Lock, k.Refusals, k.Windows()}
				for b := range k.Buckets {
					names = append(names, k.Pending(b), k.InFlight(b), k.Window(b, 0), k.Window(b, 29_539_290))
				}
				for _, key := range names {
					checks = append(checks, check{key, pipe.ClusterKeySlot(ctx, key)})
				}
			}
			return nil
		})
		must(t, err)
		per := len(checks) / shards
		equal(t, fmt.Sprintf("keys checked, %d shards", shards), len(checks), shards*(3+4*keys.Buckets(shards)))
		bad := 0
		for i, ch := range checks {
			n := i / per
			if ch.slot.Val() != tags[n].Val() && bad < 5 {
				bad++
				t.Errorf("%d shards: CLUSTER KEYSLOT %s = %d, want %d (slot of {%d})", shards, ch.key, ch.slot.Val(), tags[n].Val(), n)
			}
		}
	}
}
