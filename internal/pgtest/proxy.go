package pgtest

import (
	"net"
	"net/url"
	"sync"
	"testing"
)

// Proxy is a loopback TCP proxy in front of a PostgreSQL server, for tests of
// what a client does when the network misbehaves: Refuse turns new
// connections away (a server that is down for this client), Freeze stalls
// every byte without closing anything (a peer that vanished, a half-open
// connection), Drop closes the connections. Restore ends Refuse and Freeze;
// connections that were frozen are closed, as their peer is long gone.
type Proxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	cond    *sync.Cond
	refuse  bool
	frozen  bool
	closed  bool
	conns   map[net.Conn]bool
	stalled map[net.Conn]bool // connections that saw a freeze
	wg      sync.WaitGroup
}

// StartProxy starts a proxy to the server of serverURL, closed at the end of
// the test.
func StartProxy(t testing.TB, serverURL string) *Proxy {
	t.Helper()
	u, err := url.Parse(serverURL)
	if err != nil {
		t.Fatalf("parse database URL: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy: %v", err)
	}
	p := &Proxy{ln: ln, target: u.Host, conns: map[net.Conn]bool{}, stalled: map[net.Conn]bool{}}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// URL returns u with its host and port replaced by the proxy's.
func (p *Proxy) URL(t testing.TB, u string) string {
	t.Helper()
	parsed, err := url.Parse(u)
	if err != nil {
		t.Fatalf("parse database URL: %v", err)
	}
	parsed.Host = p.ln.Addr().String()
	return parsed.String()
}

// Refuse closes new connections as soon as they arrive.
func (p *Proxy) Refuse() {
	p.mu.Lock()
	p.refuse = true
	p.mu.Unlock()
}

// Freeze stops forwarding bytes on every connection, old and new, and closes
// none.
func (p *Proxy) Freeze() {
	p.mu.Lock()
	p.frozen = true
	for c := range p.conns {
		p.stalled[c] = true
	}
	p.mu.Unlock()
}

// Drop closes every open connection.
func (p *Proxy) Drop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
}

// Restore forwards and accepts again. Connections that were frozen are closed.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refuse, p.frozen = false, false
	for c := range p.stalled {
		c.Close()
	}
	clear(p.stalled)
	p.cond.Broadcast()
}

// Close stops the proxy and closes its connections.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	p.ln.Close()
	for c := range p.conns {
		c.Close()
	}
	p.cond.Broadcast()
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.refuse || p.closed {
			p.mu.Unlock()
			client.Close()
			continue
		}
		p.mu.Unlock()
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			client.Close()
			continue
		}
		p.mu.Lock()
		p.conns[client], p.conns[server] = true, true
		if p.frozen {
			p.stalled[client], p.stalled[server] = true, true
		}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pump(client, server)
		go p.pump(server, client)
	}
}

// pump copies src to dst, holding each chunk while the proxy is frozen.
func (p *Proxy) pump(dst, src net.Conn) {
	defer p.wg.Done()
	defer func() {
		p.mu.Lock()
		delete(p.conns, src)
		delete(p.conns, dst)
		delete(p.stalled, src)
		delete(p.stalled, dst)
		p.mu.Unlock()
		src.Close()
		dst.Close()
	}()
	buf := make([]byte, 32*1024)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			for p.frozen && !p.closed && p.conns[src] {
				p.stalled[src], p.stalled[dst] = true, true
				p.cond.Wait()
			}
			gone := p.closed || p.stalled[src] || !p.conns[src]
			p.mu.Unlock()
			if gone {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
