package tests

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/tests/testenv"
)

// subRouterApp is an app whose authentication runs in the /api/ sub-router
// only, after the top-level DeferredMiddleware: it names the user from the
// X-User header, with SetUserKnown when X-Known carries the loaded row's
// last-seen value. With X-Check its handler reports whether the user was
// already pending while it ran.
func subRouterApp(t *testing.T, p *lastseen.Plugin) http.Handler {
	auth := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if u := r.Header.Get("X-User"); u != "" {
				if k := r.Header.Get("X-Known"); k != "" {
					lastseen.SetUserKnown(r.Context(), u, mustTime(k))
				} else {
					lastseen.SetUser(r.Context(), u)
				}
			}
			next.ServeHTTP(w, r)
		})
	}
	api := http.NewServeMux()
	api.HandleFunc("GET /api/profile", func(w http.ResponseWriter, r *http.Request) {
		u := r.Header.Get("X-User")
		if r.Header.Get("X-Check") == "" {
			fmt.Fprintf(w, "profile of %s", u)
			return
		}
		_, pending, err := p.Pending(r.Context(), u)
		if err != nil {
			t.Errorf("pending: %v", err)
		}
		fmt.Fprintf(w, "profile of %s, pending during the handler: %v", u, pending)
	})
	root := http.NewServeMux()
	root.Handle("/api/", auth(api))
	root.HandleFunc("GET /public", func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "public") })
	return p.DeferredMiddleware()(root)
}

func get(h http.Handler, path string, headers ...string) (int, string) {
	req := httptest.NewRequest(http.MethodGet, path, nil)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Code, rec.Body.String()
}

// TestDeferredMiddlewareTouchesUserNamedBySubRouter: the user an inner
// auth middleware names is touched after the handler returned; anonymous
// and public requests send nothing; a known value inside the window costs
// no Redis command; SetUser outside the middleware reports false.
func TestDeferredMiddlewareTouchesUserNamedBySubRouter(t *testing.T) {
	h := newHarness(t, testenv.SQLite(), testenv.Miniredis())
	ctx := context.Background()
	p, db := h.plugin(withModel(h.config(), &usernameUser{}))
	must(t, db.AutoMigrate(&usernameUser{}))
	app := subRouterApp(t, p)
	cc := countCommands(h.r.Client)

	code, body := get(app, "/public")
	equal(t, "public", fmt.Sprint(code, " ", body), "200 public")
	code, body = get(app, "/api/profile")
	equal(t, "anonymous", fmt.Sprint(code, " ", body), "200 profile of ")
	equal(t, "touches after anonymous requests", p.Stats().Touches, 0)
	equal(t, "redis commands after anonymous requests", cc.sent.Load(), 0)

	code, body = get(app, "/api/profile", "X-User", "ada", "X-Check", "1")
	equal(t, "ada", fmt.Sprint(code, " ", body), "200 profile of ada, pending during the handler: false")
	at, ok, err := p.Pending(ctx, "ada")
	must(t, err)
	equal(t, "ada pending after the request", fmt.Sprint(ok, " ", at.Format(time.RFC3339)), "true 2026-03-01T09:30:00Z")

	before := cc.sent.Load()
	code, _ = get(app, "/api/profile", "X-User", "bob", "X-Known", "2026-03-01T09:28:00Z")
	equal(t, "bob status", code, 200)
	equal(t, "redis commands for bob (known 2m ago)", cc.sent.Load()-before, 0)
	_, ok, err = p.Pending(ctx, "bob")
	must(t, err)
	equal(t, "bob pending", ok, false)

	code, _ = get(app, "/api/profile", "X-User", "cy", "X-Known", "2026-03-01T09:00:00Z")
	equal(t, "cy status", code, 200)
	_, ok, err = p.Pending(ctx, "cy")
	must(t, err)
	equal(t, "cy (known 30m ago) pending", ok, true)

	s := p.Stats()
	equal(t, "touches", s.Touches, 3)
	equal(t, "recorded", s.Recorded, 2)
	equal(t, "known", s.Known, 1)
	equal(t, "SetUser without DeferredMiddleware", lastseen.SetUser(ctx, "ada"), false)

	// Nested: an inner DeferredMiddleware shares the outer holder; the
	// user is touched by both, the second time from the local cache.
	nested := p.DeferredMiddleware()(app)
	code, _ = get(nested, "/api/profile", "X-User", "dan")
	equal(t, "dan status", code, 200)
	s = p.Stats()
	equal(t, "touches after nested", s.Touches, 5)
	equal(t, "recorded after nested", s.Recorded, 3)
	equal(t, "cache hits after nested", s.CacheHits, 1)
}

// usernameUser is keyed by a username of any length (text on PostgreSQL and
// SQLite, varchar(191) on MySQL, GORM's size for a string key there).
type usernameUser struct {
	Handle     string `gorm:"primaryKey"`
	LastSeenAt *time.Time
}

// shortUsernameUser is keyed by a varchar(64).
type shortUsernameUser struct {
	Handle     string `gorm:"primaryKey;size:64"`
	LastSeenAt *time.Time
}

// withModel tracks m in a buffer of its own under the harness's prefix: the
// buffer's manifest names one table.
func withModel(c lastseen.Config, m any) lastseen.Config {
	c.Model = m
	c.Buffer.Prefix = fmt.Sprintf("%s:%T", c.Buffer.Prefix, m)
	return c
}

// TestMaxIDLength: 128 bytes by default, or the key column's declared
// length in characters (PostgreSQL, MySQL; SQLite declares no length: GORM
// makes the column text): a 139-byte username is refused on SQLite and
// accepted where GORM declares a longer string key, and accepted, flushed
// and written with MaxIDLength 160; a varchar(64) key holds 64 characters,
// 60 "ü" (120 bytes of utf8mb4) included, and refuses a larger explicit
// value at db.Use; out-of-range values are refused.
func TestMaxIDLength(t *testing.T) {
	forEachDialect(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		must(t, h.db.AutoMigrate(&usernameUser{}, &shortUsernameUser{}))
		long := "user-" + string(make([]byte, 0)) + fmt.Sprintf("%0134d", 7) // 139 bytes
		equal(t, "username length", len(long), 139)

		p, _ := h.plugin(withModel(h.config(), &usernameUser{}))
		_, err := p.Touch(ctx, "x"+long[1:])
		wantDefault := map[bool]string{true: "lastseen: invalid user id: string of 139 bytes (at most 128)", false: "<nil>"}[h.dialect == "sqlite"]
		equal(t, "default limit", fmt.Sprint(err), wantDefault)

		cfg := withModel(h.config(), &usernameUser{})
		cfg.Buffer.Prefix += ":seam"
		testenv.Seam(&cfg).MaxIDLength = 160
		p, db := h.plugin(cfg)
		must(t, db.Create(&usernameUser{Handle: long}).Error)
		recorded, err := p.Touch(ctx, long)
		must(t, err)
		equal(t, "139 bytes with MaxIDLength 160: recorded", recorded, true)
		res, err := p.Flush(ctx)
		must(t, err)
		equal(t, "written", res.Written, 1)
		equal(t, "column", lastSeenColumn(t, db, "username_users", "handle", "last_seen_at", long), "2026-03-01T09:30:00Z")

		limit, refusal := "129 characters (at most 64)", "lastseen: invalid config: MaxIDLength 100: key column short_username_users.handle holds at most 64 characters"
		if h.dialect == "sqlite" {
			limit, refusal = "129 bytes (at most 128)", "<nil>"
		}
		p, db = h.plugin(withModel(h.config(), &shortUsernameUser{}))
		_, err = p.Touch(ctx, fmt.Sprintf("%0129d", 1))
		equal(t, "size:64 key, default, 129 bytes", fmt.Sprint(err), "lastseen: invalid user id: string of "+limit)
		_, err = p.Touch(ctx, fmt.Sprintf("%064d", 1))
		equal(t, "size:64 key, 64 bytes", err, nil)
		umlauts := strings.Repeat("ü", 60)
		must(t, db.Create(&shortUsernameUser{Handle: umlauts}).Error)
		_, err = p.TouchAt(ctx, umlauts, mustTime("2026-03-01T09:31:00Z"))
		equal(t, "size:64 key, 60 ü (120 bytes)", err, nil)
		res, err = p.Flush(ctx)
		must(t, err)
		equal(t, "size:64 key: unknown (64 zeros and a 1), written", fmt.Sprint(res.Unknown, " ", res.Written), "1 1")
		equal(t, "60 ü's column", lastSeenColumn(t, db, "short_username_users", "handle", "last_seen_at", umlauts), "2026-03-01T09:31:00Z")

		for _, c := range []struct {
			model any
			n     int
			want  string
		}{
			{&shortUsernameUser{}, 100, refusal},
			{&usernameUser{}, -1, "lastseen: invalid config: MaxIDLength is -1, want 1 to 4096 bytes"},
			{&usernameUser{}, 4097, "lastseen: invalid config: MaxIDLength is 4097, want 1 to 4096 bytes"},
		} {
			cfg := withModel(h.config(), c.model)
			testenv.Seam(&cfg).MaxIDLength = c.n
			equal(t, fmt.Sprint("MaxIDLength ", c.n), fmt.Sprint(h.openDB().Use(lastseen.New(cfg))), c.want)
		}
	})
}

// binaryHandleUser is keyed by a byte string: MySQL VARBINARY(16), which
// counts bytes, not characters (a case-sensitive username key).
type binaryHandleUser struct {
	Handle     string `gorm:"primaryKey;type:varbinary(16)"`
	LastSeenAt *time.Time
}

// TestKeyLengthInBytesForBinaryColumns, on MySQL/MariaDB: a VARBINARY(16)
// key holds 16 bytes, whatever the characters: 8 "ü" (16 bytes) are
// tracked and written; 9 "ü" (18 bytes, 9 characters) are refused at
// Touch naming bytes, as no row can have that key. Before, the limit was
// taken as 16 characters, as for a VARCHAR: 9 "ü" were accepted, and 16
// "ü" too (32 bytes).
func TestKeyLengthInBytesForBinaryColumns(t *testing.T) {
	h := newHarness(t, servers.MySQL(), testenv.Miniredis())
	ctx := context.Background()
	must(t, h.db.AutoMigrate(&binaryHandleUser{}))
	p, db := h.plugin(withModel(h.config(), &binaryHandleUser{}))
	eight, nine := strings.Repeat("ü", 8), strings.Repeat("ü", 9)
	must(t, db.Create(&binaryHandleUser{Handle: eight}).Error)
	_, err := p.Touch(ctx, nine)
	equal(t, "9 ü (18 bytes)", fmt.Sprint(err), "lastseen: invalid user id: string of 18 bytes (at most 16)")
	_, err = p.Touch(ctx, eight)
	equal(t, "8 ü (16 bytes)", err, nil)
	res, err := p.Flush(ctx)
	must(t, err)
	equal(t, "written, unknown", [2]int{res.Written, res.Unknown}, [2]int{1, 0})
	equal(t, "column", lastSeenColumn(t, db, "binary_handle_users", "handle", "last_seen_at", eight), "2026-03-01T09:30:00Z")
}
