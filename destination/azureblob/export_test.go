package azureblob

import "github.com/fenced-dev/fenced"

// SetFenceHook makes every fence through l call f between its requests to Azure.
func SetFenceHook(l *Leased, f func(step string)) { l.hook = func(s fenceStep) { f(string(s)) } }

// DeriveLeaseIDFromToken turns the process's lease IDs into the old derivation, from resource
// and token, for a mutation test.
func DeriveLeaseIDFromToken() {
	deriveLeaseID = func(resource, _ string, t fenced.Token) string { return LeaseID(resource, "token "+t.String()) }
}
