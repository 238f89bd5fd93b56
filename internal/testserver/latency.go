package testserver

import (
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// StartLatencyProxy forwards TCP connections on a free loopback port to
// upstream, delivering everything a client sends latency later, in order,
// as a distant or overloaded server would answer late. Replies pass at
// once; throughput is not limited. It returns the proxy's address and
// stops, closing every connection, when the test ends.
func StartLatencyProxy(t testing.TB, upstream string, latency time.Duration) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testserver: latency proxy: %v", err)
	}
	p := &latencyProxy{upstream: upstream, latency: latency, conns: map[net.Conn]struct{}{}}
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.wg.Go(func() { p.serve(c) })
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		p.mu.Lock()
		p.closed = true
		for c := range p.conns {
			_ = c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return ln.Addr().String()
}

type latencyProxy struct {
	upstream string
	latency  time.Duration
	wg       sync.WaitGroup

	mu     sync.Mutex
	closed bool
	conns  map[net.Conn]struct{}
}

// track registers c to be closed with the proxy; false if it is closing.
func (p *latencyProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		_ = c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

type chunk struct {
	b  []byte
	at time.Time
}

func (p *latencyProxy) serve(client net.Conn) {
	if !p.track(client) {
		return
	}
	server, err := net.Dial("tcp", p.upstream)
	if err != nil || !p.track(server) {
		_ = client.Close()
		return
	}
	defer client.Close()
	defer server.Close()

	p.wg.Go(func() {
		_, _ = io.Copy(client, server)
		_ = client.Close()
	})
	chunks := make(chan chunk, 256)
	p.wg.Go(func() {
		defer close(chunks)
		buf := make([]byte, 32<<10)
		for {
			n, err := client.Read(buf)
			if n > 0 {
				chunks <- chunk{b: append([]byte(nil), buf[:n]...), at: time.Now().Add(p.latency)}
			}
			if err != nil {
				return
			}
		}
	})
	for c := range chunks {
		time.Sleep(time.Until(c.at))
		if _, err := server.Write(c.b); err != nil {
			_ = client.Close() // let the reader end
			for range chunks {
			}
			return
		}
	}
}
