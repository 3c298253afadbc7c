package cli_test

import (
	"encoding/json"
	"testing"

	"github.com/fenced-dev/fenced/cmd/fenced/cli"
)

// TestAcquireWait: --wait gives up busy (exit 3) when the holder keeps the lease, and gets the
// lease once the holder's lease runs out on the database's clock.
func TestAcquireWait(t *testing.T) {
	forEachTarget(t, func(tg target) {
		t := tg.t
		res := "wait für ü"
		tg.ok(nil, "provision", res)
		tg.ok(nil, "epoch", "bump")
		var long leaseOut
		if err := json.Unmarshal(tg.ok(nil, "acquire", res, "--ttl", "1h"), &long); err != nil {
			t.Fatal(err)
		}
		tg.fails(cli.ExitBusy, nil, "acquire", res, "--ttl", "1m", "--wait", "300ms")
		tg.fails(cli.ExitUsage, nil, "acquire", res, "--ttl", "1m", "--wait", "-1s")
		tg.ok(nil, leaseArgs("release", res, long)...)

		var short, next leaseOut
		if err := json.Unmarshal(tg.ok(nil, "acquire", res, "--ttl", "500ms"), &short); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(tg.ok(nil, "acquire", res, "--ttl", "1m", "--wait", "1m"), &next); err != nil {
			t.Fatal(err)
		}
		if next.Generation != short.Generation+1 || next.Epoch != short.Epoch {
			t.Fatalf("waited for %+v, got %+v", short, next)
		}
		tg.fails(cli.ExitRefused, []byte("late"), leaseArgs("publish", res, short)...)
	})
}
