package artifact

import (
	"os"

	"golang.org/x/sys/unix"
)

// startWriteback asks the kernel to start writing the range back to the disk now, without
// waiting: a hint, so that the fsync before the commit finds little left to write. Durability
// still rests on that fsync alone.
func startWriteback(f *os.File, off, n int64) {
	_ = unix.SyncFileRange(int(f.Fd()), off, n, unix.SYNC_FILE_RANGE_WRITE)
}
