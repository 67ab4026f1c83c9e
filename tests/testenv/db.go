package testenv

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/glebarez/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// Dialect makes fresh, isolated databases of one dialect.
type Dialect struct {
	// Name is "sqlite", "postgres" or "mysql", the plugin's dialect names.
	Name string
	// New makes a database of the test's own and removes it at cleanup; on
	// a server whose variable is unset it skips the test (see Need).
	New func(t testing.TB) *DB
}

// DB is one isolated database: a SQLite file in the test's temporary
// directory, a PostgreSQL schema or a MySQL database of its own.
type DB struct {
	// Dialect is the name of the Dialect that made it.
	Dialect string
	// DSN is what the CLI's --sqlite (a file path), --postgres (a DSN
	// with search_path set to the schema) or --mysql (a DSN naming the
	// database) flag takes to reach this database.
	DSN       string
	dialector func() gorm.Dialector
}

// Quiet returns a GORM config that logs nothing, new on every call: a
// handle takes one plugin of a name, so handles must not share a config.
func Quiet() *gorm.Config { return &gorm.Config{Logger: logger.Default.LogMode(logger.Silent)} }

// Open opens a new handle to the database with Quiet's config and closes it
// at cleanup.
func (d *DB) Open(t testing.TB) *gorm.DB { return d.OpenWith(t, Quiet()) }

// OpenWith opens a new handle to the database with cfg and closes it at
// cleanup.
func (d *DB) OpenWith(t testing.TB, cfg *gorm.Config) *gorm.DB {
	t.Helper()
	db, err := gorm.Open(d.dialector(), cfg)
	if err != nil {
		t.Fatalf("open %s: %v", d.Dialect, err)
	}
	t.Cleanup(func() { CloseDB(db) })
	return db
}

// Flags returns the CLI flags that name this database: --sqlite PATH,
// --postgres DSN or --mysql DSN.
func (d *DB) Flags() []string { return []string{"--" + d.Dialect, d.DSN} }

// CloseDB closes the connection pool behind db.
func CloseDB(db *gorm.DB) {
	if sqlDB, err := db.DB(); err == nil {
		sqlDB.Close()
	}
}

// Servers holds the GORM drivers of the dialects with a server
// (gorm.io/driver/postgres's Open and gorm.io/driver/mysql's Open), which
// the tests that run on servers pass in. This package does not import
// them: a module whose tests import it only for SQLite and miniredis (the
// extra/* integrations) then does not require those drivers, and its
// users are not moved to the drivers' versions.
type Servers struct {
	PostgresDriver func(dsn string) gorm.Dialector
	MySQLDriver    func(dsn string) gorm.Dialector
}

// Dialects returns every dialect: SQLite, PostgreSQL and MySQL.
func (s Servers) Dialects() []Dialect { return []Dialect{SQLite(), s.Postgres(), s.MySQL()} }

// ServerDialects returns the dialects with a server: PostgreSQL and MySQL.
func (s Servers) ServerDialects() []Dialect { return []Dialect{s.Postgres(), s.MySQL()} }

// SQLite makes a SQLite file in the test's temporary directory, opened in
// WAL mode with a 5 s busy timeout (as the CLI opens --sqlite).
func SQLite() Dialect {
	return Dialect{Name: "sqlite", New: func(t testing.TB) *DB {
		path := filepath.Join(t.TempDir(), "test.db")
		return &DB{Dialect: "sqlite", DSN: path, dialector: func() gorm.Dialector {
			return sqlite.Open(path + "?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)")
		}}
	}}
}

// Postgres makes a schema of the test's own in the database of
// LASTSEEN_POSTGRES_DSN and drops it (CASCADE) at cleanup.
func (s Servers) Postgres() Dialect {
	return Dialect{Name: "postgres", New: func(t testing.TB) *DB {
		dsn := Need(t, EnvPostgres)
		schema := RandomName("t_")
		return serverDB(t, "postgres", s.PostgresDriver, dsn, "SCHEMA "+schema, " CASCADE", dsn+" search_path="+schema)
	}}
}

// MySQL makes a database of the test's own on the server of
// LASTSEEN_MYSQL_DSN and drops it at cleanup.
func (s Servers) MySQL() Dialect {
	return Dialect{Name: "mysql", New: func(t testing.TB) *DB {
		dsn := Need(t, EnvMySQL)
		name := RandomName("lastseen_t_")
		slash, q := strings.Index(dsn, "/"), strings.Index(dsn, "?")
		if q < 0 {
			q = len(dsn)
		}
		return serverDB(t, "mysql", s.MySQLDriver, dsn, "DATABASE "+name, "", dsn[:slash+1]+name+dsn[q:])
	}}
}

// serverDB creates the object (a schema or a database) on the server of
// dsn, drops it at cleanup (with dropSuffix), and returns the database
// reached by own.
func serverDB(t testing.TB, dialect string, open func(dsn string) gorm.Dialector, dsn, object, dropSuffix, own string) *DB {
	t.Helper()
	admin := (&DB{Dialect: dialect, dialector: func() gorm.Dialector { return open(dsn) }}).Open(t)
	if err := admin.Exec("CREATE " + object).Error; err != nil {
		t.Fatalf("create %s: %v", strings.ToLower(strings.Fields(object)[0]), err)
	}
	t.Cleanup(func() { admin.Exec("DROP " + object + dropSuffix) })
	return &DB{Dialect: dialect, DSN: own, dialector: func() gorm.Dialector { return open(own) }}
}
