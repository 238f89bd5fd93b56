package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clockTick is the unit of the CPU times in /proc/<pid>/stat (USER_HZ,
// 100 on Linux).
const clockTick = 10 * time.Millisecond

// serverCPU measures the CPU time a MySQL or MariaDB server on this
// machine spends: one process, every thread of it.
type serverCPU struct{ pid int }

// findServer returns the measure of the server behind db, or an error if
// its process is not visible here (another machine, a container).
func findServer(ctx context.Context, db *sql.DB) (serverCPU, error) {
	var file string
	if err := db.QueryRowContext(ctx, "SELECT @@pid_file").Scan(&file); err != nil {
		return serverCPU{}, err
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return serverCPU{}, fmt.Errorf("the server's pid file is not readable from here: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return serverCPU{}, fmt.Errorf("pid file %s: %w", file, err)
	}
	s := serverCPU{pid: pid}
	_, err = s.used()
	return s, err
}

// used returns the CPU time, user and system, the server has used so far.
func (s serverCPU) used() (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", s.pid))
	if err != nil {
		return 0, err
	}
	st := string(b)
	i := strings.LastIndexByte(st, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: %q", s.pid, st)
	}
	f := strings.Fields(st[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %q", s.pid, st)
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * clockTick, nil
}

// selfCPU returns the CPU time this process has used so far: the Go
// client's.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
