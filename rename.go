package lastseen

import (
	"context"
	"fmt"
)

// Rename copies the buffered activity of a user whose primary key changes
// (a username key renamed in settings) from oldID to newID, both given as
// to Touch: the newest timestamp buffered for oldID (pending, in flight in
// a flush, or kept in this process's backlog while Redis did not answer)
// raises newID's pending timestamp, newest wins. oldID's entries stay.
//
// Call it before the app's UPDATE of the key commits (in the same request,
// just before). Then no flush, on any instance and at any point, loses the
// timestamp: one that runs before the UPDATE writes it to the old row,
// which the UPDATE carries to the new key (newID's copy is counted
// Unknown, no row has that key yet); one after it writes newID's copy to
// the renamed row (oldID's is counted Unknown). Called after the UPDATE, a
// flush between the two finds no row for oldID and the timestamp is lost.
// Without Rename, a timestamp pending under oldID is counted Unknown by
// the flush that finds no row with that key, and is lost. An id freed by
// the rename and taken by another user before the next flush receives
// oldID's timestamp, if it is newer than that user's own; so does a row
// keyed newID when the app's UPDATE then fails (newID taken): check that
// newID is free before calling Rename.
//
// Throttle windows are not copied: newID's next touch opens a throttle
// window of its own (one more recorded touch). Renaming an id to itself,
// or one with nothing buffered, does nothing and returns nil. Touches of
// oldID kept in another instance's backlog are not copied.
//
// Errors: ErrInvalidUserID (wrapped, naming oldID or newID), ErrClosed
// after Close without Redis, ErrNotInitialized, and the buffer's error
// (Redis did not answer), which says the timestamp stays under oldID.
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
		p.log.Debug("lastseen: copied a renamed user's buffered activity", "from", from, "to", to, "at", moved)
	}
	return nil
}
