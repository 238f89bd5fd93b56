package main

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestMySQLDSN(t *testing.T) {
	for _, tc := range []struct {
		dsn, withDB string
		args, env   []string
	}{
		{"root@tcp(127.0.0.1:3306)/test", "root@tcp(127.0.0.1:3306)/idem_test_r1",
			[]string{"-u", "root", "-h", "127.0.0.1", "-P", "3306"}, nil},
		{"app:s3cr:et@tcp(db.local:3307)/app?parseTime=true&tls=false", "app:s3cr:et@tcp(db.local:3307)/idem_test_r1?parseTime=true&tls=false",
			[]string{"-u", "app", "-h", "db.local", "-P", "3307"}, []string{"MYSQL_PWD=s3cr:et"}},
		{"me@unix(/run/mysqld/mysqld.sock)/x", "me@unix(/run/mysqld/mysqld.sock)/idem_test_r1",
			[]string{"-u", "me", "--socket=/run/mysqld/mysqld.sock"}, nil},
		{"/test", "/idem_test_r1", []string{"-h", "127.0.0.1", "-P", "3306"}, nil},
	} {
		d, err := parseMySQLDSN(tc.dsn)
		if err != nil {
			t.Fatalf("%s: %v", tc.dsn, err)
		}
		if got := d.withDB("idem_test_r1"); got != tc.withDB {
			t.Errorf("%s: with the run's database %q, want %q", tc.dsn, got, tc.withDB)
		}
		args, env := d.clientArgs()
		if want := append([]string{"--no-defaults", "--connect-timeout=5"}, tc.args...); !slices.Equal(args, want) {
			t.Errorf("%s: client args %q, want %q", tc.dsn, args, want)
		}
		if !slices.Equal(env, tc.env) {
			t.Errorf("%s: client env %q, want %q", tc.dsn, env, tc.env)
		}
	}
	if _, err := parseMySQLDSN("postgres://x"); err == nil {
		t.Error("a URL parsed as a DSN")
	}
}

func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		"amqp://guest:guest@127.0.0.1:5672/":        "amqp://guest:xxxxx@127.0.0.1:5672/",
		"postgres://postgres@127.0.0.1:5432/test":   "postgres://postgres@127.0.0.1:5432/test",
		"app:s3cret@tcp(127.0.0.1:3306)/test":       "app:xxxxx@tcp(127.0.0.1:3306)/test",
		"root@tcp(127.0.0.1:3306)/test":             "root@tcp(127.0.0.1:3306)/test",
		"127.0.0.1:6379":                            "127.0.0.1:6379",
		"postgres://u:p%40ss@db:5432/x?sslmode=off": "postgres://u:xxxxx@db:5432/x?sslmode=off",
	} {
		if got := redact(in); got != want {
			t.Errorf("redact(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestSelectServices(t *testing.T) {
	got, err := selectServices("redis, postgres,redis")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].name != "redis" || got[1].name != "postgres" {
		t.Errorf("selected %v", got)
	}
	if _, err := selectServices("redis,kafka"); err == nil {
		t.Error("an unknown service was accepted")
	}
}

func TestPrometheusBin(t *testing.T) {
	dir, other := t.TempDir(), t.TempDir()
	write := func(path string, mode os.FileMode) string {
		t.Helper()
		if err := os.WriteFile(path, []byte("#!/bin/sh\n"), mode); err != nil {
			t.Fatal(err)
		}
		return path
	}
	prom := write(filepath.Join(dir, "prometheus"), 0o755)
	tool := write(filepath.Join(dir, "promtool"), 0o755)
	if got, err := prometheusBin(prom, tool); err != nil || got != dir {
		t.Errorf("prometheusBin = %q, %v; want %q", got, err, dir)
	}
	if _, err := prometheusBin(prom, write(filepath.Join(other, "promtool"), 0o755)); err == nil {
		t.Error("programs in two directories were accepted")
	}
	if _, err := prometheusBin(prom, filepath.Join(dir, "missing")); err == nil {
		t.Error("a missing promtool was accepted")
	}
	if _, err := prometheusBin(prom, write(filepath.Join(dir, "notexec"), 0o644)); err == nil {
		t.Error("a file that is not executable was accepted")
	}
}
