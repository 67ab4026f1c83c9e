package tests_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/glebarez/sqlite"
	"github.com/lastseen/lastseen"
	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// Account is an app's user model.
type Account struct {
	ID         int64      `gorm:"primaryKey"`
	LastSeenAt *time.Time `gorm:"index"`
}

// APIToken is an API token whose expiry slides with its use: it expires 30
// days after it was last used.
type APIToken struct {
	ID         int64 `gorm:"primaryKey"`
	LastUsedAt *time.Time
	ExpiresAt  time.Time `gorm:"not null;index"`
}

const tokenInactivity = 30 * 24 * time.Hour

// slideTokenExpiry is the tokens' OnBatch: in the batch's transaction it
// moves each token's expires_at to its new last use + 30 days, forward only
// (an entry older than the column's value leaves the expiry alone).
func slideTokenExpiry(tx *gorm.DB, batch []lastseen.Seen) error {
	for _, s := range batch {
		err := tx.Model(&APIToken{}).Where("id = ? AND expires_at < ?", s.ID, s.At.Add(tokenInactivity)).
			UpdateColumn("expires_at", s.At.Add(tokenInactivity)).Error
		if err != nil {
			return err
		}
	}
	return nil
}

// exampleEnv opens a SQLite file and a miniredis for an example.
func exampleEnv() (db *gorm.DB, rdb *redis.Client, done func()) {
	dir, err := os.MkdirTemp("", "lastseen-example")
	if err != nil {
		log.Fatal(err)
	}
	db, err = gorm.Open(sqlite.Open(filepath.Join(dir, "app.db")), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		log.Fatal(err)
	}
	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	rdb = redis.NewClient(&redis.Options{Addr: mr.Addr()})
	return db, rdb, func() {
		rdb.Close()
		mr.Close()
		if sqlDB, err := db.DB(); err == nil {
			sqlDB.Close()
		}
		os.RemoveAll(dir)
	}
}

// Two tracked models on one *gorm.DB: accounts (last seen) and API tokens
// (last used, with an expiry that slides with each use, written by OnBatch
// in the same transaction as the batch's timestamps).
func Example_severalModels() {
	db, rdb, done := exampleEnv()
	defer done()
	now := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	quiet := slog.New(slog.DiscardHandler)
	db.AutoMigrate(&Account{}, &APIToken{})
	db.Create(&Account{ID: 1})
	db.Create(&APIToken{ID: 7, ExpiresAt: now.Add(time.Hour)})

	accounts := lastseen.New(lastseen.Config{
		Redis:    rdb,
		Model:    &Account{},
		Logger:   quiet,
		Buffer:   lastseen.BufferConfig{Prefix: "app:accounts"},
		Flush:    lastseen.FlushConfig{Schedule: "off"},
		Sessions: lastseen.SessionConfig{Disabled: true},
		Test:     lastseen.TestConfig{Now: clock},
	})
	tokens := lastseen.New(lastseen.Config{
		Redis:    rdb,
		Model:    &APIToken{},
		Field:    "LastUsedAt",
		Logger:   quiet,
		Buffer:   lastseen.BufferConfig{Prefix: "app:tokens"},
		Flush:    lastseen.FlushConfig{OnBatch: slideTokenExpiry, Schedule: "off"},
		Sessions: lastseen.SessionConfig{Disabled: true},
		Test:     lastseen.TestConfig{Now: clock},
	})
	if err := db.Use(accounts); err != nil {
		log.Fatal(err)
	}
	if err := db.Use(tokens); err != nil { // a second model: no conflict
		log.Fatal(err)
	}
	fmt.Println(accounts.Name())
	fmt.Println(tokens.Name())

	ctx := context.Background()
	accounts.Touch(ctx, int64(1)) // the request's user
	tokens.Touch(ctx, int64(7))   // the token it authenticated with
	for _, p := range []*lastseen.Plugin{accounts, tokens} {
		res, err := p.Flush(ctx)
		fmt.Println("flush: written", res.Written, "err", err)
	}

	var a Account
	var tok APIToken
	db.First(&a, 1)
	db.First(&tok, 7)
	fmt.Println("account 1 last seen", a.LastSeenAt.UTC().Format(time.RFC3339))
	fmt.Println("token 7 last used", tok.LastUsedAt.UTC().Format(time.RFC3339), "expires", tok.ExpiresAt.UTC().Format(time.RFC3339))

	db.Config.NowFunc = clock
	var online int64
	db.Model(&Account{}).Scopes(lastseen.SeenWithin(5 * time.Minute)).Count(&online) // last_seen_at
	var used int64
	db.Model(&APIToken{}).Scopes(lastseen.SeenWithin(5 * time.Minute)).Count(&used) // last_used_at
	fmt.Println("accounts online", online, "tokens in use", used)
	accounts.Close(ctx)
	tokens.Close(ctx)
	// Output:
	// lastseen:github.com/lastseen/lastseen/tests_test.Account.LastSeenAt
	// lastseen:github.com/lastseen/lastseen/tests_test.APIToken.LastUsedAt
	// flush: written 1 err <nil>
	// flush: written 1 err <nil>
	// account 1 last seen 2026-03-01T10:00:00Z
	// token 7 last used 2026-03-01T10:00:00Z expires 2026-03-31T10:00:00Z
	// accounts online 1 tokens in use 1
}

// Sessions that expire after 30 minutes without activity, or at their
// absolute expiry: a plugin tracks each session's LastActiveAt, and its
// purge keeps a session whose newer activity is still in the buffer.
func Example_slidingSession() {
	db, rdb, done := exampleEnv()
	defer done()
	now := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	db.AutoMigrate(&lastseen.Session{})
	at := func(t time.Time) *time.Time { return &t }
	db.Create([]lastseen.Session{
		{ID: "busy", UserID: 1, ExpiresAt: now.Add(24 * time.Hour), LastActiveAt: at(now.Add(-40 * time.Minute))},
		{ID: "idle", UserID: 2, ExpiresAt: now.Add(24 * time.Hour), LastActiveAt: at(now.Add(-40 * time.Minute))},
		{ID: "fresh", UserID: 3, ExpiresAt: now.Add(24 * time.Hour), LastActiveAt: at(now.Add(-5 * time.Minute))},
		{ID: "old", UserID: 4, ExpiresAt: now.Add(-time.Minute), LastActiveAt: at(now.Add(-time.Minute))},
	})

	sessions := lastseen.New(lastseen.Config{
		Redis:    rdb,
		Model:    &lastseen.Session{},
		Field:    "LastActiveAt",
		Logger:   slog.New(slog.DiscardHandler),
		Buffer:   lastseen.BufferConfig{Prefix: "app:sessions"},
		Flush:    lastseen.FlushConfig{Schedule: "off"},
		Sessions: lastseen.SessionConfig{IdleTimeout: 30 * time.Minute, Schedule: "off"},
		Test:     lastseen.TestConfig{Now: clock},
	})
	if err := db.Use(sessions); err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	sessions.Touch(ctx, "busy") // a request on the session "busy", not flushed yet

	db.Config.NowFunc = clock
	var expired []string
	db.Model(&lastseen.Session{}).Scopes(lastseen.Expired).Order("id").Pluck("id", &expired)
	fmt.Println("expired in the table:", expired)

	res, _ := sessions.PurgeExpiredSessions(ctx)
	var left []string
	db.Model(&lastseen.Session{}).Order("id").Pluck("id", &left)
	fmt.Println("purged", res.Deleted, "left:", left)

	sessions.Flush(ctx)
	var s lastseen.Session
	db.First(&s, "id = ?", "busy")
	fmt.Println("busy expired:", s.Expired(now, 30*time.Minute))
	sessions.Close(ctx)
	// Output:
	// expired in the table: [busy idle old]
	// purged 2 left: [busy fresh]
	// busy expired: false
}

// The operator's Status: what waits in the buffer for the next flush, read
// without writing anything.
func Example_status() {
	db, rdb, done := exampleEnv()
	defer done()
	now := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	db.AutoMigrate(&lastseen.User{})
	presence := lastseen.New(lastseen.Config{
		Redis:    rdb,
		Logger:   slog.New(slog.DiscardHandler),
		Buffer:   lastseen.BufferConfig{Prefix: "app:presence", Shards: 2},
		Flush:    lastseen.FlushConfig{Schedule: "off"},
		Sessions: lastseen.SessionConfig{Disabled: true},
		Test:     lastseen.TestConfig{Now: func() time.Time { return now }},
	})
	if err := db.Use(presence); err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	presence.TouchAt(ctx, 1, now.Add(-2*time.Minute))
	presence.TouchAt(ctx, 2, now.Add(-time.Minute))
	presence.TouchAt(ctx, 3, now)

	st, err := presence.Status(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("pending", st.Pending, "in flight", st.InFlight, "oldest", st.OldestAge())
	presence.Flush(ctx)
	st, _ = presence.Status(ctx)
	fmt.Println("after a flush: pending", st.Pending, "in flight", st.InFlight)
	presence.Close(ctx)
	// Output:
	// pending 3 in flight 0 oldest 2m0s
	// after a flush: pending 0 in flight 0
}

// The README's quick start, as it appears there: SQLite through
// github.com/glebarez/sqlite (the pure-Go driver the demo uses), no Redis,
// the middleware in front of the app's handlers, Close at shutdown. It
// serves on :8080 until SIGINT or SIGTERM, so it has no Output: go test
// compiles it and go vet checks it.
func Example_quickStart() {
	db, err := gorm.Open(sqlite.Open("app.db"), &gorm.Config{})
	if err != nil {
		log.Fatal(err)
	}
	db.AutoMigrate(&lastseen.User{}, &lastseen.Session{}) // your migrations
	db.FirstOrCreate(&lastseen.User{ID: 1})               // a user to try: curl -H 'X-User: 1' localhost:8080
	presence := lastseen.New(lastseen.Config{})           // no Redis: buffered in this process
	if err := db.Use(presence); err != nil {
		log.Fatal(err)
	}
	userID := func(r *http.Request) (any, bool) { // stands for your auth: the signed-in user's id
		id, err := strconv.ParseUint(r.Header.Get("X-User"), 10, 64)
		return id, err == nil
	}
	mux := http.NewServeMux() // your handlers
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "hello") })
	srv := &http.Server{Addr: ":8080", Handler: presence.Middleware(userID)(mux)}
	go srv.ListenAndServe()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	<-ctx.Done() // shutdown: stop serving, then write what is still buffered
	srv.Shutdown(context.Background())
	if err := presence.Close(context.Background()); err != nil {
		log.Print(err)
	}
}
