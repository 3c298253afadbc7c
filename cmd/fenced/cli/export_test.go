package cli

import (
	"context"

	"github.com/fenced-dev/fenced/backend/redis"
	"github.com/fenced-dev/fenced/cmd/fenced/torture"
	"github.com/fenced-dev/fenced/driver"
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

// RestoreLostCopy takes the restore fault's copy of resources on a SQL store (its tables named
// after runID), drops the copy's tables and restores it through the nemesis's recording to
// rec, as the restore fault does: the restore fails before its commit. It returns that error.
func RestoreLostCopy(ctx context.Context, drv driver.Driver, runID string, resources []string, rec *torture.Recorder) error {
	c, err := newStoreCopy(drv, runID, resources, "", "", "")
	if err != nil {
		return err
	}
	if _, err := c.take(ctx); err != nil {
		return err
	}
	c.drop(ctx)
	t := &tortureRun{nem: rec, resources: resources}
	return t.nemesisOps(func(string) torture.Record { return torture.Record{Op: torture.OpRestore} },
		func() error { return c.restore(ctx) },
		func(string) torture.Record { return torture.Record{Out: torture.OutOK} })
}
