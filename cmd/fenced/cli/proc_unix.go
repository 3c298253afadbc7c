//go:build unix

package cli

import (
	"os"
	"syscall"
)

func stopProcess(p *os.Process) error { return p.Signal(syscall.SIGSTOP) }

func contProcess(p *os.Process) error { return p.Signal(syscall.SIGCONT) }

// commandProcAttr puts a command run under a lease in a process group of its own, so that
// losing the lease stops its children too; on Linux it also dies with fenced.
func commandProcAttr() *syscall.SysProcAttr {
	return withDeathSignal(&syscall.SysProcAttr{Setpgid: true})
}

// signalGroup signals p's process group.
func signalGroup(p *os.Process, sig syscall.Signal) error { return syscall.Kill(-p.Pid, sig) }
