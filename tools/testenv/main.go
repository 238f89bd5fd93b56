// Command testenv runs a command with the servers this repository's tests
// need, started privately for that command and removed after it:
//
//	testenv [-services redis,postgres,...] [-print] -- command [args...]
//
// It first makes sure the programs are there. What is missing is
// installed with apt-get when testenv runs as root on Debian or Ubuntu
// (the packages' own services are not started); otherwise testenv stops
// before the command and prints the one command that installs it. The
// servers written in Go (goaws for SQS, nats-server) are built from the
// versions pinned in tools/go.mod, and dynalite (DynamoDB) is installed
// from npm at a pinned version into .cache/dynalite.
//
// Then it starts each server on a free loopback port, with its data in one
// temporary directory, and runs the command with their addresses in the
// environment:
//
//	REDIS_ADDR           a Redis server (host:port)
//	REDIS_CLUSTER_ADDRS  a Redis Cluster of three masters (host:port,...)
//	TEST_DATABASE_URL    a Postgres database (postgres://...)
//	MYSQL_DSN            a MariaDB database (go-sql-driver DSN)
//	AMQP_URL             a RabbitMQ broker (amqp://...)
//	NATS_URL             a NATS server with JetStream (nats://...)
//	SQS_ENDPOINT         goaws, an SQS emulator (http://...)
//	DYNAMODB_ENDPOINT    dynalite, a DynamoDB emulator (http://...)
//	PROMETHEUS_BIN       the directory of prometheus and promtool: not a
//	                     server, the tests start their own
//	IDEM_TEST_RUN        this run's id; tests put it in every name they
//	                     create on a server they share
//
// and PATH extended with the Postgres server programs (initdb, pg_ctl),
// which some tests run themselves.
//
// A variable that is already set names a server of the user's (or, for
// PROMETHEUS_BIN, the user's programs): testenv starts none for it and
// uses it as given, except that on Postgres and MariaDB it creates a
// database of this run's own, passes that one, and drops it afterwards,
// and on Redis it deletes, afterwards, every key that holds this run's id.
// No server the user runs is used otherwise.
//
// When the command ends, or testenv is interrupted (Ctrl-C, SIGTERM),
// every server is stopped and the temporary directory removed. A testenv
// killed outright leaves that to the next one, which stops what is left of
// its servers and removes its directory. testenv exits with the command's
// status.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

func main() {
	os.Exit(run())
}

func usage() {
	fmt.Fprintf(os.Stderr, "usage: testenv [-services %s] [-print] [-keep] [-cc=false] -- command [args...]\n", strings.Join(serviceNames(), ","))
	flag.PrintDefaults()
}

func run() int {
	flag.Usage = usage
	services := flag.String("services", strings.Join(serviceNames(), ","), "the servers to provide, comma-separated")
	print := flag.Bool("print", false, "print the environment given to the command")
	keep := flag.Bool("keep", false, "keep the servers' data and logs (printed at the end)")
	cc := flag.Bool("cc", true, "make sure a C compiler is installed (go test -race needs one)")
	flag.Parse()
	args := flag.Args()
	if len(args) == 0 {
		usage()
		return 2
	}
	wanted, err := selectServices(*services)
	if err != nil {
		logf("%v", err)
		return 2
	}
	root, err := repoRoot()
	if err != nil {
		logf("%v", err)
		return 2
	}

	// Ctrl-C reaches the command as well (same process group): testenv
	// waits for it to end, then cleans up.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var interrupted sync.Once
	stop := make(chan os.Signal, 1)
	go func() {
		for s := range sigs {
			interrupted.Do(func() { stop <- s; cancel() })
		}
	}()

	reapStale()
	tools, err := provide(ctx, root, wanted, *cc)
	if err != nil {
		logf("%v", err)
		return 1
	}
	env, err := newEnv(root, tools)
	if err != nil {
		logf("%v", err)
		return 1
	}
	env.keep = *keep
	defer env.close()

	start := time.Now()
	if err := env.start(ctx, wanted); err != nil {
		logf("%v", err)
		return 1
	}
	logf("%s ready in %.1fs (data in %s)", strings.Join(env.summary(), ", "), time.Since(start).Seconds(), env.dir)
	vars := env.vars()
	if *print {
		for _, v := range vars {
			fmt.Println(v)
		}
	}

	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), vars...)
	cmd.Dir = root
	if err := cmd.Start(); err != nil {
		logf("%v", err)
		return 1
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var waitErr error
	select {
	case waitErr = <-done:
	case s := <-stop:
		// Pass it on (a signal sent to testenv alone), then give the
		// command time to end on its own.
		_ = cmd.Process.Signal(s)
		select {
		case waitErr = <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			waitErr = <-done
		}
		logf("interrupted (%v): stopping the servers", s)
	}
	if waitErr == nil {
		return 0
	}
	var exit *exec.ExitError
	if errors.As(waitErr, &exit) {
		if code := exit.ExitCode(); code > 0 {
			return code
		}
		return 1
	}
	logf("%v", waitErr)
	return 1
}

// repoRoot is the directory above the working directory that has
// tools/go.mod: the repository's root.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "tools", "go.mod")); err == nil {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("run testenv from within the repository (no tools/go.mod above %s)", dir)
		}
	}
}

func selectServices(list string) ([]*service, error) {
	var out []*service
	for name := range strings.SplitSeq(list, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		i := slices.IndexFunc(allServices, func(s *service) bool { return s.name == name })
		if i < 0 {
			return nil, fmt.Errorf("unknown service %q (known: %s)", name, strings.Join(serviceNames(), ", "))
		}
		if !slices.Contains(out, allServices[i]) {
			out = append(out, allServices[i])
		}
	}
	return out, nil
}

func serviceNames() []string {
	names := make([]string, len(allServices))
	for i, s := range allServices {
		names[i] = s.name
	}
	return names
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "testenv: "+format+"\n", args...)
}
