// Command fenced provisions, leases, publishes and reads fenced resources from the shell, and
// shows with `fenced demo` why a lock alone does not protect a write. See `fenced help`.
package main

import (
	"os"

	"github.com/fenced-dev/fenced/cmd/fenced/cli"
)

func main() {
	os.Exit(cli.Process())
}
