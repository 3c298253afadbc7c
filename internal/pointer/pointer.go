// Package pointer is the encoding of an artifact pointer: the payload that names an object in a
// blob store instead of holding the bytes. It lives in the core module so that the core can
// refuse ordinary payloads that would be read back as pointers, while the blob stores and their
// SDKs stay in destination/artifact.
package pointer

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Prefix starts every pointer payload. The NUL bytes make a collision with a text payload
// impossible and with a binary one unlikely; the core refuses any payload that starts with it
// and is not a valid pointer, so a reader can trust the prefix.
const Prefix = "\x00\x00fenced-artifact/1\n"

// MaxKeyLen bounds the object key (S3 and Azure allow 1024 bytes).
const MaxKeyLen = 1024

// Pointer names one immutable object and what its bytes must be.
type Pointer struct {
	Key         string `json:"key"`
	SHA256      string `json:"sha256"` // lowercase hex
	Size        int64  `json:"size"`
	ContentType string `json:"content_type,omitempty"`
}

// Encode returns the payload for p. It fails if p is not valid.
func Encode(p Pointer) ([]byte, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	j, err := json.Marshal(p)
	if err != nil {
		return nil, err
	}
	return append([]byte(Prefix), j...), nil
}

// Is reports whether payload claims to be a pointer.
func Is(payload []byte) bool { return bytes.HasPrefix(payload, []byte(Prefix)) }

// Decode parses a payload that starts with Prefix. Unknown fields are refused, so a newer
// format is never half-read by an older reader.
func Decode(payload []byte) (Pointer, error) {
	if !Is(payload) {
		return Pointer{}, errors.New("it does not start with the artifact pointer prefix")
	}
	dec := json.NewDecoder(bytes.NewReader(payload[len(Prefix):]))
	dec.DisallowUnknownFields()
	var p Pointer
	if err := dec.Decode(&p); err != nil {
		return Pointer{}, fmt.Errorf("its JSON does not parse: %w", err)
	}
	if dec.More() {
		return Pointer{}, errors.New("it has data after the JSON object")
	}
	if err := p.Validate(); err != nil {
		return Pointer{}, err
	}
	return p, nil
}

// Validate checks the fields; it says what is wrong in a phrase.
func (p Pointer) Validate() error {
	switch {
	case p.Key == "" || len(p.Key) > MaxKeyLen || !utf8.ValidString(p.Key):
		return fmt.Errorf("its key must be 1 to %d bytes of UTF-8", MaxKeyLen)
	case len(p.SHA256) != 64 || strings.ToLower(p.SHA256) != p.SHA256:
		return errors.New("its sha256 must be 64 lowercase hex digits")
	case p.Size < 0:
		return errors.New("its size is negative")
	case len(p.ContentType) > 255:
		return errors.New("its content type is longer than 255 bytes")
	}
	if _, err := hex.DecodeString(p.SHA256); err != nil {
		return errors.New("its sha256 must be 64 lowercase hex digits")
	}
	return nil
}
