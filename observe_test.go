package lastseen

import (
	"context"
	"testing"
)

// TestNoObserverFlushAllocations: with no observer the observation calls
// return the context unchanged and allocate nothing.
func TestNoObserverFlushAllocations(t *testing.T) {
	p := New(Config{})
	ctx := context.Background()
	allocs := testing.AllocsPerRun(100, func() {
		c, end := p.observeFlush(ctx)
		end(FlushResult{}, nil)
		c, endShard := p.observeFlushShard(c, 1)
		endShard(FlushResult{}, nil)
		c, endPurge := p.observePurge(c)
		endPurge(PurgeResult{}, nil)
		c, endBatch := p.observePurgeBatch(c, 1)
		endBatch(0, nil)
		if c != ctx {
			t.Fatal("context changed")
		}
	})
	equal(t, "allocations", allocs, 0)
}
