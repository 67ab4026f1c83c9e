package tests

import (
	"context"
	"fmt"
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
// leave every pending and marker hash listpack-encoded, each user's marker
// in exactly one generation hash (the even users' in generation g, the odd
// users' in g+1: the touch deletes the ended marker of generation g), and
// exactly 2,000 pending entries, each in its bucket's hash.
func TestLayoutHashesStayListpack(t *testing.T) {
	rs := startPrivateRedis(t)
	rdb := newPrivateClient(t, rs.Addr())
	h := newHarness(t, testenv.SQLite(), clientKind(rdb))
	ctx := context.Background()
	const users = 2000
	cfg := h.config()
	cfg.Buffer.Shards = 16
	cfg.Throttle = time.Minute
	p, _ := h.plugin(cfg)

	g := generation(p) // 09:30:00Z, the start of a generation
	for id := 1; id <= users; id++ {
		ok, err := p.Touch(ctx, id)
		must(t, err)
		if !ok {
			t.Fatalf("user %d not recorded", id)
		}
	}
	h.clock.Add(90 * time.Second) // generation g+1, 30s in: every window of g has ended
	equal(t, "generation after 90s", generation(p), g+1)
	for id := 1; id <= users; id += 2 {
		ok, err := p.Touch(ctx, id)
		must(t, err)
		if !ok {
			t.Fatalf("user %d not recorded again", id)
		}
	}

	var pending, markers []string
	iter := rdb.Scan(ctx, 0, h.prefix+":*", 1000).Iterator()
	for iter.Next(ctx) {
		switch k := iter.Val(); {
		case strings.Contains(k, ":pending:"):
			pending = append(pending, k)
		case strings.Contains(k, ":seen:"):
			markers = append(markers, k)
		}
	}
	must(t, iter.Err())
	if len(pending) == 0 || len(markers) == 0 {
		t.Fatalf("%d pending and %d marker hashes, want some of both", len(pending), len(markers))
	}
	encodings := map[string]int{}
	for _, k := range append(append([]string{}, pending...), markers...) {
		enc, err := rdb.ObjectEncoding(ctx, k).Result()
		must(t, err)
		encodings[enc]++
	}
	equal(t, "hash encodings", fmt.Sprint(encodings), fmt.Sprintf("map[listpack:%d]", len(pending)+len(markers)))

	// Every pending entry sits in its bucket's hash, once.
	entries := 0
	for _, k := range pending {
		fields, err := rdb.HKeys(ctx, k).Result()
		must(t, err)
		for _, f := range fields {
			equal(t, "pending hash of user "+f, k, pendingKey(p, f))
		}
		entries += len(fields)
	}
	equal(t, "pending entries", entries, users)
	st, err := p.Status(ctx)
	must(t, err)
	equal(t, "status pending", st.Pending, users)

	// Every user's marker is a field of exactly one marker hash: its
	// bucket's hash of the generation of its last recorded touch.
	where := map[string][]string{}
	for _, k := range markers {
		fields, err := rdb.HKeys(ctx, k).Result()
		must(t, err)
		for _, f := range fields {
			where[f] = append(where[f], k)
		}
	}
	equal(t, "users with a marker", len(where), users)
	for id := 1; id <= users; id++ {
		uid := strconv.Itoa(id)
		want := markersKey(p, uid, g+int64(id%2))
		if got := strings.Join(where[uid], " "); got != want {
			t.Errorf("marker hashes of user %d = %q, want %q", id, got, want)
		}
	}
}

// TestLayoutBucketKeysShareShardSlot: on a Redis Cluster, every bucket key
// of shard N (pending, in-flight, markers of any generation) and its lock
// and refusals hash hash to the slot of "{N}", for 1, 16 and 1024 shards:
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
				names := []string{k.Lock, k.Refusals}
				for b := range k.Buckets {
					names = append(names, k.Pending(b), k.InFlight(b), k.Markers(b, 0), k.Markers(b, 29_539_290))
				}
				for _, key := range names {
					checks = append(checks, check{key, pipe.ClusterKeySlot(ctx, key)})
				}
			}
			return nil
		})
		must(t, err)
		per := len(checks) / shards
		equal(t, fmt.Sprintf("keys checked, %d shards", shards), len(checks), shards*(2+4*keys.Buckets(shards)))
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
