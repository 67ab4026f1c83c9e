package lastseen

import (
	"math"
	"strconv"
	"testing"
	"time"
)

// FuzzParseMicros feeds stored values to the parser a flush reads Redis
// with: garbage, negative, zero, far future, other spellings. It accepts
// exactly a decimal integer of Unix microseconds from 1970 (exclusive) to
// the earlier of 9999-12-31 and now+MaxClockSkew, and returns it in UTC.
func FuzzParseMicros(f *testing.F) {
	now := mustTime("2026-03-01T10:00:00Z").UnixMicro()
	for _, s := range []string{
		"1772359200000000", "1772362800000000", "1772362800000001", "1", "0", "-1", "-5", "", " ", "abc",
		" 1772359200000000", "1772359200000000 ", "+1772359200000000", "01772359200000000", "1772359200000000.5",
		"1.7723592e15", "0x64", "1_000", "١٢٣", "253402300799999999", "253402300800000000", "9223372036854775807",
		"9223372036854775808", "-9223372036854775808", "99999999999999999999", "NaN", "inf", "\x00", "2026-03-01T10:00:00Z",
	} {
		f.Add(s, now)
	}
	f.Add("253402300799999999", int64(math.MaxInt64))
	f.Add("1", int64(math.MinInt64))
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
