//go:build !linux

package artifact

import "os"

// startWriteback is a no-op where sync_file_range does not exist; the fsync after the commit
// writes everything.
func startWriteback(*os.File, int64, int64) {}

// createStaging opens a named file in dir; Collect removes those a crash left behind.
func createStaging(dir string) (staging, error) { return createNamedStaging(dir) }

// linkStaged gives the staged file the name to, failing with an error matching os.ErrExist if
// to exists.
func linkStaged(from, to string) error { return os.Link(from, to) }
