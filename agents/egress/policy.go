package egress

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// decision is what the allow-list says of one host:port.
type decision struct {
	allowed bool
	rule    string // the entry that admitted it
	reason  string
}

// decide matches host:port against an allow-list.
func decide(allow []string, host string, port int) decision {
	host = normalize(host)
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return decision{reason: host + " is the host itself, which sandboxes may never reach"}
	}
	nameListed := false
	for _, e := range allow {
		name, eport := splitEntry(e)
		if !matches(name, host) {
			continue
		}
		if eport == port || (eport == 0 && (port == 80 || port == 443)) {
			return decision{allowed: true, rule: e, reason: "listed as " + e}
		}
		nameListed = true
	}
	what := host
	if _, err := netip.ParseAddr(host); err == nil {
		what = "the IP address " + host
	}
	if nameListed {
		return decision{reason: fmt.Sprintf("port %d of %s is not in the agent's network list (entries admit ports 80 and 443; name another as %s)",
			port, host, net.JoinHostPort(host, strconv.Itoa(port)))}
	}
	return decision{reason: what + " is not in the agent's network list"}
}

// splitEntry splits "host:port" (or "[v6]:port"); port 0 means none was
// named.
func splitEntry(e string) (name string, port int) {
	e = strings.TrimSpace(e)
	if h, p, err := net.SplitHostPort(e); err == nil {
		if n, err := strconv.Atoi(p); err == nil && n > 0 && n < 65536 {
			return normalize(h), n
		}
		return "", 0 // a bad port admits nothing
	}
	return normalize(e), 0
}

// matches says whether an entry's name (normalized, without a port)
// admits host: itself, or any subdomain for "*.example.com", or the same
// address for an IP.
func matches(name, host string) bool {
	if name == "" {
		return false
	}
	if suffix, ok := strings.CutPrefix(name, "*"); ok {
		return strings.HasPrefix(suffix, ".") && len(host) > len(suffix) && strings.HasSuffix(host, suffix)
	}
	if a, err := netip.ParseAddr(name); err == nil {
		b, err := netip.ParseAddr(host)
		return err == nil && a.Unmap() == b.Unmap()
	}
	return name == host
}

// normalize lowercases a host name and drops a trailing dot, brackets and
// an IPv6 zone.
func normalize(h string) string {
	h = strings.ToLower(strings.TrimSuffix(h, "."))
	h = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
	if a, err := netip.ParseAddr(h); err == nil {
		return a.WithZone("").Unmap().String()
	}
	return h
}

// special are ranges no sandbox may reach besides those netip names:
// this network, shared address space (carrier-grade NAT, often a VPN's
// addresses), IETF protocol assignments, benchmarking, reserved and
// broadcast, and the IPv6 unique-local and discard-only blocks.
var special = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("192.0.0.0/24"),
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("240.0.0.0/4"),
	netip.MustParsePrefix("100::/64"),
}

// nat64 embeds an IPv4 address in its last 32 bits.
var nat64 = netip.MustParsePrefix("64:ff9b::/96")

// forbidden says what kind of address a is if sandboxes may not reach it
// (its loopback, private, link-local, ...), or "" if they may.
func forbidden(a netip.Addr) string {
	a = a.WithZone("").Unmap()
	switch {
	case !a.IsValid():
		return "not an address"
	case a.IsLoopback():
		return "a loopback address"
	case a.IsPrivate():
		return "a private address"
	case a.IsLinkLocalUnicast(), a.IsLinkLocalMulticast():
		return "a link-local address"
	case a.IsUnspecified():
		return "the unspecified address"
	case a.IsMulticast(), a.IsInterfaceLocalMulticast():
		return "a multicast address"
	}
	if nat64.Contains(a) {
		b := a.As16()
		return forbidden(netip.AddrFrom4([4]byte(b[12:])))
	}
	for _, p := range special {
		if p.Contains(a) {
			return "a reserved address"
		}
	}
	return ""
}

// Allowed says whether an agent whose network list is allow may reach
// host:port through the proxy, and if not, why. Definitions check the
// URLs of their HTTP MCP servers with it, as the proxy will check the
// requests.
func Allowed(allow []string, host string, port int) (ok bool, reason string) {
	d := decide(allow, host, port)
	return d.allowed, d.reason
}
