package redisbuf

import (
	"context"
	"fmt"
	"time"

	"github.com/lastseen/lastseen/internal/buffer"
)

// Rename copies oldUID's buffered timestamp to newUID (buffer.Buffer). The
// backlog's entry is copied in process. In Redis the two ids may live in
// different shards, so in different Redis Cluster slots that no one script
// can both touch; each step is one script on one shard:
//
//  1. read oldUID's pending and in-flight values (read.lua);
//  2. raise newUID's pending value to the newest of them (merge.lua:
//     newest wins).
//
// oldUID's entries stay where they are: a flush before the app's UPDATE
// of the key writes them to the old row, which the UPDATE carries to the
// new key.
func (b *Buffer) Rename(ctx context.Context, oldUID, newUID string, now time.Time) (time.Time, error) {
	var moved time.Time
	if ts, ok := b.backlog.rename(oldUID, newUID); ok {
		moved = time.UnixMicro(ts).UTC()
	}
	ts, err := b.newestOf(ctx, oldUID, now)
	if err != nil {
		return moved, fmt.Errorf("read %s: %w", oldUID, err)
	}
	if ts == 0 {
		return moved, nil
	}
	to, bucket := b.locate(newUID)
	err = b.redis(ctx, func(ctx context.Context, rdb *client) error {
		return mergeScript.Run(ctx, rdb, []string{to.pending[bucket]}, buffer.Ceiling(now), 1, newUID, ts).Err()
	})
	if err != nil {
		return moved, fmt.Errorf("raise %s (the timestamp stays under %s): %w", newUID, oldUID, err)
	}
	if t := time.UnixMicro(ts).UTC(); t.After(moved) {
		moved = t
	}
	return moved, nil
}

// newestOf reads uid's pending and in-flight values in one call of the
// read script and returns the newer readable one (buffer.ParseMicros at
// now), 0 when there is none.
func (b *Buffer) newestOf(ctx context.Context, uid string, now time.Time) (int64, error) {
	k, bucket := b.locate(uid)
	var reply []any
	err := b.redis(ctx, func(ctx context.Context, rdb *client) (err error) {
		reply, err = readScript.Run(ctx, rdb, []string{k.pending[bucket], k.inflight[bucket]}, uid, oneIDLayout(uid)).Slice()
		return err
	})
	if err != nil {
		return 0, err
	}
	var newest int64
	for _, v := range reply {
		if s, ok := v.(string); ok {
			if at, valid := buffer.ParseMicros(s, now); valid && buffer.Micros(at) > newest {
				newest = buffer.Micros(at)
			}
		}
	}
	return newest, nil
}
