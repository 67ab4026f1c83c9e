package lastseen

import (
	"log/slog"
	"testing"
	"time"
)

// TestRateLimitedLog: one line per message per warnInterval; the next line
// let through says how many were held back; messages are limited apart.
func TestRateLimitedLog(t *testing.T) {
	var out logBuffer
	l := jsonLogger(&out)
	clock := newClock("2026-03-01T09:30:00Z")
	r := rateLimitedLog{now: clock.Now}
	for i := range 3 {
		r.log(l, slog.LevelWarn, "lastseen: dropping unreadable pending entry", "field", i)
	}
	r.log(l, slog.LevelError, "lastseen: database refused a pending entry; it goes back to pending", "id", "7")
	clock.Add(warnInterval - time.Microsecond)
	r.log(l, slog.LevelWarn, "lastseen: dropping unreadable pending entry", "field", 3)
	clock.Add(time.Microsecond)
	r.log(l, slog.LevelWarn, "lastseen: dropping unreadable pending entry", "field", 4)
	r.log(l, slog.LevelWarn, "lastseen: dropping unreadable pending entry", "field", 5)
	equal(t, "lines", out.take(), `{"level":"WARN","msg":"lastseen: dropping unreadable pending entry","field":0}
{"level":"ERROR","msg":"lastseen: database refused a pending entry; it goes back to pending","id":"7"}
{"level":"WARN","msg":"lastseen: dropping unreadable pending entry","field":4,"suppressed":3}
`)
}
