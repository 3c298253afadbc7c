package mysql

import (
	"context"
	"database/sql"
	"sync"
	"time"
)

// innodbTrxIdle is how long this test binary leaves MariaDB's INNODB_TRX cache unread
// between two reads of its own.
const innodbTrxIdle = 150 * time.Millisecond

// innodbTrx serializes and spaces the reads of information_schema.INNODB_TRX and
// INNODB_LOCK_WAITS (one cache in MariaDB) by the tests of this binary.
var innodbTrx struct {
	mu   sync.Mutex
	last time.Time // when the last read returned
}

// QueryInnoDBTrx runs query (one row, scanned into dest) against MariaDB's INNODB_TRX cache,
// at least innodbTrxIdle after the previous such read of this binary returned. MariaDB
// refreshes that cache only when it was not read for 100 ms; tests in parallel that each poll
// it every 150 ms read it more often than that between them, and can keep it stale until the
// lock wait they are waiting to see times out (a red CI run: two gate tests, 50 s each, then
// Error 1205). The pause spaces the reads for the server's cache; it orders nothing, the
// tests' barriers are still what the server reports.
func QueryInnoDBTrx(ctx context.Context, db *sql.DB, query string, args []any, dest ...any) error {
	innodbTrx.mu.Lock()
	defer innodbTrx.mu.Unlock()
	if wait := time.Until(innodbTrx.last.Add(innodbTrxIdle)); wait > 0 {
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
	err := db.QueryRowContext(ctx, query, args...).Scan(dest...)
	innodbTrx.last = time.Now()
	return err
}
