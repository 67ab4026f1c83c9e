package redisbuf

import (
	"context"
	"errors"
	"fmt"
	"net"

	"github.com/redis/go-redis/v9"
)

// client is the client every Redis call of the buffer goes through:
// touches, reads, the backlog replay, the flush's and the purge's commands,
// the status reads, the manifest, the eviction watch and the redislock
// locks.
//
// go-redis enforces a context's deadline on the socket only when the
// client's options have ContextTimeoutEnabled; otherwise a call waits up to
// ReadTimeout (5s by default), and longer with retries, whatever the
// context says. So when the buffer is opened (newClient):
//
//   - a *redis.Client or *redis.ClusterClient with ContextTimeoutEnabled is
//     used as it is;
//   - a *redis.Client or *redis.ClusterClient without it is copied: the
//     plugin opens its own client from a copy of the app's options with
//     ContextTimeoutEnabled set (its own connection pool, opened lazily and
//     closed by Close). Hooks added to the app's client with AddHook are not
//     on the copy: set ContextTimeoutEnabled on the app's client to keep
//     them on the plugin's commands;
//   - any other client (a Sentinel failover *redis.Client, whose dialer
//     belongs to the app's failover state, a *redis.Ring, a wrapper) is used
//     as it is, and each call runs on a goroutine of its own that the caller
//     stops waiting for when its context ends (bounded, not cancelled: the
//     abandoned call still holds its connection until go-redis's own
//     timeout).
type client struct {
	redis.UniversalClient
	// own: the plugin opened this client (a copy of the app's options) and
	// closes it in Close.
	own bool
	// deadlines: the client enforces context deadlines on its sockets, so a
	// call returns by its context's deadline without a goroutine of its own.
	deadlines bool
	// kind names the choice, for the log line at Initialize.
	kind string
}

// failoverAddr is the Addr go-redis gives the options of a Sentinel failover
// client (FailoverOptions.clientOptions): its connections are dialled through
// the client's own failover state, which a copy would not follow.
const failoverAddr = "FailoverClient"

// newClient returns the client the buffer uses for app (see client).
func newClient(app redis.UniversalClient) *client {
	switch c := app.(type) {
	case *redis.Client:
		o := c.Options()
		switch {
		case o.ContextTimeoutEnabled:
			return &client{UniversalClient: c, deadlines: true, kind: "the app's client (ContextTimeoutEnabled)"}
		case o.Addr == failoverAddr:
			return &client{UniversalClient: c, kind: "the app's failover client, each call bounded by a goroutine"}
		}
		cp := *o
		cp.ContextTimeoutEnabled = true
		cp.MinIdleConns = 0                // opened on demand
		cp.PushNotificationProcessor = nil // one per client: NewClient makes its own
		cp.ClientSideCache, cp.ClientSideCacheConfig = nil, nil
		return &client{UniversalClient: redis.NewClient(&cp), own: true, deadlines: true,
			kind: "its own client copied from the app's options with ContextTimeoutEnabled"}
	case *redis.ClusterClient:
		o := c.Options()
		if o.ContextTimeoutEnabled {
			return &client{UniversalClient: c, deadlines: true, kind: "the app's cluster client (ContextTimeoutEnabled)"}
		}
		cp := *o
		cp.ContextTimeoutEnabled = true
		cp.MinIdleConns = 0
		cp.PushNotificationProcessor = nil
		if o.MaintNotificationsConfig != nil {
			mc := *o.MaintNotificationsConfig
			cp.MaintNotificationsConfig = &mc
		}
		return &client{UniversalClient: redis.NewClusterClient(&cp), own: true, deadlines: true,
			kind: "its own cluster client copied from the app's options with ContextTimeoutEnabled"}
	}
	return &client{UniversalClient: app, kind: fmt.Sprintf("the app's %T, each call bounded by a goroutine", app)}
}

// do runs fn, one Redis call or pipeline, bounded by ctx: it returns ctx's
// error at once when ctx has already ended, and otherwise by ctx's deadline
// or cancellation at the latest. On a client that enforces deadlines fn runs
// on the caller's goroutine when ctx has a deadline; otherwise (a client
// that does not, or a context that can be cancelled but has no deadline,
// which go-redis does not watch on the socket) fn runs on a goroutine of its
// own and do stops waiting when ctx ends. fn must not be read after do
// returned ctx's error.
func (c *client) do(ctx context.Context, fn func(context.Context) error) error {
	_, err := run(ctx, c, fn, func(ctx context.Context, _ *client, fn func(context.Context) error) (struct{}, error) {
		return struct{}{}, fn(ctx)
	})
	return err
}

// run is do for fn(ctx, c, a), a function of a value rather than a closure:
// on the caller's goroutine (a client that enforces deadlines, a context
// with a deadline) a and fn are not moved to the heap, so a touch's call
// allocates nothing of its own.
func run[A, R any](ctx context.Context, c *client, a A, fn func(context.Context, *client, A) (R, error)) (R, error) {
	if err := ctx.Err(); err != nil {
		var zero R
		return zero, err
	}
	if _, ok := ctx.Deadline(); (ok && c.deadlines) || ctx.Done() == nil {
		r, err := fn(ctx, c, a)
		return r, ctxError(ctx, err)
	}
	return runAsync(ctx, c, a, fn)
}

// runAsync runs fn(ctx, c, a) on a goroutine of its own and stops waiting
// when ctx ends (see do).
func runAsync[A, R any](ctx context.Context, c *client, a A, fn func(context.Context, *client, A) (R, error)) (R, error) {
	type result struct {
		r   R
		err error
	}
	done := make(chan result, 1)
	go func() {
		r, err := fn(ctx, c, a)
		done <- result{r, err}
	}()
	select {
	case res := <-done:
		return res.r, ctxError(ctx, res.err)
	case <-ctx.Done():
		var zero R
		return zero, ctx.Err()
	}
}

// ctxError makes err, the error of a call cut short by ctx's deadline (a
// socket timeout), wrap ctx's error too, so callers can test for
// context.DeadlineExceeded.
func ctxError(ctx context.Context, err error) error {
	if err == nil || ctx.Err() == nil || errors.Is(err, ctx.Err()) {
		return err
	}
	return fmt.Errorf("%w: %w", ctx.Err(), err)
}

// close closes the client if the plugin opened it.
func (c *client) close() error {
	if !c.own {
		return nil
	}
	return c.UniversalClient.Close()
}

// isTimeout reports an error of a call that got no answer in time: a
// context deadline or a socket timeout (go-redis's ReadTimeout).
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}
