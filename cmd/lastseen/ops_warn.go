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

// warnNoBuffer warns (on errOut; the command goes on) when --prefix or
// --shards point at no buffer: buffered entries in shards at or past
// --shards (the app uses more), or, when the buffer looks empty, no Redis
// key at all under --prefix (the app uses another prefix). buffered tells
// that the command already saw entries under --prefix and --shards, which
// spares the scan.
//
// Cost: one pipelined round trip of EXISTS for the pending and in-flight
// keys of shards --shards to keys.MaxShards-1; when nothing is buffered, a
// SCAN MATCH "<prefix>:[^m]*" (every key but the manifest) that stops at
// the first key.
func (e *opsEnv) warnNoBuffer(ctx context.Context, buffered bool) error {
	extra, err := e.extraShards(ctx)
	if err != nil {
		return err
	}
	if len(extra) > 0 {
		fmt.Fprintf(e.errOut, "lastseen: warning: shards %s of prefix %q hold buffered entries but --shards is %d: set --shards to the app's Config.Shards\n",
			list(extra), e.f.Prefix, e.f.Shards)
		return nil
	}
	if buffered {
		return nil
	}
	found, err := runenv.AnyKey(ctx, e.rdb, keys.Used(e.f.Prefix)) // the manifest does not count: openOps wrote it
	if err != nil {
		return fmt.Errorf("lastseen: scan %s: %w", keys.Used(e.f.Prefix), err)
	}
	if !found {
		fmt.Fprintf(e.errOut, "lastseen: warning: no Redis key under prefix %q: set --prefix to the app's Config.Prefix\n", e.f.Prefix)
	}
	return nil
}

// extraShards returns the shards at or past --shards that have a pending
// or in-flight hash (a SCAN of the prefix's buffer keys).
func (e *opsEnv) extraShards(ctx context.Context) ([]int, error) {
	seen := map[int]bool{}
	for _, pattern := range keys.Buffered(e.f.Prefix) {
		err := runenv.ScanKeys(ctx, e.rdb, pattern, func(key string) {
			if n, ok := keys.ShardOfKey(e.f.Prefix, key); ok && n >= e.f.Shards {
				seen[n] = true
			}
		})
		if err != nil {
			return nil, fmt.Errorf("lastseen: look for shards past --shards: %w", err)
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
