package cli

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

// Process runs the fenced command as this process (os.Args, the standard streams) and returns
// its exit code. SIGINT and SIGTERM cancel the context rather than kill the process, so that the
// demo and torture can stop their worker processes before exiting. The fenced binary's main is
// this call alone; the package's tests run their own binary through it as the fenced command.
func Process() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return Main(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
}
