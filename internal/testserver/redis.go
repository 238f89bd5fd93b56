// Package testserver gives the root module's tests their servers: the
// shared ones `make test` starts and names in environment variables
// (REDIS_ADDR, REDIS_CLUSTER_ADDRS, TEST_DATABASE_URL), and private,
// throwaway ones for tests that must stop, pause or restart them, each on
// a free loopback port, in a temporary directory, stopped when the test
// ends. A variable that is not set, or a server binary that is missing,
// fails the test; it never skips it.
package testserver

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis is a private redis-server process.
type Redis struct {
	t    testing.TB
	Port int
	dir  string
	args []string
	cmd  *exec.Cmd
}

// Addr returns host:port.
func (r *Redis) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.Port)) }

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testserver: free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// StartRedis starts redis-server with no persistence, plus extra arguments.
func StartRedis(t testing.TB, extra ...string) *Redis {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("testserver: redis-server is not installed (apt-get install -y redis-server): %v", err)
	}
	r := &Redis{t: t, Port: FreePort(t), dir: t.TempDir()}
	r.args = append([]string{
		"--bind", "127.0.0.1", "--port", strconv.Itoa(r.Port), "--dir", r.dir,
		"--save", "", "--appendonly", "no", "--daemonize", "no", "--logfile", filepath.Join(r.dir, "redis.log"),
	}, extra...)
	r.args = append([]string{bin}, r.args...)
	r.Start()
	t.Cleanup(r.Stop)
	return r
}

// Start starts the server (again) on the same port and waits for it.
func (r *Redis) Start() {
	r.t.Helper()
	r.cmd = exec.Command(r.args[0], r.args[1:]...)
	r.cmd.Dir = r.dir
	if err := r.cmd.Start(); err != nil {
		r.t.Fatalf("testserver: start redis-server: %v", err)
	}
	c := redis.NewClient(&redis.Options{Addr: r.Addr(), MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(r.dir, "redis.log"))
			r.t.Fatalf("testserver: redis-server on %s did not start: %v\n%s", r.Addr(), err, log)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Stop kills the server; its data is gone.
func (r *Redis) Stop() {
	if r.cmd == nil || r.cmd.Process == nil {
		return
	}
	_ = r.cmd.Process.Signal(syscall.SIGCONT) // a paused server cannot die
	_ = r.cmd.Process.Kill()
	_ = r.cmd.Wait()
	r.cmd = nil
}

// Restart kills the server and starts an empty one on the same port, as a
// restart without persistence would.
func (r *Redis) Restart() {
	r.t.Helper()
	r.Stop()
	r.Start()
}

// Pause freezes the server (SIGSTOP): connections stay open, nothing is
// answered, as with a hung server or a network partition.
func (r *Redis) Pause() { _ = r.cmd.Process.Signal(syscall.SIGSTOP) }

// Resume undoes Pause.
func (r *Redis) Resume() { _ = r.cmd.Process.Signal(syscall.SIGCONT) }

// Service returns the address of a server the tests use, from the
// environment variable name, and fails the test if it is not set: `make
// test` starts private servers and sets these (see docs/development.md).
// A test never falls back to a server on a default port, which may be one
// the user runs for something else.
func Service(t testing.TB, name string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		t.Fatalf("testserver: %s is not set. Run the tests with `make test`, which starts private servers "+
			"and sets it, or set it to a server the tests may write to", name)
	}
	return v
}

// RedisClient connects to the Redis at $REDIS_ADDR and fails the test if
// it does not answer.
func RedisClient(t testing.TB) *redis.Client {
	t.Helper()
	addr := Service(t, "REDIS_ADDR")
	c := redis.NewClient(&redis.Options{Addr: addr})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("testserver: Redis at %s (REDIS_ADDR) does not answer: %v", addr, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// ClusterAddrs returns the nodes of the Redis Cluster at
// $REDIS_CLUSTER_ADDRS (host:port,...).
func ClusterAddrs(t testing.TB) []string {
	t.Helper()
	return strings.Split(Service(t, "REDIS_CLUSTER_ADDRS"), ",")
}

// Unique returns a string unlikely to repeat, to keep tests' keys apart.
// It holds this run's id ($IDEM_TEST_RUN, set by `make test`), by which
// the run's keys are found and deleted on a server the user shares.
func Unique(prefix string) string {
	return fmt.Sprintf("%s%s-%d-%d:", prefix, os.Getenv("IDEM_TEST_RUN"), os.Getpid(), time.Now().UnixNano())
}
