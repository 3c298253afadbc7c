package artifact

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fenced-dev/fenced"
)

func TestKeyRoundTrip(t *testing.T) {
	tok := fenced.Token{Epoch: 7, Generation: 3}
	for _, r := range []string{"r", "a/b", "..", ".", "€ ü 名前", "%41", "~x", strings.Repeat("é", 127), strings.Repeat("/", 255)} {
		for _, owner := range []string{"G6IF3TTY57", "a/b%c", strings.Repeat("~", 128)} {
			key := objectKey(r, owner, tok, "nonce")
			if len(key) > 1024 {
				t.Fatalf("key for %q is %d bytes", r, len(key))
			}
			for _, seg := range strings.Split(key, "/") {
				if len(seg) > chunkLen || seg == "" || seg == "." || seg == ".." {
					t.Fatalf("key %q has the segment %q", key, seg)
				}
			}
			k, ok := parseKey(key)
			if !ok || k.resource != r || k.token != tok {
				t.Fatalf("%q -> %q -> %+v, %v", r, key, k, ok)
			}
		}
	}
	for _, bad := range []string{"", "x/a/1.1/o/n", KeyPrefix + "/a/1.1/o", KeyPrefix + "/a/1/o/n", KeyPrefix + "/a/0.1/o/n",
		KeyPrefix + "/%41/1.1/o/n", KeyPrefix + "/%e2%82%ac/1.1/o/n", KeyPrefix + "/a b/1.1/o/n", KeyPrefix + "/%4/1.1/o/n"} {
		if k, ok := parseKey(bad); ok {
			t.Errorf("%q parsed as %+v", bad, k)
		}
	}
}

// A file store URL names exactly its directory: a '#' or '?' in the path is escaped by FileURL,
// and an unescaped one is refused rather than cutting the path short.
func TestFileURL(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "a#b?c%d é")
	b, err := OpenBucket(ctx, FileURL(dir))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if b.dir != dir {
		t.Fatalf("FileURL(%q) opened %q", dir, b.dir)
	}
	for _, bad := range []string{"file://" + dir, "file:///tmp/x#", "azblob://c#frag"} {
		var ue *URLError
		if _, err := OpenBucket(ctx, bad); !errors.As(err, &ue) {
			t.Errorf("OpenBucket(%q): %v, want a URLError", bad, err)
		}
	}
}
