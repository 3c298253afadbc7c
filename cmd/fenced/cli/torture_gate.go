package cli

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"net"
	"net/http"

	"github.com/fenced-dev/fenced/destination/gate"
)

// tortureGate is the participating service of fenced torture --gate: a gate on a SQLite file
// of its own, one stored result per resource, on loopback.
type tortureGate struct {
	db  *sql.DB
	srv *http.Server
	url string
}

func startTortureGate(ctx context.Context, path string, resources []string) (*tortureGate, error) {
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)")
	if err != nil {
		return nil, err
	}
	g, err := gate.New(db, gate.SQLite, nil)
	if err == nil {
		err = g.Migrate(ctx)
	}
	for _, r := range resources {
		if err == nil {
			err = g.Add(ctx, r)
		}
	}
	if err == nil {
		_, err = db.ExecContext(ctx, `CREATE TABLE results (resource TEXT PRIMARY KEY, body BLOB NOT NULL)`)
	}
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("set up the torture's gate: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /fence", g.FenceHandler())
	mux.Handle("PUT /write", g.Handler(func(w http.ResponseWriter, r *http.Request, tx *sql.Tx) error {
		resource, _, _ := gate.TokenFrom(r.Context())
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return err
		}
		_, err = tx.ExecContext(r.Context(), `INSERT INTO results VALUES (?1, ?2)
			ON CONFLICT (resource) DO UPDATE SET body = excluded.body`, resource, body)
		return err
	}))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	t := &tortureGate{db: db, srv: &http.Server{Handler: mux, ReadHeaderTimeout: demoStep}, url: "http://" + ln.Addr().String()}
	go func() { _ = t.srv.Serve(ln) }()
	return t, nil
}

func (t *tortureGate) close() {
	_ = t.srv.Close()
	_ = t.db.Close()
}
