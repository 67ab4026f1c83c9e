package main

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/lastseen/lastseen"
	"gorm.io/gorm"
)

// layout is what the commands hand GORM and the plugin for the buffers
// they act on: the models' tables and columns (tableNamer) and one Config
// per buffer, built from its manifest exactly as the app's plugin wrote it,
// so that the plugin's start writes nothing to the manifest.
type layout struct {
	tables  map[string]string            // Go type name without type arguments -> table
	columns map[string]map[string]string // table -> Go field name -> column
	slots   map[string]int               // a rule's table -> its ruleRow's table slot
	// naive reports whether a column of the database holds wall times
	// (PostgreSQL timestamp, MySQL DATETIME); nil takes every column for
	// one.
	naive func(table, column string) (bool, error)
}

func newLayout() *layout {
	return &layout{tables: map[string]string{}, columns: map[string]map[string]string{}, slots: map[string]int{}}
}

func (l *layout) namer() tableNamer { return tableNamer{tables: l.tables, columns: l.columns} }

// mapTable records that Go type name is table with the field -> column
// map cols; a table two buffers map differently (a field on two columns)
// is an error.
func (l *layout) mapTable(name, table string, cols map[string]string) error {
	if t, ok := l.tables[name]; ok && t != table {
		return fmt.Errorf("lastseen: this CLI cannot act on tables %q and %q at once as %s", t, table, name)
	}
	l.tables[name] = table
	have := l.columns[table]
	if have == nil {
		have = map[string]string{}
		l.columns[table] = have
	}
	for f, c := range cols {
		switch old := have[f]; {
		case old == "" || old == unusedColumn:
			have[f] = c
		case c != unusedColumn && c != old:
			return fmt.Errorf("lastseen: this CLI cannot act on table %q: two buffers read %s as %q and %q", table, f, old, c)
		}
	}
	return nil
}

// or returns s, or unusedColumn when s is empty.
func orUnused(s string) string {
	if s == "" {
		return unusedColumn
	}
	return s
}

// config returns the Config of buffer b's plugin, as its manifest
// describes it, with nothing scheduled and no local cache, and maps its
// tables.
func (l *layout) config(b bufferInfo, base lastseen.Config) (lastseen.Config, error) {
	table, column, key, enc := b.get("table"), b.get("column"), keyKind(b, "key_kind", "key"), b.get("encoding")
	st, active := b.get("sessions_table"), b.get("active_column")
	if err := checkKinds("buffer "+strconv.Quote(b.Prefix), []string{enc, b.get("expires_encoding"), b.get("active_encoding")}, key); err != nil {
		return lastseen.Config{}, err
	}
	c := base
	c.Buffer.Prefix, c.Buffer.Shards, c.Buffer.LocalCacheSize = b.Prefix, b.shards(), -1
	c.Flush.Schedule, c.Flush.Upsert = "off", b.get("upsert") == "true"
	var err error
	if c.Flush.BatchSize, err = strconv.Atoi(b.get("batch")); err != nil {
		return lastseen.Config{}, fmt.Errorf("lastseen: buffer %q: batch %q: %w", b.Prefix, b.get("batch"), err)
	}
	if c.Throttle, err = time.ParseDuration(b.get("throttle")); err != nil {
		return lastseen.Config{}, fmt.Errorf("lastseen: buffer %q: throttle %q: %w", b.Prefix, b.get("throttle"), err)
	}
	if c.Flush.ColumnLocation, err = l.location(b); err != nil {
		return lastseen.Config{}, err
	}
	if c.Rules, err = l.rules(b); err != nil {
		return lastseen.Config{}, err
	}
	if !b.hasSessions() {
		c.Sessions = lastseen.SessionConfig{Disabled: true}
		return c, l.tracked(&c, b)
	}
	if err := l.sessions(&c, b); err != nil {
		return lastseen.Config{}, err
	}
	if st != table {
		return c, l.tracked(&c, b)
	}
	// The buffer tracks the session table itself (the sessions' activity).
	if key != keyKind(b, "sessions_key", "sessions_key") || b.get("id_column") != b.get("sessions_id_column") {
		return lastseen.Config{}, fmt.Errorf("lastseen: buffer %q tracks table %q by key %s and purges it by key %s", b.Prefix, table, b.get("id_column"), b.get("sessions_id_column"))
	}
	seen, seenEnc := column, enc
	c.Field = "Seen"
	if column == active {
		seen, seenEnc, c.Field = unusedColumn, "", "Active"
	}
	c.Model = newSessionsRow(key, seenEnc, b.get("expires_encoding"), b.get("active_encoding"))
	c.Sessions.Model = c.Model
	return c, l.mapTable("sessionsRow", st, map[string]string{"Seen": seen})
}

// tracked sets c's Model and Field to b's tracked table and column (not a
// session table) and maps them: a usersRow, or, when another buffer's
// table has it already (a rule's tracker), a ruleRow in the table slot of
// b's table.
func (l *layout) tracked(c *lastseen.Config, b bufferInfo) error {
	table, key, enc := b.get("table"), keyKind(b, "key_kind", "key"), b.get("encoding")
	cols := map[string]string{"ID": b.get("id_column"), "Seen": b.get("column")}
	if t, ok := l.tables["usersRow"]; !ok || t == table {
		c.Model, c.Field = newUsersRow(key, enc), "Seen"
		return l.mapTable("usersRow", table, cols)
	}
	slot, err := l.ruleSlot(table)
	if err != nil {
		return err
	}
	c.Model, c.Field = newRuleRow(slot, key, enc, "", false), "RuleSeen"
	return l.mapTable(ruleSlotName(slot), table, map[string]string{"ID": cols["ID"], "RuleSeen": cols["Seen"],
		"RuleCreated": unusedColumn, "RuleDeleted": unusedColumn})
}

// sessions fills c.Sessions from b's session rule and maps the session
// table.
func (l *layout) sessions(c *lastseen.Config, b bufferInfo) error {
	idle, err := time.ParseDuration(b.get("idle_timeout"))
	if err != nil {
		return fmt.Errorf("lastseen: buffer %q: idle_timeout %q: %w", b.Prefix, b.get("idle_timeout"), err)
	}
	batch, err := strconv.Atoi(b.get("sessions_batch"))
	if err != nil {
		return fmt.Errorf("lastseen: buffer %q: sessions_batch %q: %w", b.Prefix, b.get("sessions_batch"), err)
	}
	c.Sessions = lastseen.SessionConfig{
		Model:        newSessionsRow(keyKind(b, "sessions_key", "sessions_key"), "", b.get("expires_encoding"), b.get("active_encoding")),
		ExpiresField: "Expires", ActiveField: "Active", IdleTimeout: idle, BatchSize: batch, Schedule: "off",
	}
	return l.mapTable("sessionsRow", b.get("sessions_table"), map[string]string{
		"ID": b.get("sessions_id_column"), "Expires": b.get("expires_column"),
		"Active": orUnused(b.get("active_column")), "Seen": unusedColumn,
	})
}

// flagsRule is the session rule the purge flags give, for an app without
// Redis (no manifest to read): one plugin on the in-process buffer that
// tracks the session table's activity column (or, without one, its expiry
// column; nothing is ever flushed).
func (l *layout) flagsRule(f *ruleFlags, base lastseen.Config) (lastseen.Config, error) {
	key := keyText
	if f.SessionIDType == "int" {
		key = keySigned
	}
	active := f.ActiveColumn
	if f.IdleTimeout == 0 {
		active = ""
	}
	c := base
	c.Buffer.LocalCacheSize = -1
	c.Flush.Schedule = "off"
	c.Model = newSessionsRow(key, "", f.ExpiresEncoding, f.ActiveEncoding)
	c.Field = "Active"
	if active == "" {
		c.Field = "Expires"
	}
	c.Sessions = lastseen.SessionConfig{
		Model: c.Model, ExpiresField: "Expires", ActiveField: "Active", IdleTimeout: f.IdleTimeout,
		BatchSize: f.PurgeBatchSize, Schedule: "off",
	}
	return c, l.mapTable("sessionsRow", f.SessionsTable, map[string]string{
		"ID": f.SessionIDColumn, "Expires": f.ExpiresColumn, "Active": orUnused(active), "Seen": unusedColumn,
	})
}

// errAppAction is what a rule whose app runs an Action does in the
// commands' plugins: the Action is the app's code, which they do not have.
var errAppAction = errors.New("lastseen: the rule hands its rows to the app's Action, which runs only in the app")

// rules returns the inactivity rules b's manifest records, each on a
// ruleRow in the table slot of its table, as the app's plugin has them (so
// that the manifest it writes at start is the app's): a rule whose app
// runs an Action gets one that fails (errAppAction), never a delete.
func (l *layout) rules(b bufferInfo) ([]lastseen.Rule, error) {
	recs, err := b.rules()
	if err != nil {
		return nil, err
	}
	out := make([]lastseen.Rule, 0, len(recs))
	for _, r := range recs {
		where := fmt.Sprintf("buffer %q, rule %q", b.Prefix, r.Name)
		if err := checkKinds(where, []string{r.Encoding, r.CreatedEncoding}, r.Key); err != nil {
			return nil, err
		}
		after, err := time.ParseDuration(r.After)
		if err != nil {
			return nil, fmt.Errorf("lastseen: %s: after %q: %w", where, r.After, err)
		}
		slot, err := l.ruleSlot(r.Table)
		if err != nil {
			return nil, err
		}
		rule := lastseen.Rule{Name: r.Name, Model: newRuleRow(slot, r.Key, r.Encoding, r.CreatedEncoding, r.SoftDelete != ""),
			Field: "RuleSeen", CreatedField: "RuleCreated", After: after, Where: r.Where, Schedule: "off", BatchSize: r.Batch}
		if r.CreatedColumn == "" {
			rule.CreatedField = "-"
		}
		if !r.deletes() {
			rule.Action = func(*gorm.DB, []any) error { return errAppAction }
		}
		cols := map[string]string{"ID": r.IDColumn, "RuleSeen": r.Column, "RuleCreated": orUnused(r.CreatedColumn), "RuleDeleted": orUnused(r.SoftDelete)}
		if err := l.mapTable(ruleSlotName(slot), r.Table, cols); err != nil {
			return nil, fmt.Errorf("%w (%s)", err, where)
		}
		out = append(out, rule)
	}
	return out, nil
}

// ruleSlot returns the table slot of a rule's table, the next free one for
// a table no rule had yet.
func (l *layout) ruleSlot(table string) (int, error) {
	if n, ok := l.slots[table]; ok {
		return n, nil
	}
	if len(l.slots) == maxRuleTables {
		return 0, fmt.Errorf("lastseen: this CLI acts on the rules of at most %d tables at once: pick the buffer with --prefix", maxRuleTables)
	}
	l.slots[table] = len(l.slots)
	return l.slots[table], nil
}

// location is the app's column location as b's manifest names it: "" is
// nil (the driver's location), "+01:00" a fixed offset, else an IANA name.
// A name that does not load ("Local": the app's local zone, which it could
// not name) is an error when one of b's time columns is naive, and nil
// otherwise: only wall times depend on it.
func (l *layout) location(b bufferInfo) (*time.Location, error) {
	loc := b.get("location")
	if loc == "" {
		return nil, nil
	}
	if t, err := time.Parse("-07:00", loc); err == nil && len(loc) == len("+01:00") {
		_, off := t.Zone()
		return time.FixedZone(loc, off), nil
	}
	named, err := time.LoadLocation(loc)
	if err == nil && loc != "Local" { // LoadLocation("Local") is this process's zone, not the app's
		return named, nil
	}
	for _, c := range [][3]string{{"table", "column", "encoding"}, {"sessions_table", "expires_column", "expires_encoding"},
		{"sessions_table", "active_column", "active_encoding"}} {
		table, column := b.get(c[0]), b.get(c[1])
		if column == "" || b.get(c[2]) != "time" {
			continue
		}
		naive := true
		if l.naive != nil {
			if naive, err = l.naive(table, column); err != nil {
				return nil, fmt.Errorf("lastseen: buffer %q: the type of column %s.%s: %w", b.Prefix, table, column, err)
			}
		}
		if naive {
			return nil, fmt.Errorf("lastseen: buffer %q: column %s.%s holds wall times in the app's zone %q, which the app could not name (TZ unset, /etc/localtime not a link into zoneinfo): set Flush.ColumnLocation in the app, or run it with TZ set, and start it again", b.Prefix, table, column, loc)
		}
	}
	return nil, nil
}
