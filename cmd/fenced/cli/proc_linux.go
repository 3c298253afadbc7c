package cli

import (
	"errors"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// workerProcAttr has the kernel kill a demo worker if the demo itself dies without cleaning
// up (kill -9), so that no worker outlives it.
func workerProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// withDeathSignal has the kernel kill a command run under a lease if fenced dies without
// stopping it (kill -9). SIGKILL rather than SIGTERM: once fenced is gone nobody watches the
// trust window or sends SIGKILL after the grace, so a command that ignored SIGTERM would run
// on past the lease. The signal reaches the command's first process only, not its children.
func withDeathSignal(a *syscall.SysProcAttr) *syscall.SysProcAttr {
	a.Pdeathsig = syscall.SIGKILL
	return a
}

// waitExit waits until p has exited without reaping it (WNOWAIT), so that its pid stays
// taken; it reports false if it could not wait.
func waitExit(p *os.Process) bool {
	for {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_PID, p.Pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if !errors.Is(err, unix.EINTR) {
			return err == nil
		}
	}
}
