package lastseen

import (
	"context"
	"time"
)

// TouchKnown is Touch for an app that already holds the user's last-seen
// value, typically the row it loaded to authenticate the request:
//
//	user := loadUser(r) // SELECT ... including last_seen_at
//	p.TouchKnown(ctx, user.ID, user.LastSeenAt)
//
// When known lies inside the throttle window, that is after the plugin's
// clock minus Throttle and at most MaxClockSkew ahead of it, the user was
// recorded within the window already (the column only holds recorded
// touches), so TouchKnown returns false and nil at once: no Redis command,
// no allocation, no local cache lookup, even right after a restart when the
// local cache is empty. It counts in Stats.Touches, Throttled and Known.
// Otherwise (known older than the window, the zero time for a NULL column,
// or implausibly far ahead) it is Touch, with Touch's results and errors.
//
// known is compared as an instant, so a time read in any location works; a
// column read back with less precision than the clock is fine, as the
// window is far longer than any rounding.
func (p *Plugin) TouchKnown(ctx context.Context, userID any, known time.Time) (recorded bool, err error) {
	if t := p.tracker; t != nil && !known.IsZero() {
		now := p.now()
		if known.After(now.Add(-t.throttle)) && !known.After(now.Add(MaxClockSkew)) {
			p.stats.touches.Add(1)
			p.stats.throttled.Add(1)
			p.stats.known.Add(1)
			return false, nil
		}
		return p.touch(ctx, userID, now, now)
	}
	return p.Touch(ctx, userID)
}
