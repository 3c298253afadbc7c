package server_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/server"
)

// readSignal tells the test each time the service's store reads a row: AcquireWait reads the
// row after every busy answer, so a read means a waiter is waiting.
type readSignal struct {
	driver.Driver
	reads chan struct{}
}

func (d *readSignal) Read(ctx context.Context, resource string) (driver.State, error) {
	select {
	case d.reads <- struct{}{}:
	default:
	}
	return d.Driver.Read(ctx, resource)
}

func TestAcquireWaitThroughService(t *testing.T) {
	sig := &readSignal{Driver: sqliteBacking(t).open(t), reads: make(chan struct{}, 1)}
	store := newStore(t, sig)
	srv, err := server.New(store, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := startServer(t, store, nil)
	// The harness serves its own Server over the store; this test needs the one it can stop.
	hd := srv.Handler()
	h.handler.Store(&hd)
	const res = "wait/für ü"
	if err := store.Provision(testCtx(t), res); err != nil {
		t.Fatal(err)
	}
	if _, err := store.BumpEpoch(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	path := "/v1/resources/wait%2Ff%C3%BCr%20%C3%BC/acquire"
	acquire := func(body map[string]any) answer {
		return call(t, h, "", "POST", path, nil, mustJSON(t, body))
	}
	a := acquire(map[string]any{"ttl_ms": 3600000})
	var holder server.Lease
	if a.status != 200 || json.Unmarshal(a.body, &holder) != nil {
		t.Fatalf("acquire: %d %s", a.status, a.body)
	}
	for what, c := range map[string]struct {
		body   map[string]any
		status int
		typ    string
	}{
		"a short wait":          {map[string]any{"ttl_ms": 1000, "wait_ms": 30}, 409, server.TypeBusy},
		"a wait past the limit": {map[string]any{"ttl_ms": 1000, "wait_ms": 3.6e9}, 400, server.TypeInvalid},
		"a wait with an owner":  {map[string]any{"ttl_ms": 1000, "wait_ms": 30, "owner": "me"}, 409, server.TypeBusy},
		"a negative wait":       {map[string]any{"ttl_ms": 1000, "wait_ms": -5}, 400, server.TypeInvalid},
	} {
		a := acquire(c.body)
		if a.status != c.status || a.problem(t).Type != c.typ {
			t.Errorf("%s: %d %s, want %d %s", what, a.status, a.body, c.status, c.typ)
		}
	}

	// A waiter gets the lease when the holder releases through the service.
	got := make(chan answer, 1)
	drain(sig.reads)
	go func() { got <- acquire(map[string]any{"ttl_ms": 60000, "wait_ms": 60000}) }()
	<-sig.reads // it is waiting
	if a := call(t, h, "", "POST", "/v1/resources/wait%2Ff%C3%BCr%20%C3%BC/release", nil,
		mustJSON(t, map[string]string{"owner": holder.Owner, "token": holder.Token})); a.status != 204 {
		t.Fatalf("release: %d %s", a.status, a.body)
	}
	a = <-got
	var next server.Lease
	if a.status != 200 || json.Unmarshal(a.body, &next) != nil || next.Generation != holder.Generation+1 || next.Owner == "" {
		t.Fatalf("the waiter: %d %s", a.status, a.body)
	}
	if m := call(t, h, "", "GET", "/metrics", nil, nil); !strings.Contains(string(m.body), "fenced_handover_seconds_count 1\n") {
		t.Errorf("the handover through the service is not in the metrics:\n%s", m.body)
	}

	// A shutdown ends a wait with 503 and Retry-After.
	drain(sig.reads)
	go func() { got <- acquire(map[string]any{"ttl_ms": 60000, "wait_ms": 60000}) }()
	<-sig.reads
	srv.StopWaiting()
	a = <-got
	if a.status != 503 || a.header.Get("Retry-After") == "" || a.problem(t).Type != server.TypeShuttingDown {
		t.Fatalf("a waiter at shutdown: %d %v %s", a.status, a.header, a.body)
	}
	if a := acquire(map[string]any{"ttl_ms": 60000, "wait_ms": 60000}); a.status != 503 {
		t.Fatalf("a wait after the shutdown began: %d %s", a.status, a.body)
	}
}

func drain(c chan struct{}) {
	for {
		select {
		case <-c:
		default:
			return
		}
	}
}
