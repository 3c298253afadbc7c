package bucketcas_test

import (
	"context"
	"testing"

	"github.com/fenced-dev/fenced/destination/destinationtest"
)

// A token no lease store issues is refused as malformed before anything reaches the store: an
// object never fenced is not created (before the check, the zero Token was recorded there as
// "0.0", which ParseToken refuses, and every later fence failed), a fenced object keeps its
// data and token, and a valid fence works afterwards.
func TestMalformedTokenRefused(t *testing.T) {
	t.Parallel()
	for _, s := range stores {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := s.open(t)
			c := newCAS(t, b, nil)
			h := destinationtest.Harness{Fencer: c, Write: c.Write}
			destinationtest.RefuseBadTokens(t, ctx, h, res)
			if ok, err := b.Exists(ctx, res); err != nil || ok {
				t.Fatalf("the object exists (%v) after refused calls only", err)
			}
			first := tok(1, 1)
			if err := c.Fence(ctx, res, first); err != nil {
				t.Fatal(err)
			}
			if err := c.Write(ctx, res, first, []byte("first\x00")); err != nil {
				t.Fatal(err)
			}
			destinationtest.RefuseBadTokens(t, ctx, h, res)
			if data, got, err := c.Read(ctx, res); err != nil || got != first || string(data) != "first\x00" {
				t.Fatalf("read %q under %s (%v), want the first holder's data and token %s", data, got, err, first)
			}
			if err := c.Fence(ctx, res, tok(1, 2)); err != nil {
				t.Fatalf("a valid fence after the refused ones: %v", err)
			}
		})
	}
}
