package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// A meter reads the CPU time a process, or a server, has used so far.
type meter func(ctx context.Context) (time.Duration, error)

// selfCPU is this process's user and system time (getrusage).
func selfCPU(context.Context) (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, err
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}

// redisCPU is the Redis server's user and system time, all its threads,
// from INFO cpu (microsecond resolution).
func redisCPU(client *redis.Client) meter {
	return func(ctx context.Context) (time.Duration, error) {
		info, err := client.Info(ctx, "cpu").Result()
		if err != nil {
			return 0, err
		}
		var total float64
		found := 0
		for line := range strings.SplitSeq(info, "\n") {
			name, value, ok := strings.Cut(strings.TrimSpace(line), ":")
			if !ok || (name != "used_cpu_user" && name != "used_cpu_sys") {
				continue
			}
			v, err := strconv.ParseFloat(value, 64)
			if err != nil {
				return 0, fmt.Errorf("INFO cpu: %s: %w", line, err)
			}
			total += v
			found++
		}
		if found != 2 {
			return 0, errors.New("INFO cpu: no used_cpu_user and used_cpu_sys")
		}
		return time.Duration(total * float64(time.Second)), nil
	}
}

// clockTick is the unit of the times in /proc/<pid>/stat: USER_HZ, 100 on
// every Linux architecture Go supports.
const clockTick = 10 * time.Millisecond

// procStat is what e2ebench reads of /proc/<pid>/stat.
type procStat struct {
	ppid int
	// cpu is the process's user and system time, with that of its
	// children it has waited for (cutime, cstime): a Postgres backend
	// that ends during a run leaves its time in the postmaster's.
	cpu time.Duration
}

func readProcStat(pid int) (procStat, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return procStat{}, err
	}
	// pid (comm) state ppid ... utime stime cutime cstime: fields 4 and
	// 14 to 17; comm may hold spaces and parentheses.
	end := strings.LastIndexByte(string(b), ')')
	if end < 0 {
		return procStat{}, fmt.Errorf("/proc/%d/stat: no command", pid)
	}
	f := strings.Fields(string(b[end+1:]))
	if len(f) < 15 {
		return procStat{}, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	var n [5]int64
	for i, field := range []int{1, 11, 12, 13, 14} {
		if n[i], err = strconv.ParseInt(f[field], 10, 64); err != nil {
			return procStat{}, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
	}
	return procStat{ppid: int(n[0]), cpu: time.Duration(n[1]+n[2]+n[3]+n[4]) * clockTick}, nil
}

// treeCPU is the CPU time of the process root and of its children: a
// Postgres server is its postmaster and the processes it forks (backends,
// background workers); MariaDB is one process.
func treeCPU(root int) meter {
	return func(context.Context) (time.Duration, error) {
		st, err := readProcStat(root)
		if err != nil {
			return 0, fmt.Errorf("server process %d: %w", root, err)
		}
		total := st.cpu
		entries, err := os.ReadDir("/proc")
		if err != nil {
			return 0, err
		}
		for _, e := range entries {
			pid, err := strconv.Atoi(e.Name())
			if err != nil || pid == root {
				continue
			}
			st, err := readProcStat(pid)
			if err != nil || st.ppid != root {
				continue // gone meanwhile, or not a child
			}
			total += st.cpu
		}
		return total, nil
	}
}

// postgresCPU finds the Postgres server behind url on this machine: the
// server names the process serving this connection (pg_backend_pid), which
// must be a "postgres" process whose title carries this connection's
// client port, and its parent is the postmaster.
func postgresCPU(ctx context.Context, url string) (meter, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	var backend int
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		return nil, err
	}
	title, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(backend), "cmdline"))
	if err != nil {
		return nil, fmt.Errorf("its process %d is not on this machine: %w", backend, err)
	}
	if !strings.HasPrefix(string(title), "postgres: ") {
		return nil, fmt.Errorf("process %d is not a Postgres backend on this machine (%q)", backend, title)
	}
	if addr, ok := conn.PgConn().Conn().LocalAddr().(*net.TCPAddr); ok && !strings.Contains(string(title), fmt.Sprintf("(%d)", addr.Port)) {
		return nil, fmt.Errorf("process %d serves another connection (%q), not this one from port %d", backend, title, addr.Port)
	}
	st, err := readProcStat(backend)
	if err != nil {
		return nil, err
	}
	return treeCPU(st.ppid), nil
}

// mariadbCPU finds the MariaDB or MySQL server behind db on this machine:
// the process in the server's pid file, whose working directory is the
// server's data directory.
func mariadbCPU(ctx context.Context, db *sql.DB) (meter, error) {
	var pidFile, dataDir string
	if err := db.QueryRowContext(ctx, "SELECT @@pid_file, @@datadir").Scan(&pidFile, &dataDir); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return nil, fmt.Errorf("its pid file is not on this machine: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return nil, fmt.Errorf("pid file %s: %w", pidFile, err)
	}
	cwd, err := os.Readlink(filepath.Join("/proc", strconv.Itoa(pid), "cwd"))
	if err != nil {
		return nil, fmt.Errorf("process %d: %w", pid, err)
	}
	if filepath.Clean(cwd) != filepath.Clean(dataDir) {
		return nil, fmt.Errorf("process %d runs in %s, not in the server's data directory %s", pid, cwd, dataDir)
	}
	return treeCPU(pid), nil
}

// commandStats are Redis's commands: calls and the time spent executing
// them (INFO commandstats's usec, which leaves out reading the request
// and writing the reply), by command name.
type commandStats map[string]commandStat

type commandStat struct {
	calls int64
	exec  time.Duration
}

// redisCommands reads INFO commandstats.
func redisCommands(ctx context.Context, client *redis.Client) (commandStats, error) {
	info, err := client.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, err
	}
	stats := commandStats{}
	for line := range strings.SplitSeq(info, "\n") {
		// cmdstat_evalsha:calls=3,usec=40,usec_per_call=13.33,...
		name, fields, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		var st commandStat
		for field := range strings.SplitSeq(fields, ",") {
			k, v, _ := strings.Cut(field, "=")
			n, err := strconv.ParseInt(v, 10, 64)
			switch {
			case k != "calls" && k != "usec":
				continue
			case err != nil:
				return nil, fmt.Errorf("INFO commandstats: %s: %w", line, err)
			case k == "calls":
				st.calls = n
			default:
				st.exec = time.Duration(n) * time.Microsecond
			}
		}
		stats[strings.ToUpper(strings.TrimPrefix(name, "cmdstat_"))] = st
	}
	return stats, nil
}

// minus is what ran since before.
func (c commandStats) minus(before commandStats) commandStats {
	d := commandStats{}
	for name, st := range c {
		b := before[name]
		if st.calls > b.calls {
			d[name] = commandStat{calls: st.calls - b.calls, exec: st.exec - b.exec}
		}
	}
	return d
}
