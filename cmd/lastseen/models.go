package main

import (
	"database/sql/driver"
	"fmt"
	"strconv"
	"time"

	"gorm.io/gorm"
)

// The operator commands cannot know the app's Go models, so they hand the
// plugin models of their own, built from what the buffer's manifest (or,
// without Redis, the flags) says: usersRow for a tracked table, sessionsRow
// for the session table (and for a tracked table that is the session
// table). Their type parameters are the key's Go type (int64, uint64 or
// string)
// and each time column's type, which tells the library the column's
// encoding: *time.Time for a timestamp, unixSeconds or unixMillis for an
// integer column. tableNamer maps the type names to the tables and the
// field names, per table, to the columns; a field no column backs is
// mapped to unusedColumn and never read.
type usersRow[K, T any] struct {
	ID   K `gorm:"primaryKey"`
	Seen T
}

type sessionsRow[K, T, X, A any] struct {
	ID      K `gorm:"primaryKey"`
	Seen    T // the tracked column, when a buffer tracks the session table in a column other than Active
	Expires X
	Active  A
}

// unusedColumn names the columns of model fields that the table does not
// have; the commands never read or write them.
const unusedColumn = "lastseen_cli_unused"

// unixSeconds and unixMillis are time columns of whole Unix seconds or
// milliseconds: the library learns an encoding from what a field type's
// Value returns for a known instant.
type unixSeconds struct{ t time.Time }

type unixMillis struct{ t time.Time }

func (u unixSeconds) Value() (driver.Value, error) { return u.t.Unix(), nil }
func (u unixMillis) Value() (driver.Value, error)  { return u.t.UnixMilli(), nil }
func (u *unixSeconds) Scan(v any) error            { return scanUnix(&u.t, v, time.Unix) }
func (u *unixMillis) Scan(v any) error {
	return scanUnix(&u.t, v, func(n, _ int64) time.Time { return time.UnixMilli(n) })
}

func scanUnix(t *time.Time, v any, from func(n, ns int64) time.Time) error {
	switch x := v.(type) {
	case time.Time:
		*t = x
	case int64:
		*t = from(x, 0)
	case []byte:
		n, err := strconv.ParseInt(string(x), 10, 64)
		if err != nil {
			return err
		}
		*t = from(n, 0)
	case nil:
		*t = time.Time{}
	default:
		return fmt.Errorf("lastseen: cannot scan %T as a Unix time", v)
	}
	return nil
}

// codecs are the manifest's encodings and the key types.
const (
	encTime      = "time"
	encUnix      = "unix"
	encUnixMilli = "unixmilli"
	keySigned    = "signed"
	keyUnsigned  = "unsigned"
	keyText      = "text"
)

// keyKind is a manifest's kind of a key: "signed", "unsigned" or "text"
// from field kindField, else, from a manifest without it, from its key
// type ("integer" or "text").
func keyKind(b bufferInfo, kindField, typeField string) string {
	switch k := b.get(kindField); {
	case k != "":
		return k
	case b.get(typeField) == "integer":
		return keySigned
	}
	return keyText
}

// checkKinds refuses an encoding or key type this CLI does not know.
func checkKinds(where string, encodings []string, key string) error {
	for _, e := range encodings {
		switch e {
		case encTime, encUnix, encUnixMilli, "":
		default:
			return fmt.Errorf("lastseen: %s: column encoding %q is not one this CLI knows (time, unix, unixmilli): use the lastseen version of the app", where, e)
		}
	}
	if key != keySigned && key != keyUnsigned && key != keyText {
		return fmt.Errorf("lastseen: %s: key kind %q is not signed, unsigned or text", where, key)
	}
	return nil
}

// newUsersRow returns a *usersRow for the key type and the tracked
// column's encoding.
func newUsersRow(key, enc string) any {
	switch key {
	case keySigned:
		return usersRowK[int64](enc)
	case keyUnsigned:
		return usersRowK[uint64](enc)
	}
	return usersRowK[string](enc)
}

func usersRowK[K any](enc string) any {
	switch enc {
	case encUnix:
		return &usersRow[K, unixSeconds]{}
	case encUnixMilli:
		return &usersRow[K, unixMillis]{}
	}
	return &usersRow[K, *time.Time]{}
}

// newSessionsRow returns a *sessionsRow for the key type and the
// encodings of the tracked, expiry and activity columns ("" for a column
// not in use: a timestamp field never read).
func newSessionsRow(key, seen, expires, active string) any {
	switch key {
	case keySigned:
		return sessionsRowK[int64](seen, expires, active)
	case keyUnsigned:
		return sessionsRowK[uint64](seen, expires, active)
	}
	return sessionsRowK[string](seen, expires, active)
}

func sessionsRowK[K any](seen, expires, active string) any {
	switch seen {
	case encUnix:
		return sessionsRowKT[K, unixSeconds](expires, active)
	case encUnixMilli:
		return sessionsRowKT[K, unixMillis](expires, active)
	}
	return sessionsRowKT[K, *time.Time](expires, active)
}

func sessionsRowKT[K, T any](expires, active string) any {
	switch expires {
	case encUnix:
		return sessionsRowKTX[K, T, unixSeconds](active)
	case encUnixMilli:
		return sessionsRowKTX[K, T, unixMillis](active)
	}
	return sessionsRowKTX[K, T, time.Time](active)
}

func sessionsRowKTX[K, T, X any](active string) any {
	switch active {
	case encUnix:
		return &sessionsRow[K, T, X, unixSeconds]{}
	case encUnixMilli:
		return &sessionsRow[K, T, X, unixMillis]{}
	}
	return &sessionsRow[K, T, X, *time.Time]{}
}

// ruleRow is the model of an inactivity rule's table: its key, activity
// and creation columns (a field no column backs, for a rule without one,
// is never read) and, for a table with soft delete, its gorm.DeletedAt
// column (D is then gorm.DeletedAt, else an unused *time.Time). S is one
// of the tableSlot types: each table the rules of one command act on gets
// its own, which tableNamer maps to the table.
type ruleRow[S, K, A, C, D any] struct {
	ID          K `gorm:"primaryKey"`
	RuleSeen    A
	RuleCreated C
	RuleDeleted D
	slot        S
}

// The table slots of ruleRow: how many tables the rules of one command
// may act on.
type (
	tableSlot0 struct{}
	tableSlot1 struct{}
	tableSlot2 struct{}
	tableSlot3 struct{}
)

// maxRuleTables is the number of tableSlot types.
const maxRuleTables = 4

// ruleSlotName is the tableNamer key of table slot n's ruleRow.
func ruleSlotName(n int) string { return "ruleRow/" + strconv.Itoa(n) }

// newRuleRow returns a *ruleRow in table slot n for the key kind and the
// encodings of the activity and creation columns ("" for none), with a
// gorm.DeletedAt field when soft.
func newRuleRow(n int, key, seen, created string, soft bool) any {
	switch n {
	case 0:
		return ruleRowS[tableSlot0](key, seen, created, soft)
	case 1:
		return ruleRowS[tableSlot1](key, seen, created, soft)
	case 2:
		return ruleRowS[tableSlot2](key, seen, created, soft)
	}
	return ruleRowS[tableSlot3](key, seen, created, soft)
}

func ruleRowS[S any](key, seen, created string, soft bool) any {
	switch key {
	case keySigned:
		return ruleRowSK[S, int64](seen, created, soft)
	case keyUnsigned:
		return ruleRowSK[S, uint64](seen, created, soft)
	}
	return ruleRowSK[S, string](seen, created, soft)
}

func ruleRowSK[S, K any](seen, created string, soft bool) any {
	switch seen {
	case encUnix:
		return ruleRowSKA[S, K, unixSeconds](created, soft)
	case encUnixMilli:
		return ruleRowSKA[S, K, unixMillis](created, soft)
	}
	return ruleRowSKA[S, K, *time.Time](created, soft)
}

func ruleRowSKA[S, K, A any](created string, soft bool) any {
	switch created {
	case encUnix:
		return ruleRowSKAC[S, K, A, unixSeconds](soft)
	case encUnixMilli:
		return ruleRowSKAC[S, K, A, unixMillis](soft)
	}
	return ruleRowSKAC[S, K, A, *time.Time](soft)
}

func ruleRowSKAC[S, K, A, C any](soft bool) any {
	if soft {
		return &ruleRow[S, K, A, C, gorm.DeletedAt]{}
	}
	return &ruleRow[S, K, A, C, *time.Time]{}
}
