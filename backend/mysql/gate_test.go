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
	gatetest.Run(t, gateEngine)
}

var gateEngine = gatetest.Engine{Dialect: gate.MySQL, Open: func(t testing.TB) *sql.DB {
	d, err := Open(CreateTestDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d.DB()
}}

// BenchmarkGate: a service's write transaction with the gate's check beside the same
// transaction without it, on MariaDB/MySQL.
func BenchmarkGate(b *testing.B) { gatetest.Bench(b, gateEngine) }
