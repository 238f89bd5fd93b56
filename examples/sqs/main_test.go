package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// startGoaws starts the goaws SQS emulator, built from its pinned module
// version by `make bin/goaws` (GOAWS_BIN overrides the path), on a free
// port, and returns its endpoint.
func startGoaws(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("GOAWS_BIN")
	if bin == "" {
		bin, _ = filepath.Abs("../../bin/goaws")
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("goaws is not built (run `make bin/goaws`, or set GOAWS_BIN): %v", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	dir := t.TempDir()
	config := filepath.Join(dir, "goaws.yaml")
	if err := os.WriteFile(config, []byte(fmt.Sprintf(`Local:
  Host: 127.0.0.1
  Port: %d
  Region: us-east-1
  AccountId: "000000000000"
  LogToFile: false
  EnableDuplicates: false
  QueueAttributeDefaults:
    VisibilityTimeout: 30
  Queues: []
  Topics: []
`, port)), 0o644); err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	cmd := exec.Command(bin, "-config", config)
	cmd.Dir = dir // without -config goaws would search the working tree
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	for deadline := time.Now().Add(10 * time.Second); ; {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return "http://" + addr
		}
		if time.Now().After(deadline) {
			t.Fatalf("goaws did not start on %s:\n%s", addr, log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The example end to end on the goaws SQS emulator, with the leases in
// the real Redis and, in a second run, the real Postgres.
func TestSQSExample(t *testing.T) {
	endpoint := startGoaws(t)
	for _, store := range []string{"redis", "postgres"} {
		t.Run(store, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var out bytes.Buffer
			rep, err := Run(ctx, Config{
				Endpoint:    endpoint,
				Region:      "us-east-1",
				Store:       store,
				RedisAddr:   env("REDIS_ADDR", "127.0.0.1:6379"),
				DatabaseURL: env("TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"),
				Orders:      20,
			}, &out)
			if err != nil {
				t.Fatalf("%v\n%s", err, out.String())
			}
			t.Log("\n" + out.String())
			for order, n := range rep.ChargesPerOrder {
				if n != 1 {
					t.Errorf("order %s charged %d times", order, n)
				}
			}
			if len(rep.ChargesPerOrder) != 22 || rep.Processed != 22 {
				t.Errorf("%d orders charged, %d processed; want 22: nothing lost", len(rep.ChargesPerOrder), rep.Processed)
			}
			if rep.Duplicates < 20 {
				t.Errorf("%d duplicates dropped; the producer sent 20 retries", rep.Duplicates)
			}
			if rep.FailedAttempts != 1 {
				t.Errorf("%d failed attempts; want the flaky order's one, retried after the visibility timeout", rep.FailedAttempts)
			}
			if rep.SlowOrderDeliveries < 2 || !rep.SlowOrderCaught {
				t.Errorf("the visibility-timeout redelivery of the slow order was not caught: %+v", rep)
			}
		})
	}
}
