package tlsid

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/grpc/credentials"
)

// A dialer checks the server's name (DNS or IP SAN) against the address it
// dialled; that says where the server is, not what it is: any certificate
// of the cluster's CA — a client application's, a log store's — can be
// served at an address a replica takes for its primary's, and the replica
// would follow it. Under the default identity scheme a dialer that knows
// what it dials also checks the server's class (PeerCredentials): a
// replica's primary and a candidate's members are nodes, log stores are
// log stores. Under a custom policy (--authz-policy) identities need not
// follow the scheme, and only the name and the chain are checked.

// CheckClass checks that c, a server's certificate, carries exactly one
// well-formed SPIFFE ID, spiffe://td/walship/CLASS/NAME, with CLASS one of
// classes; the error names what it carries instead.
func CheckClass(c *x509.Certificate, td string, classes ...string) error {
	u, err := certSPIFFEID(c)
	if err != nil {
		return fmt.Errorf("the server's identity: %w", err)
	}
	class, ok := classOf(u.Host, u.Path, td)
	if !ok || !slices.Contains(classes, class) {
		return fmt.Errorf("the server's identity %s is not of class %s under trust domain %s", u, strings.Join(classes, " or "), td)
	}
	return nil
}

// classOf is the class of a SPIFFE ID of host and path under trust
// domain td (spiffe://td/walship/CLASS/NAME).
func classOf(host, path, td string) (string, bool) {
	if host != td {
		return "", false
	}
	parts := strings.Split(strings.TrimPrefix(path, "/"), "/")
	if len(parts) != 3 || parts[0] != "walship" {
		return "", false
	}
	return parts[1], true
}

// PeerCredentials are Credentials that also require the server to be of
// one of classes under trust domain td (CheckClass), checked at every
// handshake after the chain and the name: a server of another class fails
// the connection, so nothing is sent to it or taken from it.
func (s *Source) PeerCredentials(td string, classes ...string) credentials.TransportCredentials {
	return clientCreds{s: s, class: &classCheck{td: td, classes: classes}}
}

// classCheck is the class a server must be of: one of classes under
// trust domain td.
type classCheck struct {
	td      string
	classes []string
}

// clientConfig is ClientConfig with c's class check, if any.
func (c clientCreds) clientConfig() *tls.Config {
	cfg := c.s.ClientConfig()
	if cc := c.class; cc != nil {
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("tlsid: the server sent no certificate")
			}
			return CheckClass(cs.PeerCertificates[0], cc.td, cc.classes...)
		}
	}
	return cfg
}
