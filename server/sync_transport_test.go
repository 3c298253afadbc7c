package server_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced-dev/fenced/backend/remote"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/driver/drivertest"
)

// The remote driver's SyncTransport (remote.Options) and the service's loop
// (Options.SyncConnections) must keep every promise of net/http's transport and server: the
// whole suite through a service, the lost reply included.
func TestConformanceThroughServiceSyncTransport(t *testing.T) {
	drivertest.Run(t, func(t *testing.T) drivertest.Target { return remoteTargetWith(t, sqliteBacking(t), true) })
}

// The same on PostgreSQL, the database the fenced command's --db http:// client (on
// SyncTransport by default) most often reaches through a service.
func TestConformanceThroughServicePostgresSyncTransport(t *testing.T) {
	drivertest.Run(t, func(t *testing.T) drivertest.Target { return remoteTargetWith(t, postgresBacking(t), true) })
}

// leaseService answers every acquisition with a lease after calling before, and counts the
// connections it accepted.
func leaseService(t *testing.T, before func(r *http.Request)) (*httptest.Server, *atomic.Int64) {
	var conns atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		before(r)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"resource":"a ü","owner":"o","token":"3.1","epoch":3,"generation":1,"lease_until":"2030-01-01T00:00:00Z"}`))
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, &conns
}

// A context that ends while the service holds the request: the request was sent, so its
// outcome is unknown, and the connection, in an unknown state, is not used again.
func TestSyncTransportCancelMidRequest(t *testing.T) {
	entered, hold := make(chan struct{}), make(chan struct{})
	var first atomic.Bool
	first.Store(true)
	srv, conns := leaseService(t, func(r *http.Request) {
		if first.CompareAndSwap(true, false) {
			close(entered)
			<-hold
		}
	})
	defer close(hold)
	d := syncClient(t, srv.Listener.Addr().String(), "")
	ctx, cancel := context.WithCancel(testCtx(t))
	got := make(chan error, 1)
	go func() {
		_, err := d.Acquire(ctx, "a ü", "o", time.Minute)
		got <- err
	}()
	<-entered
	cancel()
	err := <-got
	if err == nil || errors.Is(err, driver.ErrNotApplied) || !errors.Is(err, context.Canceled) {
		t.Fatalf("acquire cut by its context: got %v, want an outcome-unknown error that wraps context.Canceled", err)
	}
	if _, err := d.Acquire(testCtx(t), "a ü", "o", time.Minute); err != nil {
		t.Fatalf("acquire after the cut: %v", err)
	}
	if n := conns.Load(); n != 2 {
		t.Errorf("the service accepted %d connections, want 2: the cut connection must not be reused", n)
	}
}

// A context that ended before the call: nothing was sent, so nothing was applied.
func TestSyncTransportEndedContextNotApplied(t *testing.T) {
	srv, _ := leaseService(t, func(*http.Request) {})
	d := syncClient(t, srv.Listener.Addr().String(), "")
	ctx, cancel := context.WithCancel(testCtx(t))
	cancel()
	if _, err := d.Acquire(ctx, "a ü", "o", time.Minute); !errors.Is(err, driver.ErrNotApplied) {
		t.Fatalf("acquire with an ended context: got %v, want not applied", err)
	}
}

// The service closes an idle connection between two requests (its idle timeout, a restart):
// the next request goes on a fresh connection and succeeds, rather than being written into
// the closed one and ending with an unknown outcome.
func TestSyncTransportServerClosedIdle(t *testing.T) {
	srv, conns := leaseService(t, func(*http.Request) {})
	d := syncClient(t, srv.Listener.Addr().String(), "")
	for i := range 3 {
		if _, err := d.Acquire(testCtx(t), "a ü", "o", time.Minute); err != nil {
			t.Fatalf("acquire %d: %v", i, err)
		}
		if i == 0 {
			if n := conns.Load(); n != 1 {
				t.Fatalf("the service accepted %d connections, want 1", n)
			}
		}
		// Returns once the service's side of every connection is closed: the client's idle
		// connection has its end of stream queued before the next request.
		srv.CloseClientConnections()
	}
	if n := conns.Load(); n != 3 {
		t.Errorf("the service accepted %d connections, want 3", n)
	}
}

// The driver appends its paths to the service's URL as written, so it refuses a URL with a
// query or a fragment instead of sending requests to paths inside them.
func TestRemoteOpenRefusesQuery(t *testing.T) {
	for _, u := range []string{"http://127.0.0.1:7070/?transport=sync", "http://127.0.0.1:7070?", "http://127.0.0.1:7070/p#f"} {
		if d, err := remote.Open(u, nil); err == nil {
			_ = d.Close()
			t.Errorf("Open(%q) accepted it", u)
		}
	}
	d, err := remote.Open("http://127.0.0.1:7070/prefix ü/", nil)
	if err != nil {
		t.Fatalf("a path prefix: %v", err)
	}
	_ = d.Close()
}
