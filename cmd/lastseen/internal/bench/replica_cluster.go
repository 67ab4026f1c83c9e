package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// pgPair is the private streaming replica `bench replica` starts: a
// primary initialised with initdb in a temporary directory and a standby
// cloned from it with pg_basebackup -R, each started with pg_ctl on a
// loopback port of its own, stopped by its postmaster's pid.
type pgPair struct {
	bin              string  // directory of initdb, pg_ctl, pg_basebackup
	root             string  // temporary directory holding both data directories and their logs
	runAs            *osUser // nil: the commands run as the benchmark's own user
	log              func(format string, args ...any)
	started          []*pgNode // stopped in reverse order
	primary, standby *pgNode
}

// pgNode is one started cluster.
type pgNode struct {
	name string // primary, standby
	dir  string // data directory
	port int
	pid  int // postmaster pid, from postmaster.pid
}

// dsn is a key=value DSN for the node's postgres database as the
// bootstrap superuser "postgres" (trust authentication on loopback).
func (n *pgNode) dsn() string {
	return fmt.Sprintf("host=127.0.0.1 port=%d user=postgres dbname=postgres sslmode=disable", n.port)
}

// osUser is the non-root account the server commands run as when the
// benchmark runs as root (initdb and postgres refuse root).
type osUser struct {
	name     string
	uid, gid uint32
}

// pgBinDir finds the PostgreSQL server programs: `pg_config --bindir`,
// else the newest /usr/lib/postgresql/N/bin, else the directory of initdb
// on PATH.
func pgBinDir() (string, error) {
	has := func(dir string) bool {
		_, err := os.Stat(filepath.Join(dir, "pg_basebackup"))
		_, err2 := os.Stat(filepath.Join(dir, "initdb"))
		return err == nil && err2 == nil
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		if dir := strings.TrimSpace(string(out)); has(dir) {
			return dir, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int { // newest major version first
		va, _ := strconv.Atoi(filepath.Base(filepath.Dir(a)))
		vb, _ := strconv.Atoi(filepath.Base(filepath.Dir(b)))
		return vb - va
	})
	for _, d := range dirs {
		if has(d) {
			return d, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil && has(filepath.Dir(real)) {
			return filepath.Dir(real), nil
		}
	}
	return "", errors.New("lastseen: bench: replica: PostgreSQL's server programs (initdb, pg_ctl, pg_basebackup) not found: " +
		"neither `pg_config --bindir` nor /usr/lib/postgresql/*/bin has them; install the server, or point --replica-primary at a primary with a streaming standby")
}

// lookupRunAs returns nil when the benchmark does not run as root, else
// the account name (which must not be root itself).
func lookupRunAs(name string) (*osUser, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup(name)
	if err != nil {
		return nil, fmt.Errorf("lastseen: bench: replica: running as root, the servers must run as another user: --replica-os-user %q: %w", name, err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil || uid == 0 {
		return nil, fmt.Errorf("lastseen: bench: replica: --replica-os-user %q has uid %s gid %s: want a non-root numeric account", name, u.Uid, u.Gid)
	}
	return &osUser{name: name, uid: uint32(uid), gid: uint32(gid)}, nil
}

// startPgPair starts the primary and the standby and waits until the
// standby streams. On error it stops whatever it started.
func startPgPair(ctx context.Context, osUserName string, log func(format string, args ...any)) (p *pgPair, err error) {
	p = &pgPair{log: log}
	if p.bin, err = pgBinDir(); err != nil {
		return nil, err
	}
	if p.runAs, err = lookupRunAs(osUserName); err != nil {
		return nil, err
	}
	if p.root, err = os.MkdirTemp("", "lastseen-bench-pg-"); err != nil {
		return nil, fmt.Errorf("lastseen: bench: replica: %w", err)
	}
	defer func() {
		if err != nil {
			p.stop()
		}
	}()
	if p.runAs != nil {
		if err := os.Chown(p.root, int(p.runAs.uid), int(p.runAs.gid)); err != nil {
			return p, fmt.Errorf("lastseen: bench: replica: chown %s: %w", p.root, err)
		}
	}
	ports := make([]int, 2)
	for i := range ports {
		if ports[i], err = freePort(); err != nil {
			return p, err
		}
	}
	p.primary = &pgNode{name: "primary", dir: filepath.Join(p.root, "primary"), port: ports[0]}
	p.standby = &pgNode{name: "standby", dir: filepath.Join(p.root, "standby"), port: ports[1]}

	if err := p.run(ctx, "initdb", "-D", p.primary.dir, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync"); err != nil {
		return p, err
	}
	// Autovacuum off: it would vacuum one variant's table during the next
	// variant's run, and the WAL is measured server-wide.
	if err := p.appendConf(p.primary, "wal_level = replica\nmax_wal_senders = 4\nautovacuum = off\n"); err != nil {
		return p, err
	}
	if err := p.start(ctx, p.primary); err != nil {
		return p, err
	}
	if err := p.run(ctx, "pg_basebackup", "-h", "127.0.0.1", "-p", strconv.Itoa(p.primary.port), "-U", "postgres",
		"-D", p.standby.dir, "-R", "-X", "stream", "-c", "fast", "--no-sync"); err != nil {
		return p, err
	}
	// The copy carries the primary's port: the later line wins. A reply
	// every second (default 10s) lets replay_lag read NULL soon after the
	// standby caught up, so that each variant starts from a clean reading.
	if err := p.appendConf(p.standby, "wal_receiver_status_interval = 1s\n"); err != nil {
		return p, err
	}
	if err := p.start(ctx, p.standby); err != nil {
		return p, err
	}
	if err := p.waitStreaming(ctx); err != nil {
		return p, err
	}
	return p, nil
}

// run runs one of the server programs (as runAs), in root, and returns
// its output in the error when it fails.
func (p *pgPair) run(ctx context.Context, prog string, args ...string) error {
	cmd := exec.CommandContext(ctx, filepath.Join(p.bin, prog), args...)
	cmd.Dir = p.root
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.Env = append(os.Environ(), "LC_ALL=C", "PGCONNECT_TIMEOUT=10")
	runAsUser(cmd, p.runAs) // also a process group of its own
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("lastseen: bench: replica: %s: %w: %s", prog, err, tail(out.String(), 2000))
	}
	return nil
}

// appendConf appends the node's port, loopback-only listening, its socket
// directory and extra to its postgresql.conf.
func (p *pgPair) appendConf(n *pgNode, extra string) error {
	f, err := os.OpenFile(filepath.Join(n.dir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("lastseen: bench: replica: %s configuration: %w", n.name, err)
	}
	defer f.Close()
	_, err = fmt.Fprintf(f, "\n# lastseen bench replica\nport = %d\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '%s'\n%s",
		n.port, p.root, extra)
	if err != nil {
		return fmt.Errorf("lastseen: bench: replica: %s configuration: %w", n.name, err)
	}
	return nil
}

// start runs pg_ctl start -w and reads the postmaster's pid.
func (p *pgPair) start(ctx context.Context, n *pgNode) error {
	logFile := filepath.Join(p.root, n.name+".log")
	err := p.run(ctx, "pg_ctl", "-D", n.dir, "-l", logFile, "-w", "-t", "120", "start")
	// Whatever pg_ctl said, a postmaster may be running: stop it at the end.
	if pid, perr := readPostmasterPid(n.dir); perr == nil {
		n.pid = pid
		p.started = append(p.started, n)
	}
	if err != nil {
		b, _ := os.ReadFile(logFile)
		return fmt.Errorf("%w; %s log: %s", err, n.name, tail(string(b), 2000))
	}
	if n.pid == 0 {
		return fmt.Errorf("lastseen: bench: replica: %s started but %s/postmaster.pid is unreadable", n.name, n.dir)
	}
	p.log("replica: %s pid %d on 127.0.0.1:%d (%s)", n.name, n.pid, n.port, n.dir)
	return nil
}

// readPostmasterPid reads the first line of dir/postmaster.pid.
func readPostmasterPid(dir string) (int, error) {
	b, err := os.ReadFile(filepath.Join(dir, "postmaster.pid"))
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("postmaster.pid starts with %q", line)
	}
	return pid, nil
}

// waitStreaming waits (at most a minute) until the primary lists the
// standby in pg_stat_replication as streaming.
func (p *pgPair) waitStreaming(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, p.primary.dsn())
	if err != nil {
		return fmt.Errorf("lastseen: bench: replica: connect to the primary: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	deadline := time.Now().Add(time.Minute)
	for {
		var n int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'").Scan(&n); err != nil {
			return fmt.Errorf("lastseen: bench: replica: pg_stat_replication: %w", err)
		}
		if n == 1 {
			return nil
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(filepath.Join(p.root, "standby.log"))
			return fmt.Errorf("lastseen: bench: replica: the standby is not streaming after a minute; standby log: %s", tail(string(b), 2000))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// stop stops every started postmaster by its pid (SIGINT, PostgreSQL's
// fast shutdown; SIGKILL after a minute), standby first, then removes the
// temporary directory. It returns the first error.
func (p *pgPair) stop() error {
	var errs []error
	for _, n := range slices.Backward(p.started) {
		if err := stopPostmaster(n); err != nil {
			errs = append(errs, err)
		} else {
			p.log("replica: stopped %s pid %d", n.name, n.pid)
		}
	}
	p.started = nil
	if p.root != "" {
		if err := os.RemoveAll(p.root); err != nil {
			errs = append(errs, fmt.Errorf("lastseen: bench: replica: remove %s: %w", p.root, err))
		}
	}
	return errors.Join(errs...)
}

// stopPostmaster sends SIGINT to n's postmaster and waits until it is gone
// (its pid file removed, or the process no longer running); SIGKILL after
// a minute.
func stopPostmaster(n *pgNode) error {
	proc, err := os.FindProcess(n.pid)
	if err != nil {
		return nil
	}
	if err := fastShutdown(proc); err != nil {
		if errors.Is(err, os.ErrProcessDone) {
			return nil
		}
		return fmt.Errorf("lastseen: bench: replica: stop %s pid %d: %w", n.name, n.pid, err)
	}
	gone := func() bool {
		if _, err := os.Stat(filepath.Join(n.dir, "postmaster.pid")); errors.Is(err, os.ErrNotExist) {
			return true
		}
		return !processRunning(n.pid)
	}
	deadline := time.Now().Add(time.Minute)
	for !gone() {
		if time.Now().After(deadline) {
			_ = proc.Kill()
			time.Sleep(time.Second)
			if !processRunning(n.pid) {
				return nil
			}
			return fmt.Errorf("lastseen: bench: replica: %s pid %d still running after SIGINT and SIGKILL", n.name, n.pid)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

// tail returns the last n bytes of s, trimmed.
func tail(s string, n int) string {
	if len(s) > n {
		s = s[len(s)-n:]
	}
	return strings.TrimSpace(s)
}
