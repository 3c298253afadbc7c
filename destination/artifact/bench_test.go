//go:build unix

package artifact

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"gocloud.dev/blob"
	"gocloud.dev/blob/fileblob"
)

// BenchmarkArtifact streams artifacts of 16 MiB, 256 MiB and 1 GiB through the file store with
// each pointer home (SQLite, PostgreSQL, MariaDB, etcd, Redis; a server home skips when its
// server is not reachable): impl=fenced is artifact.PublishAndRelease then artifact.Open and a
// verified read; impl=raw is the baseline, a plain fileblob bucket.Upload plus the raw
// publication of a pointer-sized payload, then a plain read; impl=raw+fsync adds to raw the
// fsync of the file and of its directory, what a store that keeps its bytes across a crash
// must do. Besides ns/op and MB/s it reports publish-ns/op (acquire, upload, publish and
// release) and publish-cpu-ns/op (the process's CPU time during it), read-ns/op (open and read
// to the end), and peak-RSS-MiB: the process's peak
// resident set (VmHWM, reset before each run through /proc/self/clear_refs), which must not
// grow with the artifact. Set FENCED_TEST_ETCD to an etcd server: the embedded member the tests
// start otherwise would count in the peak RSS. Run one size at a time to keep the disk use
// down, e.g. -bench 'Artifact/home=sqlite/size=1GiB' -benchtime 1x.
func BenchmarkArtifact(b *testing.B) {
	for _, h := range homes() {
		for _, size := range []int64{16 << 20, 256 << 20, 1 << 30} {
			for _, impl := range []string{"raw", "raw+fsync", "fenced"} {
				b.Run(fmt.Sprintf("home=%s/size=%s/impl=%s", h.name, sizeName(size), impl), func(b *testing.B) {
					benchArtifact(b, h, impl, size)
				})
			}
		}
	}
}

func sizeName(n int64) string {
	if n >= 1<<30 {
		return strconv.FormatInt(n>>30, 10) + "GiB"
	}
	return strconv.FormatInt(n>>20, 10) + "MiB"
}

func benchArtifact(b *testing.B, h namedHome, impl string, size int64) {
	ctx := context.Background()
	dir := b.TempDir()
	s, _, _ := h.open(b).open(b)
	res := "bench " + strings.ToLower(rand.Text()[:8]) + " €"
	if err := s.Provision(ctx, res); err != nil {
		b.Fatal(err)
	}
	if _, err := s.BumpEpoch(ctx); err != nil { // epoch != generation in the keys
		b.Fatal(err)
	}
	bucket, err := OpenBucket(ctx, FileURL(filepath.Join(dir, "store")))
	if err != nil {
		b.Fatal(err)
	}
	defer bucket.Close()
	raw, err := fileblob.OpenBucket(filepath.Join(dir, "store"), &fileblob.Options{Metadata: fileblob.MetadataDontWrite})
	if err != nil {
		b.Fatal(err)
	}
	defer raw.Close()
	runtime.GC()
	resetPeakRSS(b)
	b.SetBytes(size)
	var publishTime, readTime, publishCPU time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start, startCPU := time.Now(), cpuTime(b)
		lease, err := s.Acquire(ctx, res, 10*time.Minute) // a 1 GiB upload on a loaded machine took over a minute
		if err != nil {
			b.Fatal(err)
		}
		src := &patternReader{n: size}
		var key string
		switch impl {
		case "raw", "raw+fsync":
			key = fmt.Sprintf("raw/%d", i)
			if err := raw.Upload(ctx, key, src, &blob.WriterOptions{ContentType: "application/octet-stream"}); err != nil {
				b.Fatal(err)
			}
			if impl == "raw+fsync" {
				if err := syncPath(filepath.Join(dir, "store", key)); err != nil {
					b.Fatal(err)
				}
				if err := syncDirectory(filepath.Join(dir, "store", "raw")); err != nil {
					b.Fatal(err)
				}
			}
			if err := lease.PublishAndRelease(ctx, []byte(`{"key":"`+key+`","sha256":"`+strings.Repeat("0", 64)+`","size":1}`)); err != nil {
				b.Fatal(err)
			}
			publishTime += time.Since(start)
			publishCPU += cpuTime(b) - startCPU
			start = time.Now()
			r, err := raw.NewReader(ctx, key, nil)
			if err != nil {
				b.Fatal(err)
			}
			if n, err := io.Copy(io.Discard, r); err != nil || n != size {
				b.Fatal(n, err)
			}
			_ = r.Close()
		default:
			p, err := PublishAndRelease(ctx, lease, bucket, src)
			if err != nil {
				b.Fatal(err)
			}
			key = p.Key
			publishTime += time.Since(start)
			publishCPU += cpuTime(b) - startCPU
			start = time.Now()
			r, err := Open(ctx, s, bucket, res)
			if err != nil {
				b.Fatal(err)
			}
			if n, err := r.WriteTo(io.Discard); err != nil || n != size {
				b.Fatal(n, err)
			}
			_ = r.Close()
		}
		readTime += time.Since(start)
		b.StopTimer()
		if err := raw.Delete(ctx, key); err != nil { // keep the disk use to one artifact
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.StopTimer()
	b.ReportMetric(peakRSSMiB(b), "peak-RSS-MiB")
	b.ReportMetric(float64(publishTime.Nanoseconds())/float64(b.N), "publish-ns/op")
	b.ReportMetric(float64(readTime.Nanoseconds())/float64(b.N), "read-ns/op")
	b.ReportMetric(float64(publishCPU.Nanoseconds())/float64(b.N), "publish-cpu-ns/op")
}

// cpuTime is the CPU time (user and system) the process has used: on a machine shared with
// other work, the CPU a publication costs varies much less than its wall time.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func syncPath(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// patternReader yields n bytes of a repeating pattern without holding them.
type patternReader struct{ n, off int64 }

var pattern = bytes.Repeat([]byte("fenced artifact \x00"), 4096)

func (p *patternReader) Read(b []byte) (int, error) {
	if p.off >= p.n {
		return 0, io.EOF
	}
	b = b[:min(int64(len(b)), p.n-p.off)]
	n := 0
	for n < len(b) {
		n += copy(b[n:], pattern[(p.off+int64(n))%int64(len(pattern)):])
	}
	p.off += int64(n)
	return n, nil
}

func resetPeakRSS(b *testing.B) {
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		b.Logf("cannot reset the peak RSS (%v); peak-RSS-MiB is the process's since it started", err)
	}
}

func peakRSSMiB(b *testing.B) float64 {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		b.Logf("no /proc/self/status: %v", err)
		return 0
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024
		}
	}
	return 0
}
