package artifact

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/fenced-dev/fenced"
)

// A file store upload returns only after its bytes and every name leading to them are synced:
// the file, already linked under its key (so that one journal commit can carry both), and each
// directory from the key's up to the store's root, including those that existed before.
func TestUploadSyncsBytesThenNames(t *testing.T) {
	ctx, b := testCtx(t), fileStore.open(t)
	key := objectKey(resource, "owner", fenced.Token{Epoch: 3, Generation: 1}, newNonce())
	path := filepath.Join(b.dir, filepath.FromSlash(key))
	var (
		mu     sync.Mutex
		synced []string
	)
	record := func(what string) {
		if _, err := os.Stat(path); err != nil {
			t.Errorf("%s was synced before the commit: %v", what, err)
		}
		mu.Lock()
		defer mu.Unlock()
		synced = append(synced, what)
	}
	syncFile = func(f *os.File) error {
		record("file")
		return f.Sync()
	}
	syncDir = func(dir string) error {
		record(dir)
		return syncDirectory(dir)
	}
	defer func() { syncFile, syncDir = (*os.File).Sync, syncDirectory }()
	if _, _, err := b.put(ctx, key, "", strings.NewReader("bytes \x00 of € 2026")); err != nil {
		t.Fatal(err)
	}
	want := []string{"file"}
	for d := filepath.Dir(path); d != filepath.Dir(b.dir); d = filepath.Dir(d) {
		want = append(want, d)
	}
	slices.Sort(synced)
	slices.Sort(want)
	if !slices.Equal(synced, want) {
		t.Fatalf("synced:\n%s\nwant:\n%s", strings.Join(synced, "\n"), strings.Join(want, "\n"))
	}
}
