package testserver

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// GoawsBinary returns $GOAWS_BIN, or bin/goaws in the nearest directory
// above the working directory that has one (built by `make bin/goaws`).
func GoawsBinary(t testing.TB) string {
	t.Helper()
	if bin := os.Getenv("GOAWS_BIN"); bin != "" {
		return bin
	}
	dir, _ := os.Getwd()
	for {
		bin := filepath.Join(dir, "bin", "goaws")
		if _, err := os.Stat(bin); err == nil {
			return bin
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("testserver: goaws is not built (run `make bin/goaws`, or set GOAWS_BIN)")
		}
		dir = parent
	}
}

// StartGoaws starts the goaws SQS emulator on a free loopback port with an
// empty configuration, and returns its endpoint URL.
func StartGoaws(t testing.TB) string {
	t.Helper()
	bin := GoawsBinary(t)
	port := FreePort(t)
	dir := t.TempDir()
	config := filepath.Join(dir, "goaws.yaml")
	yaml := fmt.Sprintf("Local:\n  Host: 127.0.0.1\n  Port: %d\n  Region: us-east-1\n  AccountId: \"000000000000\"\n"+
		"  LogToFile: false\n  EnableDuplicates: false\n  QueueAttributeDefaults:\n    VisibilityTimeout: 30\n  Queues: []\n  Topics: []\n", port)
	if err := os.WriteFile(config, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	cmd := exec.Command(bin, "-config", config)
	cmd.Dir = dir // without -config goaws searches the working tree for a config
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatalf("testserver: start goaws: %v", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	for deadline := time.Now().Add(10 * time.Second); ; {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return "http://" + addr
		}
		if time.Now().After(deadline) {
			t.Fatalf("testserver: goaws did not start on %s:\n%s", addr, log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}
