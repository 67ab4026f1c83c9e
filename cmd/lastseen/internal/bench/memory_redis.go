package bench

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/lastseen/lastseen/cmd/lastseen/internal/runenv"
	"github.com/redis/go-redis/v9"
)

// redisServer is a private redis-server started by `bench memory`, so that
// no other client moves its used_memory: no persistence, loopback only, its
// working directory a temporary one, stopped by its pid.
type redisServer struct {
	cmd  *exec.Cmd
	addr string
	dir  string
	out  *lockedBuffer
	done chan struct{} // closed when the process has exited
}

// startRedisServer starts redis-server (found on PATH) on a free loopback
// port and waits until it answers PING. A port taken between choosing and
// binding it is retried twice with another.
func startRedisServer(ctx context.Context) (*redisServer, error) {
	path, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("lastseen: bench: memory: redis-server is not on PATH (install it, or measure an existing Redis with --memory-redis ADDR): %w", err)
	}
	var last error
	for range 3 {
		s, retry, err := tryRedisServer(ctx, path)
		if err == nil {
			return s, nil
		}
		last = err
		if !retry {
			break
		}
	}
	return nil, last
}

func tryRedisServer(ctx context.Context, path string) (s *redisServer, retry bool, err error) {
	port, err := freePort()
	if err != nil {
		return nil, false, err
	}
	dir, err := os.MkdirTemp("", "lastseen-bench-redis-")
	if err != nil {
		return nil, false, fmt.Errorf("lastseen: bench: memory: %w", err)
	}
	s = &redisServer{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), dir: dir, out: &lockedBuffer{}, done: make(chan struct{})}
	s.cmd = exec.Command(path, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", dir, "--daemonize", "no", "--logfile", "")
	s.cmd.Stdout, s.cmd.Stderr = s.out, s.out
	ownProcessGroup(s.cmd) // a Ctrl-C in the terminal reaches us, and we stop it after the cleanup
	if err := s.cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, false, fmt.Errorf("lastseen: bench: memory: start redis-server: %w", err)
	}
	go func() {
		_ = s.cmd.Wait()
		close(s.done)
	}()
	rdb := redis.NewClient(&redis.Options{Addr: s.addr, MaxRetries: -1, DialTimeout: time.Second})
	defer rdb.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		perr := rdb.Ping(pctx).Err()
		cancel()
		if perr == nil {
			return s, false, nil
		}
		select {
		case <-s.done: // exited: most likely the port was taken meanwhile
			s.stop()
			return nil, true, fmt.Errorf("lastseen: bench: memory: redis-server on %s exited at start: %s", s.addr, s.out.tail(2000))
		case <-ctx.Done():
			s.stop()
			return nil, false, fmt.Errorf("lastseen: bench: memory: waiting for redis-server: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.stop()
			return nil, false, fmt.Errorf("lastseen: bench: memory: redis-server on %s did not answer PING within 10s (%v): %s", s.addr, perr, s.out.tail(2000))
		}
	}
}

func (s *redisServer) pid() int { return s.cmd.Process.Pid }

// stop ends the server by its pid (SIGTERM, then SIGKILL after 10s) and
// removes its directory.
func (s *redisServer) stop() error {
	defer os.RemoveAll(s.dir)
	select {
	case <-s.done:
		return nil
	default:
	}
	if err := terminate(s.cmd.Process); err != nil && !errors.Is(err, os.ErrProcessDone) {
		s.cmd.Process.Kill()
	}
	select {
	case <-s.done:
		return nil
	case <-time.After(10 * time.Second):
	}
	if err := s.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("lastseen: bench: memory: stop redis-server pid %d: %w", s.pid(), err)
	}
	<-s.done
	return nil
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("lastseen: bench: memory: find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// lockedBuffer collects redis-server's output for error messages.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// tail returns the last n bytes written, trimmed.
func (l *lockedBuffer) tail(n int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.b.Bytes()
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return strings.TrimSpace(string(b))
}

// memRedis is the control connection of one measurement: INFO, DBSIZE,
// SCAN and the cleanup go through it, never the load's connections.
type memRedis struct {
	addr  string
	rdb   *redis.Client
	log   func(format string, args ...any)
	quiet time.Duration // settleQuiet, shorter in tests
}

func openMemRedis(addr string, quiet time.Duration, log func(format string, args ...any)) (*memRedis, error) {
	opt, err := runenv.RedisOptions(addr)
	if err != nil {
		return nil, fmt.Errorf("lastseen: bench: %w", errors.Unwrap(err))
	}
	opt.PoolSize = 1 // one connection: the control client's own memory stays put
	return &memRedis{addr: addr, rdb: redis.NewClient(opt), log: log, quiet: cmp.Or(quiet, settleQuiet)}, nil
}

func (m *memRedis) close() { m.rdb.Close() }

// info returns the fields of an INFO section.
func (m *memRedis) info(ctx context.Context, section string) (map[string]string, error) {
	s, err := m.rdb.Info(ctx, section).Result()
	if err != nil {
		return nil, fmt.Errorf("lastseen: bench: memory: redis %s INFO %s: %w", m.addr, section, err)
	}
	return parseInfo(s), nil
}

// parseInfo reads "field:value" lines of an INFO reply.
func parseInfo(s string) map[string]string {
	f := map[string]string{}
	for _, l := range strings.Split(s, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(l), ":"); ok && !strings.HasPrefix(k, "#") {
			f[k] = v
		}
	}
	return f
}

func (m *memRedis) version(ctx context.Context) (string, error) {
	f, err := m.info(ctx, "server")
	if err != nil {
		return "", err
	}
	return f["redis_version"], nil
}

// memSnapshot is what one reading of the server gives.
type memSnapshot struct {
	used     int64 // INFO memory used_memory
	clients  int64 // INFO memory mem_clients_normal
	lazyfree int64 // INFO memory lazyfree_pending_objects
	keys     int64 // DBSIZE
}

func (m *memRedis) snapshot(ctx context.Context) (memSnapshot, error) {
	f, err := m.info(ctx, "memory")
	if err != nil {
		return memSnapshot{}, err
	}
	var s memSnapshot
	for _, v := range []struct {
		field string
		to    *int64
	}{{"used_memory", &s.used}, {"mem_clients_normal", &s.clients}, {"lazyfree_pending_objects", &s.lazyfree}} {
		n, err := strconv.ParseInt(f[v.field], 10, 64)
		if err != nil {
			return memSnapshot{}, fmt.Errorf("lastseen: bench: memory: redis %s INFO memory %s = %q: %w", m.addr, v.field, f[v.field], err)
		}
		*v.to = n
	}
	if s.keys, err = m.rdb.DBSize(ctx).Result(); err != nil {
		return memSnapshot{}, fmt.Errorf("lastseen: bench: memory: redis %s DBSIZE: %w", m.addr, err)
	}
	return s, nil
}

// maxEncodingSample bounds the hashes whose OBJECT ENCODING is read.
const maxEncodingSample = 10_000

// Settling: readings every settleEvery; the server has settled when
// lazyfree has freed every object (UNLINK frees big values in a background
// thread) and used_memory moved by at most settleSlack over settleQuiet.
// settleQuiet is longer than the 2 s after which Redis 7.0's clientsCron
// shrinks an idle connection's query buffer, and than the serverCron that
// shrinks the main dictionary after a mass delete.
const (
	settleEvery   = 250 * time.Millisecond
	settleQuiet   = 3 * time.Second
	settleSlack   = 4 << 10
	settleTimeout = 60 * time.Second
)

// settle waits until the server has settled and returns the last reading.
// After settleTimeout it returns that reading with a warning: the figures
// then hold whatever was still moving.
func (m *memRedis) settle(ctx context.Context) (memSnapshot, error) {
	start := time.Now()
	var window []memSnapshot
	for {
		s, err := m.snapshot(ctx)
		if err != nil {
			return s, err
		}
		if s.lazyfree > 0 {
			window = window[:0]
		} else {
			window = append(window, s)
			lo, hi := window[0].used, window[0].used
			for _, w := range window {
				lo, hi = min(lo, w.used), max(hi, w.used)
			}
			if hi-lo > settleSlack {
				window = append(window[:0], s)
			} else if time.Duration(len(window)-1)*settleEvery >= m.quiet {
				return s, nil
			}
		}
		if time.Since(start) > settleTimeout {
			m.log("memory: WARNING: redis %s did not settle within %v (lazyfree_pending_objects %d, used_memory %d)", m.addr, settleTimeout, s.lazyfree, s.used)
			return s, nil
		}
		select {
		case <-ctx.Done():
			return s, fmt.Errorf("lastseen: bench: memory: waiting for redis to settle: %w", ctx.Err())
		case <-time.After(settleEvery):
		}
	}
}

// warm opens n connections of rdb's pool now and leaves them idle in it,
// so that the load's connections exist before the "before" reading and
// their memory is not counted as the users'.
func warm(ctx context.Context, rdb *redis.Client, n int) error {
	conns := make([]*redis.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range n {
		c := rdb.Conn()
		conns = append(conns, c)
		if err := c.Ping(ctx).Err(); err != nil {
			return fmt.Errorf("lastseen: bench: memory: open connection: %w", err)
		}
	}
	return nil
}

// cleanup deletes every key under prefix, checks none is left, and, unless
// the server is thrown away next (private), waits for it to settle.
func (m *memRedis) cleanup(ctx context.Context, prefix string, private bool) error {
	pattern := prefix + ":*"
	if err := runenv.DeleteKeys(ctx, m.rdb, pattern); err != nil {
		return fmt.Errorf("lastseen: bench: memory: delete redis keys %s: %w", pattern, err)
	}
	left, err := runenv.CountKeys(ctx, m.rdb, pattern)
	if err != nil {
		return fmt.Errorf("lastseen: bench: memory: count redis keys %s: %w", pattern, err)
	}
	if left > 0 {
		return fmt.Errorf("lastseen: bench: memory: %d keys %s left after the cleanup", left, pattern)
	}
	if private {
		return nil
	}
	_, err = m.settle(ctx)
	return err
}

// keysUnder returns the keys under prefix (before a load: the library's
// manifest, written at db.Use).
func (m *memRedis) keysUnder(ctx context.Context, prefix string) (map[string]bool, error) {
	found := map[string]bool{}
	iter := m.rdb.Scan(ctx, 0, prefix+":*", 1000).Iterator()
	for iter.Next(ctx) {
		found[iter.Val()] = true
	}
	if err := iter.Err(); err != nil {
		return nil, fmt.Errorf("lastseen: bench: memory: SCAN %s:*: %w", prefix, err)
	}
	return found, nil
}

// describe counts the keys and the hashes under the row's prefix that were
// not there before the load (prior), and reads OBJECT ENCODING of up to
// maxEncodingSample of those hashes. SCAN may return a key twice; hashes
// are deduplicated, the key count is not (it is exact when nothing writes
// meanwhile, which is the case here: Redis only returns a key twice when
// the keyspace is resized during the scan).
func (m *memRedis) describe(ctx context.Context, row *memoryRow, prior map[string]bool) error {
	pattern := row.Prefix + ":*"
	iter := m.rdb.Scan(ctx, 0, pattern, 1000).Iterator()
	for iter.Next(ctx) {
		if !prior[iter.Val()] {
			row.PrefixKeys++
		}
	}
	if err := iter.Err(); err != nil {
		return fmt.Errorf("lastseen: bench: memory: SCAN %s: %w", pattern, err)
	}
	var sample []string
	seen := map[string]bool{}
	iter = m.rdb.ScanType(ctx, 0, pattern, 1000, "hash").Iterator()
	for iter.Next(ctx) {
		k := iter.Val()
		if seen[k] || prior[k] {
			continue
		}
		seen[k] = true
		row.Hashes++
		if len(sample) < maxEncodingSample {
			sample = append(sample, k)
		}
	}
	if err := iter.Err(); err != nil {
		return fmt.Errorf("lastseen: bench: memory: SCAN %s TYPE hash: %w", pattern, err)
	}
	row.Encodings = map[string]int{}
	pipe := m.rdb.Pipeline()
	cmds := make([]*redis.StringCmd, len(sample))
	for i, k := range sample {
		cmds[i] = pipe.ObjectEncoding(ctx, k)
	}
	if len(sample) > 0 {
		if _, err := pipe.Exec(ctx); err != nil {
			return fmt.Errorf("lastseen: bench: memory: OBJECT ENCODING: %w", err)
		}
	}
	for _, c := range cmds {
		row.Encodings[c.Val()]++
	}
	row.EncodingCheck = len(sample)
	return nil
}
