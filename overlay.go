package lastseen

import (
	"context"
	"reflect"
	"slices"
	"time"

	"gorm.io/gorm"
)

// The read overlay (Config.Overlay): a GORM callback after gorm:query that
// puts the freshest buffered value into the last-seen field of the tracked
// model's rows a query loaded, where it is newer than the column. It reads
// Redis in one pipeline per query (tracker.buffered) through the touch
// path's circuit breaker and TouchTimeout, then the in-process backlog; when
// Redis fails it leaves the column's values and logs a rate-limited warning.
// The query's result and error are never changed otherwise.

// registerOverlay adds the overlay after gorm:query on db's callbacks
// (Initialize, when Config.Overlay is set), named after the plugin
// ("lastseen:<model>.<field>:overlay"), so each tracked model on one db has
// its own.
func (p *Plugin) registerOverlay(db *gorm.DB) error {
	return db.Callback().Query().After("gorm:query").Register(p.name+":overlay", p.overlay)
}

// overlay is the callback. It works on db.Statement.ReflectValue: a struct
// of the tracked model, or a slice or array of them or of pointers to them;
// anything else (another model, maps, a projection into another type) is
// left alone, as is a query that did not select the last-seen column.
func (p *Plugin) overlay(db *gorm.DB) {
	st, m, t := db.Statement, p.users.model, p.tracker
	if db.Error != nil || t == nil || st.Schema == nil || st.Schema.ModelType != m.typ || !selects(st, m) {
		return
	}
	rows := modelRows(st.ReflectValue, m.typ)
	if len(rows) == 0 {
		return
	}
	ctx := st.Context
	uids := make([]string, len(rows))
	var distinct []string
	for i, rv := range rows {
		id, zero := m.pk.ValueOf(ctx, rv)
		if zero {
			continue
		}
		if uid, err := t.ids.Normalize(derefValue(id)); err == nil {
			uids[i] = uid
			distinct = append(distinct, uid)
		}
	}
	slices.Sort(distinct)
	distinct = slices.Compact(distinct)
	if len(distinct) == 0 {
		return
	}
	latest := p.overlayRead(ctx, distinct)
	for i, rv := range rows {
		at, ok := latest[uids[i]]
		if !ok || uids[i] == "" {
			continue
		}
		cur, _ := m.time.ValueOf(ctx, rv)
		if c, has := m.enc.FromGo(cur); has && !at.After(c) {
			continue
		}
		_ = m.time.Set(ctx, rv, m.enc.ToGo(at)) // GORM's setter converts, or calls the field's Scan
	}
}

// overlayRead returns the buffered values of uids: Redis through the
// breaker within TouchTimeout (nothing from it on failure), and the backlog.
func (p *Plugin) overlayRead(ctx context.Context, uids []string) map[string]time.Time {
	t := p.tracker
	latest, err := t.buffered(ctx, uids, true)
	if err != nil {
		t.warn.Do(func() { p.log.Warn("lastseen: redis unreadable; the overlay leaves the column's values", "err", err) })
	}
	return latest
}

// selects reports whether the statement loads the last-seen column: no
// Select at all, "*", or the field by Go or column name, and no Omit of it.
func selects(st *gorm.Statement, m *model) bool {
	named := func(list []string) bool {
		return slices.ContainsFunc(list, func(s string) bool { return s == m.time.Name || s == m.time.DBName || s == "*" })
	}
	if len(st.Omits) > 0 && named(st.Omits) {
		return false
	}
	return len(st.Selects) == 0 || named(st.Selects)
}

// modelRows returns the addressable struct values of type typ in rv: rv
// itself, or the elements of a slice or array, through pointers.
func modelRows(rv reflect.Value, typ reflect.Type) []reflect.Value {
	rv = derefReflect(rv)
	switch rv.Kind() {
	case reflect.Struct:
		if rv.Type() == typ && rv.CanAddr() {
			return []reflect.Value{rv}
		}
	case reflect.Slice, reflect.Array:
		var out []reflect.Value
		for i := range rv.Len() {
			if e := derefReflect(rv.Index(i)); e.Kind() == reflect.Struct && e.Type() == typ && e.CanAddr() {
				out = append(out, e)
			}
		}
		return out
	}
	return nil
}

func derefReflect(rv reflect.Value) reflect.Value {
	for rv.Kind() == reflect.Pointer || rv.Kind() == reflect.Interface {
		if rv.IsNil() {
			return reflect.Value{}
		}
		rv = rv.Elem()
	}
	return rv
}

// derefValue returns what a non-nil pointer points to (a *uint64 primary
// key), or v.
func derefValue(v any) any {
	if rv := reflect.ValueOf(v); rv.Kind() == reflect.Pointer && !rv.IsNil() {
		if _, stringer := v.(interface{ String() string }); !stringer {
			return rv.Elem().Interface()
		}
	}
	return v
}
