package artifact

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"

	"github.com/fenced-dev/fenced"
)

// KeyPrefix is the folder under which every artifact key lives. Collect lists only under it.
const KeyPrefix = "fenced-artifacts"

// chunkLen bounds one key segment: filesystems allow 255 bytes per path component.
const chunkLen = 240

// objectKey is the key of one upload by one attempt:
//
//	fenced-artifacts/<resource, escaped, in segments>/<epoch>.<generation>/<owner>/<nonce>
//
// The token makes it unique to the acquisition, the owner guards against a token issued twice
// by a database restored without an epoch bump, and the nonce lets an attempt upload more than
// once. The content digest is in the pointer, not the key: putting it in the key would need the
// whole artifact before the first byte is written.
func objectKey(resource, owner string, token fenced.Token, nonce string) string {
	var b strings.Builder
	b.WriteString(KeyPrefix)
	for _, seg := range segments(escape(resource)) {
		b.WriteByte('/')
		b.WriteString(seg)
	}
	fmt.Fprintf(&b, "/%d.%d/%s/%s", token.Epoch, token.Generation, ownerSegment(owner), nonce)
	return b.String()
}

// parsedKey is what Collect and Open read back from a key.
type parsedKey struct {
	resource string
	token    fenced.Token
}

// parseKey reverses objectKey; ok is false for a key objectKey cannot have produced.
func parseKey(key string) (parsedKey, bool) {
	parts := strings.Split(key, "/")
	if len(parts) < 5 || parts[0] != KeyPrefix {
		return parsedKey{}, false
	}
	n := len(parts)
	tok, ok := parseToken(parts[n-3])
	if !ok || parts[n-2] == "" || parts[n-1] == "" {
		return parsedKey{}, false
	}
	res, ok := unescape(strings.Join(parts[1:n-3], ""))
	if !ok || res == "" {
		return parsedKey{}, false
	}
	return parsedKey{resource: res, token: tok}, true
}

func parseToken(s string) (fenced.Token, bool) {
	e, g, ok := strings.Cut(s, ".")
	if !ok {
		return fenced.Token{}, false
	}
	epoch, err1 := strconv.ParseInt(e, 10, 64)
	gen, err2 := strconv.ParseInt(g, 10, 64)
	if err1 != nil || err2 != nil || epoch < 1 || gen < 1 {
		return fenced.Token{}, false
	}
	return fenced.Token{Epoch: epoch, Generation: gen}, true
}

// safe bytes stay as they are; every other byte becomes %XX. '.' is escaped so that no segment
// is "." or "..", and '~' never appears, so it can mark a hashed owner.
func safe(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
}

func escape(s string) string {
	const hexDigits = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if safe(c) {
			b.WriteByte(c)
		} else {
			b.WriteByte('%')
			b.WriteByte(hexDigits[c>>4])
			b.WriteByte(hexDigits[c&15])
		}
	}
	return b.String()
}

func unescape(s string) (string, bool) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case safe(c):
			b.WriteByte(c)
		case c == '%' && i+2 < len(s):
			v, err := strconv.ParseUint(s[i+1:i+3], 16, 8)
			if err != nil || safe(byte(v)) || s[i+1:i+3] != strings.ToUpper(s[i+1:i+3]) {
				return "", false // not canonical: escape would not have produced it
			}
			b.WriteByte(byte(v))
			i += 2
		default:
			return "", false
		}
	}
	return b.String(), true
}

// segments splits an escaped string into pieces of at most chunkLen bytes, never inside a %XX.
func segments(s string) []string {
	var out []string
	for len(s) > chunkLen {
		cut := chunkLen
		for cut > 0 && (s[cut-1] == '%' || cut > 1 && s[cut-2] == '%') {
			cut--
		}
		out = append(out, s[:cut])
		s = s[cut:]
	}
	return append(out, s)
}

// ownerSegment is the escaped owner, or a digest of it when escaping makes it long (an owner
// is at most 128 bytes of printable ASCII, which could triple).
func ownerSegment(owner string) string {
	if e := escape(owner); len(e) <= 64 {
		return e
	}
	sum := sha256.Sum256([]byte(owner))
	return "~" + hex.EncodeToString(sum[:16])
}
