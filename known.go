package lastseen

import (
	"context"
	"time"
)

// TouchKnown is Touch for an app that already loaded the user's last-seen
// value, such as the row read to authenticate the request:
//
//	p.TouchKnown(ctx, user.ID, user.LastSeenAt)
//
// When known is after now - Throttle (and at most an hour ahead), the
// user was recorded in this window already: it returns false, nil without
// any I/O or lookup, counted in Stats.Known. Otherwise, and for the zero
// time (a NULL column), it is Touch. known compares as an instant.
func (p *Plugin) TouchKnown(ctx context.Context, userID any, known time.Time) (recorded bool, err error) {
	if t := p.tracker; t != nil && !known.IsZero() {
		now := p.now()
		if known.After(now.Add(-t.throttle)) && !known.After(now.Add(maxClockSkew)) {
			p.stats.touches.Add(1)
			p.stats.throttled.Add(1)
			p.stats.known.Add(1)
			return false, nil
		}
		return p.touch(ctx, userID, now, now)
	}
	return p.Touch(ctx, userID)
}
