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
	return toolBinary(t, "goaws", "GOAWS_BIN")
}

// toolBinary returns $env, or bin/name in the nearest directory above the
// working directory that has one (made by `make bin/name`).
func toolBinary(t testing.TB, name, env string) string {
	t.Helper()
	if bin := os.Getenv(env); bin != "" {
		return bin
	}
	dir, _ := os.Getwd()
	for {
		bin := filepath.Join(dir, "bin", name)
		if _, err := os.Stat(bin); err == nil {
			return bin
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatalf("testserver: %s is not installed (run `make bin/%s`, or set %s)", name, name, env)
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
	cmd := exec.Command(bin, "-config", config)
	cmd.Dir = dir // without -config goaws searches the working tree for a config
	return "http://" + startListener(t, "goaws", cmd, port)
}

// StartDynalite starts dynalite, a DynamoDB implementation on LevelDB
// (in memory here), on a free loopback port, and returns its endpoint URL.
// Its tables become active at once.
func StartDynalite(t testing.TB) string {
	t.Helper()
	bin := toolBinary(t, "dynalite", "DYNALITE_BIN")
	port := FreePort(t)
	cmd := exec.Command(bin, "--host", "127.0.0.1", "--port", fmt.Sprint(port),
		"--createTableMs", "0", "--deleteTableMs", "0", "--updateTableMs", "0")
	return "http://" + startListener(t, "dynalite", cmd, port)
}

// startListener starts cmd, stopped when the test ends, and waits up to
// 30 seconds (a loaded machine starts Node slowly) until it accepts
// connections on port; it returns the address.
func startListener(t testing.TB, name string, cmd *exec.Cmd, port int) string {
	t.Helper()
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatalf("testserver: start %s: %v", name, err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	for deadline := time.Now().Add(30 * time.Second); ; {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return addr
		}
		if time.Now().After(deadline) {
			t.Fatalf("testserver: %s did not start on %s:\n%s", name, addr, log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}
