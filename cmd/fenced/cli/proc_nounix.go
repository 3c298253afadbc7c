//go:build !unix

package cli

import (
	"errors"
	"os"
)

var errNoSIGSTOP = errors.New("this system cannot suspend a process with SIGSTOP; run the demo on Linux or macOS")

func stopProcess(*os.Process) error { return errNoSIGSTOP }

func contProcess(*os.Process) error { return errNoSIGSTOP }
