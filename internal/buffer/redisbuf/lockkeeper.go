package redisbuf

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/lastseen/lastseen/internal/buffer"
)

// releaseGrace is how long releasing a lock may take once the caller's
// context has ended: on a healthy Redis a release takes well under a
// millisecond; on one that does not answer, the lock expires by its TTL
// instead.
const releaseGrace = 20 * time.Millisecond

// Keep keeps a Redis lock obtained just now alive while the work under it
// runs: a goroutine refreshes it (redislock Refresh, PEXPIRE) every
// LockTTL/3. It returns the context the work must run under, and stop,
// which ends the refreshing; call it when the work returns, before
// releasing the lock.
//
// The returned context is canceled with cause lost when the lock is gone
// (the refresh found another token, or no key: buffer.ErrLockLost), or when no
// refresh succeeded for LockTTL (Redis unreachable: the lock may have
// expired and another instance may hold it now). Statements running under
// it are canceled then, so no work outlives the lock by more than the time
// a canceled statement takes to stop.
func (l *redisLease) Keep(ctx context.Context, lost error) (context.Context, func()) {
	b := l.b
	run, cancel := context.WithCancelCause(ctx)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(b.lockTTL / 3)
		defer tick.Stop()
		valid := time.Now().Add(b.lockTTL) // obtained just before: at most this long ago
		for {
			select {
			case <-done:
				return
			case <-run.Done():
				return
			case <-tick.C:
			}
			start := time.Now()
			rctx, rcancel := context.WithDeadline(run, valid) // a later answer comes too late
			err := l.Refresh(rctx)
			rcancel()
			if run.Err() != nil { // the work ended (stop) or its caller's context did
				return
			}
			switch {
			case err == nil:
				valid = start.Add(b.lockTTL)
				if h := b.hooks.LockRefreshed; h != nil {
					h(l.lock.Key())
				}
			case errors.Is(err, buffer.ErrLockLost), !time.Now().Before(valid):
				b.log.Warn("lastseen: lost a lock while working under it; stopping", "key", l.lock.Key(), "err", err)
				cancel(lost)
				return
			default:
				b.log.Warn("lastseen: could not refresh a lock; retrying", "key", l.lock.Key(), "err", err, "valid_for", time.Until(valid))
			}
		}
	}()
	return run, func() {
		close(done)
		cancel(nil) // ends a refresh in flight
		wg.Wait()
	}
}
