package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// service is one server the tests need.
type service struct {
	name   string
	envVar string
	// programs are what starting it takes; goTool, a Go package to build
	// from tools/go.mod instead.
	programs []*program
	goTool   string
	// start starts a private one and returns the variable's value.
	start func(ctx context.Context, e *env) (string, error)
	// shared checks the user's, given in the variable, prepares this run's
	// part of it and returns the value the command gets.
	shared func(ctx context.Context, e *env, given string) (string, error)
}

var allServices = []*service{
	{
		name: "redis", envVar: "REDIS_ADDR", programs: []*program{progRedisServer, progRedisCLI},
		start: func(ctx context.Context, e *env) (string, error) {
			port, err := e.port(0)
			if err != nil {
				return "", err
			}
			return hostPort(port), startRedis(ctx, e, "redis", port)
		},
		shared: func(ctx context.Context, e *env, addr string) (string, error) {
			if err := dialReady(addr, redisHello)(ctx); err != nil {
				return "", err
			}
			e.onClose(func() { e.deleteRunKeys(addr) })
			return addr, nil
		},
	},
	{
		name: "redis-cluster", envVar: "REDIS_CLUSTER_ADDRS", programs: []*program{progRedisServer, progRedisCLI},
		start: startRedisCluster,
		shared: func(ctx context.Context, e *env, addrs string) (string, error) {
			for addr := range strings.SplitSeq(addrs, ",") {
				if err := dialReady(addr, redisHello)(ctx); err != nil {
					return "", err
				}
				e.onClose(func() { e.deleteRunKeys(addr) })
			}
			return addrs, nil
		},
	},
	{
		name: "postgres", envVar: "TEST_DATABASE_URL", programs: []*program{progPostgres, progInitdb, progPgCtl, progPsql},
		start: startPostgres, shared: sharedPostgres,
	},
	{
		name: "mariadb", envVar: "MYSQL_DSN", programs: []*program{progMariadbd, progMariadbInit, progMariadb},
		start: startMariaDB, shared: sharedMariaDB,
	},
	{
		name: "rabbitmq", envVar: "AMQP_URL", programs: []*program{progRabbit, progEpmd},
		start: startRabbitMQ, shared: reachable,
	},
	{
		name: "nats", envVar: "NATS_URL", goTool: "github.com/nats-io/nats-server/v2",
		start: func(ctx context.Context, e *env) (string, error) {
			dir, err := e.subdir("nats")
			if err != nil {
				return "", err
			}
			port, err := e.port(0)
			if err != nil {
				return "", err
			}
			p, err := e.spawn("nats", exec.Command(e.tools.natsServer, "-a", "127.0.0.1", "-p", strconv.Itoa(port), "-js", "-sd", dir), syscall.SIGTERM)
			if err != nil {
				return "", err
			}
			return "nats://" + hostPort(port), p.waitReady(ctx, dialReady(hostPort(port), func(c net.Conn) error {
				line, err := bufio.NewReader(c).ReadString('\n')
				if err == nil && !strings.HasPrefix(line, "INFO ") {
					err = fmt.Errorf("not a NATS server: %q", line)
				}
				return err
			}))
		},
		shared: reachable,
	},
	{
		name: "sqs", envVar: "SQS_ENDPOINT", goTool: "github.com/Admiral-Piett/goaws/app/cmd",
		start: func(ctx context.Context, e *env) (string, error) {
			dir, err := e.subdir("goaws")
			if err != nil {
				return "", err
			}
			port, err := e.port(0)
			if err != nil {
				return "", err
			}
			config := filepath.Join(dir, "goaws.yaml")
			yaml := fmt.Sprintf("Local:\n  Host: 127.0.0.1\n  Port: %d\n  Region: us-east-1\n  AccountId: \"000000000000\"\n"+
				"  LogToFile: false\n  EnableDuplicates: false\n  QueueAttributeDefaults:\n    VisibilityTimeout: 30\n  Queues: []\n  Topics: []\n", port)
			if err := os.WriteFile(config, []byte(yaml), 0o644); err != nil {
				return "", err
			}
			cmd := exec.Command(e.tools.goaws, "-config", config)
			cmd.Dir = dir // without -config goaws searches its working tree for one
			p, err := e.spawn("goaws", cmd, syscall.SIGTERM)
			if err != nil {
				return "", err
			}
			return "http://" + hostPort(port), p.waitReady(ctx, dialReady(hostPort(port), nil))
		},
		shared: reachable,
	},
	{
		name: "dynamodb", envVar: "DYNAMODB_ENDPOINT", programs: []*program{progNode, progNpm},
		start: func(ctx context.Context, e *env) (string, error) {
			port, err := e.port(0)
			if err != nil {
				return "", err
			}
			guard := filepath.Join(e.dir, "dynalite-guard.js")
			if err := os.WriteFile(guard, []byte(dynaliteGuard), 0o644); err != nil {
				return "", err
			}
			cmd := exec.Command(e.tools.bin(progNode), "--require", guard, e.tools.dynalite, "--host", "127.0.0.1", "--port", strconv.Itoa(port),
				"--createTableMs", "0", "--deleteTableMs", "0", "--updateTableMs", "0")
			p, err := e.spawn("dynalite", cmd, syscall.SIGTERM)
			if err != nil {
				return "", err
			}
			return "http://" + hostPort(port), p.waitReady(ctx, dialReady(hostPort(port), nil))
		},
		shared: reachable,
	},
	{
		// Not a server: the directory of prometheus and promtool, for
		// tests that start a Prometheus of their own (on a port and with a
		// configuration only they know) and check rules with promtool.
		name: "prometheus", envVar: "PROMETHEUS_BIN", programs: []*program{progPrometheus, progPromtool},
		start: func(_ context.Context, e *env) (string, error) {
			return prometheusBin(e.tools.bin(progPrometheus), e.tools.bin(progPromtool))
		},
		shared: func(_ context.Context, _ *env, dir string) (string, error) {
			return prometheusBin(filepath.Join(dir, "prometheus"), filepath.Join(dir, "promtool"))
		},
	},
}

// prometheusBin returns the directory of the prometheus and promtool
// programs, which must both be there.
func prometheusBin(prometheus, promtool string) (string, error) {
	dir := filepath.Dir(prometheus)
	for _, p := range []string{prometheus, promtool} {
		st, err := os.Stat(p)
		if err != nil {
			return "", err
		}
		if st.IsDir() || st.Mode()&0o111 == 0 {
			return "", fmt.Errorf("%s is not a program", p)
		}
		if filepath.Dir(p) != dir {
			return "", fmt.Errorf("prometheus (%s) and promtool (%s) are in different directories", prometheus, promtool)
		}
	}
	return dir, nil
}

// dynaliteGuard is loaded into dynalite's Node process before dynalite.
// dynalite (4.0.0) throws from every request's 'error' handler
// (architect/dynalite#183), so a client that closes its connection before
// the server has read the whole request ends the server, and every test
// still using it fails. A store call cancelled in flight does exactly
// that (the middleware's StoreTimeout, a lease keeper stopped mid-renewal),
// and a loaded machine, on which Node reads requests late, makes it
// likely. DynamoDB itself shrugs such a client off; so does dynalite with
// this guard. Any other uncaught error still ends it.
const dynaliteGuard = `process.on('uncaughtException', function (err) {
  if (err && err.code === 'ECONNRESET' && err.message === 'aborted') {
    console.error('testenv: a client closed its connection mid-request; dynalite goes on')
    return
  }
  console.error(err)
  process.exit(1)
})
`

// reachable checks that the server a URL names accepts connections; the
// tests name and remove what they create on it.
func reachable(ctx context.Context, _ *env, given string) (string, error) {
	u, err := url.Parse(given)
	if err != nil || u.Host == "" {
		return "", fmt.Errorf("not a URL: %q", redact(given))
	}
	host := u.Host
	if u.Port() == "" {
		switch u.Scheme {
		case "amqp":
			host = net.JoinHostPort(u.Hostname(), "5672")
		case "nats":
			host = net.JoinHostPort(u.Hostname(), "4222")
		case "http":
			host = net.JoinHostPort(u.Hostname(), "80")
		case "https":
			host = net.JoinHostPort(u.Hostname(), "443")
		}
	}
	return given, dialReady(host, nil)(ctx)
}

func redisHello(c net.Conn) error {
	if _, err := io.WriteString(c, "PING\r\n"); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err == nil && !strings.HasPrefix(line, "+PONG") {
		err = fmt.Errorf("PING answered %q", strings.TrimSpace(line))
	}
	return err
}

func startRedis(ctx context.Context, e *env, name string, port int, extra ...string) error {
	dir, err := e.subdir(name)
	if err != nil {
		return err
	}
	args := append([]string{"--bind", "127.0.0.1", "--port", strconv.Itoa(port), "--dir", dir,
		"--save", "", "--appendonly", "no", "--daemonize", "no"}, extra...)
	p, err := e.spawn(name, exec.Command(e.tools.bin(progRedisServer), args...), syscall.SIGTERM)
	if err != nil {
		return err
	}
	return p.waitReady(ctx, dialReady(hostPort(port), redisHello))
}

// startRedisCluster starts three masters without replicas and waits until
// the cluster is ok. Each node's cluster bus is its port + 10000.
func startRedisCluster(ctx context.Context, e *env) (string, error) {
	addrs := make([]string, 3)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for i := range addrs {
		port, err := e.port(10000)
		if err != nil {
			return "", err
		}
		addrs[i] = hostPort(port)
		wg.Go(func() {
			name := fmt.Sprintf("redis-cluster-%d", i)
			errs[i] = startRedis(ctx, e, name, port, "--cluster-enabled", "yes",
				"--cluster-config-file", filepath.Join(e.dir, name, "nodes.conf"), "--cluster-node-timeout", "5000")
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return "", err
	}
	cli := e.tools.bin(progRedisCLI)
	args := append([]string{"--cluster", "create"}, addrs...)
	if _, err := command(ctx, nil, cli, append(args, "--cluster-replicas", "0", "--cluster-yes")...); err != nil {
		return "", err
	}
	for _, addr := range addrs {
		host, port, _ := net.SplitHostPort(addr)
		err := retry(ctx, func() error {
			out, err := command(ctx, nil, cli, "-h", host, "-p", port, "cluster", "info")
			if err == nil && !strings.Contains(out, "cluster_state:ok") {
				err = fmt.Errorf("node %s: cluster not ok yet", addr)
			}
			return err
		})
		if err != nil {
			return "", err
		}
	}
	return strings.Join(addrs, ","), nil
}

// deleteRunKeys deletes, on the user's Redis at addr, every key that
// holds this run's id.
func (e *env) deleteRunKeys(addr string) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return
	}
	cli := e.tools.bin(progRedisCLI)
	ctx := context.Background()
	out, err := command(ctx, nil, cli, "-h", host, "-p", port, "--scan", "--pattern", "*"+e.run+"*")
	if err != nil {
		logf("redis at %s: listing this run's keys: %v", addr, err)
		return
	}
	keys := strings.Fields(out)
	if len(keys) == 0 {
		return
	}
	var script strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&script, "UNLINK %q\n", k)
	}
	cmd := exec.Command(cli, "-h", host, "-p", port)
	cmd.Stdin = strings.NewReader(script.String())
	if b, err := cmd.CombinedOutput(); err != nil {
		logf("redis at %s: deleting this run's keys: %v: %s", addr, err, tail(b, 5))
		return
	}
	logf("redis at %s: deleted this run's %d keys", addr, len(keys))
}

// startPostgres initialises a cluster (fsync off) and starts it. As root
// it runs as the postgres user: Postgres refuses to run as root.
func startPostgres(ctx context.Context, e *env) (string, error) {
	dir, err := e.subdir("postgres")
	if err != nil {
		return "", err
	}
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return "", fmt.Errorf("as root, Postgres runs as the postgres user (which the postgresql package creates): %w", err)
		}
		uid, _ := strconv.ParseUint(u.Uid, 10, 32)
		gid, _ := strconv.ParseUint(u.Gid, 10, 32)
		if err := os.Chown(dir, int(uid), int(gid)); err != nil {
			return "", err
		}
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}
	}
	as := func(cmd *exec.Cmd) *exec.Cmd {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		cmd.Dir = dir
		return cmd
	}
	data := filepath.Join(dir, "data")
	initdb := as(exec.CommandContext(ctx, e.tools.bin(progInitdb), "-D", data, "-U", "postgres", "--auth=trust", "--no-sync", "--no-locale", "-E", "UTF8"))
	if out, err := initdb.CombinedOutput(); err != nil {
		return "", fmt.Errorf("initdb: %v\n%s", err, tail(out, 20))
	}
	port, err := e.port(0)
	if err != nil {
		return "", err
	}
	p, err := e.spawn("postgres", as(exec.Command(e.tools.bin(progPostgres), "-D", data, "-p", strconv.Itoa(port), "-k", dir,
		"-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "max_connections=200")), syscall.SIGINT)
	if err != nil {
		return "", err
	}
	psql := e.tools.bin(progPsql)
	err = p.waitReady(ctx, func(ctx context.Context) error {
		_, err := command(ctx, nil, psql, "-h", "127.0.0.1", "-p", strconv.Itoa(port), "-U", "postgres", "-d", "postgres", "-Atc", "select 1")
		return err
	})
	if err != nil {
		return "", err
	}
	if _, err := command(ctx, nil, psql, "-h", "127.0.0.1", "-p", strconv.Itoa(port), "-U", "postgres", "-d", "postgres", "-c", "CREATE DATABASE test"); err != nil {
		return "", err
	}
	return fmt.Sprintf("postgres://postgres@%s/test?sslmode=disable", hostPort(port)), nil
}

// sharedPostgres creates this run's database on the user's server and
// drops it at the end.
func sharedPostgres(ctx context.Context, e *env, given string) (string, error) {
	u, err := url.Parse(given)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", fmt.Errorf("not a postgres:// URL: %q", redact(given))
	}
	db := "idem_test_" + e.run
	psql := e.tools.bin(progPsql)
	if _, err := command(ctx, nil, psql, given, "-c", "CREATE DATABASE "+db); err != nil {
		return "", err
	}
	e.onClose(func() {
		if _, err := command(context.Background(), nil, psql, given, "-c", "DROP DATABASE IF EXISTS "+db+" WITH (FORCE)"); err != nil {
			logf("postgres: %v", err)
		}
	})
	u.Path = "/" + db
	return u.String(), nil
}

// startMariaDB initialises a data directory and starts mariadbd on it.
func startMariaDB(ctx context.Context, e *env) (string, error) {
	dir, err := e.subdir("mariadb")
	if err != nil {
		return "", err
	}
	data := filepath.Join(dir, "data")
	var asRoot []string
	if os.Geteuid() == 0 {
		asRoot = []string{"--user=root"}
	}
	install := append([]string{"--no-defaults", "--datadir=" + data, "--auth-root-authentication-method=normal",
		"--skip-test-db", "--skip-name-resolve"}, asRoot...)
	if out, err := command(ctx, nil, e.tools.bin(progMariadbInit), install...); err != nil {
		return "", fmt.Errorf("%v\n%s", err, tail([]byte(out), 20))
	}
	port, err := e.port(0)
	if err != nil {
		return "", err
	}
	args := append([]string{"--no-defaults", "--datadir=" + data, "--socket=" + filepath.Join(dir, "mysqld.sock"),
		"--port=" + strconv.Itoa(port), "--bind-address=127.0.0.1", "--pid-file=" + filepath.Join(dir, "mysqld.pid"),
		"--skip-name-resolve", "--character-set-server=utf8mb4", "--collation-server=utf8mb4_general_ci"}, asRoot...)
	p, err := e.spawn("mariadb", exec.Command(e.tools.bin(progMariadbd), args...), syscall.SIGTERM)
	if err != nil {
		return "", err
	}
	client := e.tools.bin(progMariadb)
	err = p.waitReady(ctx, func(ctx context.Context) error {
		_, err := command(ctx, nil, client, "--no-defaults", "-h", "127.0.0.1", "-P", strconv.Itoa(port), "-u", "root",
			"--connect-timeout=2", "-e", "CREATE DATABASE IF NOT EXISTS test")
		return err
	})
	return fmt.Sprintf("root@tcp(%s)/test", hostPort(port)), err
}

// dsnRE splits a go-sql-driver/mysql DSN:
// [user[:password]@][net[(addr)]]/dbname[?params].
var dsnRE = regexp.MustCompile(`^(?:([^:@]*)(?::(.*))?@)?(?:([a-z0-9]+)(?:\((.*)\))?)?/([^?]*)(\?.*)?$`)

// mysqlDSN is a go-sql-driver/mysql DSN, split.
type mysqlDSN struct {
	user, password, network, addr string
	// before and after are the DSN around the database name.
	before, after string
}

func parseMySQLDSN(dsn string) (mysqlDSN, error) {
	m := dsnRE.FindStringSubmatch(dsn)
	if m == nil {
		return mysqlDSN{}, fmt.Errorf("not a go-sql-driver/mysql DSN: %q", redact(dsn))
	}
	return mysqlDSN{user: m[1], password: m[2], network: m[3], addr: m[4],
		before: dsn[:len(dsn)-len(m[5])-len(m[6])], after: m[6]}, nil
}

// withDB is the DSN with another database.
func (d mysqlDSN) withDB(db string) string { return d.before + db + d.after }

// clientArgs are the mariadb client's arguments to connect as the DSN
// does, and its environment (the password).
func (d mysqlDSN) clientArgs() (args, env []string) {
	args = []string{"--no-defaults", "--connect-timeout=5"}
	if d.user != "" {
		args = append(args, "-u", d.user)
	}
	switch {
	case d.network == "unix":
		args = append(args, "--socket="+d.addr)
	case d.addr != "":
		host, port, err := net.SplitHostPort(d.addr)
		if err != nil {
			host, port = d.addr, "3306"
		}
		args = append(args, "-h", host, "-P", port)
	default:
		args = append(args, "-h", "127.0.0.1", "-P", "3306")
	}
	if d.password != "" {
		env = []string{"MYSQL_PWD=" + d.password}
	}
	return args, env
}

// sharedMariaDB creates this run's database on the user's server and
// drops it at the end.
func sharedMariaDB(ctx context.Context, e *env, given string) (string, error) {
	dsn, err := parseMySQLDSN(given)
	if err != nil {
		return "", err
	}
	args, env := dsn.clientArgs()
	db := "idem_test_" + e.run
	client := e.tools.bin(progMariadb)
	if _, err := command(ctx, env, client, append(args, "-e", "CREATE DATABASE "+db)...); err != nil {
		return "", err
	}
	e.onClose(func() {
		if _, err := command(context.Background(), env, client, append(args, "-e", "DROP DATABASE IF EXISTS "+db)...); err != nil {
			logf("mariadb: %v", err)
		}
	})
	return dsn.withDB(db), nil
}

// startRabbitMQ starts an Erlang port mapper and a RabbitMQ node of their
// own, on free ports, with no configuration but the one written here.
func startRabbitMQ(ctx context.Context, e *env) (string, error) {
	dir, err := e.subdir("rabbitmq")
	if err != nil {
		return "", err
	}
	var ports [3]int
	for i := range ports {
		if ports[i], err = e.port(0); err != nil {
			return "", err
		}
	}
	epmdPort, amqpPort, distPort := strconv.Itoa(ports[0]), ports[1], strconv.Itoa(ports[2])
	epmd, err := e.spawn("epmd", exec.Command(e.tools.bin(progEpmd), "-port", epmdPort, "-address", "127.0.0.1"), syscall.SIGTERM)
	if err != nil {
		return "", err
	}
	if err := epmd.waitReady(ctx, dialReady(hostPort(ports[0]), nil)); err != nil {
		return "", err
	}
	files := map[string]string{"rabbitmq-env.conf": "", "rabbitmq.conf": "log.console = true\n", "enabled_plugins": "[].\n"}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			return "", err
		}
	}
	cmd := exec.Command(e.tools.bin(progRabbit))
	cmd.Dir = dir
	cmd.Env = []string{
		"PATH=" + os.Getenv("PATH") + ":/usr/sbin:/sbin",
		"HOME=" + dir, // the Erlang cookie
		"LANG=C.UTF-8",
		"RABBITMQ_CONF_ENV_FILE=" + filepath.Join(dir, "rabbitmq-env.conf"),
		"RABBITMQ_CONFIG_FILE=" + filepath.Join(dir, "rabbitmq.conf"),
		"RABBITMQ_ENABLED_PLUGINS_FILE=" + filepath.Join(dir, "enabled_plugins"),
		"RABBITMQ_MNESIA_BASE=" + filepath.Join(dir, "mnesia"),
		"RABBITMQ_LOG_BASE=" + filepath.Join(dir, "log"),
		"RABBITMQ_PID_FILE=" + filepath.Join(dir, "rabbitmq.pid"),
		// A long name on the loopback address needs no host name lookup
		// (a minimal system may not even have /etc/hosts).
		"RABBITMQ_USE_LONGNAME=true",
		"RABBITMQ_NODENAME=rabbit-" + strconv.Itoa(amqpPort) + "@127.0.0.1",
		"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
		"RABBITMQ_NODE_PORT=" + strconv.Itoa(amqpPort),
		"RABBITMQ_DIST_PORT=" + distPort,
		"RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=-kernel inet_dist_use_interface {127,0,0,1}",
		"ERL_EPMD_PORT=" + epmdPort,
		"ERL_EPMD_ADDRESS=127.0.0.1",
	}
	p, err := e.spawn("rabbitmq", cmd, syscall.SIGTERM)
	if err != nil {
		return "", err
	}
	err = p.waitReady(ctx, dialReady(hostPort(amqpPort), func(c net.Conn) error {
		// The protocol header; the broker answers with connection.start.
		if _, err := c.Write([]byte("AMQP\x00\x00\x09\x01")); err != nil {
			return err
		}
		frame := make([]byte, 7)
		if _, err := io.ReadFull(c, frame); err != nil {
			return err
		}
		if frame[0] != 1 {
			return fmt.Errorf("not an AMQP 0-9-1 broker: frame type %d", frame[0])
		}
		return nil
	}))
	return "amqp://guest:guest@" + hostPort(amqpPort) + "/", err
}
