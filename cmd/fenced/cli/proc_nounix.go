//go:build !unix

package cli

import (
	"errors"
	"os"
	"syscall"
)

var errNoSIGSTOP = errors.New("this system cannot suspend a process with SIGSTOP; run the demo on Linux or macOS")

func stopProcess(*os.Process) error { return errNoSIGSTOP }

func contProcess(*os.Process) error { return errNoSIGSTOP }

func commandProcAttr() *syscall.SysProcAttr { return nil }

// signalGroup: without process groups, the command itself is killed.
func signalGroup(p *os.Process, _ syscall.Signal) error { return p.Kill() }
