package clip

import (
	"strings"
	"testing"
)

func TestText(t *testing.T) {
	for s, want := range map[string]string{
		"":                      "",
		"bob":                   "bob",
		strings.Repeat("a", 40): strings.Repeat("a", 40),
		strings.Repeat("b", 41): strings.Repeat("b", 40) + "...",
	} {
		if got := Text(s); got != want {
			t.Errorf("Text(%d bytes) = %q, want %q", len(s), got, want)
		}
	}
}
