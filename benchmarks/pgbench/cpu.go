package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// clockTick is the unit of the CPU times in /proc/<pid>/stat (USER_HZ,
// 100 on Linux).
const clockTick = 10 * time.Millisecond

// serverCPU measures the CPU time a Postgres server on this machine
// spends: its postmaster's and every child's (backends, WAL writer,
// autovacuum...), the exited children's included, which the postmaster's
// cutime and cstime count once it has reaped them.
type serverCPU struct{ postmaster int }

// findServer returns the measure of the server behind pool, or an error
// if the server's processes are not visible here (another machine, a
// container).
func findServer(ctx context.Context, pool *pgxpool.Pool) (serverCPU, error) {
	var backend int
	if err := pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&backend); err != nil {
		return serverCPU{}, err
	}
	f, err := procStat(backend)
	if err != nil {
		return serverCPU{}, fmt.Errorf("the server's processes are not visible from here: %w", err)
	}
	ppid, err := strconv.Atoi(f[1])
	if err != nil {
		return serverCPU{}, err
	}
	return serverCPU{postmaster: ppid}, nil
}

// used returns the CPU time the server has used so far: user and system,
// of the postmaster and its children, live and exited. A child is counted
// live or, once reaped, in the postmaster's cutime, never both, so the
// difference of two readings is the CPU spent between them.
func (s serverCPU) used() (time.Duration, error) {
	f, err := procStat(s.postmaster)
	if err != nil {
		return 0, err
	}
	total := ticks(f, 11, 12, 13, 14) // utime, stime, cutime, cstime
	dirs, err := filepath.Glob("/proc/[0-9]*")
	if err != nil {
		return 0, err
	}
	want := strconv.Itoa(s.postmaster)
	for _, d := range dirs {
		pid, _ := strconv.Atoi(filepath.Base(d))
		f, err := procStat(pid)
		if err != nil || f[1] != want {
			continue // gone meanwhile, or not the server's
		}
		total += ticks(f, 11, 12)
	}
	return time.Duration(total) * clockTick, nil
}

// procStat returns the fields of /proc/<pid>/stat after the command name:
// the third field (state) first.
func procStat(pid int) ([]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil, fmt.Errorf("/proc/%d/stat: %q", pid, s)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 15 {
		return nil, fmt.Errorf("/proc/%d/stat: %q", pid, s)
	}
	return f, nil
}

func ticks(f []string, idx ...int) int64 {
	var n int64
	for _, i := range idx {
		v, _ := strconv.ParseInt(f[i], 10, 64)
		n += v
	}
	return n
}

// selfCPU returns the CPU time this process has used so far: the Go
// client's, for our runs.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
