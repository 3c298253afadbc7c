package artifact

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"testing/iotest"
	"time"

	"github.com/fenced-dev/fenced"
)

// stageData is n bytes with NULs and non-ASCII in them, not repeating at any chunk boundary.
func stageData(n int) []byte {
	var b bytes.Buffer
	for i := 0; b.Len() < n; i++ {
		b.WriteString("bytes \x00 of € ")
		b.WriteByte(byte(i))
	}
	return b.Bytes()[:n]
}

// The hash that follows the copy covers every byte exactly once, at every chunk boundary.
func TestStageHashesWhatItWrote(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "staged"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, size := range []int{0, 1, hashChunk - 1, hashChunk, hashChunk + 1, 3*stageChunk + 7} {
		if err := f.Truncate(0); err != nil {
			t.Fatal(err)
		}
		if _, err := f.Seek(0, 0); err != nil {
			t.Fatal(err)
		}
		data := stageData(size)
		n, hash, err := stage(f, bytes.NewReader(data))
		if err != nil || n != int64(size) {
			t.Fatalf("stage %d bytes: %d, %v", size, n, err)
		}
		sum, err := hash.wait()
		if want := sha256.Sum256(data); err != nil || !bytes.Equal(sum, want[:]) {
			t.Fatalf("%d bytes: digest %x, %v; want %x", size, sum, err, want)
		}
	}
}

// A source that fails mid-way fails the upload and commits nothing: the hash is abandoned.
func TestStageSourceFails(t *testing.T) {
	ctx, b := testCtx(t), fileStore.open(t)
	boom := errors.New("the producer failed")
	key := objectKey(resource, "owner", fenced.Token{Epoch: 3, Generation: 1}, newNonce())
	if _, _, err := b.put(ctx, key, "", io.MultiReader(bytes.NewReader(stageData(2*stageChunk+3)), iotest.ErrReader(boom))); !errors.Is(err, boom) {
		t.Fatalf("put: %v, want the source's error", err)
	}
	if _, err := os.Stat(filepath.Join(b.dir, filepath.FromSlash(key))); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the key exists after a failed upload: %v", err)
	}
}

// The file store's commit and fsync do not wait for the SHA-256: the hash is held back until
// the staged file has been synced, and the upload must still complete with the right digest.
// An upload that hashed before (or while pacing) the copy, or that waited for the hash before
// its commit, never reaches the sync: the guard then fails the test after a minute.
func TestHashDoesNotHoldBackTheSync(t *testing.T) {
	ctx, b := testCtx(t), fileStore.open(t)
	synced := make(chan struct{})
	var once sync.Once
	syncFile = func(f *os.File) error {
		once.Do(func() { close(synced) })
		return f.Sync()
	}
	testHookHashStart = func() {
		select {
		case <-synced:
		case <-time.After(time.Minute): // a guard against a hang, not an ordering
			t.Error("the staged file was not synced while its hash was held back: the upload waits for the hash")
		}
	}
	defer func() { syncFile, testHookHashStart = (*os.File).Sync, nil }()
	data := stageData(8*stageChunk + 5) // more than any buffering between the copy and the hash
	key := objectKey(resource, "owner", fenced.Token{Epoch: 3, Generation: 1}, newNonce())
	sum, n, err := b.put(ctx, key, "", bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	if want := sha256.Sum256(data); n != int64(len(data)) || !bytes.Equal(sum, want[:]) {
		t.Fatalf("%d bytes, digest %x; want %d, %x", n, sum, len(data), want)
	}
	got, err := os.ReadFile(filepath.Join(b.dir, filepath.FromSlash(key)))
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("stored %d bytes (%v), want the %d uploaded", len(got), err, len(data))
	}
}

// A committed object whose fsync fails is removed, so that no key names bytes that may not
// survive a crash; the upload fails with the sync's error.
func TestSyncFailureRemovesTheKey(t *testing.T) {
	ctx, b := testCtx(t), fileStore.open(t)
	boom := errors.New("the disk refused the flush")
	syncFile = func(*os.File) error { return boom }
	defer func() { syncFile = (*os.File).Sync }()
	key := objectKey(resource, "owner", fenced.Token{Epoch: 3, Generation: 1}, newNonce())
	if _, _, err := b.put(ctx, key, "", bytes.NewReader(stageData(3*stageChunk+1))); !errors.Is(err, boom) {
		t.Fatalf("put: %v, want the sync's error", err)
	}
	if _, err := os.Stat(filepath.Join(b.dir, filepath.FromSlash(key))); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the key exists after its sync failed: %v", err)
	}
}
