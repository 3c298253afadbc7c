package mysql

import (
	"database/sql"
	"testing"

	"github.com/fenced-dev/fenced/destination/gate"
	"github.com/fenced-dev/fenced/destination/gate/gatetest"
)

// TestGate runs the destination suite and the gate's tests on MariaDB/MySQL: the gate package
// lives in the core module, which has no MySQL driver.
func TestGate(t *testing.T) {
	t.Parallel()
	gatetest.Run(t, gatetest.Engine{Dialect: gate.MySQL, Open: func(t *testing.T) *sql.DB {
		d, err := Open(CreateTestDatabase(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = d.Close() })
		return d.DB()
	}})
}
