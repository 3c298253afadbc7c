package mysql

import (
	"os"
	"strings"
	"testing"
)

// With FENCED_MUTANT=clock-at-statement-start every statement judges expiry with
// UTC_TIMESTAMP(6), read when it starts, as before clockAfterLock: the conformance suite must
// fail (TestSuiteCatchesClockAtStatementStart). The procedures are built from the same,
// mutated, text.
func init() {
	if os.Getenv("FENCED_MUTANT") != "clock-at-statement-start" {
		return
	}
	var mutate func(s *stmt)
	mutate = func(s *stmt) {
		if s == nil {
			return
		}
		s.sql = strings.ReplaceAll(s.sql, clockAfterLock, "UTC_TIMESTAMP(6)")
		s.body = strings.ReplaceAll(s.body, clockAfterLock, "UTC_TIMESTAMP(6)")
		mutate(s.first)
		mutate(s.second)
	}
	for _, s := range procedureStmts {
		mutate(s)
	}
}

// TestSysdateIsNowProbe: the probe CheckDurability runs says no on this server, and yes when
// SYSDATE(6) is NOW(6), which is what --sysdate-is-now makes it (no server here runs with it).
func TestSysdateIsNowProbe(t *testing.T) {
	t.Parallel()
	d := migrated(t)
	for _, c := range []struct {
		text string
		want bool
	}{
		{sqlSysdateIsNow, false},
		{strings.ReplaceAll(sqlSysdateIsNow, "SYSDATE(6)", "NOW(6)"), true},
	} {
		var got bool
		if err := d.db.QueryRowContext(ctxFor(t), c.text).Scan(&got); err != nil || got != c.want {
			t.Errorf("%s: %v, %v; want %v", c.text, got, err, c.want)
		}
	}
}

// TestClockAfterLockIsUTC: clockAfterLock reads UTC whatever the session's time zone.
func TestClockAfterLockIsUTC(t *testing.T) {
	t.Parallel()
	d := migrated(t)
	conn, err := d.db.Conn(ctxFor(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, tz := range []string{"+00:00", "+05:30", "-11:00", "SYSTEM"} {
		if _, err := conn.ExecContext(ctxFor(t), "SET time_zone = '"+tz+"'"); err != nil {
			t.Fatal(err)
		}
		var diff int64
		if err := conn.QueryRowContext(ctxFor(t), `SELECT TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), `+clockAfterLock+`)`).Scan(&diff); err != nil {
			t.Fatal(err)
		}
		if diff < 0 || diff > 1_000_000 {
			t.Errorf("time_zone %s: clockAfterLock is %d µs from UTC_TIMESTAMP(6)", tz, diff)
		}
	}
}
