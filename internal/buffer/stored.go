package buffer

import (
	"strconv"
	"time"
)

// MaxClockSkew is how far in the future a timestamp may lie, against the
// plugin's clock, and still be accepted: by a touch, and by a flush or a
// read taking it back from the buffer (ParseMicros). One hour.
const MaxClockSkew = time.Hour

// MaxMicros is 9999-12-31T23:59:59.999999Z in Unix microseconds, the last
// instant every dialect stores.
const MaxMicros = 253402300799999999

// Micros converts a time to the stored form: Unix microseconds, UTC.
func Micros(at time.Time) int64 { return at.UnixMicro() }

// ParseMicros reads a stored timestamp back. It accepts a decimal integer of
// Unix microseconds from 1970 (exclusive) up to the earlier of MaxMicros and
// now+MaxClockSkew, returned in UTC, and reports anything else (garbage,
// negative, far future, written by hand or by another version) as not ok,
// with the zero time.
func ParseMicros(s string, now time.Time) (time.Time, bool) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 || n > MaxMicros || n > now.Add(MaxClockSkew).UnixMicro() {
		return time.Time{}, false
	}
	return time.UnixMicro(n).UTC(), true
}

// Ceiling is the latest stored value a flush at now accepts (ParseMicros):
// Unix microseconds of now+MaxClockSkew, at most MaxMicros. A pending value
// above it is replaced rather than kept as newer.
func Ceiling(now time.Time) int64 { return min(Micros(now.Add(MaxClockSkew)), MaxMicros) }
