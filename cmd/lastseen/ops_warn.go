package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/lastseen/lastseen/cmd/lastseen/internal/runenv"
	"github.com/lastseen/lastseen/internal/keys"
)

// warnExtraShards warns (on errOut; the command goes on) when pending or
// in-flight hashes exist for shards at or past the buffer's manifest's
// shard count: an instance that ran with more shards left entries the app
// does not flush.
func (e *opsEnv) warnExtraShards(ctx context.Context) error {
	extra, err := e.extraShards(ctx)
	if err != nil {
		return err
	}
	if len(extra) > 0 {
		fmt.Fprintf(e.errOut, "lastseen: warning: shards %s of prefix %q hold buffered entries but the buffer has %d shards: an instance ran with another Buffer.Shards\n",
			list(extra), e.buf.Prefix, e.buf.shards())
	}
	return nil
}

// extraShards returns the shards at or past the buffer's that have a pending
// or in-flight hash (a SCAN of the prefix's buffer keys).
func (e *opsEnv) extraShards(ctx context.Context) ([]int, error) {
	seen := map[int]bool{}
	for _, pattern := range keys.Buffered(e.buf.Prefix) {
		err := runenv.ScanKeys(ctx, e.rdb, pattern, func(key string) {
			if n, ok := keys.ShardOfKey(e.buf.Prefix, key); ok && n >= e.buf.shards() {
				seen[n] = true
			}
		})
		if err != nil {
			return nil, fmt.Errorf("lastseen: look for shards past the buffer's %d: %w", e.buf.shards(), err)
		}
	}
	extra := make([]int, 0, len(seen))
	for n := range seen {
		extra = append(extra, n)
	}
	slices.Sort(extra)
	return extra, nil
}

// list writes up to 5 numbers and how many more.
func list(ns []int) string {
	var s []string
	for _, n := range ns[:min(len(ns), 5)] {
		s = append(s, strconv.Itoa(n))
	}
	if len(ns) > 5 {
		s = append(s, fmt.Sprintf("and %d more", len(ns)-5))
	}
	return strings.Join(s, ", ")
}
