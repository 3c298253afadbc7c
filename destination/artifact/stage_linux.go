package artifact

import (
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// startWriteback asks the kernel to start writing the range back to the disk now, without
// waiting: a hint, so that the fsync after the commit finds little left to write. Durability
// still rests on that fsync alone.
func startWriteback(f *os.File, off, n int64) {
	_ = unix.SyncFileRange(int(f.Fd()), off, n, unix.SYNC_FILE_RANGE_WRITE)
}

// createStaging opens an unnamed file in dir (O_TMPFILE): it has no name to create, remove or
// collect, and a crash before its commit leaves nothing behind. It falls back to a named file
// where the filesystem or /proc does not allow that.
func createStaging(dir string) (staging, error) {
	if namedStagingOnly {
		return createNamedStaging(dir)
	}
	fd, err := unix.Open(dir, unix.O_TMPFILE|unix.O_RDWR|unix.O_CLOEXEC, 0o600) // as os.CreateTemp; read back by the hash
	if err != nil {
		return createNamedStaging(dir)
	}
	f := os.NewFile(uintptr(fd), filepath.Join(dir, "(unnamed upload)"))
	// linkat(2) with AT_EMPTY_PATH needs a capability; the /proc link of the descriptor does
	// not, with AT_SYMLINK_FOLLOW.
	from := "/proc/self/fd/" + strconv.Itoa(fd)
	if _, err := os.Lstat(from); err != nil {
		_ = f.Close()
		return createNamedStaging(dir)
	}
	return staging{f: f, from: from}, nil
}

// linkStaged gives the staged file the name to, failing with an error matching os.ErrExist if
// to exists.
func linkStaged(from, to string) error {
	if err := unix.Linkat(unix.AT_FDCWD, from, unix.AT_FDCWD, to, unix.AT_SYMLINK_FOLLOW); err != nil {
		return &os.LinkError{Op: "link", Old: from, New: to, Err: err}
	}
	return nil
}
