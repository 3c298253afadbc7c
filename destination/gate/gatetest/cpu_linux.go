package gatetest

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ThreadCPU is the CPU time the kernel has counted for thread tid of process pid (the first
// field of /proc/PID/task/TID/schedstat, in nanoseconds): a database server's time for one
// connection, when the connection has a process (PostgreSQL) or a thread (MariaDB's
// one-thread-per-connection) of its own.
func ThreadCPU(pid, tid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/schedstat", pid, tid))
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, fmt.Errorf("schedstat of %d/%d: empty", pid, tid)
	}
	ns, err := strconv.ParseInt(f[0], 10, 64)
	return time.Duration(ns), err
}

// Threads returns the CPU time of each thread of process pid.
func Threads(pid int) (map[int]time.Duration, error) {
	dirs, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*", pid))
	if err != nil {
		return nil, err
	}
	m := map[int]time.Duration{}
	for _, d := range dirs {
		tid, err := strconv.Atoi(filepath.Base(d))
		if err != nil {
			continue
		}
		if cpu, err := ThreadCPU(pid, tid); err == nil {
			m[tid] = cpu
		}
	}
	return m, nil
}

// selfCPU is this process's CPU time, user and system.
func selfCPU() time.Duration {
	var u syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &u) != nil {
		return 0
	}
	return time.Duration(u.Utime.Nano() + u.Stime.Nano())
}
