package server_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/server"
)

// TestDashboardData: the dashboard lists the resources the service answered for, newest
// first, read afresh (holder, token, expiry, publication), and its refusals with their cause,
// each filtered by the reader's prefixes. No browser runs here: the page itself is only
// checked to be served (see docs/SERVICE.md).
func TestDashboardData(t *testing.T) {
	h, store, s := authService(t)
	worker := remoteStore(t, h, s.workerAll)
	la, err := worker.Acquire(testCtx(t), "team a/x", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := la.Publish(testCtx(t), []byte("a\x00")); err != nil {
		t.Fatal(err)
	}
	if err := la.Publish(testCtx(t), []byte("again")); err == nil {
		t.Fatal("second publication accepted")
	}
	lb, err := worker.Acquire(testCtx(t), "team b/x", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	read := func(bearer string) server.Dashboard {
		t.Helper()
		a := call(t, h, bearer, "GET", "/v1/dashboard", nil, nil)
		var d server.Dashboard
		if a.status != 200 || json.Unmarshal(a.body, &d) != nil {
			t.Fatalf("dashboard: %d %s", a.status, a.body)
		}
		return d
	}
	d := read(s.admin)
	if len(d.Resources) != 2 || d.Resources[0].Resource != "team b/x" || d.Resources[1].Resource != "team a/x" {
		t.Fatalf("resources %+v, want team b/x then team a/x", d.Resources)
	}
	b, a := d.Resources[0], d.Resources[1]
	if !b.Held || b.Token != lb.Token().String() || !b.LeaseUntil.After(b.Now) || a.PublishedToken != la.Token().String() || a.PayloadSize != 2 {
		t.Fatalf("rows %+v", d.Resources)
	}
	if len(d.Refusals) != 1 || d.Refusals[0].Cause != string(fenced.CauseAlreadyPublished) || d.Refusals[0].Operation != "publish" {
		t.Fatalf("refusals %+v", d.Refusals)
	}
	if d := read(s.readerA); len(d.Resources) != 1 || d.Resources[0].Resource != "team a/x" || len(d.Refusals) != 1 {
		t.Fatalf("a reader of team a/ sees %+v", d)
	}
	if a := call(t, h, "", "GET", "/v1/dashboard", nil, nil); a.status != 401 {
		t.Fatalf("dashboard without a token: %d", a.status)
	}
	page := call(t, h, "", "GET", "/", nil, nil)
	if page.status != 200 || !strings.HasPrefix(page.header.Get("Content-Type"), "text/html") || !strings.Contains(string(page.body), "/v1/dashboard") {
		t.Fatalf("the page: %d %s", page.status, page.header)
	}
	_ = store
}
