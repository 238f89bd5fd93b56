package testserver

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// PostgresURL returns $TEST_DATABASE_URL, the tests' database.
func PostgresURL(t testing.TB) string {
	t.Helper()
	return Service(t, "TEST_DATABASE_URL")
}

// PostgresPool connects to PostgresURL and fails the test if it does not
// answer.
func PostgresPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return poolFor(t, PostgresURL(t))
}

func poolFor(t testing.TB, url string) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, url)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		t.Fatalf("testserver: Postgres at %s (TEST_DATABASE_URL) does not answer: %v", url, err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Postgres is a private, throwaway Postgres server.
type Postgres struct {
	t          testing.TB
	Port       int
	dir        string
	asPostgres bool
}

// URL returns the connection URL of the server's postgres database.
func (p *Postgres) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", p.Port)
}

// StartPostgres initialises and starts a private Postgres (fsync off) on a
// free port. As root, it runs the server as the postgres user.
func StartPostgres(t testing.TB) *Postgres {
	t.Helper()
	for _, bin := range []string{"initdb", "pg_ctl"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Fatalf("testserver: %s is not installed (PostgreSQL server binaries): %v", bin, err)
		}
	}
	base, err := os.MkdirTemp("", "pgtest-")
	if err != nil {
		t.Fatal(err)
	}
	p := &Postgres{t: t, Port: FreePort(t), dir: filepath.Join(base, "data"), asPostgres: os.Geteuid() == 0}
	if p.asPostgres {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("testserver: running as root needs a postgres user: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(base, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { p.Stop(); _ = os.RemoveAll(base) })
	if out, err := p.run("initdb", "--auth=trust", "--no-sync", "-U", "postgres", "-D", p.dir); err != nil {
		t.Fatalf("testserver: initdb: %v\n%s", err, out)
	}
	p.Start()
	return p
}

func (p *Postgres) run(bin string, args ...string) ([]byte, error) {
	if p.asPostgres {
		args = append([]string{"-u", "postgres", "--", bin}, args...)
		bin = "runuser"
	}
	return exec.Command(bin, args...).CombinedOutput()
}

// Start starts the server and waits until it accepts connections.
func (p *Postgres) Start() {
	p.t.Helper()
	opts := fmt.Sprintf("-p %d -k %s -c fsync=off -c listen_addresses=127.0.0.1", p.Port, filepath.Dir(p.dir))
	if out, err := p.run("pg_ctl", "-w", "-D", p.dir, "-o", opts, "-l", filepath.Join(filepath.Dir(p.dir), "log"), "start"); err != nil {
		log, _ := os.ReadFile(filepath.Join(filepath.Dir(p.dir), "log"))
		p.t.Fatalf("testserver: pg_ctl start: %v\n%s\n%s", err, out, log)
	}
}

// Stop stops the server (fast shutdown: committed data survives).
func (p *Postgres) Stop() {
	_, _ = p.run("pg_ctl", "-w", "-D", p.dir, "-m", "fast", "stop")
}

// Restart stops and starts the server.
func (p *Postgres) Restart() {
	p.t.Helper()
	p.Stop()
	p.Start()
}

// Pool connects to the server.
func (p *Postgres) Pool(t testing.TB) *pgxpool.Pool { return poolFor(t, p.URL()) }

// Crash stops the server the way a crash would (immediate shutdown, no
// checkpoint) and starts it again, which runs crash recovery.
func (p *Postgres) Crash() {
	p.t.Helper()
	_, _ = p.run("pg_ctl", "-w", "-D", p.dir, "-m", "immediate", "stop")
	p.Start()
}
