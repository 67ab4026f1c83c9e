package tests

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/tests/testenv"
)

// userFromHeader is the test apps' extractor: the X-User header, absent for
// anonymous requests.
func userFromHeader(r *http.Request) (any, bool) {
	v := r.Header.Get("X-User")
	return v, v != ""
}

// serve runs one request through h and returns status and body.
func serve(t *testing.T, h http.Handler, user string) (int, string) {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, "/profile", nil)
	if user != "" {
		req.Header.Set("X-User", user)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Code, rec.Body.String()
}

// okHandler answers 200 "hello <user>" and counts its calls.
func okHandler(calls *int) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		*calls++
		fmt.Fprintf(w, "hello %s", r.Header.Get("X-User"))
	})
}

// TestMiddlewareTouchesUser: the extractor's user is touched, the request
// is served, anonymous requests send nothing to Redis.
func TestMiddlewareTouchesUser(t *testing.T) {
	h := newHarness(t, testenv.SQLite(), testenv.Miniredis())
	ctx := context.Background()
	p, _ := h.plugin(h.config())
	rec := recordCommands(h.r.Client)
	calls := 0
	handler := p.Middleware(userFromHeader)(okHandler(&calls))

	rec.reset()
	code, body := serve(t, handler, "")
	equal(t, "anonymous status", code, http.StatusOK)
	equal(t, "anonymous body", body, "hello ")
	equal(t, "anonymous redis commands", rec.names(), "")
	equal(t, "anonymous touches", p.Stats().Touches, 0)

	code, body = serve(t, handler, "42")
	equal(t, "status", code, http.StatusOK)
	equal(t, "body", body, "hello 42")
	at, ok, err := p.Pending(ctx, 42)
	must(t, err)
	equal(t, "pending ok", ok, true)
	equal(t, "pending", at.Format(time.RFC3339), "2026-03-01T09:30:00Z")

	rec.reset()
	h.clock.Add(time.Second)
	code, _ = serve(t, handler, "42")
	equal(t, "throttled status", code, http.StatusOK)
	equal(t, "throttled redis commands", rec.names(), "")

	code, body = serve(t, handler, "not-a-number") // invalid for the uint64 key
	equal(t, "invalid id status", code, http.StatusOK)
	equal(t, "invalid id body", body, "hello not-a-number")
	equal(t, "handler calls", calls, 4)
	s := p.Stats()
	equal(t, "touches", s.Touches, 3)
	equal(t, "recorded", s.Recorded, 1)
	equal(t, "invalid", s.Invalid, 1)
}

// TestMiddlewareRedisDown: with Redis gone the request is still served,
// the touch is kept in memory, and the next flush after Redis is back
// writes it.
func TestMiddlewareRedisDown(t *testing.T) {
	h := newHarness(t, testenv.SQLite(), testenv.Miniredis())
	ctx := context.Background()
	cfg := h.config()
	cfg.Buffer.TouchTimeout = 200 * time.Millisecond
	p, db := h.plugin(cfg)
	seedUsers(t, db, 7)
	calls := 0
	handler := p.Middleware(userFromHeader)(okHandler(&calls))

	h.r.Mini.Close()
	code, body := serve(t, handler, "7")
	equal(t, "status with redis down", code, http.StatusOK)
	equal(t, "body with redis down", body, "hello 7")
	equal(t, "handler calls", calls, 1)
	s := p.Stats()
	equal(t, "redis errors", s.RedisErrors, 1)
	equal(t, "backlogged", s.Backlogged, 1)
	equal(t, "backlog", s.Backlog, 1)

	must(t, h.r.Mini.Restart())
	res, err := p.Flush(ctx)
	must(t, err)
	equal(t, "written after redis is back", res.Written, 1)
	equal(t, "column", lastSeenColumn(t, db, "users", "id", "last_seen_at", 7), "2026-03-01T09:30:00Z")
}

// TestMiddlewareServeMux: the middleware wraps a standard ServeMux behind a
// real HTTP server; every route is served and every user touched once.
func TestMiddlewareServeMux(t *testing.T) {
	h := newHarness(t, testenv.SQLite(), testenv.Miniredis())
	ctx := context.Background()
	p, db := h.plugin(h.config())
	seedUsers(t, db, 3)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /items/{id}", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "item %s", r.PathValue("id"))
	})
	mux.HandleFunc("POST /logout", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	})
	srv := httptest.NewServer(p.Middleware(userFromHeader)(mux))
	defer srv.Close()

	do := func(method, path, user string) (int, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, method, srv.URL+path, nil)
		must(t, err)
		if user != "" {
			req.Header.Set("X-User", user)
		}
		resp, err := srv.Client().Do(req)
		must(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		must(t, err)
		return resp.StatusCode, string(b)
	}
	for _, c := range []struct {
		method, path, user string
		code               int
		body               string
	}{
		{"GET", "/items/5", "1", 200, "item 5"},
		{"GET", "/items/6", "1", 200, "item 6"},
		{"POST", "/logout", "2", 204, ""},
		{"GET", "/items/7", "", 200, "item 7"},
		{"GET", "/nowhere", "3", 404, "404 page not found\n"},
	} {
		code, body := do(c.method, c.path, c.user)
		equal(t, c.method+" "+c.path+" status", code, c.code)
		equal(t, c.method+" "+c.path+" body", body, c.body)
	}
	s := p.Stats()
	equal(t, "touches", s.Touches, 4)
	equal(t, "recorded", s.Recorded, 3)
	res, err := p.Flush(ctx)
	must(t, err)
	equal(t, "written", res.Written, 3)
	got := columnsByID(t, db, "users", "id", "last_seen_at")
	equal(t, "columns", fmt.Sprint(got["1"], got["2"], got["3"]), strings.Repeat("2026-03-01T09:30:00Z", 3))
}

// discardWriter is a ResponseWriter that keeps nothing, for counting the
// middleware's own allocations.
type discardWriter struct{ h http.Header }

func (w discardWriter) Header() http.Header         { return w.h }
func (w discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w discardWriter) WriteHeader(int)             {}

// TestMiddlewareWarnsWithoutUsers: a middleware whose first 100 requests
// have no user logs one warning naming the likely cause, at the 100th and
// never again; one that saw a user first stops counting and never warns.
// Each middleware counts its own requests, Middleware and
// DeferredMiddleware alike.
func TestMiddlewareWarnsWithoutUsers(t *testing.T) {
	h := newHarness(t, testenv.SQLite(), testenv.Miniredis())
	var logs testenv.Logs
	cfg := h.config()
	cfg.Logger = testenv.TextLogger(&logs)
	p, _ := h.plugin(cfg)
	logs.Take() // db.Use's warnings (no users table)
	next := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	setUser := http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) { lastseen.SetUser(r.Context(), uint64(42)) })
	plain := `level=WARN msg="lastseen: middleware saw 100 requests and never a user: it is probably mounted outside (before) ` +
		`the authentication middleware, or its userID function returns false; mount it after authentication" ` + logAttrs(h) + "\n"
	deferred := `level=WARN msg="lastseen: deferred middleware saw 100 requests and never a user: SetUser is probably never called; ` +
		`call SetUser or SetUserKnown in the authentication middleware, inside the deferred middleware" ` + logAttrs(h) + "\n"
	noTime := regexp.MustCompile(`(?m)^time=\S+ `)
	take := func() string { return noTime.ReplaceAllString(logs.Take(), "") }

	for _, c := range []struct {
		name    string
		handler http.Handler // anonymous requests only
		want    string
	}{
		{"Middleware", p.Middleware(userFromHeader)(next), plain},
		{"another Middleware", p.Middleware(userFromHeader)(next), plain},
		{"DeferredMiddleware", p.DeferredMiddleware()(next), deferred},
	} {
		for range 99 {
			serve(t, c.handler, "")
		}
		equal(t, c.name+": logs after 99 requests", take(), "")
		serve(t, c.handler, "")
		equal(t, c.name+": logs after 100 requests", take(), c.want)
		for range 1000 {
			serve(t, c.handler, "")
		}
		equal(t, c.name+": logs after 1100 requests", take(), "")
	}

	mw := p.Middleware(userFromHeader)(next)
	dm := p.DeferredMiddleware()
	anonDeferred, userDeferred := dm(next), dm(setUser)
	for range 50 {
		serve(t, mw, "")
		serve(t, anonDeferred, "")
	}
	serve(t, mw, "42")
	serve(t, userDeferred, "")
	for range 500 {
		serve(t, mw, "")
		serve(t, anonDeferred, "")
	}
	equal(t, "logs after a user was seen", take(), "")
}

// TestMiddlewareAllocations: the count of requests without a user adds no
// allocation to a request, counting or stopped: Middleware allocates
// nothing for an anonymous request and 1 for a throttled user (the id
// boxed by the extractor), DeferredMiddleware 3 and 4 (its holder and
// context), as before the count.
func TestMiddlewareAllocations(t *testing.T) {
	h := newHarness(t, testenv.SQLite(), testenv.Miniredis())
	p, _ := h.plugin(h.config())
	next := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	setUser := http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) { lastseen.SetUser(r.Context(), uint64(42)) })
	w := discardWriter{h: http.Header{}}
	anon := httptest.NewRequest(http.MethodGet, "/", nil)
	user := httptest.NewRequest(http.MethodGet, "/", nil)
	user.Header.Set("X-User", "42")
	allocs := func(h http.Handler, r *http.Request) float64 {
		return testing.AllocsPerRun(50, func() { h.ServeHTTP(w, r) }) // 51 requests: under the 100 that warn
	}
	warn := func(h http.Handler) { // to the 100th anonymous request, which warns
		for range 100 - 51 {
			h.ServeHTTP(w, anon)
		}
	}
	mw := p.Middleware(userFromHeader)(next)
	equal(t, "Middleware, anonymous, counting", allocs(mw, anon), 0)
	warn(mw)
	equal(t, "Middleware, anonymous, warned", allocs(mw, anon), 0)
	mw.ServeHTTP(w, user) // recorded: the next are throttled by the local cache
	equal(t, "Middleware, user", allocs(mw, user), 1)
	equal(t, "Middleware, anonymous, after a user", allocs(mw, anon), 0)

	dm := p.DeferredMiddleware()
	anonDeferred, userDeferred := dm(next), dm(setUser)
	equal(t, "DeferredMiddleware, anonymous, counting", allocs(anonDeferred, anon), 3)
	warn(anonDeferred)
	equal(t, "DeferredMiddleware, anonymous, warned", allocs(anonDeferred, anon), 3)
	equal(t, "DeferredMiddleware, user", allocs(userDeferred, anon), 4)
}
