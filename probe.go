package lastseen

import "sync/atomic"

// pickProbe splits a refused batch into the element that is written (or
// deleted) alone, the probe, and the rest: the flush's probeBatch and the
// purge's isolate both probe this way. The probe's position rotates from
// one call to the next; calls counts the calls. probe is a one-element
// subslice of batch, rest the other elements in their order in a new slice
// (empty for a batch of one). batch must not be empty.
func pickProbe[T any](calls *atomic.Uint64, batch []T) (probe, rest []T) {
	i := int(calls.Add(1) % uint64(len(batch)))
	rest = make([]T, 0, len(batch)-1)
	rest = append(append(rest, batch[:i]...), batch[i+1:]...)
	return batch[i : i+1], rest
}
