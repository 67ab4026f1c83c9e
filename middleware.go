package lastseen

import (
	"net/http"
	"time"

	"golang.org/x/time/rate"
)

// Middleware returns net/http middleware that touches the user of every
// request, so chi, gorilla/mux and the standard ServeMux take it directly.
// userID extracts the user's primary key from the request and reports
// false for anonymous requests. It is best effort: the touch happens before
// the next handler runs, the local cache answers most requests without I/O,
// Redis is given at most TouchTimeout, and an error (Redis down, invalid id)
// is logged at most once per 10 seconds and never fails the request.
func (p *Plugin) Middleware(userID func(*http.Request) (any, bool)) func(http.Handler) http.Handler {
	warn := &rate.Sometimes{Interval: 10 * time.Second}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if id, ok := userID(r); ok {
				if _, err := p.Touch(r.Context(), id); err != nil {
					warn.Do(func() { p.log.Warn("lastseen: middleware touch failed", "err", err) })
				}
			}
			next.ServeHTTP(w, r)
		})
	}
}
