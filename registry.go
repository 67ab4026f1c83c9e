package lastseen

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"

	"github.com/lastseen/lastseen/internal/buffer"
	"gorm.io/gorm"
	"gorm.io/gorm/schema"
)

// namePrefix starts the name of every lastseen plugin in db.Config.Plugins.
const namePrefix = "lastseen:"

// pluginName is the plugin's identity: "lastseen:" + the tracked model's
// Go type (package path, ".", type name) + "." + the Go name of Field, for
// example "lastseen:github.com/lastseen/lastseen.User.LastSeenAt". Field
// given by its column name resolves to the Go field name, read from the
// model parsed with GORM's default naming (no I/O); a Field or model that
// does not resolve stays as given, for db.Use to refuse. Pointers, slices
// and arrays are looked through.
func pluginName(model any, field string) string {
	t := reflect.TypeOf(model)
	for t != nil && (t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
		t = t.Elem()
	}
	if t != nil && t.Kind() == reflect.Struct {
		if s, err := schema.Parse(reflect.New(t).Interface(), &sync.Map{}, schema.NamingStrategy{}); err == nil {
			if f := s.LookUpField(field); f != nil {
				field = f.Name
			}
		}
	}
	return namePrefix + typeName(t) + "." + field
}

// typeName is t's package path, ".", and name, or its String for an
// unnamed type, or "<nil>".
func typeName(t reflect.Type) string {
	switch {
	case t == nil:
		return "<nil>"
	case t.PkgPath() != "" && t.Name() != "":
		return t.PkgPath() + "." + t.Name()
	}
	return t.String()
}

// pluginsOn returns the initialized lastseen plugins registered on db,
// sorted by Name, so every choice among them is the same whatever the order
// of registration.
func pluginsOn(db *gorm.DB) []*Plugin {
	if db == nil || db.Config == nil {
		return nil
	}
	var out []*Plugin
	for name, v := range db.Config.Plugins {
		if p, ok := v.(*Plugin); ok && strings.HasPrefix(name, namePrefix) && p.users != nil && p.sessions != nil {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b *Plugin) int { return strings.Compare(a.name, b.name) })
	return out
}

// statementTable returns the table db's statement reads: Statement.Table
// when set (db.Table, or an alias), else the table of the parsed Model or
// Dest (scopes run before GORM parses them). It returns "" when neither
// parses, for example a Count into an int64 without a Model.
func statementTable(db *gorm.DB) string {
	s := db.Statement
	if s == nil {
		return ""
	}
	if s.Table != "" {
		return s.Table
	}
	if s.Schema != nil {
		return s.Schema.Table
	}
	for _, m := range []any{s.Model, s.Dest} {
		if m == nil {
			continue
		}
		st := &gorm.Statement{DB: db}
		if err := st.Parse(m); err == nil {
			return st.Schema.Table
		}
	}
	return ""
}

// trackerOf returns the plugin on db that tracks table (its Model's table),
// the least Name first when several do, or nil.
func trackerOf(db *gorm.DB, table string) *Plugin {
	for _, p := range pluginsOn(db) {
		if table != "" && p.users.model.table == table {
			return p
		}
	}
	return nil
}

// trackerOfColumn returns the plugin on db that tracks column of table,
// or nil.
func trackerOfColumn(db *gorm.DB, table, column string) *Plugin {
	for _, p := range pluginsOn(db) {
		if p.users.model.table == table && p.users.model.time.DBName == column {
			return p
		}
	}
	return nil
}

// sessionPluginsOf returns the plugins on db whose SessionModel's table is
// table, in order of preference: the plugins that also track that table
// (their Model is the session model) first, then the rest, each group by
// Name.
func sessionPluginsOf(db *gorm.DB, table string) []*Plugin {
	var tracking, others []*Plugin
	for _, p := range pluginsOn(db) {
		switch {
		case table == "" || p.sessions.model.table != table:
		case p.users.model.table == table:
			tracking = append(tracking, p)
		default:
			others = append(others, p)
		}
	}
	return append(tracking, others...)
}

// columnTaken returns the error of a second plugin on db for the table and
// column p tracks, whichever way either spelled Field, or nil. It wraps
// gorm.ErrRegistered and names p's model, its field and the plugin that
// tracks the column already.
func (p *Plugin) columnTaken(db *gorm.DB) error {
	m := p.users.model
	for _, o := range pluginsOn(db) {
		if o != p && o.users.model.table == m.table && o.users.model.time.DBName == m.time.DBName {
			return fmt.Errorf("lastseen: %w: model %s field %s (column %s.%s) is already tracked by the plugin %s on this *gorm.DB: register one plugin per tracked column",
				gorm.ErrRegistered, typeName(m.typ), m.time.Name, m.table, m.time.DBName, o.name)
		}
	}
	return nil
}

// registeredAgain is the error of db.Use(p) on the handle that accepted p
// already (wrapping gorm.ErrRegistered, as GORM's own check would be), or
// nil on another handle.
func (p *Plugin) registeredAgain(db *gorm.DB) error {
	for _, v := range db.Config.Plugins {
		if v == gorm.Plugin(p) {
			return fmt.Errorf("lastseen: %w: the plugin %s is already registered on this *gorm.DB: call db.Use once", gorm.ErrRegistered, p.name)
		}
	}
	return nil
}

// prefixTaken returns the other initialized lastseen plugin on db whose
// buffer shares buf's namespace (Buffer.Shared: the Redis Prefix), or nil:
// two tracked models in one buffer would write one model's ids into the
// other's table. In-process buffers are each their plugin's own.
func (p *Plugin) prefixTaken(db *gorm.DB, buf buffer.Buffer) *Plugin {
	for _, o := range pluginsOn(db) {
		if o != p && o.tracker != nil && buf.Shared() != "" && o.tracker.buf.Shared() == buf.Shared() {
			return o
		}
	}
	return nil
}

// schedulesPurge reports whether this plugin's scheduled purge runs: the
// scheduled purge of a session table runs in one plugin per *gorm.DB, the
// first of sessionPluginsOf whose purge is scheduled (the plugin that
// tracks the sessions' activity if one does, else the least Name), or,
// when none is, the first with sessions in use (its purge job run by hand).
// PurgeExpiredSessions called directly always runs.
func (p *Plugin) schedulesPurge() bool {
	if p.cfg.DisablePurge {
		return false
	}
	var first *Plugin // the first with sessions in use, when none is scheduled
	for _, o := range sessionPluginsOf(p.db, p.sessions.model.table) {
		switch {
		case o.cfg.purgeScheduled():
			return o == p
		case first == nil && !o.cfg.DisablePurge:
			first = o
		}
	}
	return first == nil || first == p
}
