package tlsid

import (
	"context"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc/credentials"
)

// TestPeerCredentials: a dialer that names the classes it accepts refuses
// a server of any other class, of another trust domain, or without
// exactly one well-formed SPIFFE ID, at the handshake and naming what it
// found — though the server's chain and name check out, which is all the
// plain Credentials check.
func TestPeerCredentials(t *testing.T) {
	ca := newCA(t, "ca")
	cli := load(t, write(t, ca, t.TempDir(), "replica", Leaf{URI: URI("td", ClassNode, "r1")}))
	for _, tc := range []struct {
		name    string
		leaf    Leaf
		classes []string
		want    string // "" = accepted
	}{
		{"a node dialled as a node", Leaf{URI: URI("td", ClassNode, "n1")}, []string{ClassNode}, ""},
		{"a log store dialled as a node or a log store", Leaf{URI: URI("td", ClassLogStore, "l1")}, []string{ClassNode, ClassLogStore}, ""},
		{"a client dialled as a node", Leaf{URI: URI("td", ClassClient, "c1")}, []string{ClassNode}, "spiffe://td/walship/client/c1 is not of class node under trust domain td"},
		{"a log store dialled as a node", Leaf{URI: URI("td", ClassLogStore, "l1")}, []string{ClassNode}, "is not of class node"},
		{"a node dialled as a log store", Leaf{URI: URI("td", ClassNode, "n1")}, []string{ClassLogStore}, "is not of class logstore"},
		{"a node of another trust domain", Leaf{URI: URI("other", ClassNode, "n1")}, []string{ClassNode}, "under trust domain td"},
		{"a node path too deep", Leaf{URI: "spiffe://td/walship/node/n1/x"}, []string{ClassNode}, "is not of class node"},
		{"two identities", Leaf{URI: URI("td", ClassClient, "c1"), AlsoURIs: []string{URI("td", ClassNode, "n1")}}, []string{ClassNode}, "2 URI names"},
		{"no identity", Leaf{}, []string{ClassNode}, "0 URI names"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.leaf.IPs = localhost
			addr := serveTLS(t, load(t, write(t, ca, t.TempDir(), "server", tc.leaf)))
			for _, d := range []struct {
				creds   credentials.TransportCredentials
				checked bool
			}{{cli.Credentials(), false}, {cli.PeerCredentials("td", tc.classes...), true}} {
				raw, err := net.Dial("tcp", addr)
				if err != nil {
					t.Fatal(err)
				}
				conn, _, err := d.creds.ClientHandshake(context.Background(), addr, raw)
				if err == nil {
					conn.Close()
				} else {
					raw.Close()
				}
				checked := d.checked
				switch {
				case !checked && err != nil:
					t.Fatalf("Credentials (no class check): %v", err)
				case checked && tc.want == "" && err != nil:
					t.Fatalf("PeerCredentials(%v): %v", tc.classes, err)
				case checked && tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
					t.Fatalf("PeerCredentials(%v) = %v; want a refusal naming %q", tc.classes, err, tc.want)
				}
			}
		})
	}
}
