package faultproxy

import (
	"errors"
	"io"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// echoServer echoes every byte back and counts what it received.
type echoServer struct {
	ln       net.Listener
	received atomic.Int64
}

func startEcho(t *testing.T) *echoServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &echoServer{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 1024)
				for {
					n, err := c.Read(buf)
					if n > 0 {
						e.received.Add(int64(n))
						if _, err := c.Write(buf[:n]); err != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return e
}

func startProxy(t *testing.T, target string) *Proxy {
	t.Helper()
	p, err := Start(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// roundTrip writes msg and reads the same number of bytes back.
func roundTrip(t *testing.T, c net.Conn, msg string) string {
	t.Helper()
	if _, err := c.Write([]byte(msg)); err != nil {
		t.Fatalf("write: %v", err)
	}
	buf := make([]byte, len(msg))
	must(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Fatalf("read: %v", err)
	}
	return string(buf)
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// waitFor polls cond until it holds, failing after 10s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestForward(t *testing.T) {
	e := startEcho(t)
	p := startProxy(t, e.ln.Addr().String())
	c := dial(t, p.Addr())
	if got := roundTrip(t, c, "hello"); got != "hello" {
		t.Fatalf("echo = %q, want hello", got)
	}
	s := p.Stats()
	if s.Accepted != 1 || s.Active != 1 || s.BytesUp != 5 || s.BytesDown != 5 || s.BytesDropped != 0 {
		t.Fatalf("stats = %+v, want 1 accepted, 1 active, 5 bytes each way", s)
	}
	if p.Target() != e.ln.Addr().String() {
		t.Fatalf("target = %s", p.Target())
	}
}

// TestDelay: with a delay d each way, a round trip takes at least 2d (a
// lower bound, which no scheduling noise can break), and clearing it
// restores forwarding.
func TestDelay(t *testing.T) {
	e := startEcho(t)
	p := startProxy(t, e.ln.Addr().String())
	c := dial(t, p.Addr())
	const d = 100 * time.Millisecond
	p.SetDelay(d)
	start := time.Now()
	if got := roundTrip(t, c, "slow"); got != "slow" {
		t.Fatalf("echo = %q", got)
	}
	if took := time.Since(start); took < 2*d {
		t.Fatalf("round trip took %v, want at least %v", took, 2*d)
	}
	p.SetDelay(0)
	if got := roundTrip(t, c, "fast"); got != "fast" {
		t.Fatalf("echo = %q", got)
	}
}

// TestDrop: bytes sent into the black hole never reach the target, the
// connection stays open, and forwarding resumes when the drop ends.
func TestDrop(t *testing.T) {
	e := startEcho(t)
	p := startProxy(t, e.ln.Addr().String())
	c := dial(t, p.Addr())
	roundTrip(t, c, "a")
	p.SetDrop(true)
	if _, err := c.Write([]byte("lost")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "4 bytes dropped", func() bool { return p.Stats().BytesDropped == 4 })
	if got := e.received.Load(); got != 1 {
		t.Fatalf("target received %d bytes, want 1 (the dropped ones never arrive)", got)
	}
	if got := p.Stats().Active; got != 1 {
		t.Fatalf("active = %d, want 1: a black hole keeps the connection", got)
	}
	p.SetDrop(false)
	if got := roundTrip(t, c, "back"); got != "back" {
		t.Fatalf("echo after drop = %q, want back", got)
	}
	if got := e.received.Load(); got != 5 {
		t.Fatalf("target received %d bytes, want 5", got)
	}
}

// TestRefuseAndRestore: a refusing proxy gives ECONNREFUSED on its address
// while open connections keep working; Restore listens on the same address.
func TestRefuseAndRestore(t *testing.T) {
	e := startEcho(t)
	p := startProxy(t, e.ln.Addr().String())
	c := dial(t, p.Addr())
	p.Refuse()
	p.Refuse() // twice is a no-op
	_, err := net.Dial("tcp", p.Addr())
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial while refusing: %v, want ECONNREFUSED", err)
	}
	if got := roundTrip(t, c, "open"); got != "open" {
		t.Fatalf("open connection while refusing: %q", got)
	}
	p.SetDelay(time.Hour)
	must(t, p.Restore())
	c2 := dial(t, p.Addr())
	if got := roundTrip(t, c2, "again"); got != "again" { // Restore cleared the delay
		t.Fatalf("echo after restore = %q", got)
	}
	if got := p.Stats().Accepted; got != 2 {
		t.Fatalf("accepted = %d, want 2", got)
	}
}

// TestCutAndDown: Cut resets every open connection; Down also refuses new
// ones.
func TestCutAndDown(t *testing.T) {
	e := startEcho(t)
	p := startProxy(t, e.ln.Addr().String())
	c1, c2 := dial(t, p.Addr()), dial(t, p.Addr())
	roundTrip(t, c1, "1")
	roundTrip(t, c2, "2")
	if n := p.Cut(); n != 2 {
		t.Fatalf("cut %d connections, want 2", n)
	}
	for _, c := range []net.Conn{c1, c2} {
		must(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
		_, err := c.Read(make([]byte, 1))
		if err == nil || os.IsTimeout(err) {
			t.Fatalf("read after cut: %v, want a reset or EOF", err)
		}
	}
	waitFor(t, "no active connections", func() bool { return p.Stats().Active == 0 })
	c3 := dial(t, p.Addr())
	roundTrip(t, c3, "3")
	if n := p.Down(); n != 1 {
		t.Fatalf("down cut %d connections, want 1", n)
	}
	if _, err := net.Dial("tcp", p.Addr()); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial after down: %v, want ECONNREFUSED", err)
	}
}

// TestTargetDown: a connection accepted while the target refuses is reset
// and counted.
func TestTargetDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	target := ln.Addr().String()
	ln.Close()
	p := startProxy(t, target)
	// The reset may reach the client during its connect or at its first read.
	c, err := net.Dial("tcp", p.Addr())
	if err == nil {
		defer c.Close()
		must(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
		_, err = c.Read(make([]byte, 1))
	}
	if err == nil || os.IsTimeout(err) {
		t.Fatalf("connect and read through a proxy whose target is down: %v, want a reset or EOF", err)
	}
	if got := p.Stats().DialFailures; got != 1 {
		t.Fatalf("dial failures = %d, want 1", got)
	}
}

// TestClose: Close ends every connection and goroutine, even one waiting
// out a long delay, and Restore afterwards fails.
func TestClose(t *testing.T) {
	e := startEcho(t)
	p, err := Start(e.ln.Addr().String())
	must(t, err)
	c := dial(t, p.Addr())
	p.SetDelay(time.Hour)
	if _, err := c.Write([]byte("stuck")); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { p.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return while a chunk waited out its delay")
	}
	if err := p.Restore(); err == nil {
		t.Fatal("Restore after Close succeeded")
	}
	if got := p.Stats().Active; got != 0 {
		t.Fatalf("active after close = %d", got)
	}
}
