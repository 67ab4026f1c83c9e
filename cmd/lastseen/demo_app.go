package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/lastseen/lastseen/internal/keys"
	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"
)

// The demo's app and its meters: an auth layer, a handler, the client
// that sends the workload, and counters of Redis commands and SQL
// statements.

// get sends one request, signed in as user unless it is 0.
func get(ctx context.Context, client *http.Client, url string, user int64) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("lastseen: demo request: %w", err)
	}
	if user != 0 {
		req.Header.Set("Authorization", "Bearer user-"+strconv.FormatInt(user, 10))
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("lastseen: demo request: %w", err)
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return fmt.Errorf("lastseen: demo response: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("lastseen: demo response: %s", resp.Status)
	}
	return nil
}

type userKey struct{}

// authenticate stands for the app's auth layer: it puts the user id of a
// "Bearer user-<id>" token in the request context.
func authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer user-"); ok {
			if id, err := strconv.ParseInt(tok, 10, 64); err == nil && id > 0 {
				r = r.WithContext(context.WithValue(r.Context(), userKey{}, id))
			}
		}
		next.ServeHTTP(w, r)
	})
}

// userFromContext is the middleware's user id function.
func userFromContext(r *http.Request) (any, bool) {
	id, ok := r.Context().Value(userKey{}).(int64)
	return id, ok
}

func feed(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	if id, ok := userFromContext(r); ok {
		fmt.Fprintf(w, `{"user":%d,"items":[]}`, id)
		return
	}
	fmt.Fprint(w, `{"user":null,"items":[]}`)
}

// countHook counts the Redis client's calls and commands, and the touches
// that reached Redis: HSETNX into a throttle window's hash, whose key
// starts with one of windows (internal/keys).
type countHook struct {
	calls, commands, touches atomic.Int64
	windows                  []string
}

func newCountHook(prefix string, shards int) *countHook {
	h := &countHook{}
	for n := range shards {
		h.windows = append(h.windows, keys.ForShard(prefix, n, shards).WindowPrefix())
	}
	return h
}

func (h *countHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.calls.Add(1)
		h.count(cmd)
		return next(ctx, cmd)
	}
}

func (h *countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.calls.Add(1)
		for _, cmd := range cmds {
			h.count(cmd)
		}
		return next(ctx, cmds)
	}
}

func (h *countHook) count(cmd redis.Cmder) {
	h.commands.Add(1)
	if args := cmd.Args(); cmd.Name() == "hsetnx" && len(args) > 1 {
		key, _ := args[1].(string)
		if slices.ContainsFunc(h.windows, func(w string) bool { return strings.HasPrefix(key, w) }) {
			h.touches.Add(1)
		}
	}
}

// countStatements counts the SQL statements run through db's callbacks:
// Exec, create, update and delete in writes, queries and rows in reads.
func countStatements(db *gorm.DB, writes, reads *atomic.Int64) error {
	write := func(*gorm.DB) { writes.Add(1) }
	read := func(*gorm.DB) { reads.Add(1) }
	cb := db.Callback()
	for _, err := range []error{
		cb.Query().After("gorm:query").Register("lastseen_demo:count", read),
		cb.Row().After("gorm:row").Register("lastseen_demo:count", read),
		cb.Raw().After("gorm:raw").Register("lastseen_demo:count", write),
		cb.Create().After("gorm:create").Register("lastseen_demo:count", write),
		cb.Update().After("gorm:update").Register("lastseen_demo:count", write),
		cb.Delete().After("gorm:delete").Register("lastseen_demo:count", write),
	} {
		if err != nil {
			return fmt.Errorf("lastseen: count statements: %w", err)
		}
	}
	return nil
}
