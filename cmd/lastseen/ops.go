package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/internal/dialect"
	"github.com/lastseen/lastseen/internal/timecol"
	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"
)

// targetFlags choose the buffer an operator command acts on. The commands
// read the app's rules from the buffer's manifest (tables, columns, key
// types, encodings, batch sizes, write mode, the session rule): --prefix
// or --table picks the buffer when the app's database has several.
type targetFlags struct {
	Prefix string `help:"The buffer's Redis key prefix (the app's Buffer.Prefix, or the one it derived: lastseen buffers lists them). Needed when the database has several buffers and --table does not pick one." group:"Buffer"`
	Table  string `help:"Pick the buffer that tracks this table (as lastseen buffers prints it)." group:"Buffer"`

	rules []string // purge --rule: pick the buffer whose app has these inactivity rules
}

// ruleFlags are the session rule of the purge of an app without Redis (an
// app on the in-process buffer), which has no manifest to read.
type ruleFlags struct {
	SessionsTable   string        `default:"${default_sessions_table}" help:"Without Redis: the sessions table." group:"Without Redis"`
	SessionIDColumn string        `default:"${default_session_id_column}" help:"Without Redis: primary key column of the sessions table." group:"Without Redis"`
	SessionIDType   string        `default:"${default_session_id_type}" enum:"int,string" help:"Without Redis: kind of the session primary key: int or string." group:"Without Redis"`
	ExpiresColumn   string        `default:"${default_expires_column}" help:"Without Redis: expiry column of the sessions table (Sessions.ExpiresField)." group:"Without Redis"`
	ExpiresEncoding string        `default:"time" enum:"time,unix,unixmilli" help:"Without Redis: how the expiry column stores an instant." group:"Without Redis"`
	IdleTimeout     time.Duration `help:"Without Redis: the app's Sessions.IdleTimeout (0: sessions expire by their expiry alone)." group:"Without Redis"`
	ActiveColumn    string        `default:"${default_active_column}" help:"Without Redis: last-active column read by --idle-timeout (Sessions.ActiveField)." group:"Without Redis"`
	ActiveEncoding  string        `default:"time" enum:"time,unix,unixmilli" help:"Without Redis: how the last-active column stores an instant." group:"Without Redis"`
	PurgeBatchSize  int           `default:"${default_purge_batch_size}" help:"Without Redis: sessions deleted per transaction (Sessions.BatchSize)." group:"Without Redis"`
}

// opsEnv is an operator command's plugin and connections.
type opsEnv struct {
	p   *lastseen.Plugin
	db  *gorm.DB
	rdb redis.UniversalClient // nil without Redis
	buf bufferInfo            // the buffer acted on (zero without Redis)
	cfg lastseen.Config       // p's Config as built, before db.Use
	f   *ruleFlags            // the purge's flags (nil for the other commands)

	errOut io.Writer // warnings
}

// sessionsTable is the session table the command's rule purges ("" when
// the buffer's plugin has no session rule).
func (e *opsEnv) sessionsTable() string {
	if e.rdb == nil {
		return e.f.SessionsTable
	}
	return e.buf.get("sessions_table")
}

// openOps connects and registers the plugins of the buffer the flags pick,
// built from its manifest, without scheduler or local cache, and, when its
// session rule reads another buffer's activity, that buffer's plugin too.
// A purge (rule set) without a Redis flag runs on the in-process buffer
// with the rule's flags. The commands never call
// Plugin.Close, whose final flush would change what status and purge
// report; close releases the connections instead.
func openOps(ctx context.Context, conn *connFlags, f *targetFlags, rule *ruleFlags, now func() time.Time, errOut io.Writer) (*opsEnv, error) {
	purge := rule != nil
	if now == nil {
		now = time.Now
	}
	if err := conn.checkExisting(purge); err != nil {
		return nil, err
	}
	l := newLayout()
	db, err := conn.openDB(ctx, l.namer())
	if err != nil {
		return nil, err
	}
	e := &opsEnv{db: db, f: rule, errOut: errOut}
	base := lastseen.Config{
		Logger: slog.New(slog.NewTextHandler(errOut, &slog.HandlerOptions{Level: slog.LevelError})),
		Test:   lastseen.TestConfig{Now: now},
	}
	var extra []lastseen.Config
	if conn.hasRedis() {
		extra, err = e.fromManifest(ctx, conn, f, l, base, purge)
	} else if e.cfg, err = l.flagsRule(rule, base); err == nil {
		err = e.checkSessions() // before db.Use, whose errors name the CLI's own models
	}
	if err == nil {
		err = e.use(append([]lastseen.Config{e.cfg}, extra...))
	}
	if err != nil {
		e.close()
		return nil, err
	}
	return e, nil
}

// fromManifest opens Redis, picks the buffer and builds its Config (and
// the Configs of the buffers that track the activity its session rule and
// its inactivity rules read, returned) from the manifests.
func (e *opsEnv) fromManifest(ctx context.Context, conn *connFlags, f *targetFlags, l *layout, base lastseen.Config, purge bool) ([]lastseen.Config, error) {
	rdb, err := conn.openRedis(ctx)
	if err != nil {
		return nil, err
	}
	e.rdb = rdb
	base.Redis = rdb
	all, err := listBuffers(ctx, rdb)
	if err != nil {
		return nil, err
	}
	sel, err := selectorFor(ctx, e.db, f, purge)
	if err != nil {
		return nil, err
	}
	if e.buf, err = sel.pick(all); err != nil {
		return nil, err
	}
	l.naive = func(table, column string) (bool, error) { return naiveColumn(ctx, e.db, table, column) }
	if e.cfg, err = l.config(e.buf, base); err != nil {
		return nil, err
	}
	trackers, err := activityBuffers(all, e.buf) // status and purge check their buffered activity, as the app's purge and rules do
	if err != nil {
		return nil, err
	}
	var extra []lastseen.Config
	for _, act := range trackers {
		if err := act.complete(); err != nil {
			return nil, err
		}
		c, err := l.config(act, base)
		if err != nil {
			return nil, err
		}
		extra = append(extra, c)
	}
	return extra, nil
}

// selectorFor is the selector of the flags for the database db.
func selectorFor(ctx context.Context, db *gorm.DB, f *targetFlags, purge bool) (selector, error) {
	d := dialect.Lookup(db.Dialector.Name())
	if d == nil {
		return selector{}, fmt.Errorf("lastseen: database dialect %q is not one lastseen supports", db.Dialector.Name())
	}
	ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	id, err := d.Identity(ictx, db)
	if err != nil {
		return selector{}, fmt.Errorf("lastseen: read the database's identity (to find its buffers): %w", err)
	}
	return selector{prefix: f.Prefix, table: f.Table, dialect: d.Name(), database: id.Database, purge: purge, rules: f.rules}, nil
}

// use registers a plugin for each Config on e.db; the first is e.p.
func (e *opsEnv) use(cfgs []lastseen.Config) error {
	for i, c := range cfgs {
		p := lastseen.New(c)
		if err := e.db.Use(p); err != nil {
			return err
		}
		if i == 0 {
			e.p = p
		}
	}
	return nil
}

func (e *opsEnv) close() {
	closeDB(e.db)
	if e.rdb != nil {
		e.rdb.Close()
	}
}

// checkSessions returns a clear error, naming the flag to set, when the
// flags' session table or one of its columns is missing, or when its
// primary key column is not of the kind --session-id-type says (without
// Redis, where the flags give the session rule).
func (e *opsEnv) checkSessions() error {
	f := e.f
	model := e.cfg.Sessions.Model
	m := e.db.Migrator()
	if !m.HasTable(model) {
		return fmt.Errorf("lastseen: table %q not found (set --sessions-table)", f.SessionsTable)
	}
	cols := map[string]string{f.SessionIDColumn: "session-id-column", f.ExpiresColumn: "expires-column"}
	encs := map[string]string{f.ExpiresColumn: "expires"}
	if f.IdleTimeout > 0 {
		cols[f.ActiveColumn] = "active-column"
		encs[f.ActiveColumn] = "active"
	}
	for _, col := range slices.Sorted(maps.Keys(cols)) {
		if !m.HasColumn(model, col) {
			return fmt.Errorf("lastseen: table %q has no column %q (set --%s)", f.SessionsTable, col, cols[col])
		}
	}
	types, err := m.ColumnTypes(model)
	if err != nil {
		return fmt.Errorf("lastseen: read the columns of %q: %w", f.SessionsTable, err)
	}
	for _, ct := range types {
		dbType := ct.DatabaseTypeName()
		upper := strings.ToUpper(dbType)
		integer := strings.Contains(upper, "INT") || strings.Contains(upper, "SERIAL")
		if ct.Name() == f.SessionIDColumn {
			if want := map[bool]string{true: "int", false: "string"}[integer]; want != f.SessionIDType {
				return fmt.Errorf("lastseen: column %q of table %q is %s, not --session-id-type %s (set --session-id-type %s)",
					f.SessionIDColumn, f.SessionsTable, dbType, f.SessionIDType, want)
			}
		}
		if which, ok := encs[ct.Name()]; ok {
			enc := map[string]string{"expires": f.ExpiresEncoding, "active": f.ActiveEncoding}[which]
			if integer != (enc != encTime) {
				want := map[bool]string{true: "unix or unixmilli", false: "time"}[integer]
				return fmt.Errorf("lastseen: column %q of table %q is %s, not --%s-encoding %s (set --%s-encoding %s)",
					ct.Name(), f.SessionsTable, dbType, which, enc, which, want)
			}
		}
	}
	return nil
}

// naiveColumn reports whether column of table holds wall times
// (PostgreSQL timestamp, MySQL DATETIME), by the catalog.
func naiveColumn(ctx context.Context, db *gorm.DB, table, column string) (bool, error) {
	cols, err := db.WithContext(ctx).Migrator().ColumnTypes(table)
	if err != nil {
		return false, err
	}
	d := dialect.Lookup(db.Dialector.Name())
	for _, c := range cols {
		if c.Name() == column {
			return d.Classify(strings.ToLower(c.DatabaseTypeName())) == timecol.ClassNaive, nil
		}
	}
	return false, fmt.Errorf("no such column")
}
