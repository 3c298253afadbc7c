package cli

import (
	"reflect"
	"testing"
)

// The delay fault's proxies replace each address of the URL and keep everything else,
// credentials and parameters included.
func TestURLHosts(t *testing.T) {
	for _, tc := range []struct {
		url, prefix, suffix string
		addrs               []string
	}{
		{"postgres://u:p%40ss@127.0.0.1:5432/db?search_path=s%20%C3%A9", "postgres://u:p%40ss@", "/db?search_path=s%20%C3%A9", []string{"127.0.0.1:5432"}},
		{"mysql://root@localhost/test", "mysql://root@", "/test", []string{"localhost:3306"}},
		{"redis://:pw@[::1]/0", "redis://:pw@", "/0", []string{"[::1]:6379"}},
		{"etcd://10.0.0.1:2379,10.0.0.2:2379", "etcd://", "", []string{"10.0.0.1:2379", "10.0.0.2:2379"}},
		{"rediss://h:6380?tls_ca=ca.pem", "rediss://", "?tls_ca=ca.pem", []string{"h:6380"}},
	} {
		prefix, addrs, suffix, err := urlHosts(tc.url)
		if err != nil || prefix != tc.prefix || suffix != tc.suffix || !reflect.DeepEqual(addrs, tc.addrs) {
			t.Errorf("urlHosts(%q) = %q, %q, %q, %v", tc.url, prefix, addrs, suffix, err)
		}
	}
	for _, bad := range []string{"sqlite:/tmp/x.db", "postgres:///db?host=/var/run/postgresql", "gopher://host/x"} {
		if _, _, _, err := urlHosts(bad); err == nil {
			t.Errorf("urlHosts(%q): no error", bad)
		}
	}
}
