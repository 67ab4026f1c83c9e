package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"text/tabwriter"
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
// and table exactly as the app's is, and the buffer's manifest refuses a
// Shards, table or column that differs from the app's.
type targetFlags struct {
	Prefix          string `help:"Redis key prefix (the app's Config.Prefix); empty: derived from the database and table, as the app derives it." group:"App"`
	Shards          int    `default:"16" help:"Number of pending shards (the app's Config.Shards)." group:"App"`
	UsersTable      string `default:"users" help:"Users table (may be schema-qualified, e.g. app.users)." group:"App"`
	UserIDColumn    string `default:"id" help:"Primary key column of the users table." group:"App"`
	UserIDType      string `default:"int" enum:"int,string" help:"Kind of the user primary key: int (any integer type) or string (text, UUID)." group:"App"`
	LastSeenColumn  string `default:"last_seen_at" help:"Last-seen column of the users table." group:"App"`
	WriteMode       string `default:"update" enum:"update,upsert" help:"Write mode (the app's Config.WriteMode): update or upsert." group:"App"`
	BatchSize       int    `default:"1000" help:"Users per SQL statement in a flush." group:"App"`
	SessionsTable   string `default:"sessions" help:"Sessions table." group:"App"`
	SessionIDColumn string `default:"id" help:"Primary key column of the sessions table." group:"App"`
	SessionIDType   string `default:"string" enum:"int,string" help:"Kind of the session primary key: int or string." group:"App"`
	ExpiresColumn   string `default:"expires_at" help:"Expiry column of the sessions table." group:"App"`
	PurgeBatchSize  int    `default:"1000" help:"Sessions deleted per transaction." group:"App"`
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
}

// openOps connects and registers a plugin without scheduler or local cache.
// The commands never call Plugin.Close, whose final flush would change what
// status and purge report; close releases the connections instead.
func openOps(ctx context.Context, conn *connFlags, f *targetFlags, now func() time.Time) (*opsEnv, error) {
	if now == nil {
		now = time.Now
	}
	if !conn.hasDB() {
		return nil, errors.New("lastseen: no database: give one of --postgres, --mysql or --sqlite")
	}
	if !conn.hasRedis() {
		return nil, errors.New("lastseen: no redis: give --redis or --redis-cluster")
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
	mode := lastseen.Update
	if f.WriteMode == "upsert" {
		mode = lastseen.Upsert
	}
	p := lastseen.New(lastseen.Config{
		Redis:            rdb,
		Prefix:           f.Prefix,
		Shards:           f.Shards,
		LocalCacheSize:   -1,
		BatchSize:        f.BatchSize,
		WriteMode:        mode,
		Model:            f.userModel(),
		SessionModel:     f.sessionModel(),
		PurgeBatchSize:   f.PurgeBatchSize,
		DisableScheduler: true,
		Logger:           slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Now:              now,
	})
	if err := db.Use(p); err != nil {
		closeDB(db)
		rdb.Close()
		return nil, err
	}
	return &opsEnv{p: p, db: db, rdb: rdb, f: f}, nil
}

func (e *opsEnv) close() {
	closeDB(e.db)
	e.rdb.Close()
}

// checkTable returns a clear error when model's table or one of its
// columns is missing: the flags name them, so a typo should say which.
func (e *opsEnv) checkTable(model any, table string, columns map[string]string) error {
	m := e.db.Migrator()
	if !m.HasTable(model) {
		return fmt.Errorf("lastseen: table %q not found (set --%s)", table, tableFlag(table, e.f))
	}
	for field, flag := range columns {
		if !m.HasColumn(model, field) {
			return fmt.Errorf("lastseen: table %q has no column %q (set --%s)", table, e.f.namer().columns[field], flag)
		}
	}
	return nil
}

func tableFlag(table string, f *targetFlags) string {
	if table == f.UsersTable {
		return "users-table"
	}
	return "sessions-table"
}

func (e *opsEnv) checkUsers() error {
	return e.checkTable(e.f.userModel(), e.f.UsersTable,
		map[string]string{"UserID": "user-id-column", "LastSeenAt": "last-seen-column"})
}

func (e *opsEnv) checkSessions() error {
	return e.checkTable(e.f.sessionModel(), e.f.SessionsTable,
		map[string]string{"SessionID": "session-id-column", "ExpiresAt": "expires-column"})
}

// statusCmd prints the Redis buffer per shard and the expired sessions.
type statusCmd struct {
	connFlags   `embed:""`
	targetFlags `embed:""`

	out io.Writer        // default os.Stdout; tests set it
	now func() time.Time // default time.Now; tests set it
}

func (c *statusCmd) Run() error {
	ctx := context.Background()
	e, err := openOps(ctx, &c.connFlags, &c.targetFlags, c.now)
	if err != nil {
		return err
	}
	defer e.close()
	st, err := e.p.Status(ctx)
	if err != nil {
		return err
	}
	out := writerOr(c.out)
	fmt.Fprintf(out, "redis buffer (prefix %q, %d shards) at %s\n", e.p.Config().Prefix, c.Shards, st.At.Format(time.RFC3339))
	fmt.Fprintln(out, evictionLine(st))
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "shard\tpending\tin-flight\toldest")
	for _, s := range st.Shards {
		fmt.Fprintf(tw, "%d\t%d\t%d\t%s\n", s.Shard, s.Pending, s.InFlight, when(s.Oldest, st.At))
	}
	fmt.Fprintf(tw, "total\t%d\t%d\t%s\n", st.Pending, st.InFlight, when(st.Oldest, st.At))
	tw.Flush()
	if st.Unreadable > 0 {
		fmt.Fprintf(out, "unreadable entries: %d (the next flush drops them as rejected)\n", st.Unreadable)
	}
	if err := e.checkSessions(); err != nil {
		fmt.Fprintf(out, "expired sessions: not counted: %s\n", strings.TrimPrefix(err.Error(), "lastseen: "))
		return nil
	}
	n, oldest, err := e.p.ExpiredSessions(ctx)
	if err != nil {
		return err
	}
	if n == 0 {
		fmt.Fprintf(out, "expired sessions in %q: 0\n", c.SessionsTable)
		return nil
	}
	fmt.Fprintf(out, "expired sessions in %q: %d, oldest expiry %s\n", c.SessionsTable, n, when(oldest, st.At))
	return nil
}

// flushCmd runs one flush and prints its FlushResult.
type flushCmd struct {
	connFlags   `embed:""`
	targetFlags `embed:""`

	out io.Writer
	now func() time.Time
}

func (c *flushCmd) Run() error {
	ctx := context.Background()
	e, err := openOps(ctx, &c.connFlags, &c.targetFlags, c.now)
	if err != nil {
		return err
	}
	defer e.close()
	if err := e.checkUsers(); err != nil {
		return err
	}
	res, err := e.p.Flush(ctx)
	tw := tabwriter.NewWriter(writerOr(c.out), 0, 0, 2, ' ', 0)
	for _, row := range []struct {
		name string
		v    any
	}{
		{"drained", res.Drained}, {"written", res.Written}, {"unknown", res.Unknown}, {"stale", res.Stale},
		{"rejected", res.Rejected}, {"failed", res.Failed}, {"batches", res.Batches}, {"shards", res.Shards},
		{"skipped", res.Skipped}, {"duration", res.Duration.Round(time.Microsecond)},
	} {
		fmt.Fprintf(tw, "%s\t%v\n", row.name, row.v)
	}
	tw.Flush()
	return err
}

// purgeCmd deletes expired sessions now, or with --dry-run counts them.
type purgeCmd struct {
	connFlags   `embed:""`
	targetFlags `embed:""`
	DryRun      bool `help:"Only count the expired sessions and print the oldest expiry; delete nothing."`

	out io.Writer
	now func() time.Time
}

func (c *purgeCmd) Run() error {
	ctx := context.Background()
	e, err := openOps(ctx, &c.connFlags, &c.targetFlags, c.now)
	if err != nil {
		return err
	}
	defer e.close()
	if err := e.checkSessions(); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(writerOr(c.out), 0, 0, 2, ' ', 0)
	defer tw.Flush()
	if c.DryRun {
		cutoff := e.p.Config().Now().UTC()
		n, oldest, err := e.p.ExpiredSessions(ctx)
		if err != nil {
			return err
		}
		fmt.Fprintf(tw, "dry run\tnothing deleted\n")
		fmt.Fprintf(tw, "cutoff\t%s\n", cutoff.Format(time.RFC3339))
		fmt.Fprintf(tw, "expired\t%d\n", n)
		fmt.Fprintf(tw, "oldest\t%s\n", when(oldest, cutoff))
		return nil
	}
	res, err := e.p.PurgeExpiredSessions(ctx)
	if errors.Is(err, lastseen.ErrLocked) {
		return fmt.Errorf("%w: a purge is running elsewhere; nothing deleted", err)
	}
	fmt.Fprintf(tw, "deleted\t%d\n", res.Deleted)
	fmt.Fprintf(tw, "batches\t%d\n", res.Batches)
	fmt.Fprintf(tw, "cutoff\t%s\n", res.Cutoff.Format(time.RFC3339))
	fmt.Fprintf(tw, "stopped\t%v\n", res.Stopped)
	fmt.Fprintf(tw, "duration\t%v\n", res.Duration.Round(time.Microsecond))
	return err
}

// evictionLine is the status command's line about Redis's maxmemory-policy.
func evictionLine(st lastseen.Status) string {
	if st.EvictionRisk {
		return "redis maxmemory-policy: " + st.EvictionPolicy +
			" (can evict the buffer: accepted touches lost without an error; fix: CONFIG SET maxmemory-policy noeviction)"
	}
	return "redis maxmemory-policy: " + st.EvictionPolicy
}

func writerOr(w io.Writer) io.Writer {
	if w == nil {
		return os.Stdout
	}
	return w
}

// when formats a timestamp and its age against now, or "-" for none.
func when(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	age := now.Sub(t).Round(time.Second)
	if age < 0 {
		return fmt.Sprintf("%s (%v ahead of the clock)", t.UTC().Format(time.RFC3339), -age)
	}
	return fmt.Sprintf("%s (%v ago)", t.UTC().Format(time.RFC3339), age)
}
