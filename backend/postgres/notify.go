package postgres

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/fenced-dev/fenced/driver"
)

var _ driver.ReleaseNotifier = (*Driver)(nil)

// sqlListen subscribes to the notifications migration 0003's trigger sends when a lease is
// freed; sqlSchema names the schema whose notifications are this store's.
const (
	sqlListen = `LISTEN fenced_release`
	sqlSchema = `SELECT current_schema()`
)

// listener holds one connection of its own (outside the pool, so that it never takes a
// pool's last connection) that LISTENs for freed leases and hands each to the subscribers of
// that resource. It starts with the first subscription and stops when the driver is closed or
// the connection fails; the next subscription starts it again.
type listener struct {
	subs    driver.Subscribers
	mu      sync.Mutex
	running bool
	cancel  context.CancelFunc
	done    chan struct{}
	pid     uint32 // the listening session's, for tests
}

// NotifyReleased subscribes to the freeing of resource's lease (see driver.ReleaseNotifier).
func (d *Driver) NotifyReleased(ctx context.Context, resource string) (<-chan struct{}, func(), error) {
	l := &d.listen
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.running {
		if err := d.startListening(ctx); err != nil {
			return nil, nil, err
		}
	}
	ch, stop := l.subs.Add(resource)
	return ch, stop, nil
}

// startListening connects, LISTENs and starts the loop. l.mu is held.
func (d *Driver) startListening(ctx context.Context) error {
	conn, err := pgx.ConnectConfig(ctx, d.pool.Config().ConnConfig.Copy())
	if err != nil {
		return fmt.Errorf("listen for freed leases: %w", classify(err))
	}
	var schema string
	err = conn.QueryRow(ctx, sqlSchema).Scan(&schema)
	if err == nil {
		_, err = conn.Exec(ctx, sqlListen)
	}
	if err != nil {
		_ = conn.Close(context.WithoutCancel(ctx))
		return fmt.Errorf("listen for freed leases: %w", classify(err))
	}
	lctx, cancel := context.WithCancel(context.Background())
	l := &d.listen
	l.running, l.cancel, l.done, l.pid = true, cancel, make(chan struct{}), conn.PgConn().PID()
	go d.listenLoop(lctx, conn, schema, l.done)
	return nil
}

func (d *Driver) listenLoop(ctx context.Context, conn *pgx.Conn, schema string, done chan struct{}) {
	defer close(done)
	defer func() { _ = conn.Close(context.Background()) }()
	l := &d.listen
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			// Closed, or the connection failed: wake everyone so that nobody waits for a
			// signal that cannot come, and let the next subscription start again.
			l.mu.Lock()
			l.running = false
			l.mu.Unlock()
			l.subs.SignalAll()
			return
		}
		s, resource, ok := strings.Cut(n.Payload, "\n")
		if !ok || s != schema {
			continue // another schema's store in the same database
		}
		l.subs.Signal(resource)
	}
}

// stopListening ends the loop and waits for it.
func (d *Driver) stopListening() {
	l := &d.listen
	l.mu.Lock()
	cancel, done := l.cancel, l.done
	l.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}
