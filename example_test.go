package lastseen_test

// Examples that compile with the library alone. They need a database and a
// Redis, so they have no Output lines: go test compiles them, pkg.go.dev
// shows them. Runnable versions with checked output (SQLite, miniredis) are
// in the tests module: tests/example_test.go.

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"time"

	"github.com/lastseen/lastseen"
	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"
)

// appDialector stands for the app's driver: postgres.Open(dsn),
// mysql.Open(dsn) or a SQLite driver's Open(path).
var appDialector gorm.Dialector

// The README's integration: one plugin on the app's *gorm.DB, the
// middleware after authentication, Close at shutdown.
func Example() {
	db, err := gorm.Open(appDialector, &gorm.Config{})
	if err != nil {
		log.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	presence := lastseen.New(lastseen.Config{Redis: rdb}) // users.last_seen_at, sessions purged
	if err := db.Use(presence); err != nil {
		log.Fatal(err)
	}

	userID := func(r *http.Request) (any, bool) { // the app's authenticated user
		id, ok := r.Context().Value("user").(int64)
		return id, ok
	}
	mux := http.NewServeMux()
	srv := &http.Server{Addr: ":8080", Handler: presence.Middleware(userID)(mux)}
	go srv.ListenAndServe()

	// At shutdown: Close stops the jobs and writes what is still pending.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv.Shutdown(ctx)
	if err := presence.Close(ctx); err != nil {
		log.Print(err)
	}
}

// An operator's view of the buffer: what waits for the next flush, and
// how old the oldest entry is.
func ExamplePlugin_Status() {
	var presence *lastseen.Plugin // registered with db.Use
	st, err := presence.Status(context.Background())
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("pending %d, in flight %d, unreadable %d, oldest %v ago, backlog %d\n",
		st.Pending, st.InFlight, st.Unreadable, st.OldestAge().Round(time.Second), st.Backlog)
	for n, s := range st.Shards {
		fmt.Printf("shard %d: %+v\n", n, s)
	}
}
