package lastseen

import (
	"context"
	"net/http"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// requestUser is the holder DeferredMiddleware puts in a request's context
// for SetUser to fill.
type requestUser struct {
	mu    sync.Mutex
	id    any
	known time.Time
	set   bool
}

type requestUserKey struct{}

// SetUser names the user of the request whose context ctx is, for the
// DeferredMiddleware around the handler: it touches that user once the
// handler returns. Call it from the authentication middleware of a
// sub-router, where the user becomes known after the top-level middleware
// has run. userID is what Touch takes. A later call replaces an earlier one.
// It reports false, and does nothing, when no DeferredMiddleware is around
// the handler.
func SetUser(ctx context.Context, userID any) bool {
	return setUser(ctx, userID, time.Time{})
}

// SetUserKnown is SetUser for an authentication middleware that loaded the
// user's row: known is its last-seen value, and the touch is TouchKnown's,
// free when known lies inside the throttle window. Pass the zero time for a
// NULL column.
func SetUserKnown(ctx context.Context, userID any, known time.Time) bool {
	return setUser(ctx, userID, known)
}

func setUser(ctx context.Context, userID any, known time.Time) bool {
	h, ok := ctx.Value(requestUserKey{}).(*requestUser)
	if !ok {
		return false
	}
	h.mu.Lock()
	h.id, h.known, h.set = userID, known, true
	h.mu.Unlock()
	return true
}

// DeferredMiddleware returns net/http middleware for apps that
// authenticate inside sub-routers: it puts a holder in the request's
// context, runs the next handler, and then touches the user that an inner
// handler named with SetUser or SetUserKnown (nothing for a request that
// named none). Nested DeferredMiddlewares share the outermost holder. The
// touch runs after the response was written, on the request's context
// without its cancellation (a client that hung up still counts), bounded
// by TouchTimeout. Like Middleware it is best effort: an error is logged at
// most once per 10 seconds and never changes the response; a handler that
// panics is not touched.
func (p *Plugin) DeferredMiddleware() func(http.Handler) http.Handler {
	warn := &rate.Sometimes{Interval: 10 * time.Second}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if _, ok := r.Context().Value(requestUserKey{}).(*requestUser); ok {
				next.ServeHTTP(w, r) // an outer DeferredMiddleware owns the holder
				p.touchHeld(r.Context(), warn)
				return
			}
			h := &requestUser{}
			r = r.WithContext(context.WithValue(r.Context(), requestUserKey{}, h))
			next.ServeHTTP(w, r)
			p.touchHeld(r.Context(), warn)
		})
	}
}

// touchHeld touches the user held in ctx, if a handler named one.
func (p *Plugin) touchHeld(ctx context.Context, warn *rate.Sometimes) {
	h := ctx.Value(requestUserKey{}).(*requestUser)
	h.mu.Lock()
	id, known, set := h.id, h.known, h.set
	h.mu.Unlock()
	if !set {
		return
	}
	if _, err := p.TouchKnown(context.WithoutCancel(ctx), id, known); err != nil {
		warn.Do(func() { p.log.Warn("lastseen: deferred middleware touch failed", "err", err) })
	}
}
