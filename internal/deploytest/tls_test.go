package deploytest

import (
	"net"
	"net/url"
	"path"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The cert-manager.io/v1 fields the manifests use, decoded strictly: an
// unknown or misspelled field is an error, as the CRD's schema would make
// it (cert-manager's own API module is not a dependency of the tests).
type cmIssuerRef struct {
	Name  string `json:"name"`
	Kind  string `json:"kind,omitempty"`
	Group string `json:"group,omitempty"`
}

type cmCertificate struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		SecretName  string           `json:"secretName"`
		IsCA        bool             `json:"isCA,omitempty"`
		CommonName  string           `json:"commonName,omitempty"`
		Duration    *metav1.Duration `json:"duration,omitempty"`
		RenewBefore *metav1.Duration `json:"renewBefore,omitempty"`
		URIs        []string         `json:"uris,omitempty"`
		DNSNames    []string         `json:"dnsNames,omitempty"`
		Usages      []string         `json:"usages,omitempty"`
		PrivateKey  *struct {
			Algorithm      string `json:"algorithm,omitempty"`
			Size           int    `json:"size,omitempty"`
			RotationPolicy string `json:"rotationPolicy,omitempty"`
		} `json:"privateKey,omitempty"`
		IssuerRef cmIssuerRef `json:"issuerRef"`
	} `json:"spec"`
}

type cmIssuer struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		SelfSigned *struct{} `json:"selfSigned,omitempty"`
		CA         *struct {
			SecretName string `json:"secretName"`
		} `json:"ca,omitempty"`
	} `json:"spec"`
}

// certificateFor returns the Certificate that makes Secret name.
func (c *checker) certificateFor(secret string) *cmCertificate {
	for _, n := range sortedKeys(c.o.certificates) {
		if cert := c.o.certificates[n]; cert.Spec.SecretName == secret {
			return cert
		}
	}
	return nil
}

// checkIssuers: every Certificate names an Issuer of the build, every CA
// Issuer a CA Certificate's Secret.
func (c *checker) checkIssuers() {
	for _, n := range sortedKeys(c.o.certificates) {
		cert := c.o.certificates[n]
		ref := cert.Spec.IssuerRef
		if ref.Kind != "" && ref.Kind != "Issuer" || c.o.issuers[ref.Name] == nil {
			c.errorf("Certificate %s: issuerRef %s %q is not an Issuer of the build", n, ref.Kind, ref.Name)
		}
		if cert.Spec.SecretName == "" {
			c.errorf("Certificate %s: no secretName", n)
		}
	}
	for _, n := range sortedKeys(c.o.issuers) {
		is := c.o.issuers[n]
		switch {
		case is.Spec.CA != nil:
			if cert := c.certificateFor(is.Spec.CA.SecretName); cert == nil || !cert.Spec.IsCA {
				c.errorf("Issuer %s: ca.secretName %q is not made by a CA Certificate", n, is.Spec.CA.SecretName)
			}
		case is.Spec.SelfSigned == nil:
			c.errorf("Issuer %s: neither ca nor selfSigned", n)
		}
	}
}

// checkTLS: a pod that serves TLS mounts its role's certificate as a whole
// Secret volume where its --tls-* flags point, and the certificate carries
// one SPIFFE ID of the pod's class under its --trust-domain, is for server
// and client use, and names the pod as everyone dials it: as its peers do
// (<pod>.<headless service>), as it advertises itself (--advertise, the
// address clients follow after a failover), and as every client Service
// that routes to it, short and namespace-qualified (<service>.<ns>.svc,
// for clients in other namespaces). (Its probes: checkProbes.)
func (c *checker) checkTLS(where string, sts *appsv1.StatefulSet, p *pod) {
	env := p.env
	if env["WALSHIP_TLS_CERT"] == "" {
		return
	}
	if env["WALSHIP_PLAINTEXT"] == "true" {
		c.errorf("%s: WALSHIP_PLAINTEXT=true beside the TLS flags", where)
	}
	dir := path.Dir(env["WALSHIP_TLS_CERT"])
	for _, k := range []string{"WALSHIP_TLS_KEY", "WALSHIP_TLS_CA"} {
		if path.Dir(env[k]) != dir {
			c.errorf("%s: %s=%q is not in %s beside the certificate", where, k, env[k], dir)
		}
	}
	ct := p.container
	var secret string
	for _, vm := range ct.VolumeMounts {
		if vm.MountPath != dir {
			continue
		}
		if vm.SubPath != "" || vm.SubPathExpr != "" {
			c.errorf("%s: %s is mounted with subPath: its files would never update", where, dir)
		}
		for _, v := range sts.Spec.Template.Spec.Volumes {
			if v.Name == vm.Name && v.Secret != nil {
				secret = v.Secret.SecretName
			}
		}
	}
	cert := c.certificateFor(secret)
	if cert == nil {
		c.errorf("%s: no Secret volume made by a Certificate is mounted at %s", where, dir)
		return
	}
	class := "node"
	if p.command == "logstore" {
		class = "logstore"
	}
	prefix := "spiffe://" + env["WALSHIP_TRUST_DOMAIN"] + "/walship/" + class + "/"
	if len(cert.Spec.URIs) != 1 || !strings.HasPrefix(cert.Spec.URIs[0], prefix) {
		c.errorf("%s: Certificate %s has URIs %v; want one SPIFFE ID under %s", where, cert.Name, cert.Spec.URIs, prefix)
	} else if u, err := url.Parse(cert.Spec.URIs[0]); err != nil || u.Path != path.Clean(u.Path) {
		c.errorf("%s: Certificate %s: %q is not a clean SPIFFE ID", where, cert.Name, cert.Spec.URIs[0])
	}
	for _, u := range []string{"server auth", "client auth"} {
		if !slices.Contains(cert.Spec.Usages, u) {
			c.errorf("%s: Certificate %s lacks the usage %q", where, cert.Name, u)
		}
	}
	names := []string{p.name + "." + sts.Spec.ServiceName}
	if adv := p.flag("advertise"); adv != "" {
		if host, _, err := net.SplitHostPort(adv); err == nil {
			names = append(names, host)
		}
	}
	for _, sn := range sortedKeys(c.o.services) {
		svc := c.o.services[sn]
		if svc.Spec.ClusterIP == corev1.ClusterIPNone {
			continue
		}
		if targets, _ := c.podsOfService(svc.Spec.Selector); len(targets) == 1 && targets[0] == sts {
			names = append(names, svc.Name)
			if c.namespace != "" {
				names = append(names, svc.Name+"."+c.namespace+".svc")
			}
		}
	}
	for _, n := range names {
		if !slices.ContainsFunc(cert.Spec.DNSNames, func(pat string) bool { return dnsMatch(pat, n) }) {
			c.errorf("%s: Certificate %s does not name %s, where it is dialled (dnsNames %v)", where, cert.Name, n, cert.Spec.DNSNames)
		}
	}
	for _, n := range cert.Spec.DNSNames {
		if slices.Contains(strings.Split(n, "."), "NAMESPACE") {
			c.errorf("%s: Certificate %s: dnsName %q still says NAMESPACE: the overlay must fill in its namespace (replacements, as overlays/prod does)", where, cert.Name, n)
		}
	}
}

// dnsMatch reports whether a certificate's DNS name covers host, with a
// wildcard only as the whole left-most label.
func dnsMatch(pattern, host string) bool {
	if rest, ok := strings.CutPrefix(pattern, "*."); ok {
		_, after, found := strings.Cut(host, ".")
		return found && after == rest
	}
	return pattern == host
}
