package sqloutbox_test

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"testing"
)

// privatePostgres is a throwaway Postgres server of the test's own, to
// crash and restart: initdb and pg_ctl from PATH (make test puts the
// server's programs there), as the postgres user when run as root.
type privatePostgres struct {
	t          testing.TB
	port       int
	dir        string
	asPostgres bool
}

func startPostgres(t testing.TB) *privatePostgres {
	t.Helper()
	for _, bin := range []string{"initdb", "pg_ctl"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Fatalf("%s is not installed (PostgreSQL server programs; make test puts them on PATH): %v", bin, err)
		}
	}
	base, err := os.MkdirTemp("", "sqloutbox-pg-")
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	p := &privatePostgres{t: t, port: port, dir: filepath.Join(base, "data"), asPostgres: os.Geteuid() == 0}
	if p.asPostgres {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("running as root needs a postgres user: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(base, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_, _ = p.run("pg_ctl", "-w", "-D", p.dir, "-m", "immediate", "stop")
		_ = os.RemoveAll(base)
	})
	if out, err := p.run("initdb", "--auth=trust", "--no-sync", "-U", "postgres", "-D", p.dir); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	p.start()
	return p
}

func (p *privatePostgres) url() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", p.port)
}

func (p *privatePostgres) run(bin string, args ...string) ([]byte, error) {
	if p.asPostgres {
		args = append([]string{"-u", "postgres", "--", bin}, args...)
		bin = "runuser"
	}
	return exec.Command(bin, args...).CombinedOutput()
}

func (p *privatePostgres) start() {
	opts := fmt.Sprintf("-p %d -k %s -c fsync=off -c listen_addresses=127.0.0.1 -c max_connections=200", p.port, filepath.Dir(p.dir))
	if out, err := p.run("pg_ctl", "-w", "-D", p.dir, "-o", opts, "-l", filepath.Join(filepath.Dir(p.dir), "log"), "start"); err != nil {
		log, _ := os.ReadFile(filepath.Join(filepath.Dir(p.dir), "log"))
		p.t.Errorf("pg_ctl start: %v\n%s\n%s", err, out, log)
	}
}

// crash stops the server as a crash would (immediate shutdown: every
// connection cut, open transactions lost) and starts it again, which runs
// crash recovery.
func (p *privatePostgres) crash() {
	_, _ = p.run("pg_ctl", "-w", "-D", p.dir, "-m", "immediate", "stop")
	p.start()
}
