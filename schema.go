package lastseen

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lastseen/lastseen/internal/dialect"
	"github.com/lastseen/lastseen/internal/idcodec"
	"github.com/lastseen/lastseen/internal/timecol"
	"gorm.io/gorm"
)

// schemaTimeout bounds the catalog queries of one schema check.
const schemaTimeout = 5 * time.Second

// schemaLogInterval is the least time between two log lines of the
// scheduled flush or purge about the same schema problem (a missing table
// or column): the first is logged at once, the repeats within the interval
// are counted into the next line's "repeats" attribute.
const schemaLogInterval = 5 * time.Minute

// schemaState remembers which tables were found to fit the config, so each
// is inspected until it does and then no more, and rate-limits the
// scheduled jobs' log lines about them.
type schemaState struct {
	usersOK, sessionsOK atomic.Bool
	flushLog, purgeLog  logLimiter
}

// logLimiter lets one line through per schemaLogInterval on the plugin's
// clock and counts the others.
type logLimiter struct {
	mu      sync.Mutex
	last    time.Time
	repeats int
}

// allow reports whether a line may be logged at now, and how many were
// held back since the last one.
func (l *logLimiter) allow(now time.Time) (ok bool, repeats int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.last.IsZero() && now.Sub(l.last) < schemaLogInterval {
		l.repeats++
		return false, 0
	}
	repeats, l.last, l.repeats = l.repeats, now, 0
	return true, repeats
}

// tableCheck is one model's table as the config names it.
type tableCheck struct {
	model     *model
	modelOpt  string     // "Model" or "SessionModel"
	modelVal  any        // the configured model, for %T
	fieldOpt  string     // "Field" or "ExpiresField"
	fieldName string     // as configured
	codecs    []optCodec // the time columns whose declared types are checked (checkColumnTypes)
	extra     []optCodec // more columns it needs, checked present as the time column is
}

func (p *Plugin) usersCheck() tableCheck {
	return tableCheck{p.users.model, "Model", p.cfg.Model, "Field", p.cfg.Field,
		[]optCodec{{"Field", p.cfg.Field, p.users.model.enc}}, nil}
}

func (p *Plugin) sessionsCheck() tableCheck {
	s := p.sessions
	codecs := []optCodec{{"Sessions.ExpiresField", p.cfg.ExpiresField, s.model.enc}}
	if s.activeEnc != nil {
		codecs = append(codecs, optCodec{"Sessions.ActiveField", p.cfg.ActiveField, s.activeEnc})
	}
	return tableCheck{s.model, "Sessions.Model", p.cfg.SessionModel, "Sessions.ExpiresField", p.cfg.ExpiresField, codecs, nil}
}

// inspect reports whether c's table exists and, when it does, the first
// column the config needs that it lacks (key, then time column) as a
// message naming the Config field to fix.
func (c tableCheck) inspect(m gorm.Migrator) (exists bool, problem string) {
	if !m.HasTable(c.model.table) {
		return false, ""
	}
	if !m.HasColumn(c.model.table, c.model.pk.DBName) {
		return true, fmt.Sprintf("Config.%s %T: table %s has no column %s (its primary key %s)",
			c.modelOpt, c.modelVal, c.model.table, c.model.pk.DBName, c.model.pk.Name)
	}
	if !m.HasColumn(c.model.table, c.model.time.DBName) {
		return true, fmt.Sprintf("Config.%s %q: table %s has no column %s", c.fieldOpt, c.fieldName, c.model.table, c.model.time.DBName)
	}
	for _, oc := range c.extra {
		if col := oc.c.Field().DBName; !m.HasColumn(c.model.table, col) {
			return true, fmt.Sprintf("Config.%s %q: table %s has no column %s", oc.opt, oc.name, c.model.table, col)
		}
	}
	return true, ""
}

// inspectSchema checks the tables at Initialize. A table present without
// a column the config names is an ErrInvalidConfig error naming the Config
// field. A missing table is a warning, not an error: apps often call
// AutoMigrate after db.Use; the first flush (tracked model) or purge
// (sessions, unless DisablePurge) checks again. A string key column with a
// declared length bounds MaxIDLength (checkKeyLength).
func (p *Plugin) inspectSchema(db *gorm.DB) error {
	ctx, cancel := context.WithTimeout(context.Background(), schemaTimeout)
	defer cancel()
	db = fresh(ctx, db)
	if ping(db) != nil {
		p.log.Warn("lastseen: database unreachable at start; the first flush and purge check the tables")
		return nil
	}
	checks := []tableCheck{p.usersCheck()}
	oks := []*atomic.Bool{&p.schema.usersOK}
	if !p.cfg.DisablePurge {
		checks, oks = append(checks, p.sessionsCheck()), append(oks, &p.schema.sessionsOK)
	}
	for _, r := range p.rules {
		checks, oks = append(checks, r.check()), append(oks, &r.schemaOK)
	}
	for i, c := range checks {
		exists, problem := c.inspect(db.Migrator())
		if exists && problem == "" {
			problem = p.checkColumnTypes(db, c)
		}
		switch {
		case problem != "":
			return schemaConfigError(problem)
		case !exists:
			p.log.Warn("lastseen: "+c.missing(p.keeps(stayBuffered)), "table", c.model.table)
		default:
			oks[i].Store(true)
		}
	}
	if !p.schema.usersOK.Load() {
		return nil
	}
	cols, err := p.dialect.Columns(db, p.users.model.table)
	if err != nil {
		return nil // the catalog is not readable here: the flush reports what it finds
	}
	for _, c := range cols {
		if c.Name == p.users.model.pk.DBName {
			return p.checkKeyLength(c)
		}
	}
	return nil
}

// optCodec is one configured time column of a table: the Config field that
// names it, as configured, and its codec.
type optCodec struct {
	opt, name string
	c         *timecol.Codec
}

// checkColumnTypes reads the declared types of c's time columns from the
// catalog (Dialect.Columns: PostgreSQL information_schema.columns, MySQL
// information_schema.COLUMNS, SQLite's table definition) and checks each
// against its codec. It records whether each is naive and returns the
// first mismatch as a message naming the Config field, the Go type and the
// column type, or "" when all fit. A catalog it cannot read is not a
// mismatch: the flush's guard reports values it cannot compare.
func (p *Plugin) checkColumnTypes(db *gorm.DB, c tableCheck) string {
	cols, err := p.dialect.Columns(db, c.model.table)
	if err != nil {
		return ""
	}
	for _, oc := range c.codecs {
		f := oc.c.Field()
		for _, col := range cols {
			if col.Name != f.DBName {
				continue
			}
			k := p.dialect.Classify(col.Type)
			if !oc.c.Fits(k) {
				return fmt.Sprintf("Config.%s %q: %s.%s is %s, but column %s.%s is %s, which holds %s",
					oc.opt, oc.name, c.model.schema.Name, f.Name, oc.c.Describe(),
					c.model.table, col.Name, strings.ToUpper(col.Type), k)
			}
			oc.c.SetClass(k)
		}
	}
	return ""
}

// missing describes c's missing table and what to do about it; kept adds
// that the touches wait for it (keeps).
func (c tableCheck) missing(kept string) string {
	switch {
	case c.modelOpt == "Sessions.Model":
		return fmt.Sprintf("table %s does not exist: create it, or set Config.Sessions.Disabled for an app without a sessions table (Config.%s %T)",
			c.model.table, c.modelOpt, c.modelVal)
	case strings.HasPrefix(c.modelOpt, "Rules["):
		return fmt.Sprintf("table %s does not exist: create it (AutoMigrate) or fix Config.%s (%T)", c.model.table, c.modelOpt, c.modelVal)
	}
	return fmt.Sprintf("table %s does not exist: create it (AutoMigrate) or fix Config.%s (%T)%s",
		c.model.table, c.modelOpt, c.modelVal, kept)
}

// checkTable checks c's table before a flush or purge writes to it, until
// it was once found to fit (ok). The error wraps ErrSchema and names the
// Config field to fix.
func (p *Plugin) checkTable(ctx context.Context, op string, c tableCheck, ok *atomic.Bool) error {
	if ok.Load() {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, schemaTimeout)
	defer cancel()
	db := fresh(ctx, p.db)
	exists, problem := c.inspect(db.Migrator())
	if exists && problem == "" {
		problem = p.checkColumnTypes(db, c)
	}
	switch {
	case problem != "":
		return fmt.Errorf("%w: %s: %s", ErrSchema, op, problem)
	case !exists:
		if err := ping(db); err != nil {
			return fmt.Errorf("lastseen: %s: check table %s: %w", op, c.model.table, err)
		}
		return fmt.Errorf("%w: %s: %s", ErrSchema, op, c.missing(p.keeps(stayBuffered)))
	}
	ok.Store(true)
	return nil
}

// maxKeyChars bounds the characters of an id a key column's declared
// length admits: at most 4 bytes each, maxIDLengthLimit in all.
const maxKeyChars = maxIDLengthLimit / 4

// checkKeyLength fits the id limit to a string key column's declared
// length, in the column's own unit: characters as varchar(n) counts them
// (utf8mb4 included), bytes for a binary string type (countsBytes). Left
// at its default (128 bytes) it becomes the length, up to maxKeyChars; set
// by the test seam above it, it is an error, as longer ids would be
// refused by the flush, or truncated into another id by MySQL outside
// strict mode.
func (p *Plugin) checkKeyLength(col dialect.Column) error {
	ids := &p.users.ids
	if ids.Kind != idcodec.String {
		return nil
	}
	n := col.Length
	bytes := countsBytes(col.Type)
	unit := map[bool]string{false: "characters", true: "bytes"}[bytes]
	switch {
	case n <= 0:
		return nil
	case p.idLenSet && n < int64(ids.MaxLen):
		return invalid("MaxIDLength %d: key column %s.%s holds at most %d %s", ids.MaxLen, p.users.model.table, col.Name, n, unit)
	case p.idLenSet:
		return nil
	}
	if bytes {
		ids.MaxLen, ids.Chars = int(min(n, maxIDLengthLimit)), false
		return nil
	}
	ids.MaxLen, ids.Chars = int(min(n, maxKeyChars)), true
	return nil
}

// countsBytes reports a column type whose declared length counts bytes,
// not characters: the binary string types (MySQL BINARY and VARBINARY, and
// a CHAR or VARCHAR declared CHARACTER SET binary, which the catalog
// reports as those; BLOB; PostgreSQL bytea declares no length).
func countsBytes(typ string) bool {
	t := strings.ToLower(typ)
	return strings.Contains(t, "binary") || strings.Contains(t, "blob") || t == "bytea"
}

// logSchemaError logs a scheduled job's schema error through its limiter:
// one ERROR line per schemaLogInterval, the repeats counted.
func (p *Plugin) logSchemaError(l *logLimiter, msg string, err error, attrs ...any) {
	ok, repeats := l.allow(p.now())
	if !ok {
		return
	}
	p.log.Error(msg, append(attrs, "err", err, "repeats", repeats)...)
}

// schemaConfigError is Initialize's error for a present table without a
// column the config names: it reads as a configuration problem and matches
// both ErrInvalidConfig and ErrSchema with errors.Is.
type schemaConfigError string

func (e schemaConfigError) Error() string { return ErrInvalidConfig.Error() + ": " + string(e) }

// Is reports ErrInvalidConfig and ErrSchema.
func (e schemaConfigError) Is(target error) bool {
	return target == ErrInvalidConfig || target == ErrSchema
}
