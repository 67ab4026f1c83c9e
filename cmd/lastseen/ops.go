package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/lastseen/lastseen"
	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"
)

// targetFlags point the operator commands at the app's tables. The CLI
// cannot know the app's Go models, so it uses two fixed models (userRow,
// sessionRow) whose table and column names come from these flags; the
// defaults are those of lastseen.User and lastseen.Session. Prefix and
// Shards must be the app's Config values, or the commands look at other
// Redis keys; an empty Prefix is derived by the library from the database
// and table exactly as the app's is (openOps then sets it), and the
// buffer's manifest refuses a Shards, table or column that differs from
// the app's.
type targetFlags struct {
	Prefix          string `help:"Redis key prefix (the app's Config.Prefix); empty: derived from the database, --users-table and --last-seen-column, as the app derives it." group:"App"`
	Shards          int    `default:"${default_shards}" help:"Number of pending shards (the app's Config.Shards)." group:"App"`
	UsersTable      string `default:"${default_users_table}" help:"Users table (may be schema-qualified, e.g. app.users)." group:"App"`
	UserIDColumn    string `default:"${default_user_id_column}" help:"Primary key column of the users table." group:"App"`
	UserIDType      string `default:"${default_user_id_type}" enum:"int,string" help:"Kind of the user primary key: int (any integer type) or string (text, UUID)." group:"App"`
	LastSeenColumn  string `default:"${default_last_seen_column}" help:"Last-seen column of the users table." group:"App"`
	WriteMode       string `default:"update" enum:"update,upsert" help:"Write mode: upsert when the app sets Config.Flush.Upsert, else update." group:"App"`
	BatchSize       int    `default:"${default_batch_size}" help:"Users per SQL statement in a flush." group:"App"`
	SessionsTable   string `default:"${default_sessions_table}" help:"Sessions table." group:"App"`
	SessionIDColumn string `default:"${default_session_id_column}" help:"Primary key column of the sessions table." group:"App"`
	SessionIDType   string `default:"${default_session_id_type}" enum:"int,string" help:"Kind of the session primary key: int or string." group:"App"`
	ExpiresColumn   string `default:"${default_expires_column}" help:"Expiry column of the sessions table." group:"App"`
	PurgeBatchSize  int    `default:"${default_purge_batch_size}" help:"Sessions deleted per transaction." group:"App"`
}

// userRow and sessionRow are the models the operator commands hand to the
// plugin; tableNamer maps their type names to the tables and their field
// names (unique across both) to the columns of targetFlags.
type userRow[K int64 | string] struct {
	UserID     K `gorm:"primaryKey"`
	LastSeenAt *time.Time
}

type sessionRow[K int64 | string] struct {
	SessionID K `gorm:"primaryKey"`
	ExpiresAt time.Time
}

func (f *targetFlags) namer() tableNamer {
	return tableNamer{
		tables: map[string]string{"userRow": f.UsersTable, "sessionRow": f.SessionsTable},
		columns: map[string]string{
			"UserID": f.UserIDColumn, "LastSeenAt": f.LastSeenColumn,
			"SessionID": f.SessionIDColumn, "ExpiresAt": f.ExpiresColumn,
		},
	}
}

func (f *targetFlags) userModel() any {
	if f.UserIDType == "string" {
		return &userRow[string]{}
	}
	return &userRow[int64]{}
}

func (f *targetFlags) sessionModel() any {
	if f.SessionIDType == "int" {
		return &sessionRow[int64]{}
	}
	return &sessionRow[string]{}
}

// opsEnv is an operator command's plugin and connections.
type opsEnv struct {
	p   *lastseen.Plugin
	db  *gorm.DB
	rdb redis.UniversalClient
	f   *targetFlags

	errOut io.Writer // warnings
}

// openOps connects and registers a plugin without scheduler or local cache.
// The commands never call Plugin.Close, whose final flush would change what
// status and purge report; close releases the connections instead.
func openOps(ctx context.Context, conn *connFlags, f *targetFlags, now func() time.Time, errOut io.Writer) (*opsEnv, error) {
	if now == nil {
		now = time.Now
	}
	if err := conn.checkExisting(); err != nil {
		return nil, err
	}
	rdb, err := conn.openRedis(ctx)
	if err != nil {
		return nil, err
	}
	db, err := conn.openDB(ctx, f.namer())
	if err != nil {
		rdb.Close()
		return nil, err
	}
	p := lastseen.New(lastseen.Config{
		Redis:    rdb,
		Model:    f.userModel(),
		Logger:   slog.New(slog.NewTextHandler(errOut, &slog.HandlerOptions{Level: slog.LevelError})),
		Buffer:   lastseen.BufferConfig{Prefix: f.Prefix, Shards: f.Shards, LocalCacheSize: -1},
		Flush:    lastseen.FlushConfig{BatchSize: f.BatchSize, Upsert: f.WriteMode == "upsert", Schedule: "off"},
		Sessions: lastseen.SessionConfig{Model: f.sessionModel(), BatchSize: f.PurgeBatchSize, Schedule: "off"},
		Test:     lastseen.TestConfig{Now: now},
	})
	e := &opsEnv{p: p, db: db, rdb: rdb, f: f, errOut: errOut}
	if err := db.Use(p); err != nil {
		if errors.Is(err, lastseen.ErrSchema) { // a column the flags name is missing: say which flag
			if cerr := cmp.Or(e.checkUsers(), e.checkSessions()); cerr != nil {
				err = cerr
			}
		}
		e.close()
		return nil, err
	}
	f.Prefix = p.Config().Buffer.Prefix // derived by the library when --prefix was not given
	return e, nil
}

func (e *opsEnv) close() {
	closeDB(e.db)
	e.rdb.Close()
}

// checkTable returns a clear error when model's table or one of its
// columns is missing, or when the primary key column's type is not the
// kind idFlag says: the flags name them, so a mistake should say which.
func (e *opsEnv) checkTable(model any, table, tableFlag string, columns map[string]string, idColumn, idFlag, idKind string) error {
	m := e.db.Migrator()
	if !m.HasTable(model) {
		return fmt.Errorf("lastseen: table %q not found (set --%s)", table, tableFlag)
	}
	for _, field := range slices.Sorted(maps.Keys(columns)) {
		if !m.HasColumn(model, field) {
			return fmt.Errorf("lastseen: table %q has no column %q (set --%s)", table, e.f.namer().columns[field], columns[field])
		}
	}
	types, err := m.ColumnTypes(model)
	if err != nil {
		return fmt.Errorf("lastseen: read the columns of %q: %w", table, err)
	}
	for _, ct := range types {
		if ct.Name() != idColumn {
			continue
		}
		dbType := ct.DatabaseTypeName()
		upper := strings.ToUpper(dbType)
		want := "string"
		if strings.Contains(upper, "INT") || strings.Contains(upper, "SERIAL") {
			want = "int"
		}
		if want != idKind {
			return fmt.Errorf("lastseen: column %q of table %q is %s, not --%s %s (set --%s %s)",
				idColumn, table, dbType, idFlag, idKind, idFlag, want)
		}
	}
	return nil
}

func (e *opsEnv) checkUsers() error {
	return e.checkTable(e.f.userModel(), e.f.UsersTable, "users-table",
		map[string]string{"UserID": "user-id-column", "LastSeenAt": "last-seen-column"},
		e.f.UserIDColumn, "user-id-type", e.f.UserIDType)
}

func (e *opsEnv) checkSessions() error {
	return e.checkTable(e.f.sessionModel(), e.f.SessionsTable, "sessions-table",
		map[string]string{"SessionID": "session-id-column", "ExpiresAt": "expires-column"},
		e.f.SessionIDColumn, "session-id-type", e.f.SessionIDType)
}
