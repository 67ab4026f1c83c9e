package lastseen

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/bsm/redislock"
)

// releaseGrace is how long releasing a lock may take once the caller's
// context has ended: on a healthy Redis a release takes well under a
// millisecond; on one that does not answer, the lock expires by its TTL
// instead.
const releaseGrace = 20 * time.Millisecond

// obtainLock takes the redislock lock key for LockTTL, without retrying,
// bounded by ctx. It returns redislock.ErrNotObtained when another holder
// has it.
func (p *Plugin) obtainLock(ctx context.Context, key string) (lock *redislock.Lock, err error) {
	err = p.rdb.do(ctx, func(ctx context.Context) error {
		l, err := p.locker.Obtain(ctx, key, p.cfg.LockTTL, nil)
		lock = l
		return err
	})
	if err != nil {
		return nil, err
	}
	return lock, nil
}

// releaseLock releases lock (redislock Release: DEL if the token still
// matches), bounded by ctx, or by releaseGrace when ctx has already ended.
func (p *Plugin) releaseLock(ctx context.Context, lock *redislock.Lock) {
	cancel := context.CancelFunc(func() {})
	if ctx.Err() != nil {
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), releaseGrace)
	}
	defer cancel()
	_ = p.rdb.do(ctx, lock.Release)
}

// refreshLock extends lock to LockTTL (redislock Refresh: PEXPIRE if the
// token still matches), bounded by ctx. It returns redislock.ErrNotObtained
// when the lock is no longer held.
func (p *Plugin) refreshLock(ctx context.Context, lock *redislock.Lock) error {
	return p.rdb.do(ctx, func(ctx context.Context) error { return lock.Refresh(ctx, p.cfg.LockTTL, nil) })
}

// keepLock keeps a lock obtained just now alive while the work under it
// runs: a goroutine refreshes it every LockTTL/3. It returns the context the
// work must run under, and stop, which ends the refreshing; call it when the
// work returns, before releasing the lock.
//
// The returned context is canceled with cause lost when the lock is gone
// (the refresh found another token, or no key: ErrNotObtained), or when no
// refresh succeeded for LockTTL (Redis unreachable: the lock may have
// expired and another instance may hold it now). Statements running under
// it are canceled then, so no work outlives the lock by more than the time
// a canceled statement takes to stop.
func (p *Plugin) keepLock(ctx context.Context, lock *redislock.Lock, lost error) (context.Context, func()) {
	run, cancel := context.WithCancelCause(ctx)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(p.cfg.LockTTL / 3)
		defer tick.Stop()
		valid := time.Now().Add(p.cfg.LockTTL) // obtained just before: at most this long ago
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
			err := p.refreshLock(rctx, lock)
			rcancel()
			if run.Err() != nil { // the work ended (stop) or its caller's context did
				return
			}
			switch {
			case err == nil:
				valid = start.Add(p.cfg.LockTTL)
				p.hooks.lockRefreshed(lock.Key())
			case errors.Is(err, redislock.ErrNotObtained), !time.Now().Before(valid):
				p.log.Warn("lastseen: lost a lock while working under it; stopping", "key", lock.Key(), "err", err)
				cancel(lost)
				return
			default:
				p.log.Warn("lastseen: could not refresh a lock; retrying", "key", lock.Key(), "err", err, "valid_for", time.Until(valid))
			}
		}
	}()
	return run, func() {
		close(done)
		cancel(nil) // ends a refresh in flight
		wg.Wait()
	}
}
