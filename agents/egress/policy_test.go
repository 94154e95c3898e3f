package egress

import (
	"net/netip"
	"testing"
)

func TestDecide(t *testing.T) {
	allow := []string{"api.example.com", "*.Wild.test", "alt.test:8443", "203.0.113.5", "2001:db8::1", "[2001:db8::2]:8080", "bad.test:99999"}
	for _, tc := range []struct {
		host string
		port int
		rule string // "" means refused
	}{
		{"api.example.com", 443, "api.example.com"},
		{"API.Example.COM.", 80, "api.example.com"},
		{"api.example.com", 8080, ""},
		{"example.com", 443, ""},
		{"x.api.example.com", 443, ""},
		{"a.wild.test", 443, "*.Wild.test"},
		{"a.b.wild.test", 80, "*.Wild.test"},
		{"wild.test", 443, ""},
		{"notwild.test", 443, ""},
		{"alt.test", 8443, "alt.test:8443"},
		{"alt.test", 443, ""},
		{"203.0.113.5", 443, "203.0.113.5"},
		{"203.0.113.6", 443, ""},
		{"2001:db8::1", 443, "2001:db8::1"},
		{"[2001:db8::1]", 80, "2001:db8::1"},
		{"2001:db8::2", 8080, "[2001:db8::2]:8080"},
		{"2001:db8::2", 443, ""},
		{"bad.test", 443, ""},
		{"localhost", 443, ""},
		{"", 443, ""},
	} {
		d := decide(allow, tc.host, tc.port)
		if d.rule != tc.rule || d.allowed != (tc.rule != "") || d.reason == "" {
			t.Errorf("decide(%q, %d) = %+v, want rule %q", tc.host, tc.port, d, tc.rule)
		}
	}
}

func TestForbidden(t *testing.T) {
	for _, tc := range []struct {
		addr string
		want string
	}{
		{"127.0.0.1", "a loopback address"},
		{"127.9.9.9", "a loopback address"},
		{"::1", "a loopback address"},
		{"::ffff:127.0.0.1", "a loopback address"},
		{"10.0.0.1", "a private address"},
		{"172.16.5.4", "a private address"},
		{"192.168.0.1", "a private address"},
		{"fd00::1", "a private address"},
		{"169.254.169.254", "a link-local address"},
		{"fe80::1%eth0", "a link-local address"},
		{"0.0.0.0", "the unspecified address"},
		{"::", "the unspecified address"},
		{"224.0.0.1", "a link-local address"},
		{"239.1.1.1", "a multicast address"},
		{"100.64.0.1", "a reserved address"},
		{"255.255.255.255", "a reserved address"},
		{"64:ff9b::10.0.0.1", "a private address"},
		{"64:ff9b::8.8.8.8", ""},
		{"8.8.8.8", ""},
		{"203.0.113.10", ""},
		{"2606:4700::1111", ""},
	} {
		if got := forbidden(netip.MustParseAddr(tc.addr)); got != tc.want {
			t.Errorf("forbidden(%s) = %q, want %q", tc.addr, got, tc.want)
		}
	}
}
