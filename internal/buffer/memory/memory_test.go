package memory_test

import (
	"testing"

	"github.com/lastseen/lastseen/internal/buffer"
	"github.com/lastseen/lastseen/internal/buffer/buffertest"
	"github.com/lastseen/lastseen/internal/buffer/memory"
)

// TestContract runs the buffer contract suite on the in-process buffer.
func TestContract(t *testing.T) {
	buffertest.Exercise(t, func(t *testing.T, s buffertest.Setup) (buffer.Buffer, string) {
		b := memory.New(memory.Options{Prefix: "test", Shards: s.Shards, Presence: s.Presence, Now: s.Now})
		t.Cleanup(func() { _ = b.Close() })
		return b, "test"
	})
}
