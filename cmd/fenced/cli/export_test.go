package cli

import (
	"context"

	"github.com/fenced-dev/fenced/backend/redis"
	"github.com/fenced-dev/fenced/cmd/fenced/torture"
)

// SetServeHooks installs the service's test hooks until the returned function is called.
func SetServeHooks(connActive, shutdown func()) (restore func()) {
	old := serveHooks
	serveHooks.connActive, serveHooks.shutdown = connActive, shutdown
	return func() { serveHooks = old }
}

// RedisCopyStates takes the restore fault's copy of resources on a Redis store and returns
// what it holds for each.
func RedisCopyStates(ctx context.Context, d *redis.Driver, resources []string) (map[string]torture.State, error) {
	return (&redisCopy{d: d, resources: resources}).take(ctx)
}
