package azureblob_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/streaming"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blockblob"
	"github.com/fenced-dev/fenced/destination/azureblob"
	"github.com/fenced-dev/fenced/internal/benchstat"
)

// BenchmarkWrite: a 4 KiB upload through Leased (lease ID and If-Match) and through CAS (a
// properties read, then a conditional upload) beside a plain upload of another blob, in
// alternation within each iteration so that the load of a shared machine falls on all alike.
// On Azurite this measures the client's and the protocol's work, not Azure's latency. Run with
// FENCED_TEST_AZURITE=… go test -run '^$' -bench Write -count 5 ./destination/azureblob/
func BenchmarkWrite(b *testing.B) {
	ctx := context.Background()
	c := containerForTest(b)
	leased, cas := azureblob.NewLeased(c, nil), azureblob.NewCAS(c, nil)
	token := tok(1, 2)
	if err := leased.FenceOwner(ctx, "leased", "bench-owner", token); err != nil {
		b.Fatal(err)
	}
	if err := cas.Fence(ctx, "cas", token); err != nil {
		b.Fatal(err)
	}
	plain := c.NewBlockBlobClient("plain")
	data := make([]byte, 4096)
	n := uint64(0)
	next := func() []byte { n++; binary.BigEndian.PutUint64(data, n); return data }
	var tPlain, tLeased, tCAS time.Duration
	var rLeased, rCAS []float64 // per round: one write of each
	for b.Loop() {
		t0 := time.Now()
		if _, err := plain.Upload(ctx, streaming.NopCloser(bytes.NewReader(next())), &blockblob.UploadOptions{}); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := leased.Write(ctx, "leased", "bench-owner", token, next()); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		if err := cas.Write(ctx, "cas", token, next()); err != nil {
			b.Fatal(err)
		}
		t3 := time.Now()
		tPlain, tLeased, tCAS = tPlain+t1.Sub(t0), tLeased+t2.Sub(t1), tCAS+t3.Sub(t2)
		rLeased = append(rLeased, float64(t2.Sub(t1))/float64(t1.Sub(t0)))
		rCAS = append(rCAS, float64(t3.Sub(t2))/float64(t1.Sub(t0)))
	}
	b.ReportMetric(benchstat.Median(rLeased), "leased/plain-median")
	b.ReportMetric(benchstat.Median(rCAS), "cas/plain-median")
	b.ReportMetric(float64(tPlain.Nanoseconds())/float64(b.N), "plain-ns/write")
	b.ReportMetric(float64(tLeased.Nanoseconds())/float64(b.N), "leased-ns/write")
	b.ReportMetric(float64(tCAS.Nanoseconds())/float64(b.N), "cas-ns/write")
	b.ReportMetric(float64(tLeased)/float64(tPlain), "leased/plain")
	b.ReportMetric(float64(tCAS)/float64(tPlain), "cas/plain")
}
