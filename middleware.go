package lastseen

import (
	"net/http"
	"time"

	"golang.org/x/time/rate"
)

// Middleware returns net/http middleware (chi, gorilla/mux, ServeMux)
// that touches the user of every request before the next handler runs.
// userID returns the request's primary key, or false when anonymous. It is
// best effort: Redis gets at most Buffer.TouchTimeout, and an error is
// logged at most once per 10s and never fails the request.
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
