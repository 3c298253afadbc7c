package mysql

import (
	"context"
	"database/sql"
	"testing"
)

// TestOpenKeepsIdleConnections: after 16 concurrent callers, Open's pool keeps their 16
// connections for the next ones (database/sql alone keeps 2 and closes the rest).
func TestOpenKeepsIdleConnections(t *testing.T) {
	d, err := Open(CreateTestDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ctx := context.Background()
	conns := make([]*sql.Conn, DefaultMaxIdleConns)
	for i := range conns {
		if conns[i], err = d.DB().Conn(ctx); err != nil {
			t.Fatal(err)
		}
		if err := conns[i].PingContext(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range conns {
		_ = c.Close()
	}
	if st := d.DB().Stats(); st.Idle != DefaultMaxIdleConns || st.MaxIdleClosed != 0 {
		t.Fatalf("after %d callers: %d idle connections, %d closed as surplus; want all kept", DefaultMaxIdleConns, st.Idle, st.MaxIdleClosed)
	}
}
