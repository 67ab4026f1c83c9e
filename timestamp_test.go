package lastseen

import (
	"strconv"
	"testing"
	"time"
)

// FuzzParseMicros feeds stored values to the parser a flush reads Redis
// with: garbage, negative, zero, far future, other spellings. It accepts
// exactly a decimal integer of Unix microseconds from 1970 (exclusive) to
// the earlier of 9999-12-31 and now+MaxClockSkew, and returns it in UTC.
// Its seeds (testdata/fuzz/FuzzParseMicros) are those values at now
// 2026-03-01T10:00:00Z (1772359200000000 µs), and two at the ends of int64.
func FuzzParseMicros(f *testing.F) {
	f.Fuzz(func(t *testing.T, s string, nowMicros int64) {
		clock := time.UnixMicro(nowMicros)
		at, ok := parseMicros(s, clock)
		n, err := strconv.ParseInt(s, 10, 64)
		limit := min(maxMicros, clock.Add(MaxClockSkew).UnixMicro())
		if clock.Add(MaxClockSkew).Before(clock) { // overflow at the far end of int64
			limit = maxMicros
		}
		want := err == nil && n > 0 && n <= limit
		if ok != want {
			t.Fatalf("parseMicros(%q, now %d) ok=%v, want %v", s, nowMicros, ok, want)
		}
		if !ok {
			if !at.IsZero() {
				t.Fatalf("parseMicros(%q) not ok but returned %v", s, at)
			}
			return
		}
		if at.Location() != time.UTC || at.UnixMicro() != n {
			t.Fatalf("parseMicros(%q) = %v (%s), want %d µs in UTC", s, at, at.Location(), n)
		}
		if back, ok := parseMicros(strconv.FormatInt(micros(at), 10), clock); !ok || !back.Equal(at) {
			t.Fatalf("parseMicros(%q): the stored form of %v does not read back (%v, %v)", s, at, back, ok)
		}
	})
}
