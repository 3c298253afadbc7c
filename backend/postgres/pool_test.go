package postgres

import (
	"testing"
)

// TestOpenPoolSize: Open's pool serves DefaultMaxConns callers at once unless the URL sets
// pool_max_conns (pgxpool alone would give max(4, CPUs)), and pool_max_conns is obeyed.
func TestOpenPoolSize(t *testing.T) {
	rawURL := testSchema(t, nil)
	if got := openDriver(t, rawURL).Pool().Config().MaxConns; got < DefaultMaxConns {
		t.Errorf("Open without pool_max_conns: a pool of %d connections, want at least %d", got, DefaultMaxConns)
	}
	sized := testSchema(t, map[string]string{"pool_max_conns": "3"})
	if got := openDriver(t, sized).Pool().Config().MaxConns; got != 3 {
		t.Errorf("Open with pool_max_conns=3: a pool of %d connections", got)
	}
}
