package gate_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/destination"
	"github.com/fenced-dev/fenced/destination/gate"
)

// A service checks the writer's token inside the transaction of its write; once a newer holder
// has fenced the service, the previous holder's write is refused and nothing changes.
func ExampleGate_Check() {
	dir, _ := os.MkdirTemp("", "gate-example")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	db, _ := sql.Open("sqlite", filepath.Join(dir, "service.db"))
	defer db.Close()
	_, _ = db.Exec(`CREATE TABLE reports (resource TEXT PRIMARY KEY, body TEXT)`)

	g, _ := gate.New(db, gate.SQLite, nil)
	_ = g.Migrate(ctx)
	_ = g.Add(ctx, "report:42")

	write := func(token fenced.Token, body string) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback() }()
		if err := g.Check(ctx, tx, "report:42", token); err != nil {
			return err
		}
		if _, err := tx.Exec(`INSERT INTO reports VALUES ('report:42', ?)
			ON CONFLICT (resource) DO UPDATE SET body = excluded.body`, body); err != nil {
			return err
		}
		return tx.Commit()
	}
	a := fenced.Token{Epoch: 1796132345000000, Generation: 41}
	b := fenced.Token{Epoch: 1796132345000000, Generation: 42}
	fmt.Println("A writes:", write(a, "by A"))
	_ = g.Fence(ctx, "report:42", b) // B acquired and fenced the service; it has written nothing
	err := write(a, "late A")
	fmt.Println("A's late write refused:", errors.Is(err, destination.ErrStale))
	fmt.Println(err)
	var body string
	_ = db.QueryRow(`SELECT body FROM reports`).Scan(&body)
	fmt.Println("report:", body)
	// Output:
	// A writes: <nil>
	// A's late write refused: true
	// "report:42": token 1796132345000000.41 is older than the destination's 1796132345000000.42
	// report: by A
}
