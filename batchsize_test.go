package lastseen

import (
	"testing"
	"time"
)

// TestBatchSizer: the working size starts at Flush.BatchSize; a statement
// past the bound halves it below the failed batch (never under 1, never
// raised by a larger batch failing later); a full batch committed within a
// quarter of the bound doubles it up to Flush.BatchSize; a slower one, or
// a partial batch, leaves it.
func TestBatchSizer(t *testing.T) {
	s := &batchSizer{max: 1000, bound: time.Second}
	equal(t, "first size", s.size(), 1000)
	equal(t, "after 1000 timed out", s.timedOut(1000), 500)
	equal(t, "after 500 timed out", s.timedOut(500), 250)
	equal(t, "a batch of 1000 timing out later", s.timedOut(1000), 250)
	s.committed(250, 750*time.Millisecond) // over a quarter of the bound
	equal(t, "after a slow batch", s.size(), 250)
	s.committed(100, time.Millisecond) // a partial batch says nothing of 250
	equal(t, "after a fast partial batch", s.size(), 250)
	s.committed(250, 249*time.Millisecond)
	equal(t, "after a fast batch", s.size(), 500)
	s.committed(500, time.Millisecond)
	equal(t, "after another", s.size(), 1000)
	s.committed(1000, time.Millisecond)
	equal(t, "capped at Flush.BatchSize", s.size(), 1000)
	equal(t, "a batch of 3 timed out", s.timedOut(3), 1)
	equal(t, "a batch of 1 timed out", s.timedOut(1), 1)

	fresh := &batchSizer{max: 7, bound: time.Second}
	equal(t, "timed out before any size was read", fresh.timedOut(7), 3)
}
