//go:build !linux

package gatetest

import (
	"errors"
	"time"
)

var errNoProc = errors.New("gatetest: CPU time per thread is read from /proc, on Linux only")

func ThreadCPU(pid, tid int) (time.Duration, error) { return 0, errNoProc }

func Threads(pid int) (map[int]time.Duration, error) { return nil, errNoProc }

func selfCPU() time.Duration { return 0 }
