package cluster

import (
	"net"
	"os"
	"time"

	"github.com/walship/walship/internal/serve"
	"github.com/walship/walship/internal/tlsid"
)

// DevTrustDomain is the trust domain of DevTLS's identities.
const DevTrustDomain = "walship.dev"

// DevTLS makes a throwaway CA in dir and certificates for the nodes (one
// node identity, reached at host), log stores run as processes of their
// own (logstore.crt, reached at host too), a client (client.crt) and an
// admin (admin.crt), and returns the in-process servers' security: mTLS
// under the default policy, dialling as the nodes do (Security.Dialer). For `walship dev --tls`, `walship bench --tls` and
// tests, never production.
func DevTLS(dir, host string) (serve.Security, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return serve.Security{}, err
	}
	ca, err := tlsid.NewCA("walship dev CA", 30*24*time.Hour)
	if err != nil {
		return serve.Security{}, err
	}
	// The nodes dial as nodes, and so do the in-process tools given
	// Security.Dialer (bench, tests): the default policy lets nodes read
	// and write.
	at := tlsid.Leaf{URI: tlsid.URI(DevTrustDomain, tlsid.ClassNode, "dev"), DNS: []string{"localhost"}}
	if ip := net.ParseIP(host); ip != nil {
		at.IPs = []net.IP{ip}
	} else {
		at.DNS = append(at.DNS, host)
	}
	nodeFiles, err := ca.WriteFiles(dir, "node", at)
	if err != nil {
		return serve.Security{}, err
	}
	// A log store process dialled by a primary process must hold a log
	// store's certificate (the primary checks its class).
	ls := at
	ls.URI = tlsid.URI(DevTrustDomain, tlsid.ClassLogStore, "dev")
	if _, err := ca.WriteFiles(dir, "logstore", ls); err != nil {
		return serve.Security{}, err
	}
	for _, class := range []string{tlsid.ClassClient, tlsid.ClassAdmin} {
		if _, err := ca.WriteFiles(dir, class, tlsid.Leaf{URI: tlsid.URI(DevTrustDomain, class, "dev")}); err != nil {
			return serve.Security{}, err
		}
	}
	src, err := tlsid.Load(nodeFiles, nil)
	if err != nil {
		return serve.Security{}, err
	}
	az, err := tlsid.NewAuthz(tlsid.AuthzConfig{TrustDomain: DevTrustDomain, Reflection: tlsid.ReflectionAll})
	if err != nil {
		return serve.Security{}, err
	}
	// Every server of the process serves the one node identity, log
	// stores too: a dial cannot tell a log store by its class here.
	return serve.Security{TLS: src, Authz: az, Dialer: serve.NewDialer(src, "")}, nil
}
