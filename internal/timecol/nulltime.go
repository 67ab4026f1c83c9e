package timecol

import (
	"fmt"
	"strings"
	"time"

	"github.com/lastseen/lastseen/internal/clip"
)

// NullTime scans a time column as every dialect returns it: a time.Time,
// NULL (Valid false), or, from SQLite for a column not declared DATE,
// DATETIME, TIME or TIMESTAMP (such as TIMESTAMPTZ or TEXT), the text
// SQLite drivers write, read as UTC unless it has an offset (the layouts
// of github.com/glebarez/go-sqlite and mattn/go-sqlite3).
type NullTime struct {
	Time  time.Time
	Valid bool
}

var sqliteTimeLayouts = []string{
	"2006-01-02 15:04:05.999999999-07:00",
	"2006-01-02T15:04:05.999999999-07:00",
	"2006-01-02 15:04:05.999999999",
	"2006-01-02T15:04:05.999999999",
	"2006-01-02 15:04",
	"2006-01-02T15:04",
	"2006-01-02",
}

// Scan implements sql.Scanner. A value of another type, or text in none
// of the layouts, is an error "lastseen: cannot read ..." quoting at most
// 40 bytes of it.
func (c *NullTime) Scan(v any) error {
	var s string
	switch v := v.(type) {
	case nil:
		*c = NullTime{}
		return nil
	case time.Time:
		*c = NullTime{Time: v, Valid: true}
		return nil
	case string:
		s = v
	case []byte:
		s = string(v)
	default:
		return fmt.Errorf("lastseen: cannot read a %T as a time", v)
	}
	ts := strings.TrimSuffix(s, "Z")
	for _, layout := range sqliteTimeLayouts {
		if t, err := time.ParseInLocation(layout, ts, time.UTC); err == nil {
			*c = NullTime{Time: t, Valid: true}
			return nil
		}
	}
	return fmt.Errorf("lastseen: cannot read %q as a time", clip.Text(s))
}
