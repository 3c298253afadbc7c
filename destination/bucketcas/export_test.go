package bucketcas

import gblob "gocloud.dev/blob"

// SetHook makes every fence and write through c call f after comparing the tokens and before
// its conditional upload.
func SetHook(c *CAS, f func(op, resource string)) { c.hook = f }

// NewAllowingS3 is New, except that it opens an S3 bucket, to show the A-B-A New refuses.
func NewAllowingS3(b *gblob.Bucket, opts *Options) (*CAS, error) { return open(b, opts, true) }

// Unconditional turns c's uploads into plain ones, a mutant for the schedule tests.
func Unconditional(c *CAS) { c.unconditional = true }
