package cli

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

// Process runs the fenced command as this process (os.Args, the standard streams) and returns
// its exit code. SIGINT, SIGTERM and SIGHUP cancel the context rather than kill the process, so
// that run, the demo and torture can stop the processes they started before exiting: a closed
// terminal or ssh session (SIGHUP) must not leave a command running unwatched. The fenced binary's main is
// this call alone; the package's tests run their own binary through it as the fenced command.
func Process() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	return Main(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
}
