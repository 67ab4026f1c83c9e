package lastseen

import "time"

// dayThrottle is the throttle window of a tracked DATE column, the
// longest a day lasts (25 hours, when DST ends): each window ends at the
// next midnight in the column's location (tracker.windowEnd), and a
// Throttle of at least this long never cuts a day's window short.
const dayThrottle = 25 * time.Hour

// dayPrecision fits the settings to a tracked DATE column, known at
// db.Use from the catalog or the field's `gorm:"type:date"` tag: Throttle
// unset becomes dayThrottle (a shorter one set is refused, as it would
// record users more than once a day for nothing), and Online, which
// counts throttle windows of one day here, is off unless
// Presence.OnlineWindow was set (at least Throttle, checkCounts).
func (p *Plugin) dayPrecision() error {
	m := p.users.model
	if !m.enc.Date() {
		return nil
	}
	if p.throttleSet && p.cfg.Throttle < dayThrottle {
		return invalid("Throttle is %v, but %s.%s is a DATE column, written at most once per user per day "+
			"(each throttle window lasts until the next midnight in its location): leave Throttle unset, or at least %v",
			p.cfg.Throttle, m.table, m.time.DBName, dayThrottle)
	}
	if !p.throttleSet {
		p.cfg.Throttle = dayThrottle
	}
	if !p.onlineSet {
		p.cfg.OnlineWindow = -1
	}
	return checkCounts(p.cfg, p.dialect)
}
