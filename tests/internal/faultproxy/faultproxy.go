// Package faultproxy is a TCP proxy on loopback for fault-injection tests:
// it forwards connections to one target and, on command, delays traffic,
// drops it (a black hole: connections stay open, bytes vanish), refuses new
// connections (the listening port is closed, so dials get ECONNREFUSED) and
// cuts open connections (closed with a TCP reset).
//
//	p, err := faultproxy.Start("127.0.0.1:6379")
//	defer p.Close()
//	client := redis.NewClient(&redis.Options{Addr: p.Addr()})
//	p.SetDelay(100 * time.Millisecond) // every byte arrives 100ms late
//	p.SetDrop(true)                    // nothing arrives at all
//	p.Refuse()                         // the "server" is down
//	p.Restore()                        // everything back to normal
//
// Faults apply to data read after they are set, in both directions. The
// proxy is meant for tests: it logs nothing and keeps no history beyond the
// counters of Stats.
package faultproxy

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy forwards TCP connections from Addr to a target. All methods are safe
// for concurrent use.
type Proxy struct {
	target string
	addr   string

	mu     sync.Mutex
	ln     net.Listener // nil while refusing or closed
	links  map[*link]struct{}
	delay  time.Duration
	drop   bool
	closed bool
	lnDone chan struct{} // closed when the current listener's accept loop ended

	linkWG                               sync.WaitGroup // every link's goroutines
	accepted, up, down, dropped, refused atomic.Int64
}

// Stats are cumulative counters since Start.
type Stats struct {
	Accepted     int64 // connections accepted and connected to the target
	Active       int64 // connections open now
	BytesUp      int64 // bytes passed on from clients to the target
	BytesDown    int64 // bytes passed on from the target to clients
	BytesDropped int64 // bytes discarded while dropping, both directions
	DialFailures int64 // accepted connections closed because the target refused them
}

// Start listens on a free loopback port (127.0.0.1:0) and forwards every
// connection to target ("host:port"). It returns the listen error, if any.
func Start(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultproxy: listen: %w", err)
	}
	p := &Proxy{target: target, addr: ln.Addr().String(), links: map[*link]struct{}{}}
	p.serve(ln)
	return p, nil
}

// Addr is the proxy's "127.0.0.1:port"; it stays the same across Refuse and
// Restore.
func (p *Proxy) Addr() string { return p.addr }

// Target is the address connections are forwarded to.
func (p *Proxy) Target() string { return p.target }

// SetDelay delays every chunk read from then on by d before it is written to
// the other side (latency, not bandwidth: chunks are not serialized behind
// each other's delay). Zero turns the delay off.
func (p *Proxy) SetDelay(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.delay = d
}

// SetDrop turns the black hole on or off: while on, every chunk read in
// either direction is discarded and connections stay open, as when packets
// are lost on the way.
func (p *Proxy) SetDrop(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.drop = on
}

// Refuse closes the listening port, so new connections are refused
// (ECONNREFUSED); open connections are left alone (Cut closes them). It is a
// no-op when already refusing.
func (p *Proxy) Refuse() {
	p.mu.Lock()
	ln, done := p.ln, p.lnDone
	p.ln = nil
	p.mu.Unlock()
	if ln != nil {
		ln.Close()
		<-done
	}
}

// Down is Refuse and Cut together: the target looks like a stopped server.
// It returns the number of connections cut.
func (p *Proxy) Down() int {
	p.Refuse()
	return p.Cut()
}

// Cut closes every open connection, client and target side, with a TCP
// reset (SO_LINGER 0), and returns how many it closed.
func (p *Proxy) Cut() int {
	p.mu.Lock()
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	p.mu.Unlock()
	for _, l := range links {
		l.close(true)
	}
	return len(links)
}

// Restore clears the delay and the black hole and, if refusing, listens on
// Addr again. It fails when the port was taken meanwhile or the proxy is
// closed.
func (p *Proxy) Restore() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errors.New("faultproxy: closed")
	}
	p.delay, p.drop = 0, false
	if p.ln != nil {
		return nil
	}
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		return fmt.Errorf("faultproxy: listen again on %s: %w", p.addr, err)
	}
	p.serveLocked(ln)
	return nil
}

// Stats returns the counters.
func (p *Proxy) Stats() Stats {
	p.mu.Lock()
	active := len(p.links)
	p.mu.Unlock()
	return Stats{
		Accepted: p.accepted.Load(), Active: int64(active),
		BytesUp: p.up.Load(), BytesDown: p.down.Load(), BytesDropped: p.dropped.Load(),
		DialFailures: p.refused.Load(),
	}
}

// Close stops listening, cuts every connection and waits for the proxy's
// goroutines to end.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.Refuse()
	p.Cut()
	p.linkWG.Wait()
	return nil
}

func (p *Proxy) serve(ln net.Listener) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.serveLocked(ln)
}

func (p *Proxy) serveLocked(ln net.Listener) {
	done := make(chan struct{})
	p.ln, p.lnDone = ln, done
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return // listener closed by Refuse or Close
			}
			p.connect(c)
		}
	}()
}

// connect dials the target for an accepted client and starts forwarding.
func (p *Proxy) connect(client net.Conn) {
	target, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		p.refused.Add(1)
		reset(client)
		return
	}
	l := &link{p: p, client: client, target: target, done: make(chan struct{})}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		reset(client)
		reset(target)
		return
	}
	p.links[l] = struct{}{}
	p.mu.Unlock()
	p.accepted.Add(1)
	p.linkWG.Add(4)
	go l.pipe(client, target, &p.up)
	go l.pipe(target, client, &p.down)
}

// fault returns the faults in force now.
func (p *Proxy) fault() (delay time.Duration, drop bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.delay, p.drop
}

// link is one proxied connection.
type link struct {
	p              *Proxy
	client, target net.Conn
	once           sync.Once
	done           chan struct{} // closed by close
}

func (l *link) close(rst bool) {
	l.once.Do(func() {
		close(l.done)
		if rst {
			reset(l.client)
			reset(l.target)
		} else {
			l.client.Close()
			l.target.Close()
		}
		l.p.mu.Lock()
		delete(l.p.links, l)
		l.p.mu.Unlock()
	})
}

func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	c.Close()
}

// chunk is data read at one moment, due for writing at due.
type chunk struct {
	data []byte
	due  time.Time
}

// pipe copies src to dst through a queue, so that each chunk waits its own
// delay. It runs a reader and a writer goroutine (two linkWG slots). When
// src ends, the writer passes on what was queued and then closes the link;
// when the link is closed, both goroutines end without waiting out delays.
func (l *link) pipe(src, dst net.Conn, counter *atomic.Int64) {
	queue := make(chan chunk, 256)
	go func() { // writer
		defer l.p.linkWG.Done()
		defer func() {
			for range queue { // let the reader finish
			}
		}()
		defer l.close(false) // runs first: ends the reader's Read
		for c := range queue {
			if wait := time.Until(c.due); wait > 0 {
				timer := time.NewTimer(wait)
				select {
				case <-timer.C:
				case <-l.done:
					timer.Stop()
					return
				}
			}
			counter.Add(int64(len(c.data))) // before the write: the reply may overtake it
			if _, err := dst.Write(c.data); err != nil {
				return
			}
		}
	}()
	defer l.p.linkWG.Done()
	defer close(queue)
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if delay, drop := l.p.fault(); drop {
				l.p.dropped.Add(int64(n))
			} else {
				select {
				case queue <- chunk{data: append([]byte(nil), buf[:n]...), due: time.Now().Add(delay)}:
				case <-l.done:
					return
				}
			}
		}
		if err != nil {
			return
		}
	}
}
