package server_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
)

func TestMetricsAndProbes(t *testing.T) {
	h, store := sqliteService(t, nil)
	if err := store.Provision(testCtx(t), "m ü"); err != nil {
		t.Fatal(err)
	}
	rs := remoteStore(t, h, "")
	l, err := rs.Acquire(testCtx(t), "m ü", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rs.Acquire(testCtx(t), "m ü", time.Minute); err == nil {
		t.Fatal("second acquire granted")
	}
	if err := l.Publish(testCtx(t), []byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := l.Publish(testCtx(t), []byte("y")); err == nil {
		t.Fatal("second publication accepted")
	}
	a := call(t, h, "", "GET", "/metrics", nil, nil)
	if a.status != 200 {
		t.Fatalf("metrics: %d %s", a.status, a.body)
	}
	for _, want := range []string{
		"fenced_acquisitions_total 1\n",
		"fenced_busy_total 1\n",
		`fenced_refusals_total{cause="` + string(fenced.CauseAlreadyPublished) + `"} 1` + "\n",
		`fenced_answers_total{operation="publish",outcome="ok"} 1` + "\n",
		`fenced_answers_total{operation="publish",outcome="refused"} 1` + "\n",
		"fenced_waiters 0\n",
		"fenced_request_duration_seconds_bucket{operation=\"acquire\"",
	} {
		if !strings.Contains(string(a.body), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	if a := call(t, h, "", "GET", "/healthz", nil, nil); a.status != 200 {
		t.Fatalf("healthz: %d", a.status)
	}
	a = call(t, h, "", "GET", "/readyz", nil, nil)
	var ready struct{ Status string }
	if a.status != 200 || json.Unmarshal(a.body, &ready) != nil || ready.Status != "ready" {
		t.Fatalf("readyz: %d %s", a.status, a.body)
	}
	_ = store.Close() // the database is gone
	a = call(t, h, "", "GET", "/readyz", nil, nil)
	if a.status != 503 || a.problem(t).Type != "urn:fenced:problem:unavailable" {
		t.Fatalf("readyz without a database: %d %s", a.status, a.body)
	}
	if a := call(t, h, "", "GET", "/healthz", nil, nil); a.status != 200 {
		t.Fatalf("healthz without a database: %d", a.status)
	}
}
