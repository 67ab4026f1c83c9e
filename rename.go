package lastseen

import (
	"context"
	"fmt"
)

// Rename moves the buffered activity of a user whose primary key changes
// (a username key renamed in settings) from oldID to newID, both given as
// to Touch: the newest timestamp buffered for oldID (pending, in flight in
// a flush, or kept in this process's backlog while Redis did not answer)
// raises newID's pending timestamp, newest wins, and oldID's entries are
// removed. Call it when the app changes the key, before or after its own
// UPDATE of the row: the next flush writes the timestamp to the row under
// newID. Without it, a timestamp pending under oldID is counted Unknown by
// the flush that finds no row with that key, and is lost.
//
// Throttle markers are not moved: newID's next touch opens a throttle
// window of its own (one more recorded touch). Renaming an id to itself,
// or one with nothing buffered, does nothing and returns nil.
//
// It is safe against a concurrent flush, on any instance: a flush that
// swapped oldID's entry to in-flight but has not read it yet finds it gone;
// one that read it before the rename writes it under oldID as well (a
// no-op, or Unknown when the row already has its new key), and never puts
// it back under oldID. The timestamp is never lost: with Redis, newID is
// raised before oldID is removed (one script on each id's shard, so the
// two may live on different Redis Cluster masters), and an error between
// the two leaves it under both. Touches of oldID kept in another
// instance's backlog are not moved.
//
// Errors: ErrInvalidUserID (wrapped, naming oldID or newID), ErrClosed
// after Close without Redis, ErrNotInitialized, and the buffer's error
// (Redis did not answer), which says under which id the timestamp is.
func (p *Plugin) Rename(ctx context.Context, oldID, newID any) error {
	t := p.tracker
	if t == nil {
		return p.notReady()
	}
	from, err := t.ids.Normalize(oldID)
	if err != nil {
		return fmt.Errorf("lastseen: rename: oldID: %w", err)
	}
	to, err := t.ids.Normalize(newID)
	if err != nil {
		return fmt.Errorf("lastseen: rename: newID: %w", err)
	}
	if from == to {
		return nil
	}
	if p.touchClosed.Load() {
		return ErrClosed
	}
	moved, err := t.buf.Rename(ctx, from, to, p.now())
	if err != nil {
		return fmt.Errorf("lastseen: rename user %s to %s: %w", from, to, err)
	}
	if !moved.IsZero() {
		p.log.Debug("lastseen: renamed a user's buffered activity", "from", from, "to", to, "at", moved)
	}
	return nil
}
