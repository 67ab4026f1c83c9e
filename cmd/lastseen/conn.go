package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"time"

	"github.com/glebarez/sqlite"
	"github.com/lastseen/lastseen/cmd/lastseen/internal/runenv"
	"github.com/redis/go-redis/v9"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
	"gorm.io/gorm/schema"
)

// connFlags are the connection flags of every command: one database and
// one Redis. The demo falls back to a temporary SQLite file and an
// in-process Redis when they are not given; the operator commands need
// both.
type connFlags struct {
	Postgres     string   `help:"PostgreSQL DSN, e.g. 'host=127.0.0.1 user=app dbname=app sslmode=disable'." xor:"db" placeholder:"DSN" group:"Connection"`
	MySQL        string   `name:"mysql" help:"MySQL/MariaDB DSN, e.g. 'app:secret@tcp(127.0.0.1:3306)/app?parseTime=true'." xor:"db" placeholder:"DSN" group:"Connection"`
	SQLite       string   `name:"sqlite" help:"SQLite database file." xor:"db" placeholder:"PATH" group:"Connection"`
	Redis        string   `help:"Redis address host:port, or a redis:// or rediss:// URL (password, database number)." xor:"redis" placeholder:"ADDR" group:"Connection"`
	RedisCluster []string `help:"Redis Cluster seed addresses, comma separated." xor:"redis" placeholder:"ADDRS" sep:"," group:"Connection"`
}

// The usage errors of a missing connection flag.
var (
	errNoDB    = runenv.Usagef("lastseen: no database: give one of --postgres, --mysql or --sqlite")
	errNoRedis = runenv.Usagef("lastseen: no redis: give --redis or --redis-cluster")
)

// checkExisting refuses what the operator commands must not do: run
// without a database, or without a Redis unless noRedis (the purge of an
// app on the in-process buffer), or open a --sqlite path that does not
// exist (SQLite would create an empty database there, and the commands
// would then report an empty app).
func (c *connFlags) checkExisting(noRedis bool) error {
	switch {
	case !c.hasDB():
		return errNoDB
	case !c.hasRedis() && !noRedis:
		return errNoRedis
	case c.SQLite == "":
		return nil
	}
	fi, err := os.Stat(c.SQLite)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return runenv.Usagef("lastseen: --sqlite %s: no such file (status, flush and purge open an existing database only)", c.SQLite)
	case err != nil:
		return fmt.Errorf("lastseen: --sqlite: %w", err)
	case fi.IsDir():
		return runenv.Usagef("lastseen: --sqlite %s: a directory, not a database file", c.SQLite)
	}
	return nil
}

// hasDB reports whether a database flag was given.
func (c *connFlags) hasDB() bool { return c.Postgres != "" || c.MySQL != "" || c.SQLite != "" }

// hasRedis reports whether a Redis flag was given.
func (c *connFlags) hasRedis() bool { return c.Redis != "" || len(c.RedisCluster) > 0 }

// dbName describes the database for humans, without credentials.
func (c *connFlags) dbName() string {
	switch {
	case c.Postgres != "":
		return "postgres"
	case c.MySQL != "":
		return "mysql"
	case c.SQLite != "":
		return "sqlite " + c.SQLite
	}
	return "none"
}

// redisName describes the Redis for humans, without credentials.
func (c *connFlags) redisName() string {
	switch {
	case len(c.RedisCluster) > 0:
		return "redis cluster " + strings.Join(c.RedisCluster, ",")
	}
	if opt, err := runenv.RedisOptions(c.Redis); err == nil {
		return "redis " + opt.Addr
	}
	return "redis " + c.Redis
}

// openDB opens the database given by the flags with namer as GORM's naming
// strategy and checks that it answers.
func (c *connFlags) openDB(ctx context.Context, namer schema.Namer) (*gorm.DB, error) {
	var d gorm.Dialector
	switch {
	case c.Postgres != "":
		d = postgres.Open(c.Postgres)
	case c.MySQL != "":
		d = mysql.Open(c.MySQL)
	case c.SQLite != "":
		d = sqlite.Open(c.SQLite + "?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)")
	default:
		return nil, errNoDB
	}
	// NowFunc in UTC: the app's zone comes from its manifest, never this
	// process's own.
	db, err := gorm.Open(d, &gorm.Config{Logger: logger.Discard, NamingStrategy: namer,
		NowFunc: func() time.Time { return time.Now().UTC() }})
	if err != nil {
		return nil, fmt.Errorf("lastseen: open %s: %w", c.dbName(), err)
	}
	sqlDB, err := db.DB()
	if err == nil {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err = sqlDB.PingContext(pctx)
		cancel()
	}
	if err != nil {
		closeDB(db)
		return nil, fmt.Errorf("lastseen: %s does not answer: %w", c.dbName(), err)
	}
	return db, nil
}

// operatorReplyTimeout is how long an operator command waits for one Redis
// reply (go-redis's default is 3s): a status or a purge on a busy Redis
// should report, not fail, and a Redis that does not answer at all is
// caught first by the ping's 5s. A redis:// URL's read_timeout and
// write_timeout override it.
const operatorReplyTimeout = 10 * time.Second

// openRedis connects to the Redis given by the flags and checks that it
// answers: an operator command against a Redis it cannot reach would only
// report an empty buffer. The client has ContextTimeoutEnabled, so the
// plugin sends on it as it is (and the demo's command-counting hook sees
// its commands) instead of opening a copy.
func (c *connFlags) openRedis(ctx context.Context) (redis.UniversalClient, error) {
	var rdb redis.UniversalClient
	switch {
	case len(c.RedisCluster) > 0:
		rdb = redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.RedisCluster, ContextTimeoutEnabled: true,
			ReadTimeout: operatorReplyTimeout, WriteTimeout: operatorReplyTimeout})
	case c.Redis != "":
		opt, err := runenv.RedisOptions(c.Redis)
		if err != nil {
			return nil, err
		}
		opt.ContextTimeoutEnabled = true
		if opt.ReadTimeout == 0 { // not set by the URL (read_timeout)
			opt.ReadTimeout = operatorReplyTimeout
		}
		if opt.WriteTimeout == 0 {
			opt.WriteTimeout = operatorReplyTimeout
		}
		rdb = redis.NewClient(opt)
	default:
		return nil, errNoRedis
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := rdb.Ping(pctx).Err(); err != nil {
		rdb.Close()
		return nil, fmt.Errorf("lastseen: %s does not answer: %w", c.redisName(), err)
	}
	return rdb, nil
}

func closeDB(db *gorm.DB) {
	if sqlDB, err := db.DB(); err == nil {
		sqlDB.Close()
	}
}

// tableNamer is GORM's default naming strategy with table names chosen per
// Go type and column names chosen per table and Go field, so that the
// commands can point their own Go models at the app's tables and columns.
// Keys of tables are Go type names without type arguments ("usersRow" for
// usersRow[int64, *time.Time]), and for ruleRow its table slot
// (ruleSlotName: "ruleRow/0" for ruleRow[main.tableSlot0, ...]).
type tableNamer struct {
	schema.NamingStrategy
	tables  map[string]string
	columns map[string]map[string]string
}

// TableName returns the table chosen for the Go type name, else GORM's
// default.
func (n tableNamer) TableName(typeName string) string {
	base, args, _ := strings.Cut(typeName, "[")
	if base == "ruleRow" { // by its table slot, the first type argument
		slot, _, _ := strings.Cut(args, ",")
		base = ruleSlotName(int(slot[len(slot)-1] - '0'))
	}
	if t, ok := n.tables[base]; ok {
		return t
	}
	return n.NamingStrategy.TableName(typeName)
}

// ColumnName returns the column chosen for the table's Go field name, else
// GORM's default.
func (n tableNamer) ColumnName(table, field string) string {
	if c, ok := n.columns[table][field]; ok {
		return c
	}
	return n.NamingStrategy.ColumnName(table, field)
}
