//go:build !linux

package cli

import "syscall"

// workerProcAttr: outside Linux there is no parent-death signal; the demo's cleanup on every
// exit path is what stops the workers.
func workerProcAttr() *syscall.SysProcAttr { return nil }
