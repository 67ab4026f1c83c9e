package buffer

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/lastseen/lastseen/internal/keys"
)

// TestJoinsGroupsByMinuteAndDay: a page of entries joins one online set per
// minute and one active set per UTC day, each set once, in the order it
// first comes, with its time to live from now; values ParseMicros refuses
// and minutes past OnlineWindow are left out; with both sets off nothing.
func TestJoinsGroupsByMinuteAndDay(t *testing.T) {
	now := time.Date(2026, 3, 1, 9, 30, 0, 0, time.UTC)
	k := keys.ForPresence("p")
	us := func(s string) string {
		return strconv.FormatInt(Micros(time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC).Add(mustDur(s))), 10)
	}
	kv := []string{
		"a", us("9h29m10s"),
		"b", us("9h29m50s"), // the same minute as a
		"c", us("9h30m00s"), // the next minute
		"d", "garbage",
		"e", us("8h29m00s"), // its minute ended more than OnlineWindow ago: its day only
		"f", us("9h29m59s"), // back to a's minute
		"g", strconv.FormatInt(Micros(now.Add(2*time.Hour)), 10), // beyond now + MaxClockSkew
	}
	p := Presence{OnlineWindow: time.Hour, ActiveRetention: 35 * 24 * time.Hour}
	got := fmt.Sprint(p.Joins(k, kv, now))
	want := "[{p:{presence}:online:29539289 3600 [a b f]} {p:{presence}:active:2026-03-01 3076200 [a b c e f]} {p:{presence}:online:29539290 3660 [c]}]"
	if got != want {
		t.Errorf("Joins = %s, want %s", got, want)
	}
	if got := p.Joins(k, nil, now); got != nil {
		t.Errorf("Joins of no entries = %v, want nil", got)
	}
	if got := (Presence{OnlineWindow: -1, ActiveRetention: -1}).Joins(k, kv, now); got != nil {
		t.Errorf("Joins with both sets off = %v, want nil", got)
	}
	got = fmt.Sprint(Presence{OnlineWindow: -1, ActiveRetention: 0}.Joins(k, kv[:4], now))
	if want := "[{p:{presence}:active:2026-03-01 52200 [a b]}]"; got != want {
		t.Errorf("Joins, active only = %s, want %s", got, want)
	}
}

func mustDur(s string) time.Duration {
	d, err := time.ParseDuration(s)
	if err != nil {
		panic(err)
	}
	return d
}

// BenchmarkJoins groups a flush page of 1,000 entries whose timestamps
// fall at random within 5 minutes (as a page of a busy buffer does) by
// their presence sets.
func BenchmarkJoins(b *testing.B) {
	now := time.Date(2026, 3, 1, 9, 30, 0, 0, time.UTC)
	k := keys.ForPresence("p")
	kv := make([]string, 0, 2000)
	x := uint64(1)
	for i := range 1000 {
		x = x*6364136223846793005 + 1442695040888963407
		at := now.Add(-time.Duration(x>>33%300_000_000) * time.Microsecond)
		kv = append(kv, strconv.Itoa(i), strconv.FormatInt(Micros(at), 10))
	}
	p := Presence{OnlineWindow: time.Hour, ActiveRetention: 35 * 24 * time.Hour}
	b.ReportAllocs()
	for b.Loop() {
		if got := p.Joins(k, kv, now); len(got) != 6 {
			b.Fatalf("%d sets, want 6 (5 minutes and a day)", len(got))
		}
	}
}
