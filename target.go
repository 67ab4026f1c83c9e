package lastseen

import (
	"context"
	"fmt"
	"reflect"
	"sync"
	"time"

	"github.com/lastseen/lastseen/internal/dialect"
	"github.com/lastseen/lastseen/internal/idcodec"
	"github.com/lastseen/lastseen/internal/timecol"
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
	enc    *timecol.Codec // the time column's encoding
}

// resolveModel parses m with db's naming strategy and checks that it has one
// primary key and that field is a time field of a supported type, in enc.
func resolveModel(db *gorm.DB, m any, field, modelOpt, fieldOpt string, enc timecol.Encoding, d *dialect.Dialect, loc *time.Location) (*model, error) {
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
// resolves its encoding (timecol.New).
func timeField(s *schema.Schema, field, fieldOpt string, enc timecol.Encoding, d *dialect.Dialect, loc *time.Location) (*schema.Field, *timecol.Codec, error) {
	f := s.LookUpField(field)
	if f == nil || f.DBName == "" {
		return nil, nil, fmt.Errorf("%s %q: %s has no such field or column", fieldOpt, field, s.Name)
	}
	c, err := timecol.New(s, f, field, enc, fieldOpt, d.Naive(), loc)
	if err != nil {
		return nil, nil, err
	}
	return f, c, nil
}

// columnLocation is the location of the wall times in naive columns: loc
// when set; else, on PostgreSQL, the location of db's NowFunc when it is
// not UTC, as pgx writes a naive timestamp as the wall clock of the value's
// own zone and GORM's own times carry NowFunc's (time.Now().Local() by
// default); else nil, the driver's location (go-sql-driver/mysql converts
// every value to the DSN's loc).
func columnLocation(loc *time.Location, db *gorm.DB, d *dialect.Dialect) *time.Location {
	if loc != nil || d.Name() != "postgres" || db.Config.NowFunc == nil {
		return loc
	}
	l := db.Config.NowFunc().Location()
	year := time.Now().Year()
	for _, t := range []time.Time{time.Date(year, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(year, 7, 1, 0, 0, 0, 0, time.UTC)} {
		if _, off := t.In(l).Zone(); off != 0 {
			return l
		}
	}
	return nil
}

// resolveTargets resolves the user and session models and the rules
// against db (table, primary key, time columns) and the user ids' codec
// against dialect d.
func (p *Plugin) resolveTargets(db *gorm.DB, d *dialect.Dialect) error {
	c := p.cfg
	loc := columnLocation(c.ColumnLocation, db, d)
	users, err := resolveModel(db, c.Model, c.Field, "Model", "Field", c.FieldEncoding, d, loc)
	if err != nil {
		return invalid("%v", err)
	}
	ids, err := idcodec.New(users.pk)
	if err != nil {
		return invalid("Model %s: %v", users.schema.Name, err)
	}
	if ids.Kind == idcodec.Unsigned {
		ids.Max = d.MaxUnsigned()
	}
	ids.MaxLen = c.MaxIDLength
	if ids.Kind == idcodec.String {
		ids.BadText = d.BadText
	}
	p.users = &userTarget{model: users, ids: ids, zone: dstZone(users.enc.Location(), db, d, p.now())}
	sessions, err := resolveModel(db, c.SessionModel, c.ExpiresField, "Sessions.Model", "Sessions.ExpiresField", c.SessionEncoding, d, loc)
	if err != nil {
		return invalid("%v", err)
	}
	p.sessions = &sessionTarget{model: sessions}
	if c.IdleTimeout > 0 {
		if p.sessions.active, p.sessions.activeEnc, err = timeField(sessions.schema, c.ActiveField, "Sessions.ActiveField", c.SessionEncoding, d, loc); err != nil {
			return invalid("%v", err)
		}
	}
	return p.resolveRules(db, d, loc) // rule.go
}

// dstZone is the location of a naive column's wall times, the codec's or
// the driver's (Dialect.DriverLocation), when its offset changes (DST):
// the flush then compares instants where the dialect converts
// (Target.Zone) and counts the entries a repeated hour makes ambiguous
// where it does not (countAmbiguous). nil otherwise.
func dstZone(loc *time.Location, db *gorm.DB, d *dialect.Dialect, now time.Time) *time.Location {
	if loc == nil {
		loc = d.DriverLocation(db)
	}
	if !timecol.HasDST(loc, now) {
		return nil
	}
	return loc
}

// userTarget is the resolved user model and what a flush needs to write it.
type userTarget struct {
	model *model
	ids   idcodec.Codec
	zone  *time.Location // dstZone of the tracked column; nil without DST

	mu    sync.Mutex
	write *dialect.Target // nil until the first flush resolved it
}

// sessionTarget is the resolved session model.
type sessionTarget struct {
	model     *model
	active    *schema.Field  // the last-active field; nil unless IdleTimeout > 0
	activeEnc *timecol.Codec // its encoding
}

// writeTarget resolves the table and columns a flush writes and what the
// dialect reads of them in the catalog (PostgreSQL's SQL types, MySQL's
// key collation), once the table exists.
func (p *Plugin) writeTarget(ctx context.Context) (*dialect.Target, error) {
	u := p.users
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.write != nil {
		return u.write, nil
	}
	t := &dialect.Target{Table: u.model.table, PK: u.model.pk.DBName, Column: u.model.time.DBName, Codec: u.model.enc,
		IntKey: u.ids.Integer(), ExactKey: u.ids.Kind == idcodec.String, Bound: p.cfg.StatementTimeout}
	if u.zone != nil && u.model.enc.Naive() {
		t.Zone, _ = timecol.ZoneName(u.zone, p.now())
	}
	if err := p.dialect.ColumnTypes(p.db.WithContext(ctx), t); err != nil {
		return nil, err
	}
	u.write = t
	return t, nil
}

// User is the default Model, table "users"; apps usually pass their own.
// LastSeenAt has no index on purpose: on PostgreSQL an indexed column makes
// every flushed row a non-HOT update (PostgreSQL manual, "Heap-Only
// Tuples"), written at a fraction of the rate. Count users online with
// Plugin.Online; see Plugin.TableHealth.
type User struct {
	ID         uint64     `gorm:"primaryKey"` // the user's id, as given to Touch
	LastSeenAt *time.Time // last seen (UTC); NULL until the first flush
}
