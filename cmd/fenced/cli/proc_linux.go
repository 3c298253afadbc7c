package cli

import "syscall"

// workerProcAttr has the kernel kill a demo worker if the demo itself dies without cleaning
// up (kill -9), so that no worker outlives it.
func workerProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
