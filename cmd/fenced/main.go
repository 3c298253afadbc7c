// Command fenced provisions, leases, publishes and reads fenced resources from the shell, and
// shows with `fenced demo` why a lock alone does not protect a write. See `fenced help`.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/fenced-dev/fenced/cmd/fenced/cli"
)

func main() {
	// A signal cancels the context rather than killing the process, so that the demo can stop
	// its worker processes before exiting.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Main(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
