package sqlserver

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
)

// These tests need a server (FENCED_TEST_SQLSERVER) and skip without one. They were written
// where no SQL Server runs, so they have not been run.

// TestLeaseExpiresWhileWaitingOnTheRowLock: another session holds an update lock on the row
// (it only locks it: nothing re-evaluates a condition after such a wait) while a renewal and a
// publication wait for it and the lease expires. Once the lock is released, both are refused:
// the clock is read after the wait. A statement that read SYSUTCDATETIME() before its wait
// would accept both.
func TestLeaseExpiresWhileWaitingOnTheRowLock(t *testing.T) {
	admin, schemaURL := newSchema(t, serverURL(t))
	for _, tt := range []struct {
		name string
		op   func(ctx context.Context, l *fenced.Lease) error
	}{
		{"renew", func(ctx context.Context, l *fenced.Lease) error { return l.Renew(ctx, time.Minute) }},
		{"publish", func(ctx context.Context, l *fenced.Lease) error { return l.Publish(ctx, []byte("late\x00")) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			d, err := Open(schemaURL)
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			s, err := fenced.New(ctx, d, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if _, err := admin.BumpEpoch(ctx); err != nil { // epoch != generation
				t.Fatal(err)
			}
			resource := "lock wait é " + tt.name
			if err := s.Provision(ctx, resource); err != nil {
				t.Fatal(err)
			}
			l, err := s.Acquire(ctx, resource, 2*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			until := l.LeaseUntil()

			holder, err := admin.DB().Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer holder.Close()
			var spid int64
			if err := holder.QueryRowContext(ctx, "SELECT @@SPID").Scan(&spid); err != nil {
				t.Fatal(err)
			}
			tx, err := holder.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback() }()
			var one int
			if err := tx.QueryRowContext(ctx, "SELECT 1 FROM "+admin.sql.table["fenced_resources"]+
				" WITH (UPDLOCK, ROWLOCK) WHERE resource = @resource", sql.Named("resource", resource)).Scan(&one); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- tt.op(context.Background(), l) }()

			// The server, not a sleep, says when the operation waits on the holder's lock.
			waitFor(t, ctx, done, admin.DB(), "SELECT COUNT(*) FROM sys.dm_exec_requests WHERE blocking_session_id = @spid",
				sql.Named("spid", spid))
			// And the server's clock says when the lease has expired.
			waitFor(t, ctx, done, admin.DB(), "SELECT CASE WHEN SYSUTCDATETIME() > @until THEN 1 ELSE 0 END",
				sql.Named("until", until.UTC()))
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			var refused *fenced.RefusedError
			if err := <-done; !errors.As(err, &refused) {
				t.Fatalf("%s after the lease expired during its lock wait: %v, want refused", tt.name, err)
			}
			st, err := s.Show(ctx, resource)
			if err != nil || st.PublishedGeneration != 0 || !st.LeaseUntil.Equal(until) {
				t.Fatalf("row after the refusal: %+v, %v", st, err)
			}
		})
	}
}

// waitFor polls query until it answers a positive count, failing if done delivers first.
func waitFor(t *testing.T, ctx context.Context, done <-chan error, db *sql.DB, query string, args ...any) {
	t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		var n int64
		if err := db.QueryRowContext(ctx, query, args...).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		select {
		case err := <-done:
			t.Fatalf("the operation finished while the row was locked: %v", err)
		case <-tick.C:
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
	}
}

// TestIncarnationChangeStopsLeasesUntilBump: when the recorded incarnation is not the
// database's (as after a restore; simulated by overwriting the record), every lease-carrying
// operation fails with ErrIncarnationChanged and changes nothing, until BumpEpoch records the
// database's incarnation; the old lease stays fenced.
func TestIncarnationChangeStopsLeasesUntilBump(t *testing.T) {
	admin, schemaURL := newSchema(t, serverURL(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d, err := Open(schemaURL)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	s, err := fenced.New(ctx, d, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Provision(ctx, "restored é"); err != nil {
		t.Fatal(err)
	}
	old, err := s.Acquire(ctx, "restored é", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.DB().ExecContext(ctx, "UPDATE "+admin.sql.table["fenced_meta"]+" SET recovery_fork_guid = NEWID() WHERE id = 1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Acquire(ctx, "restored é", time.Minute); !errors.Is(err, fenced.ErrIncarnationChanged) {
		t.Fatalf("acquire: %v", err)
	}
	for what, err := range map[string]error{"publish": old.Publish(ctx, []byte("p\x00")),
		"renew": old.Renew(ctx, time.Minute), "release": old.Release(ctx)} {
		if !errors.Is(err, fenced.ErrIncarnationChanged) {
			t.Errorf("%s: %v", what, err)
		}
	}
	epoch, err := s.BumpEpoch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	l, err := s.Acquire(ctx, "restored é", time.Minute)
	if err != nil || l.Epoch() != epoch || l.Token().Compare(old.Token()) <= 0 {
		t.Fatalf("acquire after the bump: %v, %v", l, err)
	}
	if err := old.Publish(ctx, []byte("stale")); err == nil {
		t.Fatal("the old lease published after the bump")
	}
}
