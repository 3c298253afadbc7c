package main

import (
	"context"
	"database/sql"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/backend/sqlite"
	"github.com/fenced-dev/fenced/destination"
	_ "modernc.org/sqlite"
)

const resource = "weekly report ü"

func setup(t *testing.T) (*fenced.Store, *sqlite.Driver, *httptest.Server) {
	t.Helper()
	ctx := context.Background()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "reports.db")+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	h, err := NewHandler(ctx, db, []string{resource})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)

	drv, err := sqlite.Open(filepath.Join(t.TempDir(), "fenced.db"))
	if err != nil {
		t.Fatal(err)
	}
	store, err := fenced.New(ctx, drv, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	if err := store.Provision(ctx, resource); err != nil {
		t.Fatal(err)
	}
	for range 2 { // epoch 3, so that epoch and generation differ
		if _, err := store.BumpEpoch(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return store, drv, srv
}

func put(t *testing.T, srv *httptest.Server, l destination.Holder, path, body string) int {
	t.Helper()
	c := &http.Client{Transport: &destination.Transport{Holder: l}}
	req, _ := http.NewRequest("PUT", srv.URL+path, strings.NewReader(body))
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	return resp.StatusCode
}

func get(t *testing.T, srv *httptest.Server) (string, string) {
	t.Helper()
	resp, err := http.Get(srv.URL + "/reports/" + url.PathEscape(resource))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b), resp.Header.Get("Written-By-Token")
}

// A holder fences the service on acquisition; the previous holder, paused, is refused by the
// service before the new holder has written anything.
func TestPausedHolderRefused(t *testing.T) {
	store, drv, srv := setup(t)
	ctx := context.Background()
	path := "/reports/" + url.PathEscape(resource)
	svc := &destination.Remote{URL: srv.URL + "/fence"}

	a, err := store.Acquire(ctx, resource, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Fence(ctx, svc); err != nil {
		t.Fatal(err)
	}
	if code := put(t, srv, a, path, "A's report\x00"); code != http.StatusNoContent {
		t.Fatalf("A's write: %d", code)
	}
	// A pauses; its lease expires on the lease store's clock; B acquires and fences.
	if _, err := drv.DB().Exec(`UPDATE fenced_resources SET lease_until = CAST(unixepoch('subsec') * 1000000 AS INTEGER) - 1000000 WHERE resource = ?`, resource); err != nil {
		t.Fatal(err)
	}
	b, err := store.Acquire(ctx, resource, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Fence(ctx, svc); err != nil {
		t.Fatal(err)
	}
	if code := put(t, srv, a, path, "A's late report"); code != http.StatusConflict {
		t.Fatalf("A's delayed write after B fenced: %d, want 409", code)
	}
	if body, by := get(t, srv); body != "A's report\x00" || by != a.Token().String() {
		t.Fatalf("report %q by %s", body, by)
	}
	if code := put(t, srv, b, path, "B's report"); code != http.StatusNoContent {
		t.Fatalf("B's write: %d", code)
	}
	if body, by := get(t, srv); body != "B's report" || by != b.Token().String() {
		t.Fatalf("report %q by %s", body, by)
	}
	// A token for another resource than the path is refused and changes nothing.
	if code := put(t, srv, b, "/reports/other", "x"); code != http.StatusBadRequest {
		t.Fatalf("mismatched path: %d", code)
	}
}

// The header by hand, as a shell script with curl would send it.
func TestHandWrittenHeader(t *testing.T) {
	_, _, srv := setup(t)
	send := func(header string) int {
		req, _ := http.NewRequest("PUT", srv.URL+"/reports/"+url.PathEscape(resource), strings.NewReader("r"))
		if header != "" {
			req.Header.Set("Fencing-Token", header)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	for _, c := range []struct {
		header string
		code   int
	}{
		{"weekly%20report%20%C3%BC; 1796132345000000.3", 204},
		{"weekly%20report%20%C3%BC; 1796132345000000.2", 409},
		{"weekly%20report%20%C3%BC; 1.99", 409},
		{"weekly report ü; 1796132345000000.9", 400},
		{"", 400},
		{"nobody; 1.1", 422},
	} {
		if got := send(c.header); got != c.code {
			t.Errorf("Fencing-Token %q: %d, want %d", c.header, got, c.code)
		}
	}
}
