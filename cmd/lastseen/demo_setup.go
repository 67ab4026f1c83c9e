package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/cmd/lastseen/internal/runenv"
	"github.com/lastseen/lastseen/internal/keys"
	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"
)

// demoRun is one demo run: what setup opened (each with its undo in
// cleanups), what drive measures and check reads back.
type demoRun struct {
	c        *demoCmd
	res      *demoResult
	conn     connFlags
	rdb      redis.UniversalClient
	mr       *miniredis.Miniredis // the in-process Redis; nil on a real one and with --memory
	db       *gorm.DB
	p        *lastseen.Plugin
	clock    *runenv.Clock // the plugin's clock on the simulated timeline
	hook     *countHook    // nil with --memory
	writes   atomic.Int64  // SQL statements that write
	reads    atomic.Int64  // SQL queries
	addr     string        // the HTTP server
	cleanups []func(ctx context.Context)
	closed   bool // the plugin is closed
}

// setup opens the Redis, the database with a table of the demo's own, the
// plugin and the HTTP server. The returned run is never nil: teardown
// undoes whatever part succeeded.
func (c *demoCmd) setup(ctx context.Context) (*demoRun, error) {
	r := &demoRun{c: c, conn: c.connFlags, res: &demoResult{
		Prefix: runenv.RandomName("lastseen-demo-"), Table: runenv.RandomName("lastseen_demo_"), Simulated: !c.hasRedis(),
	}}
	for _, step := range []func(context.Context) error{r.setupRedis, r.setupDB, r.setupPlugin, r.setupServer} {
		if err := step(ctx); err != nil {
			return r, err
		}
	}
	return r, nil
}

// teardown undoes setup in reverse order.
func (r *demoRun) teardown(ctx context.Context) {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i](ctx)
	}
}

func (r *demoRun) undo(f func(ctx context.Context)) { r.cleanups = append(r.cleanups, f) }

// setupRedis starts miniredis unless a Redis was given, or nothing with
// --memory (the plugin then buffers in process); every Redis call is
// counted by a hook; on a real Redis the demo's keys are removed at the end.
func (r *demoRun) setupRedis(ctx context.Context) error {
	switch {
	case r.c.Memory:
		return nil
	case r.res.Simulated:
		mr, err := miniredis.Run()
		if err != nil {
			return fmt.Errorf("lastseen: start miniredis: %w", err)
		}
		r.mr = mr
		r.undo(func(context.Context) { mr.Close() })
		r.rdb = redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true}) // see openRedis
	default:
		rdb, err := r.conn.openRedis(ctx)
		if err != nil {
			return err
		}
		r.rdb = rdb
	}
	rdb := r.rdb
	r.undo(func(context.Context) { rdb.Close() })
	if !r.res.Simulated {
		r.undo(func(ctx context.Context) { runenv.DeleteKeys(ctx, rdb, keys.All(r.res.Prefix)) })
	}
	r.hook = newCountHook(r.res.Prefix, lastseen.DefaultShards)
	r.rdb.AddHook(r.hook)
	return nil
}

// setupDB opens the database (a SQLite file in a temporary directory
// unless one was given), creates the demo's table and fills it with the
// users; the table is dropped at the end.
func (r *demoRun) setupDB(ctx context.Context) error {
	if !r.conn.hasDB() {
		dir, err := os.MkdirTemp("", "lastseen-demo-")
		if err != nil {
			return fmt.Errorf("lastseen: temp dir: %w", err)
		}
		r.undo(func(context.Context) { os.RemoveAll(dir) })
		r.conn.SQLite = filepath.Join(dir, "demo.db")
	}
	db, err := r.conn.openDB(ctx, tableNamer{tables: map[string]string{"demoUser": r.res.Table}})
	if err != nil {
		return err
	}
	r.db = db
	r.undo(func(context.Context) { closeDB(db) })
	if err := db.AutoMigrate(&demoUser{}); err != nil {
		return fmt.Errorf("lastseen: create demo table: %w", err)
	}
	r.undo(func(context.Context) { db.Migrator().DropTable(&demoUser{}) })
	rows := make([]demoUser, r.c.Users)
	for i := range rows {
		rows[i] = demoUser{ID: int64(i + 1), Email: fmt.Sprintf("user%d@example.test", i+1)}
	}
	if err := db.CreateInBatches(rows, 200).Error; err != nil {
		return fmt.Errorf("lastseen: fill demo table: %w", err)
	}
	return nil
}

// setupPlugin registers the plugin: on the simulated clock with
// miniredis, on the real clock otherwise.
func (r *demoRun) setupPlugin(context.Context) error {
	c := r.c
	r.res.start = time.Now().UTC().Truncate(time.Second)
	if r.res.Simulated { // the start of a throttle window: the workload's times line up with the windows
		r.res.start = windowStart(r.res.start, c.Throttle)
	}
	r.clock = runenv.NewClock(r.res.start)
	now := time.Now
	if r.res.Simulated {
		now = r.clock.Now
	}
	level := slog.LevelWarn
	if c.Verbose {
		level = slog.LevelInfo
	}
	schedule := "@every " + c.FlushEvery.String()
	if c.Fast {
		schedule = "off" // --fast flushes by hand, between phases
	}
	r.p = lastseen.New(lastseen.Config{
		Redis:    r.rdb,
		Throttle: c.Throttle,
		Model:    &demoUser{},
		Logger:   slog.New(slog.NewTextHandler(c.errOut, &slog.HandlerOptions{Level: level})),
		// Generous TouchTimeout, so that a loaded machine does not push
		// touches into the in-process backlog and the exact checks hold.
		Buffer:   lastseen.BufferConfig{Prefix: r.res.Prefix, TouchTimeout: time.Second},
		Flush:    lastseen.FlushConfig{Schedule: schedule},
		Sessions: lastseen.SessionConfig{Disabled: true}, // the demo app keeps no sessions table
		Test:     lastseen.TestConfig{Now: now},
	})
	if err := r.db.Use(r.p); err != nil {
		return err
	}
	// Every SQL statement of the workload is counted from here: not the
	// seeding, not the plugin's start-up check of the table.
	if err := countStatements(r.db, &r.writes, &r.reads); err != nil {
		return err
	}
	r.undo(func(ctx context.Context) {
		if !r.closed {
			r.p.Close(ctx)
		}
	})
	return nil
}

// setupServer starts the app on 127.0.0.1: the auth layer puts the user id
// in the context, the middleware touches it, the handler answers.
func (r *demoRun) setupServer(context.Context) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("lastseen: listen: %w", err)
	}
	srv := &http.Server{Handler: authenticate(r.p.Middleware(userFromContext)(http.HandlerFunc(feed)))}
	go srv.Serve(ln)
	r.undo(func(context.Context) { srv.Close() })
	r.addr = ln.Addr().String()
	return nil
}
