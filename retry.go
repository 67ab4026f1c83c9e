package lastseen

import (
	"context"
	"time"
)

// retry runs fn, and runs it again while it fails with an error retryable
// accepts (a deadlock or serialization failure: Dialect.Retryable), at most
// max more times (MaxRetries; negative: never), waiting backoff between
// attempts. retryable is asked only when another attempt is allowed, so it
// may log the retry. It returns how many times fn was repeated and fn's last
// error, or ctx's cause when ctx ends during a wait. Flush (writeWithRetry)
// and purge (deleteBatch) use it.
func retry(ctx context.Context, max int, retryable func(error) bool, fn func() error) (retries int, err error) {
	for ; ; retries++ {
		err = fn()
		if err == nil || retries >= max || !retryable(err) {
			return retries, err
		}
		if err := backoff(ctx, retries); err != nil {
			return retries, err
		}
	}
}

// backoff waits before retry attempt+1 of a deadlocked or serialized
// statement: 10ms, 40ms, 160ms, ... It returns ctx's cause if ctx ends first.
func backoff(ctx context.Context, attempt int) error {
	t := time.NewTimer(10 * time.Millisecond << (2 * attempt))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}
