// Command reportservice is a small service that takes part in fencing: it stores one report
// per resource and accepts a write only from the resource's current fenced holder. Copy it.
//
//	PUT  /reports/{resource}   store the body; needs Fencing-Token: <resource>; <epoch>.<generation>
//	GET  /reports/{resource}   the stored report
//	POST /fence                raise the mark on acquisition (destination.Remote, fenced run --fence)
//
// The gate's check and the report's write are one transaction in the service's own SQLite
// database, so a refused token changes nothing and an accepted one commits with its write.
package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/fenced-dev/fenced/destination/gate"
)

const maxReport = 1 << 20

// NewHandler migrates db, gives each resource a mark, and returns the service's routes.
func NewHandler(ctx context.Context, db *sql.DB, resources []string) (http.Handler, error) {
	g, err := gate.New(db, gate.SQLite, nil)
	if err != nil {
		return nil, err
	}
	if err := g.Migrate(ctx); err != nil {
		return nil, err
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS reports (
		resource TEXT PRIMARY KEY, body BLOB NOT NULL, epoch INTEGER NOT NULL, generation INTEGER NOT NULL)`); err != nil {
		return nil, fmt.Errorf("create reports: %w", err)
	}
	for _, r := range resources {
		if err := g.Add(ctx, r); err != nil {
			return nil, err
		}
	}
	mux := http.NewServeMux()
	mux.Handle("POST /fence", g.FenceHandler())
	mux.Handle("PUT /reports/{resource}", g.Handler(func(w http.ResponseWriter, r *http.Request, tx *sql.Tx) error {
		resource, token, _ := gate.TokenFrom(r.Context())
		if resource != r.PathValue("resource") {
			// Checked after the gate, inside the rolled-back transaction: the mark stays.
			http.Error(w, "the Fencing-Token names another resource than the path", http.StatusBadRequest)
			return errors.New("resource mismatch")
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxReport))
		if err != nil {
			http.Error(w, "the report is over 1 MiB", http.StatusRequestEntityTooLarge)
			return err
		}
		_, err = tx.ExecContext(r.Context(), `INSERT INTO reports (resource, body, epoch, generation) VALUES (?1, ?2, ?3, ?4)
			ON CONFLICT (resource) DO UPDATE SET body = excluded.body, epoch = excluded.epoch, generation = excluded.generation`,
			resource, body, token.Epoch, token.Generation)
		return err
	}))
	mux.HandleFunc("GET /reports/{resource}", func(w http.ResponseWriter, r *http.Request) {
		var body []byte
		var epoch, gen int64
		err := db.QueryRowContext(r.Context(), `SELECT body, epoch, generation FROM reports WHERE resource = ?1`,
			r.PathValue("resource")).Scan(&body, &epoch, &gen)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			http.NotFound(w, r)
			return
		case err != nil:
			http.Error(w, "read failed", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Written-By-Token", fmt.Sprintf("%d.%d", epoch, gen))
		_, _ = w.Write(body)
	})
	return mux, nil
}
