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

// SetUser names the request's user, from an authentication middleware in
// a sub-router, for the DeferredMiddleware around it to touch once the
// handler returns. userID is what Touch takes; a later call replaces an
// earlier one. It returns false, doing nothing, without a
// DeferredMiddleware.
func SetUser(ctx context.Context, userID any) bool {
	return setUser(ctx, userID, time.Time{})
}

// SetUserKnown is SetUser with the user's loaded last-seen value (zero for
// NULL): the touch is TouchKnown's.
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
// authenticate in sub-routers: after the handler returns it touches the
// user named with SetUser or SetUserKnown (nested ones share the
// outermost), ignoring the request's cancellation; not after a panic.
// Otherwise it works as Middleware.
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
