package buffer

import (
	"time"

	"github.com/lastseen/lastseen/internal/keys"
)

// Presence says which presence sets a recorded touch adds its user to, and
// how long each set is kept: the set of the users online in the touch's
// minute and the set of the users active on its UTC day, each the whole
// buffer's (keys.Presence: every shard's users in one set). The memory
// buffer adds the user when the touch opens its window; the Redis buffer
// when a flush drains the user's entry (Joins), the touch's script left
// alone. The zero value keeps both sets until the end of their period.
type Presence struct {
	// OnlineWindow is how long a minute's online set is kept after the
	// minute ends; negative: no online sets.
	OnlineWindow time.Duration
	// ActiveRetention is how long a day's active set is kept after the day
	// ends, counted in whole days (truncated); negative: no active sets.
	ActiveRetention time.Duration
}

// Sets returns the presence sets a touch at at joins, from the plugin's
// clock now: their names (k.Online of the Unix minute of at and k.Active of
// its UTC day, in that order, each left out when turned off) and each one's
// time to live in whole seconds from now, rounded up; 0 when its period
// ended longer ago than it is kept (the touch skips that set).
func (p Presence) Sets(k keys.Presence, at, now time.Time) (names []string, ttls []int64) {
	if p.OnlineWindow >= 0 {
		m := at.Unix() / 60
		names = append(names, k.Online(m))
		ttls = append(ttls, ttlSeconds(time.Unix((m+1)*60, 0).Add(p.OnlineWindow), now))
	}
	if p.ActiveRetention >= 0 {
		day := at.UTC().Truncate(24 * time.Hour)
		keep := p.ActiveRetention / (24 * time.Hour) * 24 * time.Hour
		names = append(names, k.Active(day))
		ttls = append(ttls, ttlSeconds(day.Add(24*time.Hour+keep), now))
	}
	return names, ttls
}

// On reports whether any presence set is kept.
func (p Presence) On() bool { return p.OnlineWindow >= 0 || p.ActiveRetention >= 0 }

// Join is one presence set and the users to add to it.
type Join struct {
	// Name is the set's key (Sets).
	Name string
	// TTL is its time to live in whole seconds from now (Sets).
	TTL int64
	// Users are the users to add, in the order of the entries.
	Users []string
}

// Joins groups the entries kv (field, value, field, value, ...: user ids
// and their stored timestamps, as a flush reads them) by the
// presence sets their timestamps join (Sets, at the plugin's clock now):
// one Join per set, in the order each set first comes. Values ParseMicros
// refuses, and sets whose period ended longer ago than they are kept (TTL
// 0), are left out.
func (p Presence) Joins(k keys.Presence, kv []string, now time.Time) []Join {
	if !p.On() {
		return nil
	}
	var joins []Join
	index := map[string]int{}    // set name -> its Join
	sets := map[[2]int64][]int{} // (Unix minute, Unix day) -> the Joins of its sets
	var last [2]int64            // the last entry's, whose sets are most often the next one's too
	var lastSets []int
	for i := 0; i+1 < len(kv); i += 2 {
		at, ok := ParseMicros(kv[i+1], now)
		if !ok {
			continue
		}
		period := [2]int64{at.Unix() / 60, at.Unix() / 86400}
		if lastSets == nil || period != last {
			xs, known := sets[period]
			if !known {
				names, ttls := p.Sets(k, at, now)
				xs = make([]int, 0, len(names))
				for j, name := range names {
					if ttls[j] <= 0 {
						continue
					}
					x, seen := index[name]
					if !seen {
						x = len(joins)
						index[name] = x
						joins = append(joins, Join{Name: name, TTL: ttls[j]})
					}
					xs = append(xs, x)
				}
				sets[period] = xs
			}
			last, lastSets = period, xs
		}
		for _, x := range lastSets {
			joins[x].Users = append(joins[x].Users, kv[i])
		}
	}
	return joins
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
