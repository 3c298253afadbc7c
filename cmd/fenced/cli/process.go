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
// terminal or ssh session (SIGHUP) must not leave a command running unwatched. SIGHUP is left
// alone when the process started with it ignored (nohup): asking for it would undo that. The
// fenced binary's main is this call alone; the package's tests run their own binary through it
// as the fenced command.
func Process() int {
	sigs := []os.Signal{os.Interrupt, syscall.SIGTERM}
	if !signal.Ignored(syscall.SIGHUP) {
		sigs = append(sigs, syscall.SIGHUP)
	}
	ctx, stop := signal.NotifyContext(context.Background(), sigs...)
	defer stop()
	return Main(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
}
