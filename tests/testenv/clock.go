package testenv

import (
	"sync"
	"time"
)

// Clock is a settable clock for Config.Now and the integrations' own
// clocks: tests pin it and move it by hand instead of sleeping. With a
// step, every read also moves it on by the step, so that a run timed with
// two reads lasts exactly the step. Safe for concurrent use.
type Clock struct {
	mu   sync.Mutex
	now  time.Time
	step time.Duration
}

// NewClock returns a clock reading t.
func NewClock(t time.Time) *Clock { return &Clock{now: t} }

// ClockAt returns a clock reading the RFC 3339 time s (see MustTime).
func ClockAt(s string) *Clock { return NewClock(MustTime(s)) }

// SteppingClock returns a clock reading t that moves on by step after
// every read.
func SteppingClock(t time.Time, step time.Duration) *Clock { return &Clock{now: t, step: step} }

// Now returns the clock's time (then moves it on by its step, if any).
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := c.now
	c.now = c.now.Add(c.step)
	return t
}

// Add moves the clock on by d (back for a negative d).
func (c *Clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// Set moves the clock to t.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

// MustTime parses an RFC 3339 time (fractional seconds allowed) and returns
// it in UTC; it panics on a malformed one, which is a mistake in the test.
func MustTime(s string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		panic(err)
	}
	return t.UTC()
}
