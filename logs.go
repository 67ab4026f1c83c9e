package lastseen

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// warnInterval is how often one message of a rateLimitedLog gets through.
const warnInterval = 10 * time.Second

// rateLimitedLog lets a message through at most once per warnInterval
// (per message text) and adds "suppressed", the number of lines of that
// message it held back since the last one it let through, when not zero.
// Per-entry warnings of a flush (an unreadable entry, a refused row) go
// through it: a buffer full of bad entries logs a line per interval, not a
// line per entry; the flush's own line counts them all.
type rateLimitedLog struct {
	now func() time.Time // time.Now; tests replace it

	mu   sync.Mutex
	last map[string]time.Time
	held map[string]int
}

// log logs msg at level on l unless the same message got through less than
// warnInterval ago.
func (r *rateLimitedLog) log(l *slog.Logger, level slog.Level, msg string, args ...any) {
	now := time.Now
	if r.now != nil {
		now = r.now
	}
	t := now()
	r.mu.Lock()
	if r.last == nil {
		r.last, r.held = map[string]time.Time{}, map[string]int{}
	}
	if last, ok := r.last[msg]; ok && t.Sub(last) < warnInterval {
		r.held[msg]++
		r.mu.Unlock()
		return
	}
	r.last[msg] = t
	held := r.held[msg]
	delete(r.held, msg)
	r.mu.Unlock()
	if held > 0 {
		args = append(args, "suppressed", held)
	}
	l.Log(context.Background(), level, msg, args...)
}
