package memory

import (
	"context"
	"time"

	"github.com/lastseen/lastseen/internal/buffer"
	"github.com/lastseen/lastseen/internal/keys"
)

// Rename copies the newest of oldUID's pending and in-flight values to
// newUID's pending value (newest wins) under both shards' mutexes, taken in
// shard order: atomic with respect to touches and to the flush's swap,
// scan, ack and requeue. oldUID's entries stay (buffer.Buffer). It never
// fails.
func (b *Buffer) Rename(_ context.Context, oldUID, newUID string, now time.Time) (time.Time, error) {
	from, to := b.shards[keys.ShardOf(oldUID, len(b.shards))], b.shards[keys.ShardOf(newUID, len(b.shards))]
	first, second := from, to
	if keys.ShardOf(newUID, len(b.shards)) < keys.ShardOf(oldUID, len(b.shards)) {
		first, second = to, from
	}
	first.mu.Lock()
	defer first.mu.Unlock()
	if second != first {
		second.mu.Lock()
		defer second.mu.Unlock()
	}
	ts := max(from.pending.m[oldUID], from.inflight.m[oldUID])
	if ts == 0 {
		return time.Time{}, nil
	}
	if cur, ok := to.pending.m[newUID]; !ok || cur < ts || cur > buffer.Ceiling(now) {
		to.pending.put(newUID, ts) // sets newUID's filter bit (set.go)
	}
	return time.UnixMicro(ts).UTC(), nil
}
