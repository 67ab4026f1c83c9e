package redisbuf

import "time"

// generation is where the plugin's clock stands among the marker
// generations (see the package doc, "Throttle markers").
type generation struct {
	start  int64 // Unix ms: a multiple of length
	into   int64 // ms since start
	length int64 // ms: the throttle window
}

// generation returns the marker generation at now.
func (b *Buffer) generation(now time.Time) generation {
	length := max(b.throttle.Milliseconds(), 1)
	ms := now.UnixMilli()
	n := ms / length
	if ms < 0 && ms%length != 0 {
		n-- // floor: clocks before 1970 are refused earlier, but keep the arithmetic right
	}
	return generation{start: n * length, into: ms - n*length, length: length}
}
