package fenced

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fenced-dev/fenced/backend/sqlite"
)

// reporting is an SQLite driver that reports the durability settings a test gives it: the
// decision under test is the store's, not the engine's.
type reporting struct {
	*sqlite.Driver
	warnings []string
	err      error
}

func (r reporting) CheckDurability(context.Context) ([]string, error) { return r.warnings, r.err }

func openReporting(t *testing.T, warnings []string, checkErr error, cfg *Config) (*Store, error) {
	t.Helper()
	d, err := sqlite.Open(filepath.Join(t.TempDir(), "fenced.db"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(context.Background(), reporting{d, warnings, checkErr}, cfg)
	if err != nil {
		_ = d.Close()
		return nil, err
	}
	t.Cleanup(func() { _ = s.Close() })
	return s, nil
}

// TestNonDurableRefusedByDefault: a store whose backend reports a setting that can lose
// acknowledged writes is refused, naming the setting and the way to accept the risk; with
// AllowNonDurable it opens, and the warning is logged once however many stores the process
// opens.
func TestNonDurableRefusedByDefault(t *testing.T) {
	setting := "the setting of " + t.Name() + " loses commits" // unique: warnings are per process
	_, err := openReporting(t, []string{setting}, nil, nil)
	if !errors.Is(err, ErrNotDurable) || !strings.Contains(err.Error(), setting) || !strings.Contains(err.Error(), "AllowNonDurable") {
		t.Fatalf("a non-durable store opened with the defaults: %v", err)
	}
	var log bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&log, nil))
	for range 3 {
		if _, err := openReporting(t, []string{setting}, nil, &Config{AllowNonDurable: true, Logger: logger}); err != nil {
			t.Fatal(err)
		}
	}
	if n := strings.Count(log.String(), setting); n != 1 || !strings.Contains(log.String(), "handed out again") {
		t.Fatalf("three stores logged the warning %d times:\n%s", n, log.String())
	}
	if _, err := openReporting(t, nil, nil, &Config{AllowNonDurable: true, StrictDurability: true}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("AllowNonDurable with StrictDurability: %v, want ErrInvalid", err)
	}
	if _, err := openReporting(t, nil, nil, nil); err != nil {
		t.Fatalf("a durable store: %v", err)
	}
}

// TestUnreadableDurability: settings that cannot be read are logged once, not refused, unless
// the store is strict.
func TestUnreadableDurability(t *testing.T) {
	checkErr := errors.New("CONFIG refused in " + t.Name())
	var log bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&log, nil))
	for range 2 {
		if _, err := openReporting(t, nil, checkErr, &Config{Logger: logger}); err != nil {
			t.Fatal(err)
		}
	}
	if n := strings.Count(log.String(), checkErr.Error()); n != 1 {
		t.Fatalf("two stores logged the failed check %d times:\n%s", n, log.String())
	}
	if _, err := openReporting(t, nil, checkErr, &Config{StrictDurability: true}); !errors.Is(err, checkErr) {
		t.Fatalf("a strict store with unreadable settings: %v", err)
	}
}
