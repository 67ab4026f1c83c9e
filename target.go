package lastseen

import (
	"context"
	"fmt"
	"reflect"
	"sync"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/schema"
)

// model is a parsed GORM model: its table, single primary key and one time
// column (last seen or expiry).
type model struct {
	schema *schema.Schema
	typ    reflect.Type // struct type
	table  string
	pk     *schema.Field
	time   *schema.Field
	enc    *timeCodec // the time column's encoding (coltype.go)
}

var timeType = reflect.TypeOf(time.Time{})

// resolveModel parses m with db's naming strategy and checks that it has one
// primary key and that field is a time field of a supported type, in enc
// (coltype.go).
func resolveModel(db *gorm.DB, m any, field, modelOpt, fieldOpt string, enc Encoding, d *dialect, loc *time.Location) (*model, error) {
	stmt := &gorm.Statement{DB: db}
	if err := stmt.Parse(m); err != nil {
		return nil, fmt.Errorf("%s %T: %v", modelOpt, m, err)
	}
	s := stmt.Schema
	if len(s.PrimaryFields) != 1 {
		names := make([]string, len(s.PrimaryFields))
		for i, f := range s.PrimaryFields {
			names[i] = f.Name
		}
		return nil, fmt.Errorf("%s %s has %d primary key fields %v, want exactly one", modelOpt, s.Name, len(s.PrimaryFields), names)
	}
	f, c, err := timeField(s, field, fieldOpt, enc, d, loc)
	if err != nil {
		return nil, err
	}
	return &model{schema: s, typ: s.ModelType, table: s.Table, pk: s.PrimaryFields[0], time: f, enc: c}, nil
}

// timeField looks field up in s, by Go field name or column name, and
// resolves its encoding (newTimeCodec).
func timeField(s *schema.Schema, field, fieldOpt string, enc Encoding, d *dialect, loc *time.Location) (*schema.Field, *timeCodec, error) {
	f := s.LookUpField(field)
	if f == nil || f.DBName == "" {
		return nil, nil, fmt.Errorf("%s %q: %s has no such field or column", fieldOpt, field, s.Name)
	}
	c, err := newTimeCodec(s, f, field, enc, fieldOpt, d, loc)
	if err != nil {
		return nil, nil, err
	}
	return f, c, nil
}

// resolveTargets resolves the user and session models against db (table,
// primary key, time column) and the user ids' codec against dialect d.
func (p *Plugin) resolveTargets(db *gorm.DB, d *dialect) error {
	c := p.cfg
	loc := c.ColumnLocation // nil: the driver's location (coltype.go)
	users, err := resolveModel(db, c.Model, c.Field, "Model", "Field", c.FieldEncoding, d, loc)
	if err != nil {
		return invalid("%v", err)
	}
	ids, err := newIDCodec(users.pk)
	if err != nil {
		return invalid("Model %s: %v", users.schema.Name, err)
	}
	if ids.kind == idUnsigned {
		ids.max = d.maxUnsigned
	}
	ids.maxLen = c.MaxIDLength
	if ids.kind == idString {
		ids.badText = d.badText
	}
	p.users = &userTarget{model: users, ids: ids}
	sessions, err := resolveModel(db, c.SessionModel, c.ExpiresField, "Sessions.Model", "Sessions.ExpiresField", c.SessionEncoding, d, loc)
	if err != nil {
		return invalid("%v", err)
	}
	p.sessions = &sessionTarget{model: sessions}
	if c.IdleTimeout > 0 { // idle.go
		if p.sessions.active, p.sessions.activeEnc, err = timeField(sessions.schema, c.ActiveField, "Sessions.ActiveField", c.SessionEncoding, d, loc); err != nil {
			return invalid("%v", err)
		}
	}
	return nil
}

// userTarget is the resolved user model and what a flush needs to write it.
type userTarget struct {
	model *model
	ids   idCodec

	mu    sync.Mutex
	write *writeTarget // nil until the first flush resolved it
}

// sessionTarget is the resolved session model.
type sessionTarget struct {
	model     *model
	active    *schema.Field // the last-active field; nil unless IdleTimeout > 0
	activeEnc *timeCodec    // its encoding
}

// writeTarget names the table and columns a flush writes, with the SQL types
// PostgreSQL's statement casts to.
type writeTarget struct {
	table, pk, col string
	codec          *timeCodec // the time column's encoding
	intKey         bool       // the primary key's Go type is an integer kind
	// exactKey: the primary key's Go type is a string kind, whose ids are
	// matched byte for byte (dialect.exactIn), not as the column's
	// collation folds them. A Scanner key such as a UUID is matched by
	// value: its text's case is not part of it.
	exactKey        bool
	pkType, colType string // PostgreSQL only, from the catalog
	// pkCharset and pkCollation are a MySQL string key's character set and
	// collation, from information_schema ("" when unknown).
	pkCharset, pkCollation string
}

// writeTarget resolves table, columns and, on PostgreSQL, their SQL types,
// once the table exists.
func (p *Plugin) writeTarget(ctx context.Context) (*writeTarget, error) {
	u := p.users
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.write != nil {
		return u.write, nil
	}
	t := &writeTarget{table: u.model.table, pk: u.model.pk.DBName, col: u.model.time.DBName, codec: u.model.enc,
		intKey: u.ids.kind == idSigned || u.ids.kind == idUnsigned, exactKey: u.ids.kind == idString}
	if p.dialect.columnTypes != nil {
		if err := p.dialect.columnTypes(p.db.WithContext(ctx), t); err != nil {
			return nil, err
		}
	}
	u.write = t
	return t, nil
}
