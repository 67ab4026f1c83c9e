package tests

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/lastseen/lastseen/internal/buffer"
	"github.com/lastseen/lastseen/internal/buffer/buffertest"
	"github.com/lastseen/lastseen/internal/buffer/redisbuf"
	"github.com/lastseen/lastseen/internal/keys"
	"github.com/lastseen/lastseen/tests/testenv"
	"github.com/redis/go-redis/v9"
)

// TestRedisBufferContract runs the buffer contract suite (the one the
// in-process buffer runs in its own package) on the Redis buffer, on every
// Redis kind: miniredis, a Redis server and a Redis Cluster. Each check has
// a key prefix of its own, deleted at cleanup. miniredis v2.40.0 answers a
// PFCOUNT of several keys with the sum of their counts, not the union's
// cardinality: only a real server checks the union.
func TestRedisBufferContract(t *testing.T) {
	for _, kind := range testenv.RedisKinds() {
		t.Run(kind.Name, func(t *testing.T) {
			var quirks []buffertest.Quirk
			if kind.Name == "miniredis" {
				quirks = append(quirks, buffertest.CountSumsKeys)
			}
			buffertest.Exercise(t, func(t *testing.T, s buffertest.Setup) (buffer.Buffer, string) {
				r := kind.Open(t)
				prefix := testenv.KeyPrefix(t, r.Client)
				b := redisbuf.New(redisbuf.Options{
					Client:       r.Client,
					Prefix:       prefix,
					Shards:       s.Shards,
					Throttle:     s.Throttle,
					TouchTimeout: 5 * time.Second, // a slow machine must not send a touch to the backlog
					Presence:     s.Presence,
					Now:          s.Now,
					Logger:       slog.New(slog.NewTextHandler(io.Discard, nil)),
				})
				t.Cleanup(func() { _ = b.Close() })
				return b, prefix
			}, quirks...)
		})
	}
}

// TestRedisReadAcrossShardsRefused: a client that sends every command to one
// server which refuses a script across cluster slots (here a plain client to
// one master of the Redis Cluster, as a proxy in front of a cluster does)
// gets a CROSSSLOT error for a read across shards; the buffer reads again
// one shard per call, answers exactly, says so once, and reads one shard per
// call from then on.
func TestRedisReadAcrossShardsRefused(t *testing.T) {
	ctx := context.Background()
	r := testenv.RedisCluster().Open(t)
	cc := r.Client.(*redis.ClusterClient)
	prefix := testenv.KeyPrefix(t, r.Client)
	const shards = 16
	slots, err := cc.ClusterSlots(ctx).Result()
	must(t, err)
	owner := func(shard int) string { // the master that serves the shard's slot
		slot := cc.ClusterKeySlot(ctx, keys.ForShard(prefix, shard, shards).Lock).Val()
		for _, s := range slots {
			if int64(s.Start) <= slot && slot <= int64(s.End) {
				return s.Nodes[0].Addr
			}
		}
		t.Fatalf("no node serves slot %d", slot)
		return ""
	}
	var pair []int // two shards of one master
	for a := 0; a < shards && pair == nil; a++ {
		for b := a + 1; b < shards && pair == nil; b++ {
			if owner(a) == owner(b) {
				pair = []int{a, b}
			}
		}
	}
	if pair == nil {
		t.Fatal("no master serves two of 16 shards")
	}
	plain := redis.NewClient(&redis.Options{Addr: owner(pair[0]), ContextTimeoutEnabled: true})
	t.Cleanup(func() { plain.Close() })
	var logs testenv.Logs
	clock := testenv.ClockAt("2026-03-01T09:30:00Z")
	b := redisbuf.New(redisbuf.Options{Client: plain, Prefix: prefix, Shards: shards, TouchTimeout: 5 * time.Second,
		Now: clock.Now, Logger: testenv.TextLogger(&logs)})
	t.Cleanup(func() { _ = b.Close() })
	var uids []string
	want := map[string]string{}
	for i := 1; len(uids) < 40; i++ {
		uid := strconv.Itoa(i)
		if n := keys.ShardOf(uid, shards); n != pair[0] && n != pair[1] {
			continue
		}
		uids, want[uid] = append(uids, uid), ""
		if i%3 == 0 {
			at := clock.Now().Add(-time.Duration(i) * time.Second)
			_, _, err := b.Touch(ctx, uid, at, clock.Now(), clock.Now().Add(time.Minute))
			must(t, err)
			want[uid] = at.Format(time.RFC3339)
		}
	}
	refusals := countRoundTrips(plain)
	for read := 1; read <= 2; read++ {
		refusals.reset()
		out := make([]time.Time, len(uids))
		must(t, b.Newest(ctx, uids, out, clock.Now(), true))
		for i, uid := range uids {
			got := ""
			if !out[i].IsZero() {
				got = out[i].Format(time.RFC3339)
			}
			equal(t, fmt.Sprintf("read %d: user %s", read, uid), got, want[uid])
		}
		equal(t, fmt.Sprintf("read %d: warnings", read), logs.Count("reading one shard per call"), 1)
		if read == 2 {
			equal(t, "read 2: round trips", refusals.String(), "1 pipelines of 2 commands, 0 single commands")
		}
	}
}
