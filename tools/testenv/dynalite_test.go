package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

// A client that closes its connection before its request has all arrived
// leaves dynalite serving (dynaliteGuard): the next request is answered.
// Unguarded, dynalite 4.0.0 exits on it.
func TestDynaliteOutlivesAbortedRequest(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	svc, err := selectServices("dynamodb")
	if err != nil {
		t.Fatal(err)
	}
	tools, err := provide(ctx, root, svc, false)
	if err != nil {
		t.Fatal(err)
	}
	e, err := newEnv(root, tools)
	if err != nil {
		t.Fatal(err)
	}
	defer e.close()
	url, err := svc[0].start(ctx, e) // a private one, whatever DYNAMODB_ENDPOINT says
	if err != nil {
		t.Fatal(err)
	}
	p := e.procs[0]

	addr := strings.TrimPrefix(url, "http://")
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	// Headers that promise 100 bytes of body, one byte of it, then the end.
	_, err = fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: %s\r\nContent-Length: 100\r\nX-Amz-Target: DynamoDB_20120810.ListTables\r\n\r\n{", addr)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}

	// dynalite has met the aborted request once the guard says so, or it
	// has exited.
	for {
		log, _ := os.ReadFile(p.logPath)
		if strings.Contains(string(log), "dynalite goes on") {
			break
		}
		select {
		case <-p.exited:
			log, _ = os.ReadFile(p.logPath)
			t.Fatalf("dynalite exited on an aborted request:\n%s", log)
		case <-ctx.Done():
			t.Fatalf("dynalite did not report the aborted request:\n%s", log)
		case <-time.After(10 * time.Millisecond):
		}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Amz-Target", "DynamoDB_20120810.ListTables")
	req.Header.Set("Content-Type", "application/x-amz-json-1.0")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("dynalite no longer answers after an aborted request: %v", err)
	}
	resp.Body.Close()
	if resp.Header.Get("X-Amzn-Requestid") == "" {
		t.Errorf("not dynalite's answer: %s %v", resp.Status, resp.Header)
	}
}
