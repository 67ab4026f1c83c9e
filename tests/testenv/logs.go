package testenv

import (
	"bytes"
	"io"
	"log/slog"
	"strings"
	"sync"
)

// Logs captures what a logger writes, for tests that read it while the
// plugin's jobs still write to it. Safe for concurrent use; the zero value
// is ready.
type Logs struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p (io.Writer).
func (b *Logs) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything written and not yet taken.
func (b *Logs) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Count returns how many times s occurs in what was written (for a
// message or an attribute, the number of lines that hold it).
func (b *Logs) Count(s string) int { return strings.Count(b.String(), s) }

// Take returns what was written since the last Take, and forgets it.
func (b *Logs) Take() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.buf.String()
	b.buf.Reset()
	return s
}

// TextLogger logs text lines (key=value) at Debug level and above into w.
func TextLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// JSONLogger logs JSON lines at Debug level and above into w, without the
// time and duration attributes, the two that differ from run to run.
func JSONLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{
		Level: slog.LevelDebug,
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey || a.Key == "duration" {
				return slog.Attr{}
			}
			return a
		},
	}))
}

// Discard is a logger that drops everything, for a test that does not read
// the plugin's logs.
var Discard = slog.New(slog.NewTextHandler(io.Discard, nil))
