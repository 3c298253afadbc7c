package artifact

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"

	"gocloud.dev/blob"
	_ "gocloud.dev/blob/azureblob" // azblob:// URLs
	"gocloud.dev/blob/fileblob"
	_ "gocloud.dev/blob/gcsblob" // gs:// URLs (documented, not tested here)
	_ "gocloud.dev/blob/s3blob"  // s3:// URLs (documented, not tested here)
	"gocloud.dev/gcerrors"
)

// ErrExists is returned when an upload's key already exists: the store refused to overwrite it.
var ErrExists = errors.New("an object with this key already exists; artifacts are never overwritten")

// tmpDir is where the file store stages uploads, beside KeyPrefix so that Collect never lists it.
const tmpDir = ".fenced-upload"

// Bucket is a blob store holding artifacts. Open one with OpenBucket, or wrap a *blob.Bucket
// with NewBucket.
type Bucket struct {
	b *blob.Bucket
	// dir is the root of a file store. Its uploads are made create-only with a hard link,
	// because fileblob's IfNotExist is a stat followed by a rename, which two writers can both
	// pass.
	dir string
}

// URLError is a store URL that cannot name a store; nothing was contacted.
type URLError struct{ URL, Reason string }

func (e *URLError) Error() string { return fmt.Sprintf("artifact store URL %q: %s", e.URL, e.Reason) }

// OpenBucket opens a store by URL: file:///abs/dir (created if missing; see FileURL),
// azblob://container, s3://bucket or gs://bucket, with gocloud.dev/blob's query parameters and
// environment.
func OpenBucket(ctx context.Context, rawURL string) (*Bucket, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, &URLError{URL: rawURL, Reason: "it does not parse: " + err.Error()}
	}
	if u.Fragment != "" || strings.HasSuffix(rawURL, "#") {
		// A '#' in a path must be written %23: unescaped, it would cut the path short and
		// silently name another store.
		return nil, &URLError{URL: rawURL, Reason: "it has a fragment (#...); write a '#' in a path as %23"}
	}
	switch u.Scheme {
	case "file":
		if u.Path == "" || u.Host != "" && u.Host != "localhost" {
			return nil, &URLError{URL: rawURL, Reason: "a file store needs an absolute path, as in file:///var/lib/fenced/artifacts"}
		}
		if len(u.Query()) > 0 {
			return nil, &URLError{URL: rawURL, Reason: "a file store takes no query parameters"}
		}
		return openDir(filepath.FromSlash(u.Path))
	case "azblob", "s3", "gs":
		if u.Host == "" {
			return nil, &URLError{URL: rawURL, Reason: fmt.Sprintf("it names no bucket or container (expected %s://NAME)", u.Scheme)}
		}
	case "":
		return nil, &URLError{URL: rawURL, Reason: "it has no scheme; use file:///dir, azblob://container, s3://bucket or gs://bucket"}
	default:
		return nil, &URLError{URL: rawURL, Reason: fmt.Sprintf("the scheme %q is not supported; use file, azblob, s3 or gs", u.Scheme)}
	}
	b, err := blob.OpenBucket(ctx, rawURL)
	if err != nil {
		return nil, fmt.Errorf("open artifact store %q: %w", rawURL, err)
	}
	// Opening contacts nothing; a read proves the store is reachable before any upload starts.
	switch ok, err := b.IsAccessible(ctx); {
	case err != nil:
		_ = b.Close()
		return nil, fmt.Errorf("artifact store %q is not reachable: %w", rawURL, err)
	case !ok:
		_ = b.Close()
		return nil, fmt.Errorf("artifact store %q: the bucket or container does not exist", rawURL)
	}
	return &Bucket{b: b}, nil
}

// FileURL is the file store URL of an absolute directory, escaped so that any path (with '#',
// '?' or '%' in it) names that directory.
func FileURL(dir string) string {
	return (&url.URL{Scheme: "file", Path: filepath.ToSlash(dir)}).String()
}

func openDir(dir string) (*Bucket, error) {
	dir = filepath.Clean(dir) // syncCommitted walks up to it
	if !filepath.IsAbs(dir) {
		return nil, fmt.Errorf("artifact store directory %q is not absolute", dir)
	}
	if err := os.MkdirAll(filepath.Join(dir, tmpDir), 0o777); err != nil {
		return nil, fmt.Errorf("artifact store directory: %w", err)
	}
	// No sidecar files: the pointer carries the content type, and a key is one file.
	b, err := fileblob.OpenBucket(dir, &fileblob.Options{Metadata: fileblob.MetadataDontWrite})
	if err != nil {
		return nil, fmt.Errorf("open artifact store directory %q: %w", dir, err)
	}
	return &Bucket{b: b, dir: dir}, nil
}

// NewBucket wraps an open bucket. Uploads use the driver's IfNotExist, so create-only holds only
// where the driver enforces it (Azure, S3 and GCS send a conditional request; fileblob does not
// enforce it between concurrent writers: open a file store with OpenBucket instead).
func NewBucket(b *blob.Bucket) *Bucket { return &Bucket{b: b} }

// Blob returns the underlying bucket.
func (b *Bucket) Blob() *blob.Bucket { return b.b }

// Close closes the underlying bucket.
func (b *Bucket) Close() error { return b.b.Close() }

// testHookBeforeCommit, when set, runs in a file store upload after the bytes are staged and
// before the create-only commit, so a test can line up two writers there.
var testHookBeforeCommit func(key string)

// put streams r to key, refusing to replace an existing object, and returns the SHA-256 and
// the size of what it stored; it returns ErrExists when the key is taken. Nothing is left under
// key when it fails.
func (b *Bucket) put(ctx context.Context, key, contentType string, r io.Reader) ([]byte, int64, error) {
	if b.dir != "" {
		return b.putFile(ctx, key, r)
	}
	if contentType == "" {
		contentType = "application/octet-stream"
	}
	h := sha256.New()
	cr := &countingReader{r: io.TeeReader(r, h)}
	// Upload, not NewWriter and Copy: it hands r to the driver in one call (azureblob's
	// pipe-based writer panics in Close after a refused conditional write), and a read error
	// from r aborts the upload before anything is committed.
	err := b.b.Upload(ctx, key, cr, &blob.WriterOptions{ContentType: contentType, IfNotExist: true})
	if err != nil {
		if gcerrors.Code(err) == gcerrors.FailedPrecondition {
			return nil, 0, fmt.Errorf("%q: %w", key, ErrExists)
		}
		return nil, 0, err
	}
	return h.Sum(nil), cr.n, nil
}

// putFile stages the bytes in a file of their own, links it to the key's path (link fails if
// the path exists, in one system call, whatever other writers do), and syncs the file and
// every directory from the key's up to the store's root before it returns.
//
// The link comes before the syncs so that one journal commit can cover the bytes and their
// name (on ext4 the file's fsync commits the link with it, and the directories' fsyncs find
// nothing left to write). The object is visible under its key from the link on, but no pointer
// names it until put has returned: a crash before the syncs leaves an orphan for Collect, never
// a pointer to bytes that were lost.
//
// The SHA-256 is not in the key, so the commit and the syncs do not wait for it: the staged
// file is hashed by reading it back while it is written, linked and synced (see stage), and
// put returns once both the syncs and the hash are done. A failure of either removes the key
// (TestSyncFailureRemovesTheKey forces a failed sync; a failed read-back of the hash shares
// that path but is not forced by a test).
func (b *Bucket) putFile(ctx context.Context, key string, r io.Reader) ([]byte, int64, error) {
	st, err := createStaging(filepath.Join(b.dir, tmpDir))
	if err != nil {
		return nil, 0, err
	}
	defer st.discard()
	n, hash, err := stage(st.f, r)
	if err != nil {
		return nil, 0, err
	}
	defer hash.cancel() // before discard closes the file it reads
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	path := filepath.Join(b.dir, filepath.FromSlash(key))
	if err := os.MkdirAll(filepath.Dir(path), 0o777); err != nil {
		return nil, 0, err
	}
	if testHookBeforeCommit != nil {
		testHookBeforeCommit(key)
	}
	if err := commitFile(st.from, path); err != nil {
		if errors.Is(err, os.ErrExist) {
			return nil, 0, fmt.Errorf("%q: %w", key, ErrExists)
		}
		return nil, 0, err
	}
	err = b.syncCommitted(st.f, path)
	sum, herr := hash.wait()
	if err == nil && herr != nil {
		err = fmt.Errorf("hash the staged upload: %w", herr)
	}
	if err != nil {
		_ = os.Remove(path) // a crash now would leave it as an orphan anyway
		return nil, 0, err
	}
	return sum, n, nil
}

// syncCommitted makes a committed object durable: its bytes, and the name of every directory
// from the key's up to the store's root (the whole chain every time, rather than only the
// directories this upload created: another upload may have created one and not synced it
// yet). The fsyncs run at once: a directory whose entries an earlier commit already wrote has
// nothing to write, but its fsync still waits for a flush of the disk's cache, and concurrent
// flushes are merged by the block layer and the journal, where successive ones each take a
// round trip to the disk.
func (b *Bucket) syncCommitted(f *os.File, path string) error {
	var dirs []string
	for d := filepath.Dir(path); ; d = filepath.Dir(d) {
		dirs = append(dirs, d)
		if d == b.dir || filepath.Dir(d) == d {
			break
		}
	}
	errs := make(chan error, len(dirs))
	for _, d := range dirs {
		go func() { errs <- syncDir(d) }()
	}
	err := syncFile(f)
	for range dirs {
		if derr := <-errs; err == nil {
			err = derr
		}
	}
	return err
}

// staging is the file an upload writes before committing it under its key.
type staging struct {
	f *os.File
	// from is the path commitFile links from: /proc/self/fd/N for an unnamed file, else the
	// file's name.
	from  string
	named bool
}

// namedStagingOnly is set by tests to run the named-file fallback of createStaging.
var namedStagingOnly bool

func createNamedStaging(dir string) (staging, error) {
	f, err := os.CreateTemp(dir, "upload-*")
	if err != nil {
		return staging{}, err
	}
	return staging{f: f, from: f.Name(), named: true}, nil
}

// discard closes the staging file and removes its name: after a commit, the object keeps the
// bytes under its own name.
func (s staging) discard() {
	_ = s.f.Close()
	if s.named {
		_ = os.Remove(s.from)
	}
}

// Staging: the caller's goroutine reads r and writes the staging file in chunks of
// stageChunk bytes; every writeBehind bytes, the range written since the last request is
// handed to the kernel's writeback (startWriteback) by a second goroutine, so the disk writes
// while the copy goes on and the fsync after the commit waits for little; the request can
// block (a full device queue, a journal commit), so the copy never waits for it: a range the
// goroutine is too busy to take joins the next request.
//
// A third goroutine hashes the file by reading back (pread, hashChunk bytes at a time) what the
// copy has written so far. Hashing (about 1.3 GB/s with SHA-NI) is slower than a copy into the
// page cache, and it does not pace the copy: the copy, the commit and the fsync go on at their
// own speed while the hash catches up, so an upload takes about the longer of the copy plus
// the fsync and the hash, not their sum. The bytes hashed are the bytes in the file, read
// from the page cache (no disk reads unless memory pressure evicted them). The memory stays
// two buffers, whatever the size; the page cache is the kernel's, not the process's.
const (
	stageChunk  = 512 << 10
	hashChunk   = 512 << 10
	writeBehind = 8 << 20
)

// digest is the SHA-256 of a staging file, computed by a goroutine that follows the copy.
type digest struct {
	written atomic.Int64  // bytes the copy has written, all readable
	more    chan struct{} // a signal that written moved (capacity 1: signals merge)
	end     chan struct{} // closed when written is final
	abort   atomic.Bool   // stop now: the upload failed
	done    chan struct{} // closed when sum and err are set
	sum     []byte
	err     error
}

// testHookHashStart, when set, runs in the hashing goroutine before it reads anything.
var testHookHashStart func()

func startDigest(f *os.File) *digest {
	d := &digest{more: make(chan struct{}, 1), end: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(d.done)
		if testHookHashStart != nil {
			testHookHashStart()
		}
		h := sha256.New()
		buf := make([]byte, hashChunk)
		var off int64
		for !d.abort.Load() {
			if w := d.written.Load(); off < w {
				k, err := f.ReadAt(buf[:min(int64(len(buf)), w-off)], off)
				if err != nil {
					d.err = err // a short read is io.EOF: the file is not what was written
					return
				}
				h.Write(buf[:k])
				off += int64(k)
				continue
			}
			select {
			case <-d.more:
			case <-d.end:
				if off == d.written.Load() {
					d.sum = h.Sum(nil)
					return
				}
			}
		}
		d.err = errors.New("the upload was abandoned")
	}()
	return d
}

// wrote records that the file holds its first n bytes.
func (d *digest) wrote(n int64) {
	d.written.Store(n)
	select {
	case d.more <- struct{}{}:
	default: // a signal is pending already
	}
}

// finish says the file is complete: the hash ends once it has read everything written.
func (d *digest) finish() { close(d.end) }

// wait returns the SHA-256 of the whole file.
func (d *digest) wait() ([]byte, error) {
	<-d.done
	return d.sum, d.err
}

// cancel stops the hash and waits for its goroutine, which no longer reads the file when
// cancel returns. Calling it after wait, or again, is harmless.
func (d *digest) cancel() {
	d.abort.Store(true)
	select {
	case <-d.end:
	default:
		close(d.end)
	}
	<-d.done
}

// stage copies r to f, which must be open for reading and writing, and returns the number of
// bytes copied and their SHA-256 in progress: the caller waits for it (digest.wait) or
// abandons it (digest.cancel) before closing f. When stage returns, writeback has been
// requested for every byte but the last writeBehind. If the copy fails, the hash is already
// cancelled.
func stage(f *os.File, r io.Reader) (int64, *digest, error) {
	hash := startDigest(f)
	type span struct{ off, n int64 }
	writeback := make(chan span, 1)
	wrote := make(chan struct{})
	go func() {
		for s := range writeback {
			startWriteback(f, s.off, s.n)
		}
		close(wrote)
	}()
	buf := make([]byte, stageChunk)
	var n, flushed int64
	var err error
	for {
		var k int
		k, err = io.ReadFull(r, buf)
		if k > 0 {
			if _, werr := f.Write(buf[:k]); werr != nil {
				err = werr
				break
			}
			n += int64(k)
			hash.wrote(n)
		}
		if n-flushed >= writeBehind {
			select {
			case writeback <- span{flushed, n - flushed}:
				flushed = n
			default: // still busy with the last request
			}
		}
		if err != nil {
			break
		}
	}
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		err = nil
	}
	if err == nil && n-flushed >= writeBehind {
		writeback <- span{flushed, n - flushed}
	}
	close(writeback)
	<-wrote
	if err != nil {
		hash.cancel()
		return 0, nil, err
	}
	hash.finish()
	return n, hash, nil
}

// commitFile makes the staged file visible under path only if path does not exist yet.
var commitFile = linkStaged

// syncFile and syncDir are variables so that a test can see what an upload syncs, and when.
var (
	syncFile = (*os.File).Sync
	syncDir  = syncDirectory
)

func syncDirectory(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// newNonce is a fresh random key segment.
func newNonce() string { return strings.ToLower(rand.Text()) }
