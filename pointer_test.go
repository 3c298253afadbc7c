package fenced_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/backend/sqlite"
	"github.com/fenced-dev/fenced/internal/pointer"
)

// A payload that starts with the artifact prefix is read back as a pointer, so the core accepts
// it only when it is a valid one; every other payload, NUL bytes included, is untouched.
func TestPublishRefusesPayloadsThatImitateAPointer(t *testing.T) {
	ctx := context.Background()
	drv, err := sqlite.Open(filepath.Join(t.TempDir(), "fenced.db"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := fenced.New(ctx, drv, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const res = "rapport trimestriel/€ 1"
	if err := s.Provision(ctx, res); err != nil {
		t.Fatal(err)
	}
	if _, err := s.BumpEpoch(ctx); err != nil {
		t.Fatal(err)
	}
	lease, err := s.Acquire(ctx, res, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{
		pointer.Prefix,
		pointer.Prefix + "not json",
		pointer.Prefix + `{"key":"k","sha256":"00","size":1}`,
		pointer.Prefix + `{"key":"k","sha256":"` + strings.Repeat("a", 64) + `","size":1,"extra":1}`,
		pointer.Prefix + `{"key":"k","sha256":"` + strings.Repeat("a", 64) + `","size":1} trailing`,
	} {
		err := lease.Publish(ctx, []byte(bad))
		if !errors.Is(err, fenced.ErrInvalid) || !strings.Contains(err.Error(), "reserved artifact pointer prefix") {
			t.Fatalf("payload %q: %v, want an invalid-argument error naming the prefix", bad, err)
		}
	}
	if _, gen, err := s.Get(ctx, res); !errors.Is(err, fenced.ErrNothingPublished) {
		t.Fatalf("after refused payloads: generation %d, %v; want nothing published", gen, err)
	}
	// A payload with NUL bytes that is not the prefix is an ordinary payload.
	if err := lease.Publish(ctx, []byte("\x00\x00fenced-artifact/2\n")); err != nil {
		t.Fatalf("an ordinary payload with NUL bytes: %v", err)
	}

	lease2, err := s.Acquire(ctx, res, time.Minute)
	if !errors.Is(err, fenced.ErrBusy) {
		t.Fatalf("acquire while held: %v", err)
	}
	_ = lease2
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	lease3, err := s.Acquire(ctx, res, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	good, err := pointer.Encode(pointer.Pointer{Key: "k", SHA256: strings.Repeat("0", 64), Size: 3})
	if err != nil {
		t.Fatal(err)
	}
	if err := lease3.Publish(ctx, good); err != nil {
		t.Fatalf("a valid pointer: %v", err)
	}
}
