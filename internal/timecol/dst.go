package timecol

import (
	"os"
	"path/filepath"
	"strings"
	"time"
)

// dstShifts are the sizes of the clock changes a zone's rules have: 1 hour
// almost everywhere, 30 minutes (Australia/Lord_Howe), 2 hours
// (Antarctica/Troll).
var dstShifts = []time.Duration{30 * time.Minute, time.Hour, 2 * time.Hour}

// sameWall reports whether a and b show the same wall clock in their own
// locations.
func sameWall(a, b time.Time) bool {
	y1, m1, d1 := a.Date()
	y2, m2, d2 := b.Date()
	return y1 == y2 && m1 == m2 && d1 == d2 && a.Hour() == b.Hour() && a.Minute() == b.Minute() &&
		a.Second() == b.Second() && a.Nanosecond() == b.Nanosecond()
}

// SecondPass reports whether t's wall clock in loc also names an earlier
// instant: t lies in the second pass of the wall times a DST fall-back
// repeats (02:10 CET on the night Europe/Berlin goes back from 03:00 CEST
// to 02:00 CET), so that a naive column cannot tell it from the first.
func SecondPass(t time.Time, loc *time.Location) bool {
	w := t.In(loc)
	for _, s := range dstShifts {
		if sameWall(t.Add(-s).In(loc), w) {
			return true
		}
	}
	return false
}

// Earliest returns the earliest instant whose wall clock in loc is wall's
// (its date and clock fields, whatever its location): for a wall time a DST
// fall-back repeats, its first pass.
func Earliest(wall time.Time, loc *time.Location) time.Time {
	y, m, d := wall.Date()
	c := time.Date(y, m, d, wall.Hour(), wall.Minute(), wall.Second(), wall.Nanosecond(), loc)
	best := c
	for _, s := range dstShifts {
		for _, cand := range []time.Time{c.Add(-s), c.Add(s)} {
			if cand.Before(best) && sameWall(cand.In(loc), c) {
				best = cand
			}
		}
	}
	return best
}

// HasDST reports whether loc's offset from UTC changes within the years
// around now (a zone with daylight saving time, or other transitions).
func HasDST(loc *time.Location, now time.Time) bool {
	if loc == nil {
		return false
	}
	_, off := now.In(loc).Zone()
	for m := -18; m <= 18; m++ {
		if _, o := now.AddDate(0, m, 0).In(loc).Zone(); o != off {
			return true
		}
	}
	return false
}

// ZoneName returns the IANA name of loc ("Europe/Berlin"), for a database
// that converts wall times itself (PostgreSQL's AT TIME ZONE): the
// location's own name; for time.Local, named "Local", the TZ variable's
// name (without a leading ':', or the part of a path after "zoneinfo/")
// or, without TZ, the zone /etc/localtime links to. ok is false when no
// name is found, or the one found has other offsets than loc around now.
func ZoneName(loc *time.Location, now time.Time) (string, bool) {
	if loc == nil {
		return "", false
	}
	name := zoneOfPath(strings.TrimPrefix(loc.String(), ":")) // Go names a local zone from TZ=/path/to/zoneinfo/X by its path
	if name == "Local" {
		name = localName()
	}
	if name == "" || name == "Local" {
		return "", false
	}
	named, err := time.LoadLocation(name)
	if err != nil {
		return "", false
	}
	for m := -18; m <= 18; m += 3 {
		t := now.AddDate(0, m, 0)
		_, a := t.In(named).Zone()
		_, b := t.In(loc).Zone()
		if a != b {
			return "", false
		}
	}
	return name, true
}

// localName is the IANA name of the process's local zone, "" when unknown.
func localName() string {
	tz, set := os.LookupEnv("TZ")
	if set {
		if tz == "" {
			return "UTC"
		}
		return zoneOfPath(strings.TrimPrefix(tz, ":"))
	}
	link, err := filepath.EvalSymlinks("/etc/localtime")
	if err != nil {
		return ""
	}
	if name := zoneOfPath(link); name != link {
		return name
	}
	return ""
}

// zoneOfPath returns the zone name in a path to a zoneinfo file (the part
// after "zoneinfo/"), or the text itself when it is not such a path.
func zoneOfPath(p string) string {
	if i := strings.LastIndex(p, "zoneinfo/"); i >= 0 {
		return p[i+len("zoneinfo/"):]
	}
	return p
}
