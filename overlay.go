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

// registerOverlay adds the overlay right after gorm:query on db's
// callbacks, before gorm:preload and so before gorm:after_query (a model's
// AfterFind sees the fresh value), at Initialize when Config.Overlay is
// set. It is named after the plugin ("lastseen:<model>.<field>:overlay"),
// so each tracked model on one db has its own.
func (p *Plugin) registerOverlay(db *gorm.DB) error {
	return db.Callback().Query().After("gorm:query").Before("gorm:preload").Register(p.name+":overlay", p.overlay)
}

// overlay is the callback. It works on db.Statement.ReflectValue: a struct
// of the tracked model, or a slice or array of them or of pointers to them,
// and the tracked model's rows loaded by Joins into such a result (rows
// loaded by Preload go through their own query, and so through the
// overlay); anything else (maps, a projection into another type) is left
// alone, as is a query that did not select the last-seen column.
func (p *Plugin) overlay(db *gorm.DB) {
	st, t := db.Statement, p.tracker
	if db.Error != nil || t == nil || st.Schema == nil {
		return
	}
	if rows := p.overlayRows(st); len(rows) > 0 {
		p.overlayOn(st.Context, rows)
	}
}

// overlayRows returns the rows of the tracked model that the statement
// loaded with the last-seen column: its own result's, or those its Joins
// loaded.
func (p *Plugin) overlayRows(st *gorm.Statement) []reflect.Value {
	m := p.users.model
	if st.Schema.ModelType == m.typ {
		if !selects(st.Selects, st.Omits, m) {
			return nil
		}
		return modelRows(st.ReflectValue, m.typ)
	}
	var rows []reflect.Value
	for _, j := range st.Joins {
		rel := st.Schema.Relationships.Relations[j.Name]
		if rel == nil || rel.FieldSchema == nil || rel.FieldSchema.ModelType != m.typ || !selects(j.Selects, j.Omits, m) {
			continue
		}
		for _, parent := range modelRows(st.ReflectValue, st.Schema.ModelType) {
			if v := derefReflect(rel.Field.ReflectValueOf(st.Context, parent)); v.Kind() == reflect.Struct && v.CanAddr() {
				rows = append(rows, v)
			}
		}
	}
	return rows
}

// overlayOn puts the freshest buffered value into each row's last-seen
// field where it is newer than the column's.
func (p *Plugin) overlayOn(ctx context.Context, rows []reflect.Value) {
	m, t := p.users.model, p.tracker
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

// selects reports whether a statement (or a join) with these Select and
// Omit lists loads the last-seen column: no Select at all, "*", or the
// field by Go or column name, and no Omit of it.
func selects(sel, omit []string, m *model) bool {
	named := func(list []string) bool {
		return slices.ContainsFunc(list, func(s string) bool { return s == m.time.Name || s == m.time.DBName || s == "*" })
	}
	if len(omit) > 0 && named(omit) {
		return false
	}
	return len(sel) == 0 || named(sel)
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
