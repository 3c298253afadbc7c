package server_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/server"
)

// heldPublish holds the driver's next Publish, once it has begun, until the test opens it.
type heldPublish struct {
	driver.Driver
	publishing chan struct{}
	open       chan struct{}
}

func (d *heldPublish) Publish(ctx context.Context, l driver.LeaseRef, pub driver.Publication) (bool, error) {
	d.publishing <- struct{}{}
	select {
	case <-d.open:
	case <-ctx.Done():
		return false, driver.NotApplied(ctx.Err())
	}
	return d.Driver.Publish(ctx, l, pub)
}

// A publication whose client hangs up while the database has it runs to its end (the package
// comment: the database's answer decides, never the connection): the test holds the
// publication in the driver, closes the client's connection, waits until net/http has ended
// the request's context (its background read saw the hang-up), and only then lets the
// publication go on. Its operation id then reads as accepted, and the payload is the one
// published. A mutation run under the request's context would have been cut off here.
func TestMutationOutlivesTheClient(t *testing.T) {
	drv := &heldPublish{Driver: sqliteBacking(t).open(t), publishing: make(chan struct{}), open: make(chan struct{})}
	store := newStore(t, drv)
	ctx := testCtx(t)
	const resource = "hang up ü"
	if err := store.Provision(ctx, resource); err != nil {
		t.Fatal(err)
	}
	if _, err := store.BumpEpoch(ctx); err != nil {
		t.Fatal(err)
	}
	l, err := store.Acquire(ctx, resource, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(store, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := startServerWith(t, store, nil, false)
	requests, served := make(chan context.Context, 1), make(chan struct{})
	inner := srv.Handler()
	var hd http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests <- r.Context()
		defer close(served)
		inner.ServeHTTP(w, r)
	})
	h.handler.Store(&hd)

	c, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	payload := "published after the hang-up \x00"
	if _, err := fmt.Fprintf(c, "POST /v1/resources/hang%%20up%%20%%C3%%BC/publish HTTP/1.1\r\nHost: 127.0.0.1\r\n%s: %s\r\n%s: %s\r\n%s: outlives-1\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n%s",
		server.HeaderOwner, l.Owner(), server.HeaderToken, l.Token(), server.HeaderOpID, len(payload), payload); err != nil {
		t.Fatal(err)
	}
	reqCtx := <-requests
	<-drv.publishing
	_ = c.Close()
	select {
	case <-reqCtx.Done(): // net/http saw the hang-up
	case <-ctx.Done():
		t.Fatal("the request's context did not end after the client hung up")
	}
	close(drv.open)
	<-served // Resolve before the handler's end could record the id as aborted first

	res, err := store.Resolve(ctx, "outlives-1")
	if err != nil {
		t.Fatal(err)
	}
	if !res.Accepted {
		t.Fatalf("the publication whose client hung up: %+v, want accepted", res)
	}
	got, _, err := store.Get(ctx, resource)
	if err != nil || string(got) != payload {
		t.Fatalf("published payload %q, %v; want %q", got, err, payload)
	}
}
