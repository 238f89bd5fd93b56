package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// The password every case below carries, in one spelling or another.
const secret = "s3cret"

// secretCase is a value of a store flag that holds the secret.
type secretCase struct {
	name string
	// flag is the store flag, given the value on the command line and,
	// in a second run, in its variable.
	flag, value string
	// env is the rest of the environment the case needs (the store, AWS
	// settings).
	env []string
	// want is in the one line idem prints.
	want string
}

// No output of idem holds a password, whatever the store flag that
// carried it, on every path: values that do not parse (the messages that
// quote them), addresses nothing listens on, a server that never
// answers, real servers refusing the password, -h showing the value a
// variable gave, and the JSON and table outputs. The one line of each
// failure says what was wrong with the value, with the password replaced
// by xxxxx.
func TestNoSecretInAnyOutput(t *testing.T) {
	closed := closedPort(t)
	hung := hungServer(t)
	aws := func(extra ...string) []string {
		return append([]string{"IDEM_STORE=dynamodb", "AWS_REGION=us-east-1", "AWS_ACCESS_KEY_ID=test",
			"AWS_SECRET_ACCESS_KEY=" + secret + "-aws", "AWS_SESSION_TOKEN=" + secret + "-session", "AWS_EC2_METADATA_DISABLED=true"}, extra...)
	}
	redisUser := redisACLUser(t, []string{service(t, "REDIS_ADDR")})
	clusterAddrs := service(t, "REDIS_CLUSTER_ADDRS")
	clusterUser := redisACLUser(t, strings.Split(clusterAddrs, ","))
	firstNode, _, _ := strings.Cut(clusterAddrs, ",")
	pgAddr := passwordPostgres(t)
	dsn, err := mysql.ParseDSN(mysqlDSN(t))
	require.NoError(t, err)
	dsn.Passwd = secret
	dynamo := dynamoEnv(t)

	cases := []secretCase{
		// --redis-url
		{"redis: space in the port", "redis-url", "redis://user:" + secret + "@127.0.0.1:63 79/0", nil, `--redis-url "redis://user:xxxxx@127.0.0.1:63 79/0": invalid port`},
		{"redis: no scheme", "redis-url", "user:" + secret + "@127.0.0.1:6379", nil, `has no scheme: want a URL such as "redis://user:xxxxx@127.0.0.1:6379"`},
		{"redis: unclosed IPv6 host", "redis-url", "redis://user:" + secret + "@[::1/0", nil, "missing ']' in host"},
		{"redis: bad escape", "redis-url", "redis://user:" + secret + "%zz@127.0.0.1:6379/0", nil, "invalid URL escape"},
		{"redis: password in the query", "redis-url", "redis://127.0.0.1:6379/0?password=" + secret, nil, "unexpected option: password"},
		{"redis: wrong scheme", "redis-url", "http://user:" + secret + "@127.0.0.1:6379", nil, "want redis://, rediss:// (TLS) or unix://"},
		{"redis: bad database", "redis-url", "redis://user:" + secret + "@127.0.0.1:6379/zero", nil, "invalid database number"},
		{"redis: closed port", "redis-url", "redis://user:" + secret + "@" + closed + "/0", nil, "Redis at " + closed + " does not answer"},
		{"redis: hung server", "redis-url", "redis://user:" + secret + "@" + hung + "/0", nil, "did not answer within"},
		{"redis: wrong password", "redis-url", "redis://" + redisUser + ":" + secret + "@" + service(t, "REDIS_ADDR") + "/0", nil, `answered with an error: "WRONGPASS`},

		// --redis-cluster
		{"cluster: password in an address", "redis-cluster", "user:" + secret + "@127.0.0.1:7000", nil, "give a user and password as a URL"},
		{"cluster: space in the port", "redis-cluster", "redis://user:" + secret + "@127.0.0.1:70 00", nil, "invalid port"},
		{"cluster: closed port", "redis-cluster", "redis://user:" + secret + "@" + closed, nil, "the Redis Cluster at " + closed + " does not answer"},
		{"cluster: hung server", "redis-cluster", "redis://user:" + secret + "@" + hung, nil, "did not answer within"},
		{"cluster: wrong password", "redis-cluster", "redis://" + clusterUser + ":" + secret + "@" + firstNode, nil, `answered with an error: "WRONGPASS`},

		// --pg-url
		{"postgres: space in the port", "pg-url", "postgres://user:" + secret + "@127.0.0.1:54 32/db", nil, `--pg-url "postgres://user:xxxxx@127.0.0.1:54 32/db": failed to parse as URL`},
		{"postgres: no scheme", "pg-url", "user:" + secret + "@127.0.0.1:5432/db", nil, `has no scheme: want a URL such as "postgres://user:xxxxx@127.0.0.1:5432/db"`},
		{"postgres: wrong scheme", "pg-url", "mysql://user:" + secret + "@127.0.0.1/db", nil, "want a postgres:// or postgresql:// URL"},
		{"postgres: bad escape", "pg-url", "postgres://user:" + secret + "%zz@127.0.0.1/db", nil, "--pg-url"},
		{"postgres: password in the query", "pg-url", "postgres://127.0.0.1/db?password=" + secret + "&sslmode=bogus", nil, "sslmode is invalid"},
		{"postgres: bad parameter", "pg-url", "postgres://user:" + secret + "@127.0.0.1/db?connect_timeout=soon", nil, "invalid connect_timeout"},
		{"postgres: keyword/value, bad port", "pg-url", "host=127.0.0.1 port=x password=" + secret, nil, `"host=127.0.0.1 port=x password=xxxxx": invalid port`},
		{"postgres: keyword/value, open quote", "pg-url", "host=127.0.0.1 password='" + secret + " and more", nil, "unterminated quoted string"},
		{"postgres: closed port", "pg-url", "postgres://user:" + secret + "@" + closed + "/db", nil, "does not answer"},
		{"postgres: keyword/value, closed port", "pg-url", "host=127.0.0.1 port=" + portOf(closed) + " user=idem password=" + secret, nil, "does not answer"},
		{"postgres: hung server", "pg-url", "postgres://user:" + secret + "@" + hung + "/db", nil, "did not answer within"},
		{"postgres: wrong password", "pg-url", "postgres://postgres:" + secret + "@" + pgAddr + "/postgres?sslmode=disable", nil, "password authentication failed"},

		// --mysql-dsn
		{"mysql: unclosed address", "mysql-dsn", "app:" + secret + "@tcp(127.0.0.1:3306", nil, `--mysql-dsn "app:xxxxx@tcp(127.0.0.1:3306": invalid DSN`},
		{"mysql: a URL", "mysql-dsn", "mysql://app:" + secret + "@127.0.0.1:3306/db", nil, `the driver takes a DSN, user:password@tcp(host:3306)/db: here "app:xxxxx@tcp(127.0.0.1:3306)/db"`},
		{"mysql: address outside tcp()", "mysql-dsn", "app:" + secret + "@127.0.0.1:3306/db", nil, `the address goes in tcp(...): "app:xxxxx@tcp(127.0.0.1:3306)/db"`},
		{"mysql: bad parameter", "mysql-dsn", "app:" + secret + "@tcp(127.0.0.1:3306)/db?timeout=soon", nil, "invalid duration"},
		{"mysql: no address", "mysql-dsn", "app:" + secret + "/db", nil, "--mysql-dsn"},
		{"mysql: closed port", "mysql-dsn", "app:" + secret + "@tcp(" + closed + ")/db", nil, "does not answer"},
		{"mysql: hung server", "mysql-dsn", "app:" + secret + "@tcp(" + hung + ")/db", nil, "did not answer within"},
		{"mysql: wrong password", "mysql-dsn", dsn.FormatDSN(), nil, `answered with an error: "Error 1045`},

		// --dynamo-endpoint, and the AWS secrets of the environment
		{"dynamodb: no scheme", "dynamo-endpoint", "user:" + secret + "@127.0.0.1:8000", aws(), `has no scheme: want a URL such as "http://user:xxxxx@127.0.0.1:8000"`},
		{"dynamodb: space in the port", "dynamo-endpoint", "http://user:" + secret + "@127.0.0.1:80 00", aws(), "invalid port"},
		{"dynamodb: wrong scheme", "dynamo-endpoint", "ftp://user:" + secret + "@127.0.0.1", aws(), "want http://host:port"},
		{"dynamodb: closed port", "dynamo-endpoint", "http://user:" + secret + "@" + closed, aws(), "DynamoDB at http://user:xxxxx@" + closed},
		{"dynamodb: hung server", "dynamo-endpoint", "http://user:" + secret + "@" + hung, aws(), "did not answer within"},
		{"dynamodb: a real server", "dynamo-endpoint", strings.Replace(strings.TrimPrefix(dynamo[1], "IDEM_DYNAMO_ENDPOINT="), "http://", "http://user:"+secret+"@", 1), aws(dynamo[2]), "has no table"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// The servers that answer get the time a loaded machine needs;
			// one that never answers holds each run for --timeout, and the
			// AWS SDK retries a refused connection for seconds: those run
			// one command.
			hung := strings.Contains(c.name, "hung")
			env := append(append(noStore, c.env...), "IDEM_TIMEOUT=30s")
			if hung {
				env = append(env, "IDEM_TIMEOUT=2s")
			}
			runs := [][]string{{"stats", "--" + c.flag, c.value}}
			if !hung && c.name != "dynamodb: closed port" {
				runs = append(runs, []string{"list", "-o", "json", "--" + c.flag, c.value}, []string{"inspect", "charge:k", "--" + c.flag, c.value})
			}
			for _, args := range runs {
				r := idem(t, env, "", args...)
				requireNoSecret(t, r, args)
				require.Equal(t, exitError, r.code, "idem %v: %s%s", args[:len(args)-2], r.stdout, r.stderr)
				requireOneLine(t, r.stderr)
				require.Contains(t, r.stderr, c.want)
			}
			// The same value from the variable.
			if !hung {
				r := idem(t, append(env, envVar(c.flag)+"="+c.value), "", "stats")
				requireNoSecret(t, r, []string{"stats", "(" + envVar(c.flag) + ")"})
				require.Equal(t, exitError, r.code)
				require.Contains(t, r.stderr, c.want)
			}
			// -h shows the variable's value, redacted.
			r := idem(t, append(env, envVar(c.flag)+"="+c.value), "", "stats", "-h")
			requireNoSecret(t, r, []string{"stats", "-h"})
			require.Equal(t, exitOK, r.code)
			require.Contains(t, r.stderr, "(default "+strconv.Quote(redactValue(c.flag, c.value))+")")
		})
	}

	// A value whose password a library would print decoded: percent-
	// encoded in the URL, quoted in keyword/value form.
	for _, c := range []struct{ flag, value, hide string }{
		{"redis-url", "redis://user:s3%63ret@127.0.0.1:63 79/0", secret},
		{"pg-url", "postgres://user:s3%63ret@" + closed + "/db", secret},
		{"pg-url", `host=127.0.0.1 port=` + portOf(closed) + ` password='s3\'cret'`, `s3'cret`},
	} {
		r := idem(t, append(noStore, "IDEM_TIMEOUT=30s"), "", "stats", "--"+c.flag, c.value)
		require.Equal(t, exitError, r.code)
		require.NotContains(t, r.stdout+r.stderr, c.hide, "%s %s", c.flag, c.value)
		require.NotContains(t, r.stdout+r.stderr, "s3%63ret")
		requireOneLine(t, r.stderr)
	}

	// Commands that succeed print records, never the flags: a real store
	// reached with a password in its URL.
	t.Run("outputs of a working store", func(t *testing.T) {
		env := append(noStore, "IDEM_STORE=redis", "IDEM_REDIS_URL=redis://"+redisUser+":right-"+secret+"@"+service(t, "REDIS_ADDR")+"/0",
			"IDEM_REDIS_PREFIX="+unique("idem-secrets-"))
		for _, args := range [][]string{
			{"complete", "charge:k", "--create"}, {"complete", "charge:k", "--create", "-o", "json"},
			{"inspect", "charge:k"}, {"inspect", "charge:k", "-o", "json"},
			{"list"}, {"list", "-o", "json"}, {"stats"}, {"stats", "--namespace", "charg"},
			{"delete", "charge:k", "-o", "json"}, {"inspect", "charge:k"},
		} {
			r := idem(t, env, "", args...)
			requireNoSecret(t, r, args)
		}
	})
}

// requireNoSecret fails the test if the output holds the secret.
func requireNoSecret(t *testing.T, r result, args []string) {
	t.Helper()
	for _, out := range []string{r.stdout, r.stderr} {
		require.NotContains(t, out, secret, "idem %v printed the password:\n%s", args, out)
	}
}

// redisACLUser creates a Redis user on each server at addrs, whose
// password is "right-" + secret, deleted when the test ends, and returns
// its name.
func redisACLUser(t *testing.T, addrs []string) string {
	t.Helper()
	name := strings.TrimSuffix(unique("idem-user-"), ":")
	ctx := context.Background()
	for _, addr := range addrs {
		c := redis.NewClient(&redis.Options{Addr: addr})
		t.Cleanup(func() { c.Close() })
		require.NoError(t, c.Do(ctx, "ACL", "SETUSER", name, "on", ">right-"+secret, "~*", "&*", "+@all").Err())
		t.Cleanup(func() { c.Do(context.Background(), "ACL", "DELUSER", name) })
	}
	return name
}

// portOf is the port of a host:port address.
func portOf(addr string) string {
	_, port, _ := net.SplitHostPort(addr)
	return port
}

// passwordPostgres starts a private Postgres that checks passwords (the
// tests' own trusts every connection), with the user postgres, whose
// password is "right-" + secret, and returns its address. It needs
// initdb and pg_ctl on PATH, where make test puts them; as root it runs
// the server as the postgres user.
func passwordPostgres(t *testing.T) string {
	t.Helper()
	for _, bin := range []string{"initdb", "pg_ctl"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Fatalf("%s is not installed (PostgreSQL server programs; make test puts them on PATH): %v", bin, err)
		}
	}
	base, err := os.MkdirTemp("", "idem-pg-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(base) })
	pwfile := filepath.Join(base, "pw")
	require.NoError(t, os.WriteFile(pwfile, []byte("right-"+secret+"\n"), 0o644))
	asPostgres := func(bin string, args ...string) *exec.Cmd { return exec.Command(bin, args...) }
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		require.NoError(t, err, "running as root needs a postgres user")
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		require.NoError(t, os.Chown(base, uid, gid))
		require.NoError(t, os.Chown(pwfile, uid, gid))
		asPostgres = func(bin string, args ...string) *exec.Cmd {
			return exec.Command("runuser", append([]string{"-u", "postgres", "--", bin}, args...)...)
		}
	}
	data := filepath.Join(base, "data")
	if out, err := asPostgres("initdb", "--auth=scram-sha-256", "--pwfile="+pwfile, "--no-sync", "-U", "postgres", "-D", data).CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	addr := closedPort(t)
	opts := fmt.Sprintf("-p %s -k %s -c fsync=off -c listen_addresses=127.0.0.1", portOf(addr), base)
	logFile := filepath.Join(base, "log")
	if out, err := asPostgres("pg_ctl", "-w", "-t", "120", "-D", data, "-o", opts, "-l", logFile, "start").CombinedOutput(); err != nil {
		log, _ := os.ReadFile(logFile)
		t.Fatalf("pg_ctl start: %v\n%s\n%s", err, out, log)
	}
	t.Cleanup(func() { _ = asPostgres("pg_ctl", "-w", "-D", data, "-m", "immediate", "stop").Run() })
	// The right password works: a wrong one is refused for being wrong.
	r := idem(t, append(noStore, "IDEM_TIMEOUT=30s"), "", "pg", "migrate",
		"--pg-url", "postgres://postgres:right-"+secret+"@"+addr+"/postgres?sslmode=disable")
	require.Equal(t, exitOK, r.code, r.stderr)
	return addr
}

// redactValue replaces the password of every form of value a secret flag
// takes, parsed or not, and leaves the rest as it is.
func TestRedactValue(t *testing.T) {
	for _, c := range []struct{ flag, value, want string }{
		{"redis-url", "redis://u:p@h:6379/0", "redis://u:xxxxx@h:6379/0"},
		{"redis-url", "redis://:p@h:6379/0", "redis://:xxxxx@h:6379/0"},
		{"redis-url", "redis://u@h:6379/0", "redis://u@h:6379/0"},
		{"redis-url", "redis://h:6379/0", "redis://h:6379/0"},
		{"redis-url", "127.0.0.1:6379", "127.0.0.1:6379"},
		{"redis-url", "u:p@h:6379", "u:xxxxx@h:6379"},
		{"redis-url", "redis://u:p@ss:w/rd@h:6379", "redis://u:xxxxx@h:6379"},
		{"redis-url", "redis://u:p@h:63 79/0", "redis://u:xxxxx@h:63 79/0"},
		{"redis-cluster", "h1:7000,h2:7001", "h1:7000,h2:7001"},
		{"redis-cluster", "redis://u:p@h1:7000?addr=h2:7001", "redis://u:xxxxx@h1:7000?addr=h2:7001"},
		{"pg-url", "postgres://h/db?password=p&sslmode=disable", "postgres://h/db?password=xxxxx&sslmode=disable"},
		{"pg-url", "postgres://h/db?sslpassword=p", "postgres://h/db?sslpassword=xxxxx"},
		{"pg-url", "host=h password=p user=u", "host=h password=xxxxx user=u"},
		{"pg-url", "host=h password = 'a b\\'c' user=u", "host=h password = xxxxx user=u"},
		{"pg-url", "host=h password='a b", "host=h password=xxxxx"},
		{"pg-url", "host=h dbname=passwords", "host=h dbname=passwords"},
		{"mysql-dsn", "app:p@tcp(h:3306)/db", "app:xxxxx@tcp(h:3306)/db"},
		{"mysql-dsn", "app:p@tcp(h:3306)/db?tls=true", "app:xxxxx@tcp(h:3306)/db?tls=true"},
		{"mysql-dsn", "app@tcp(h:3306)/db", "app@tcp(h:3306)/db"},
		{"mysql-dsn", "tcp(h:3306)/db", "tcp(h:3306)/db"},
		{"mysql-dsn", "app:p/db", "app:xxxxx/db"},
		{"dynamo-endpoint", "http://127.0.0.1:8000", "http://127.0.0.1:8000"},
		{"dynamo-endpoint", "http://u:p@127.0.0.1:8000", "http://u:xxxxx@127.0.0.1:8000"},
		{"redis-prefix", "a:b@c", "a:b@c"},
	} {
		require.Equal(t, c.want, redactValue(c.flag, c.value), "--%s %s", c.flag, c.value)
	}
}
