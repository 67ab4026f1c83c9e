package lastseen

import (
	"sync"
	"time"
)

// batchSizer is the flush's working batch size, shared by the shards and
// kept from one flush to the next: Flush.BatchSize at first; halved (to
// at most half the batch that failed) when a statement runs past the
// statement bound; doubled (up to Flush.BatchSize) after a batch of the
// working size committed within a quarter of the bound, which the doubled
// batch would then take about half of. A table that stays slow keeps the
// smaller size without a statement timing out flush after flush; one that
// became fast again gets its full batches back in a few statements.
type batchSizer struct {
	max   int           // Flush.BatchSize
	bound time.Duration // the statement bound

	mu sync.Mutex
	n  int // the working size, 1 to max; 0 before the first call
}

// size returns the working size.
func (s *batchSizer) size() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n == 0 {
		s.n = s.max
	}
	return s.n
}

// timedOut lowers the working size to at most half of n, the size of a
// batch whose statement ran past the bound, and returns it.
func (s *batchSizer) timedOut(n int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n == 0 || s.n > n/2 {
		s.n = max(1, n/2)
	}
	return s.n
}

// committed doubles the working size after a batch of n entries, at least
// the working size, committed within a quarter of the bound (took).
func (s *batchSizer) committed(n int, took time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n != 0 && s.n < s.max && n >= s.n && took < s.bound/4 {
		s.n = min(s.max, 2*s.n)
	}
}
