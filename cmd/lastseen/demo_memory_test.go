package main

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// TestDemoMemory runs the shortened demo with --memory (no Redis at all:
// the plugin's in-process buffer) and checks it against the same model as
// the miniredis run: the same touches recorded, rows, statements and
// values, and no Redis call.
func TestDemoMemory(t *testing.T) {
	var out bytes.Buffer
	c := fastDemo(&out, connFlags{})
	c.Memory = true
	res, err := c.run(context.Background())
	must(t, err)
	checkAgainstModel(t, c, res)
	equal(t, "redis calls", res.RedisCalls, 0)
	printed := lines(out.String())
	for _, want := range []string{
		"  redis         none: the in-process buffer (--memory)",
		fmt.Sprintf("  lastseen            %d row writes in %d statements, plus 0 Redis calls", res.Stats.RowsWritten, res.Writes),
		"  value check   every last_seen_at is the user's last recorded touch: ok",
	} {
		if !slices.Contains(printed, want) {
			t.Errorf("summary lacks line %q:\n%s", want, out.String())
		}
	}
	if !strings.Contains(out.String(), ", no Redis (the in-process buffer)\n") {
		t.Errorf("header does not name the in-process buffer:\n%s", out.String())
	}
}

// TestDemoMemoryRefusesRedis: --memory and a Redis flag exclude each other.
func TestDemoMemoryRefusesRedis(t *testing.T) {
	_, err := runCLI(t, nil, "demo", "--memory", "--redis", "127.0.0.1:6379")
	if err == nil || !strings.Contains(err.Error(), "--memory") || !strings.Contains(err.Error(), "--redis") {
		t.Errorf("error %v, want one naming --memory and --redis", err)
	}
}
