package artifact

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// stage hands what it writes to the kernel's writeback as it goes, so that the fsync after the
// commit has little left to wait for: when it returns, at most the last writeBehind bytes of
// the file are still dirty in the page cache. Without the hint they all would be, since the
// flusher starts on a file only once its pages are dirty_expire_centisecs old (30 s by default)
// or the machine holds many dirty pages.
func TestStageStartsWriteback(t *testing.T) {
	dir := t.TempDir()
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		t.Fatal(err)
	}
	if fs.Type == unix.TMPFS_MAGIC {
		t.Skip("the test directory is on tmpfs, which has no writeback; set TMPDIR to a disk")
	}
	f, err := os.Create(filepath.Join(dir, "staged"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	size := int64(4*writeBehind + 12345)
	n, hash, err := stage(f, &patternReader{n: size})
	if err != nil || n != size {
		t.Fatalf("stage: %d bytes, %v", n, err)
	}
	defer hash.cancel()
	var cs unix.Cachestat_t
	err = unix.Cachestat(uint(f.Fd()), &unix.CachestatRange{}, &cs, 0) // Len 0: to the end
	if errors.Is(err, unix.ENOSYS) {
		t.Skip("cachestat(2) needs Linux 6.5 or later")
	}
	if err != nil {
		t.Fatal(err)
	}
	page := uint64(os.Getpagesize())
	if limit := uint64(writeBehind)/page + 1; cs.Dirty > limit {
		t.Fatalf("%d of the file's %d pages are still dirty after stage, want at most %d (the last %d bytes): the writeback was not started",
			cs.Dirty, cs.Cache, limit, writeBehind)
	}
	t.Logf("after stage: %d pages cached, %d dirty, %d under writeback", cs.Cache, cs.Dirty, cs.Writeback)
}
