package memory_test

import (
	"context"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/lastseen/lastseen/internal/buffer"
	"github.com/lastseen/lastseen/internal/buffer/memory"
)

// TestNewestAgreesWithTheSets: through 3,000 random touches, swaps, acks
// (some final), requeues and in-flight puts over 4 shards and 2,000 ids
// (enough for every set's filter to have stale bits), Newest of every id
// gives exactly the newer of its pending and in-flight values that the
// shards' maps hold: the sets' filters never hide a value.
func TestNewestAgreesWithTheSets(t *testing.T) {
	ctx := context.Background()
	start := time.Date(2026, 3, 1, 9, 30, 0, 0, time.UTC)
	b := memory.New(memory.Options{Prefix: "test", Shards: 4})
	rng := rand.New(rand.NewPCG(1, 2))
	const users = 2000
	uids := make([]string, users)
	for i := range uids {
		uids[i] = "u" + strconv.Itoa(i)
	}
	now := start
	for step := range 3000 {
		now = now.Add(time.Second)
		switch op := rng.IntN(10); {
		case op < 6:
			uid := uids[rng.IntN(users)]
			_, _, err := b.Touch(ctx, uid, now.Add(-time.Duration(rng.IntN(100))*time.Second), now, now) // late: always recorded
			must(t, err)
		case op < 8:
			flushStep(t, b, rng.IntN(4), rng)
		case op < 9:
			uid := uids[rng.IntN(users)]
			memory.PutInFlight(b, uid, now.UnixMicro())
		default:
			for n := range 4 {
				flushStep(t, b, n, rng)
			}
		}
		if step%100 == 99 {
			checkNewest(t, b, uids, now, step)
		}
	}
}

// flushStep takes shard n's lease and either swaps it, or acknowledges or
// requeues some of its in-flight entries (all of them, finally, one time
// in three).
func flushStep(t *testing.T, b *memory.Buffer, n int, rng *rand.Rand) {
	t.Helper()
	ctx := context.Background()
	l, err := b.LockShard(ctx, n)
	must(t, err)
	defer l.Release(ctx)
	if _, err := l.Swap(ctx); err == nil {
		return
	}
	kv, _, _, err := l.Scan(ctx, 0, 1<<20)
	must(t, err)
	var held []buffer.Held
	var refused []buffer.Refused
	for i := 0; i+1 < len(kv); i += 2 {
		switch rng.IntN(3) {
		case 0:
			held = append(held, buffer.Held{Field: kv[i], Bucket: -1})
		case 1:
			refused = append(refused, buffer.Refused{Field: kv[i], Value: kv[i+1], Bucket: -1})
		}
	}
	_, err = l.Requeue(ctx, refused, 1<<62, 0)
	must(t, err)
	must(t, l.Ack(ctx, held, rng.IntN(3) == 0))
}

// checkNewest compares Newest of every id with the shards' maps.
func checkNewest(t *testing.T, b *memory.Buffer, uids []string, now time.Time, step int) {
	t.Helper()
	got := make([]time.Time, len(uids))
	must(t, b.Newest(context.Background(), uids, got, now, true))
	for i, uid := range uids {
		st := memory.ShardState(b, memory.ShardOf(b, uid))
		want := time.Time{}
		if ts := max(st.Pending[uid], st.InFlight[uid]); ts > 0 {
			want = time.UnixMicro(ts).UTC()
		}
		if !got[i].Equal(want) {
			t.Fatalf("after step %d: Newest(%s) = %v, want %v", step, uid, got[i], want)
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestNewestDuringSwaps: while one goroutine moves a user between pending
// and in-flight over and over (swap, requeue, final ack), Newest from
// another always finds the user: reading the filters without the shard's
// mutex never misses a user that one of the sets holds.
func TestNewestDuringSwaps(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 3, 1, 9, 30, 0, 0, time.UTC)
	b := memory.New(memory.Options{Prefix: "test", Shards: 1})
	_, _, err := b.Touch(ctx, "u", now, now, now.Add(time.Minute))
	must(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 5000 {
			l, err := b.LockShard(ctx, 0)
			if err != nil {
				panic(err)
			}
			if _, err := l.Swap(ctx); err != nil {
				panic(err)
			}
			if _, err := l.Requeue(ctx, []buffer.Refused{{Field: "u", Value: strconv.FormatInt(now.UnixMicro(), 10), Bucket: -1}}, 1<<62, 0); err != nil {
				panic(err)
			}
			if err := l.Ack(ctx, nil, true); err != nil {
				panic(err)
			}
			l.Release(ctx)
		}
	}()
	out := make([]time.Time, 1)
	for reads := 0; ; reads++ {
		select {
		case <-done:
			return
		default:
		}
		must(t, b.Newest(ctx, []string{"u"}, out, now, true))
		if !out[0].Equal(now) {
			t.Fatalf("read %d: Newest(u) = %v, want %v", reads, out[0], now)
		}
	}
}
