package destination_test

import (
	"context"
	"database/sql"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/destination"
	"github.com/fenced-dev/fenced/destination/gate"
	_ "modernc.org/sqlite"
)

// TestRemoteRequiresTheConfirmation: a 2xx is a fence only with the gate's Fencing-Mark for the
// resource, naming a mark at least the token sent. A server answering 200 to any POST (a
// catch-all route, a proxy) is refused, and the real FenceHandler is accepted.
func TestRemoteRequiresTheConfirmation(t *testing.T) {
	ctx := context.Background()
	const res = "rapport nº 1"
	token := fenced.Token{Epoch: 1796132345000001, Generation: 7}
	older := fenced.Token{Epoch: token.Epoch, Generation: 6}

	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "service.db")+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	g, err := gate.New(db, gate.SQLite, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := g.Add(ctx, res); err != nil {
		t.Fatal(err)
	}
	real := httptest.NewServer(g.FenceHandler())
	defer real.Close()
	if err := (&destination.Remote{URL: real.URL}).Fence(ctx, res, token); err != nil {
		t.Fatalf("the gate's FenceHandler: %v", err)
	}
	if m, err := g.Mark(ctx, res); err != nil || m != token {
		t.Fatalf("mark %s (%v), want %s", m, err, token)
	}

	answering := func(mark ...string) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			for _, m := range mark {
				w.Header().Add(destination.MarkHeader, m)
			}
			_, _ = w.Write([]byte("OK"))
		}))
		t.Cleanup(srv.Close)
		return srv.URL
	}
	for _, c := range []struct {
		name string
		url  string
		want string
	}{
		{"200 to everything", answering(), "did not confirm the fence (no Fencing-Mark in its answer): is it a fenced gate?"},
		{"an older mark", answering(destination.FormatHeader(res, older)), "confirmed the mark " + older.String() + " for \"rapport nº 1\", older than the token " + token.String()},
		{"another resource", answering(destination.FormatHeader("other", token)), `confirmed a fence of "other", not of "rapport nº 1"`},
		{"unparsable", answering("yes"), "did not confirm the fence (its Fencing-Mark \"yes\" does not parse)"},
		{"two marks", answering(destination.FormatHeader(res, token), destination.FormatHeader(res, token)), "did not confirm the fence (2 Fencing-Mark values"},
	} {
		err := (&destination.Remote{URL: c.url}).Fence(ctx, res, token)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), c.url) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
	// A newer mark is a confirmation: the gate's mark may have moved on since.
	if err := (&destination.Remote{URL: answering(destination.FormatHeader(res, fenced.Token{Epoch: token.Epoch + 1, Generation: 1}))}).Fence(ctx, res, token); err != nil {
		t.Errorf("a newer mark: %v", err)
	}
}
