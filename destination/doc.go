// Package destination is for places that check a fencing token themselves, so that a write
// which leaves fenced's database is still refused once its writer has been superseded.
//
// A destination implements fenced.Fencer: Fence installs a holder's token right after it
// acquired the lease, and from then on the destination refuses writes carrying an older token,
// whatever the new holder has written. Each destination lives in its own package below this
// one, and each passes the conformance suite in destination/destinationtest:
//
//   - destination/gate: a high-water mark kept in a participating service's own database and
//     checked, with one conditional statement, inside the transaction of the service's write.
//   - destination/azureblob (its own module): one Azure blob fenced by Azure's blob lease and
//     ETags, or by ETag compare-and-swap alone.
//   - destination/bucketcas (its own module): one object of a gocloud.dev/blob bucket on Google
//     Cloud Storage or Azure, fenced by compare-and-swap on its generation or ETag. S3 is
//     refused: its ETags are content hashes.
//
// This package also defines how a token travels over HTTP: the Fencing-Token header (see
// FormatHeader), set on a request by SetHeader or by a Transport.
//
// # The gap, and how Fence narrows it
//
// A destination that only remembers the highest token it has seen cannot tell that a newer
// holder exists until that holder writes: between B's acquisition and B's first write, A's
// delayed write with the older token is accepted. Fencing on acquisition (fenced.Lease.Fence,
// fenced.RunOptions.Fence) narrows that gap for the destinations a holder names: from the
// moment B's Fence returns they refuse A, whatever B has written. It does not close it: a
// write of A's that lands between B's acquisition and the return of B's Fence is still
// accepted. A destination not named stays open until the new holder writes to it.
package destination
