package tests

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/tests/testenv"
)

// TestUncomparableNeverStale: on SQLite, where a column holds values of any
// type, a row whose value the forward-only guard cannot compare (an integer
// of epoch milliseconds in a DATETIME column read as timestamps; text in an
// INTEGER column of epoch milliseconds) is neither written nor Stale: the
// flush counts it Uncomparable, returns ErrUncomparable naming the column,
// the encoding and the id, and keeps the entry pending, flush after flush,
// until the value can be compared; the rest of the batch is written or
// Stale as usual.
func TestUncomparableNeverStale(t *testing.T) {
	cases := []uncomparableCase{
		{"integer in a timestamp column", "nulltime_users", "CREATE TABLE nulltime_users (id integer PRIMARY KEY, seen datetime)", "1772355600000",
			"nulltime_users.seen of id 1 is not a timestamp SQLite's julianday reads (Field encoding time)",
			&nullTimeUser{}, mustTime("2026-03-01T09:00:00Z"), mustTime("2026-03-01T09:25:00Z")},
		{"text in an epoch-ms column", "ms_users", "CREATE TABLE ms_users (id integer PRIMARY KEY, seen integer)", "'2026-03-01 09:00:00'",
			"ms_users.seen of id 1 is not an integer (Field encoding unixmilli)",
			&msUser{}, mustTime("2026-03-01T09:00:00Z").UnixMilli(), mustTime("2026-03-01T09:25:00Z").UnixMilli()},
	}
	for _, tc := range cases {
		for _, buf := range []testenv.RedisKind{testenv.Miniredis(), memoryKind()} {
			t.Run(tc.name+"/"+buf.Name, func(t *testing.T) { checkUncomparable(t, newHarness(t, testenv.SQLite(), buf), tc) })
		}
	}
}

// uncomparableCase is one column and the value in it the guard cannot compare.
type uncomparableCase struct {
	name, table, ddl, bad, what string
	model                       any
	older, newer                any // comparable values: older than the touch (row 3, written), newer (row 2, Stale)
}

func checkUncomparable(t *testing.T, h *harness, tc uncomparableCase) {
	ctx := context.Background()
	must(t, h.db.Exec(tc.ddl).Error)
	must(t, h.db.Exec("INSERT INTO "+tc.table+" (id, seen) VALUES (1, "+tc.bad+"), (2, ?), (3, ?)", tc.newer, tc.older).Error)
	cfg := h.config()
	cfg.Model, cfg.Field, cfg.Buffer.Shards = tc.model, "Seen", 1
	p, db := h.plugin(cfg)
	touch := mustTime("2026-03-01T09:20:00Z")
	for _, id := range []int64{1, 2, 3} {
		_, err := p.TouchAt(ctx, id, touch)
		must(t, err)
	}
	wantErr := "lastseen: flush shard 0: 1 entries, back in pending for the next flush: lastseen: column value cannot be compared: " +
		tc.what + "; the entry stays pending"
	for i, want := range []string{"written 1 stale 1 uncomparable 1", "written 0 stale 0 uncomparable 1"} {
		res, err := p.Flush(ctx)
		if !errors.Is(err, lastseen.ErrUncomparable) {
			t.Fatalf("flush %d = %v, want ErrUncomparable", i+1, err)
		}
		equal(t, fmt.Sprintf("flush %d error", i+1), err.Error(), wantErr)
		equal(t, fmt.Sprintf("flush %d", i+1), fmt.Sprintf("written %d stale %d uncomparable %d", res.Written, res.Stale, res.Uncomparable), want)
		at, ok, err := p.Pending(ctx, int64(1))
		must(t, err)
		equal(t, fmt.Sprintf("flush %d: id 1 pending", i+1), fmt.Sprintf("%v %s", ok, at.Format(time.RFC3339)), "true 2026-03-01T09:20:00Z")
	}
	s := p.Stats()
	equal(t, "Stats", fmt.Sprintf("stale %d uncomparable %d", s.Stale, s.Uncomparable), "stale 1 uncomparable 2")

	// Once the value can be compared, the entry is written.
	must(t, db.Exec("UPDATE "+tc.table+" SET seen = NULL WHERE id = 1").Error)
	res, err := p.Flush(ctx)
	must(t, err)
	equal(t, "flush after the fix", fmt.Sprintf("written %d stale %d uncomparable %d", res.Written, res.Stale, res.Uncomparable), "written 1 stale 0 uncomparable 0")
	equal(t, "pending keys", fmt.Sprint(h.pendingKeys()), "[]")
}
