package buffer

import (
	"strconv"
	"testing"
	"time"
)

// FuzzParseMicros feeds stored values to the parser a flush reads the
// buffer with: garbage, negative, zero, far future, other spellings. It accepts
// exactly a decimal integer of Unix microseconds from 1970 (exclusive) to
// the earlier of 9999-12-31 and now+MaxClockSkew, and returns it in UTC.
// Its seeds (testdata/fuzz/FuzzParseMicros) are those values at now
// 2026-03-01T10:00:00Z (1772359200000000 µs), and two at the ends of int64.
func FuzzParseMicros(f *testing.F) {
	f.Fuzz(func(t *testing.T, s string, nowMicros int64) {
		clock := time.UnixMicro(nowMicros)
		at, ok := ParseMicros(s, clock)
		n, err := strconv.ParseInt(s, 10, 64)
		limit := min(MaxMicros, clock.Add(MaxClockSkew).UnixMicro())
		if clock.Add(MaxClockSkew).Before(clock) { // overflow at the far end of int64
			limit = MaxMicros
		}
		want := err == nil && n > 0 && n <= limit
		if ok != want {
			t.Fatalf("ParseMicros(%q, now %d) ok=%v, want %v", s, nowMicros, ok, want)
		}
		if !ok {
			if !at.IsZero() {
				t.Fatalf("ParseMicros(%q) not ok but returned %v", s, at)
			}
			return
		}
		if at.Location() != time.UTC || at.UnixMicro() != n {
			t.Fatalf("ParseMicros(%q) = %v (%s), want %d µs in UTC", s, at, at.Location(), n)
		}
		if back, ok := ParseMicros(strconv.FormatInt(Micros(at), 10), clock); !ok || !back.Equal(at) {
			t.Fatalf("ParseMicros(%q): the stored form of %v does not read back (%v, %v)", s, at, back, ok)
		}
	})
}

// TestMaxMicros: the constant is 9999-12-31T23:59:59.999999Z.
func TestMaxMicros(t *testing.T) {
	want := time.Date(9999, 12, 31, 23, 59, 59, 999999000, time.UTC).UnixMicro()
	if MaxMicros != want {
		t.Fatalf("MaxMicros = %d, want %d", MaxMicros, want)
	}
}
