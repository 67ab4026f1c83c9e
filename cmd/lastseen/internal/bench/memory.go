package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/lastseen/lastseen/cmd/lastseen/internal/runenv"
)

// MemoryFlags are the flags of `lastseen bench memory`, which needs neither
// PostgreSQL nor --redis: by default it starts a redis-server of its own.
type MemoryFlags struct {
	// MemoryUsers is how many distinct users (ids 1..n) each layout
	// touches once. Default 1,000,000.
	MemoryUsers int `name:"memory-users" default:"1000000" help:"memory: distinct users (ids 1..N) touched once in each layout."`
	// MemoryRedis, when set, is an existing Redis (host:port or redis://
	// URL) to measure instead of a private redis-server; other clients of
	// that server move used_memory and DBSIZE.
	MemoryRedis string `name:"memory-redis" placeholder:"ADDR" help:"memory: measure this existing Redis instead of a private redis-server (other clients then move the figures)."`
	// MemoryWorkers is how many goroutines touch users through the library
	// at the same time. Default 64.
	MemoryWorkers int `name:"memory-workers" default:"64" help:"memory: goroutines calling Plugin.TouchAt at the same time."`

	quiet time.Duration // tests: how long used_memory must stay put (settleQuiet when 0)
}

// validateMemory checks the flags `bench memory` reads.
func (c *Cmd) validateMemory() error {
	bad := func(format string, args ...any) error {
		return runenv.Usagef("lastseen: bench: "+format, args...)
	}
	switch {
	case c.MemoryUsers < 1:
		return bad("--memory-users is %d, want at least 1", c.MemoryUsers)
	case c.MemoryWorkers < 1:
		return bad("--memory-workers is %d, want at least 1", c.MemoryWorkers)
	case c.Throttle < time.Millisecond:
		return bad("--throttle is %v, want at least 1ms", c.Throttle)
	}
	return nil
}

// memoryReport is what `bench memory` prints and writes as JSON.
type memoryReport struct {
	Info    runInfo       `json:"info"`
	Memory  *memoryResult `json:"memory"`
	Targets []target      `json:"targets"`
}

// memoryResult is the Redis memory of N touched users in each layout.
type memoryResult struct {
	Users    int    `json:"users"`
	Throttle string `json:"throttle"`
	Workers  int    `json:"workers"`
	// Server is "private redis-server" or the --memory-redis address;
	// Warning is set for the latter.
	Server  string      `json:"server"`
	Warning string      `json:"warning,omitempty"`
	Rows    []memoryRow `json:"rows"`
}

// memoryRow is one layout's measurement. Memory figures are Redis INFO
// memory fields in bytes, read once the server settled (settle).
type memoryRow struct {
	Name   string `json:"name"`
	Addr   string `json:"addr"`   // the Redis measured
	Prefix string `json:"prefix"` // key prefix of the row, deleted at its end

	UsedBefore    int64   `json:"used_memory_before"`
	UsedAfter     int64   `json:"used_memory_after"`
	UsedDelta     int64   `json:"used_memory_delta"`
	ClientsDelta  int64   `json:"mem_clients_normal_delta"` // included in UsedDelta
	BytesPerUser  float64 `json:"bytes_per_user"`           // UsedDelta / users
	KeysDelta     int64   `json:"keys_delta"`               // DBSIZE after - before
	PrefixKeys    int64   `json:"prefix_keys"`              // SCAN of the row's prefix, less the keys there before the load
	Hashes        int64   `json:"hashes"`                   // SCAN ... TYPE hash
	EncodingCheck int     `json:"encoding_checked"`
	// Encodings counts OBJECT ENCODING over the first EncodingCheck hashes
	// SCAN returned (listpack, hashtable).
	Encodings map[string]int `json:"encodings"`
	Pending   int64          `json:"pending"`  // pending entries after the load
	Recorded  int64          `json:"recorded"` // touches that opened a window
	// Presence: the default configuration's row only. After the
	// figures above, a Flush drains the pending entries into the presence
	// HyperLogLogs; PresenceBytes is the sum of MEMORY USAGE of those keys
	// (PresenceKeys of them), added to UsedDelta in BytesPerUser, and
	// ActiveUsers is what Plugin.ActiveUsers counts for the day then.
	PresenceKeys  int64         `json:"presence_keys,omitempty"`
	PresenceBytes int64         `json:"presence_bytes,omitempty"`
	ActiveUsers   int64         `json:"active_users,omitempty"`
	FlushWall     time.Duration `json:"flush_wall_ns,omitempty"`
	Wall          time.Duration `json:"load_wall_ns"`
	Cleanup       time.Duration `json:"cleanup_ns"` // deleting the keys, then (--memory-redis) waiting for lazyfree
	Check         string        `json:"check"`
}

// The rows' names.
const (
	memFormat1 = "key per marker (format 1)"
	memLibrary = "lastseen (this build), presence off"
	memDefault = "lastseen (this build), default config (presence on)"
)

// runMemory runs `bench memory`: the baseline layout, the library with the
// presence counts off and the library in its default configuration
// (presence on), one after the other, each on a fresh private redis-server
// (or all on --memory-redis), and prints the report.
func (c *Cmd) runMemory(ctx context.Context) error {
	rep := &memoryReport{Info: runInfo{Date: time.Now().UTC().Format(time.RFC3339), GoVersion: runtime.Version(),
		CPUs: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0), LoadStart: loadAvg()}}
	res := &memoryResult{Users: c.MemoryUsers, Throttle: c.Throttle.String(), Workers: c.MemoryWorkers, Server: "private redis-server"}
	if c.MemoryRedis != "" {
		res.Server = c.MemoryRedis
		res.Warning = "measured on an existing Redis: every other client's writes in the meantime move used_memory and DBSIZE"
		c.progress("memory: WARNING: %s", res.Warning)
	}
	rep.Memory = res
	for _, name := range []string{memFormat1, memLibrary, memDefault} {
		row, version, err := c.memoryRow(ctx, name)
		if err != nil {
			return err
		}
		rep.Info.Redis = version
		res.Rows = append(res.Rows, row)
	}
	rep.Info.LoadEnd = loadAvg()
	rep.Targets = res.targets()
	rep.writeMarkdown(c.stdout())
	if c.JSON != "" {
		if err := writeJSONFile(c.JSON, rep); err != nil {
			return err
		}
	}
	var failed []string
	for _, r := range res.Rows {
		if r.Check != "ok" {
			failed = append(failed, r.Name+": "+r.Check)
		}
	}
	if len(failed) > 0 {
		return errors.New("lastseen: bench: checks failed: " + strings.Join(failed, "; "))
	}
	return nil
}

// memoryRow measures one layout: it starts the private server (or connects
// to --memory-redis), loads the users, reads the figures, deletes the
// row's keys (on --memory-redis then waits for lazyfree, so that the next
// row starts settled) and stops the private server, also after an error or
// Ctrl-C. It returns the row and the server's version.
func (c *Cmd) memoryRow(ctx context.Context, name string) (row memoryRow, version string, err error) {
	addr := c.MemoryRedis
	if addr == "" {
		srv, err := startRedisServer(ctx)
		if err != nil {
			return row, "", err
		}
		defer func() {
			if serr := srv.stop(); serr != nil && err == nil {
				err = serr
			}
		}()
		addr = srv.addr
		c.progress("memory: %s: private redis-server pid %d on %s", name, srv.pid(), addr)
	}
	m, err := openMemRedis(addr, c.quiet, c.progress)
	if err != nil {
		return row, "", err
	}
	defer m.close()
	if version, err = m.version(ctx); err != nil {
		return row, "", err
	}
	row = memoryRow{Name: name, Addr: addr, Prefix: runenv.RandomName("lastseen-bench-")}
	defer func() {
		// The keys go whatever happened.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
		defer cancel()
		t0 := time.Now()
		if cerr := m.cleanup(cctx, row.Prefix, c.MemoryRedis == ""); cerr != nil && err == nil {
			err = cerr
		}
		row.Cleanup = time.Since(t0)
		if err == nil {
			c.progress("memory: %s: deleted %s:* in %s", name, row.Prefix, fmtDur(row.Cleanup))
		}
	}()
	switch name {
	case memFormat1:
		err = c.loadFormat1(ctx, m, &row)
	default:
		err = c.loadLibrary(ctx, m, &row, name == memDefault)
	}
	if err != nil {
		return row, version, err
	}
	c.progress("memory: %s: %s per user (used_memory %+d B, of which connections %+d B; presence %d B in %d keys), %s keys, check %s",
		name, fmtPerUser(row.BytesPerUser), row.UsedDelta, row.ClientsDelta, row.PresenceBytes, row.PresenceKeys, fmtInt(row.KeysDelta), row.Check)
	return row, version, nil
}

// measure wraps one load: the figures before (once the server settled,
// with the load's connections open and idle), the load, the figures after
// (once it settled again), and what the keys under the row's prefix are.
func (c *Cmd) measure(ctx context.Context, m *memRedis, row *memoryRow, load func() error) error {
	before, err := m.settle(ctx)
	if err != nil {
		return err
	}
	prior, err := m.keysUnder(ctx, row.Prefix)
	if err != nil {
		return err
	}
	t0 := time.Now()
	if err := load(); err != nil {
		return err
	}
	row.Wall = time.Since(t0)
	after, err := m.settle(ctx)
	if err != nil {
		return err
	}
	n := float64(c.MemoryUsers)
	row.UsedBefore, row.UsedAfter = before.used, after.used
	row.UsedDelta = after.used - before.used
	row.ClientsDelta = after.clients - before.clients
	row.BytesPerUser = float64(row.UsedDelta) / n
	row.KeysDelta = after.keys - before.keys
	return m.describe(ctx, row, prior)
}

// targets judges the memory target on this run.
func (r *memoryResult) targets() []target {
	var t []target
	for _, row := range r.Rows {
		switch row.Name {
		case memDefault:
			t = append(t, target{"lastseen, default config (presence on): <= 32 B of Redis per active user ((used_memory delta + presence HyperLogLogs) / users)",
				fmtPerUser(row.BytesPerUser), row.BytesPerUser <= 32})
		case memLibrary:
			t = append(t, target{"lastseen, presence off: <= 32 B of Redis per active user (used_memory delta / users)",
				fmtPerUser(row.BytesPerUser), row.BytesPerUser <= 32})
		}
	}
	return t
}

func fmtPerUser(b float64) string { return fmt.Sprintf("%.1f B", b) }

func (r *memoryReport) writeMarkdown(w io.Writer) {
	in, m := r.Info, r.Memory
	fmt.Fprintf(w, "# lastseen bench memory\n\n")
	fmt.Fprintf(w, "%s; %s, %d CPUs (GOMAXPROCS %d), load average %s at the start and %s at the end; Redis %s.\n",
		in.Date, in.GoVersion, in.CPUs, in.GOMAXPROCS, in.LoadStart, in.LoadEnd, in.Redis)
	server := "a fresh private redis-server per layout (--save \"\" --appendonly no)"
	if m.Warning != "" {
		server = "the existing Redis " + m.Server + " (**" + m.Warning + "**)"
	}
	fmt.Fprintf(w, "\n## Redis memory: %s distinct users touched once each, throttle window %s, on %s\n\n",
		fmtInt(int64(m.Users)), m.Throttle, server)
	fmt.Fprint(w, "| |")
	for _, row := range m.Rows {
		fmt.Fprintf(w, " %s |", row.Name)
	}
	fmt.Fprint(w, "\n|---|")
	for range m.Rows {
		fmt.Fprint(w, "--:|")
	}
	fmt.Fprintln(w)
	line := func(label string, f func(r memoryRow) string) {
		fmt.Fprintf(w, "| %s |", label)
		for _, row := range m.Rows {
			fmt.Fprintf(w, " %s |", f(row))
		}
		fmt.Fprintln(w)
	}
	line("**bytes per user** ((used_memory delta + presence) / users)", func(r memoryRow) string { return "**" + fmtPerUser(r.BytesPerUser) + "**" })
	line("used_memory delta", func(r memoryRow) string { return fmtBytes(r.UsedDelta) })
	line("presence HyperLogLogs after a flush (MEMORY USAGE) / keys", func(r memoryRow) string {
		if r.Name != memDefault {
			return "-"
		}
		return fmtBytes(r.PresenceBytes) + " / " + fmtInt(r.PresenceKeys)
	})
	line("ActiveUsers of the day after the flush", func(r memoryRow) string {
		if r.Name != memDefault {
			return "-"
		}
		return fmtInt(r.ActiveUsers)
	})
	line("  of it connections (mem_clients_normal delta)", func(r memoryRow) string { return fmtBytes(r.ClientsDelta) })
	line("keys (DBSIZE delta)", func(r memoryRow) string { return fmtInt(r.KeysDelta) })
	line("keys under the prefix / of them hashes", func(r memoryRow) string { return fmtInt(r.PrefixKeys) + " / " + fmtInt(r.Hashes) })
	line("hash encodings (OBJECT ENCODING)", func(r memoryRow) string { return r.encodings() })
	line("pending entries", func(r memoryRow) string { return fmtInt(r.Pending) })
	line("touches recorded", func(r memoryRow) string { return fmtInt(r.Recorded) })
	line("load wall time", func(r memoryRow) string { return fmtDur(r.Wall) })
	line("flush wall time (presence written)", func(r memoryRow) string {
		if r.Name != memDefault {
			return "-"
		}
		return fmtDur(r.FlushWall)
	})
	line("check", func(r memoryRow) string { return r.Check })
	fmt.Fprintf(w, "\nThe baseline writes today's layout with plain pipelined commands: per user `SET <prefix>:{N}:seen:<id> 1 NX PX <throttle>` "+
		"and `HSET <prefix>:{N}:pending <id> <Unix µs>`, N = FNV-1a 32 of the decimal id mod 16. The library rows touch the same users through "+
		"Plugin.TouchAt (%d goroutines) with the local cache off: the first with the presence counters off (OnlineWindow and ActiveUsersRetention negative), "+
		"the second in the default configuration (presence on); after its figures a Flush (into an in-memory SQLite users table) drains the entries into "+
		"the presence HyperLogLogs, whose MEMORY USAGE is added (all touches share one minute and one day: one online and one active set for all the shards; "+
		"each further minute kept costs at most 12 KB, a fixed cost, not one per user). Key prefixes are %d bytes (the default lastseen:users:<8 hex> is 23).\n",
		m.Workers, len(firstPrefix(m.Rows)))
	if len(r.Targets) > 0 {
		fmt.Fprintf(w, "\n## Memory target (judged on this run; reported, never asserted)\n\n| target | this run | met |\n|---|---|---|\n")
		for _, t := range r.Targets {
			met := "no"
			if t.Met {
				met = "yes"
			}
			fmt.Fprintf(w, "| %s | %s | %s |\n", t.Target, t.Value, met)
		}
	}
}

func firstPrefix(rows []memoryRow) string {
	if len(rows) == 0 {
		return ""
	}
	return rows[0].Prefix
}

// encodings writes "16 of 16: hashtable 16".
func (r memoryRow) encodings() string {
	if r.EncodingCheck == 0 {
		return "-"
	}
	var parts []string
	for _, enc := range []string{"listpack", "ziplist", "hashtable"} {
		if n := r.Encodings[enc]; n > 0 {
			parts = append(parts, fmt.Sprintf("%s %s", enc, fmtInt(int64(n))))
		}
	}
	for _, enc := range slices.Sorted(maps.Keys(r.Encodings)) {
		if enc != "listpack" && enc != "ziplist" && enc != "hashtable" {
			parts = append(parts, fmt.Sprintf("%s %s", enc, fmtInt(int64(r.Encodings[enc]))))
		}
	}
	return fmt.Sprintf("%s checked: %s", fmtInt(int64(r.EncodingCheck)), strings.Join(parts, ", "))
}

// writeJSONFile writes v as indented JSON to path (--json).
func writeJSONFile(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("lastseen: bench: json: %w", err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("lastseen: bench: --json: %w", err)
	}
	return nil
}
