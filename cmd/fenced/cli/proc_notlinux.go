//go:build !linux

package cli

import (
	"os"
	"syscall"
)

// workerProcAttr: outside Linux there is no parent-death signal; the demo's cleanup on every
// exit path is what stops the workers.
func workerProcAttr() *syscall.SysProcAttr { return nil }

// withDeathSignal: outside Linux there is no parent-death signal; a command outlives a fenced
// killed with kill -9.
func withDeathSignal(a *syscall.SysProcAttr) *syscall.SysProcAttr { return a }

// waitExit: outside Linux the command is reaped by Wait as soon as it exits.
func waitExit(*os.Process) bool { return false }
