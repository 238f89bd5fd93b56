// Package testserver starts private, throwaway servers for tests that must
// stop, pause or restart them: each on a free loopback port, in a temporary
// directory, stopped when the test ends. A missing server binary fails the
// test; it never skips it.
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

// StartRedisCluster starts a Redis Cluster of n masters without replicas
// and waits until it reports cluster_state:ok. It returns the node addresses.
func StartRedisCluster(t testing.TB, n int) []string {
	t.Helper()
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Fatalf("testserver: redis-cli is not installed: %v", err)
	}
	addrs := make([]string, n)
	for i := range addrs {
		dir := t.TempDir()
		r := StartRedis(t, "--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(dir, "nodes.conf"),
			"--cluster-node-timeout", "5000")
		addrs[i] = r.Addr()
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("testserver: redis-cli --cluster create: %v\n%s", err, out)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, addr := range addrs {
		c := redis.NewClient(&redis.Options{Addr: addr})
		for {
			info, err := c.ClusterInfo(context.Background()).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				c.Close()
				t.Fatalf("testserver: cluster node %s not ready: %v %q", addr, err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
		c.Close()
	}
	return addrs
}

// Env returns the environment variable's value, or def.
func Env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// RedisClient connects to the shared Redis at $REDIS_ADDR (default
// 127.0.0.1:6379) and fails the test if it does not answer.
func RedisClient(t testing.TB) *redis.Client {
	t.Helper()
	addr := Env("REDIS_ADDR", "127.0.0.1:6379")
	c := redis.NewClient(&redis.Options{Addr: addr})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("testserver: Redis at %s (REDIS_ADDR) does not answer: %v", addr, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Unique returns a string unlikely to repeat, to keep tests' keys apart.
func Unique(prefix string) string {
	return fmt.Sprintf("%s%d-%d:", prefix, os.Getpid(), time.Now().UnixNano())
}
