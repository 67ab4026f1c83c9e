package buffer

import (
	"strconv"
	"time"

	"github.com/lastseen/lastseen/internal/keys"
)

// Presence says which presence sets a touch that opens a throttle window
// adds its user to, and how long each set is kept: the set of the users
// online in the touch's minute and the set of the users active on its UTC
// day. The zero value keeps both sets until the end of their period.
type Presence struct {
	// OnlineWindow is how long a minute's online set is kept after the
	// minute ends; negative: no online sets.
	OnlineWindow time.Duration
	// ActiveRetention is how long a day's active set is kept after the day
	// ends, counted in whole days (truncated); negative: no active sets.
	ActiveRetention time.Duration
}

// Sets returns the presence sets a touch at at joins, from the plugin's
// clock now: their names (shard k's keys, Online + the Unix minute of at and
// Active + the UTC day of at in keys.DayLayout, in that order, each left out
// when turned off) and each one's time to live in whole seconds from now,
// rounded up; 0 when its period ended longer ago than it is kept (the touch
// skips that set).
func (p Presence) Sets(k keys.Shard, at, now time.Time) (names []string, ttls []int64) {
	if p.OnlineWindow >= 0 {
		m := at.Unix() / 60
		names = append(names, k.Online+strconv.FormatInt(m, 10))
		ttls = append(ttls, ttlSeconds(time.Unix((m+1)*60, 0).Add(p.OnlineWindow), now))
	}
	if p.ActiveRetention >= 0 {
		day := at.UTC().Truncate(24 * time.Hour)
		keep := p.ActiveRetention / (24 * time.Hour) * 24 * time.Hour
		names = append(names, k.Active+day.Format(keys.DayLayout))
		ttls = append(ttls, ttlSeconds(day.Add(24*time.Hour+keep), now))
	}
	return names, ttls
}

// ttlSeconds is the EXPIRE argument for a key kept until end: whole seconds
// from now, rounded up, or 0 when end is not after now.
func ttlSeconds(end, now time.Time) int64 {
	d := end.Sub(now)
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}
