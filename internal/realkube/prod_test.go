package realkube

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/check"
	"github.com/walship/walship/internal/s3test"
	"github.com/walship/walship/internal/tlsid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

const (
	prodNamespace   = "walship"
	prodTrustDomain = "walship.local"
	// prodStorageClass is testdata/prod's: the dev overlay's claims
	// never take its volumes, nor its claims the dev overlay's.
	prodStorageClass = "realkube-prod"
	archiveBucket    = "walship-archive"
)

// TestProdOverlay applies the prod overlay as a user does, through
// testdata/prod (only what one two-core node needs: images imported, local
// volumes, small requests, the required anti-affinity dropped) and an
// overlay of it written here with the archive's endpoint and credentials
// (a SeaweedFS S3 server on the host). cert-manager's CRDs and the
// Prometheus Operator's are installed from their pinned modules, and a
// real cert-manager controller (make certmanager) issues the TLS
// component's Certificates. Every pod must be Ready with mutual TLS, every
// volume hold one cluster id, a checked workload through walship-rw with a
// client certificate from cert-manager lose nothing while cert-manager
// renews the nodes' and log stores' certificates (which walship reloads
// without a restart and without a client error), and the archive receive
// the log.
func TestProdOverlay(t *testing.T) {
	c := cluster(t)
	bin := os.Getenv(EnvBin)
	if _, err := os.Stat(filepath.Join(bin, CertManagerBinary)); err != nil {
		t.Skipf("%v: build cert-manager's controller with `make certmanager`", err)
	}
	if os.Getenv(s3test.EnvWeed) == "" {
		t.Setenv(s3test.EnvWeed, filepath.Join(bin, "weed"))
	}
	s3 := s3test.StartOn(t, archiveBucket, c.HostIP)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	if err := c.InstallCRDs(ctx, ProdCRDs); err != nil {
		t.Fatal(err)
	}
	if err := c.StartCertManager(ctx); err != nil {
		t.Fatal(err)
	}
	dirs, err := c.CreateLocalPVsIn(ctx, prodStorageClass, "realkube-prod-pv", 6, "100Gi")
	if err != nil {
		t.Fatal(err)
	}
	overlay, err := prodOverlay(t.TempDir(), s3.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	t.Cleanup(func() {
		if t.Failed() {
			dumpNS(t, c, prodNamespace)
			t.Logf("cert-manager:\n%s", c.Logs("cert-manager", 8000))
		}
		// Free the node for the tests after this one.
		dctx, dcancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer dcancel()
		if err := c.Kubectl(dctx, nil, "delete", "namespace", prodNamespace, "--wait=true", "--timeout=2m"); err != nil {
			t.Logf("delete the prod namespace: %v", err)
		}
	})
	if err := c.Kubectl(ctx, nil, "apply", "-k", overlay); err != nil {
		t.Fatal(err)
	}
	certs, err := c.WaitCertificatesReady(ctx, prodNamespace, 3*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Certificates Ready %v after the apply: %v", time.Since(started).Round(time.Second), certs)
	if err := waitAllReadyIn(ctx, c, prodNamespace, 8*time.Minute); err != nil {
		t.Fatal(err)
	}
	t.Logf("every pod Ready %v after the apply", time.Since(started).Round(time.Second))
	checkOneClusterID(t, dirs)

	client := clientIdentity(t, c, ctx)
	tg := target{ns: prodNamespace, creds: client.PeerCredentials(prodTrustDomain, tlsid.ClassNode)}

	// Mutual TLS: a plaintext client is not served.
	plain, err := grpc.NewClient(serviceIP(t, c, ctx, prodNamespace, "walship-rw")+":7401", grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
	_, err = walshipv1.NewAdminServiceClient(plain).Status(pctx, &walshipv1.StatusRequest{})
	pcancel()
	if err == nil {
		t.Fatal("a plaintext Status through walship-rw was answered")
	}

	underLoadOn(t, c, tg, "prod-renewal", func(ctx context.Context, h *check.History) error {
		return renewAndReload(ctx, t, c, client, h)
	})

	// The archive: the log stores upload the log to the S3 server.
	rw := walshipv1.NewAdminServiceClient(serviceConnTo(t, c, ctx, tg, "walship-rw"))
	var archived *walshipv1.ArchiveStatus
	if err := waitFor(ctx, 2*time.Minute, "an archived LSN through walship-rw", func() error {
		st, err := rw.Status(ctx, &walshipv1.StatusRequest{})
		if err != nil {
			return err
		}
		archived = st.GetArchive()
		if archived.GetArchivedLsn() == 0 {
			return fmt.Errorf("archive status %v", archived)
		}
		return nil
	}); err != nil {
		t.Fatalf("%v\nweed:\n%s", err, s3.Logs())
	}
	t.Logf("archive %s holds the log up to LSN %d (uploader %s)", archived.GetUrl(), archived.GetArchivedLsn(), archived.GetUploaderAddr())
}

// prodOverlay writes, in dir, an overlay of testdata/prod that points the
// archive at endpoint with the S3 server's credentials, and returns dir.
func prodOverlay(dir, endpoint string) (string, error) {
	base, err := filepath.Abs("testdata/prod")
	if err != nil {
		return "", err
	}
	rel, err := filepath.Rel(dir, base)
	if err != nil {
		return "", err
	}
	k := fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: %[1]s
resources:
  - %[2]s
configMapGenerator:
  - name: walship-logstore
    behavior: merge
    literals: [WALSHIP_ARCHIVE_ENDPOINT=%[3]s, WALSHIP_ARCHIVE_PATH_STYLE=true]
  - name: walship-node
    behavior: merge
    literals: [WALSHIP_ARCHIVE_ENDPOINT=%[3]s, WALSHIP_ARCHIVE_PATH_STYLE=true]
secretGenerator:
  - name: walship-archive
    literals: [AWS_ACCESS_KEY_ID=%[4]s, AWS_SECRET_ACCESS_KEY=%[5]s]
`, prodNamespace, rel, endpoint, s3test.AccessKey, s3test.SecretKey)
	return dir, os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644)
}

// checkOneClusterID fails t unless every volume holds the same cluster
// id. A node stamps its volume when it joins the cluster (the primary's
// first heartbeat reaches it), which can come just after its pod turned
// Ready: the stamps are waited for.
func checkOneClusterID(t *testing.T, dirs []string) {
	t.Helper()
	var ids map[string][]string
	err := waitFor(context.Background(), time.Minute, "every volume stamped with a cluster id", func() error {
		ids = map[string][]string{}
		for _, d := range dirs {
			b, err := os.ReadFile(filepath.Join(d, "cluster"))
			if err != nil {
				return fmt.Errorf("%s: %w", filepath.Base(d), err)
			}
			id := strings.TrimSpace(string(b))
			ids[id] = append(ids[id], filepath.Base(d))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 1 {
		t.Fatalf("cluster ids on the volumes = %v, want one id on all %d", ids, len(dirs))
	}
}

// serviceIP is the ClusterIP of a Service in namespace ns.
func serviceIP(t *testing.T, c *Cluster, ctx context.Context, ns, svc string) string {
	t.Helper()
	ip, err := c.KubectlOutput(ctx, nil, "-n", ns, "get", "service", svc, "-o", "jsonpath={.spec.clusterIP}")
	if err != nil {
		t.Fatal(err)
	}
	return string(ip)
}

// clientIdentity has cert-manager issue a client certificate of the
// walship CA (class client, as an application's) and loads it as walship
// clients do.
func clientIdentity(t *testing.T, c *Cluster, ctx context.Context) *tlsid.Source {
	t.Helper()
	cert := fmt.Sprintf(`apiVersion: cert-manager.io/v1
kind: Certificate
metadata: {name: realkube-client, namespace: %s}
spec:
  secretName: realkube-client-tls
  duration: 24h
  uris: [%s]
  usages: [digital signature, client auth]
  privateKey: {algorithm: ECDSA, size: 256}
  issuerRef: {name: walship-ca, kind: Issuer}
`, prodNamespace, tlsid.URI(prodTrustDomain, tlsid.ClassClient, "realkube"))
	if err := c.Kubectl(ctx, strings.NewReader(cert), "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	if err := waitFor(ctx, 2*time.Minute, "Certificate realkube-client Ready", func() error {
		return c.Kubectl(ctx, nil, "-n", prodNamespace, "wait", "--for=condition=Ready", "certificate/realkube-client", "--timeout=5s")
	}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	files := tlsid.Files{Cert: filepath.Join(dir, "tls.crt"), Key: filepath.Join(dir, "tls.key"), CA: filepath.Join(dir, "ca.crt")}
	for key, path := range map[string]string{"tls.crt": files.Cert, "tls.key": files.Key, "ca.crt": files.CA} {
		b, err := secretKey(ctx, c, "realkube-client-tls", key)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	src, err := tlsid.Load(files, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	return src
}

// secretKey returns one key of a Secret of the prod namespace, decoded.
func secretKey(ctx context.Context, c *Cluster, secret, key string) ([]byte, error) {
	out, err := c.KubectlOutput(ctx, nil, "-n", prodNamespace, "get", "secret", secret,
		"-o", "jsonpath={.data."+strings.ReplaceAll(key, ".", `\.`)+"}")
	if err != nil {
		return nil, err
	}
	return base64.StdEncoding.DecodeString(string(out))
}

// secretSerial is the serial number of a TLS Secret's certificate.
func secretSerial(ctx context.Context, c *Cluster, secret string) (string, error) {
	b, err := secretKey(ctx, c, secret, "tls.crt")
	if err != nil {
		return "", err
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		return "", fmt.Errorf("secret %s: no PEM certificate", secret)
	}
	crt, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return "", err
	}
	return crt.SerialNumber.String(), nil
}

// servedSerial is the serial number of the certificate a pod serves on
// port, as name (what a peer dials it by).
func servedSerial(ctx context.Context, c *Cluster, client *tlsid.Source, pod, port, name string) (string, error) {
	out, err := c.KubectlOutput(ctx, nil, "-n", prodNamespace, "get", "pod", pod, "-o", "jsonpath={.status.podIP}")
	if err != nil || len(out) == 0 {
		return "", fmt.Errorf("%s's IP: %q, %v", pod, out, err)
	}
	cfg := client.ClientConfig()
	cfg.ServerName = name
	cfg.NextProtos = []string{"h2"}
	d := tls.Dialer{Config: cfg}
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := d.DialContext(dctx, "tcp", string(out)+":"+port)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	return conn.(*tls.Conn).ConnectionState().PeerCertificates[0].SerialNumber.String(), nil
}

// renewAndReload has cert-manager renew the data nodes' and the log
// stores' certificates now (as `cmctl renew` does: the Issuing condition
// set on the Certificate's status), waits for every pod to serve the new
// certificate, and checks that no container restarted and that no
// operation of the workload failed meanwhile.
func renewAndReload(ctx context.Context, t *testing.T, c *Cluster, client *tlsid.Source, h *check.History) error {
	began := h.Now()
	restarts := func() (string, error) {
		out, err := c.KubectlOutput(ctx, nil, "-n", prodNamespace, "get", "pods",
			"-o", `jsonpath={range .items[*]}{.metadata.name}:{.status.containerStatuses[0].restartCount} {end}`)
		return strings.TrimSpace(string(out)), err
	}
	before, err := restarts()
	if err != nil {
		return err
	}
	roles := []struct {
		cert, secret, port string
		pods               []string
		name               func(pod string) string
	}{
		{"walship-node", "walship-node-tls", "7401", []string{"walship-0", "walship-1", "walship-2"},
			func(p string) string { return p + ".walship-headless" }},
		{"walship-logstore", "walship-logstore-tls", "7400", []string{"walship-logstore-0", "walship-logstore-1", "walship-logstore-2"},
			func(p string) string { return p + ".walship-logstore-headless" }},
	}
	// Both roles at once, as their renewBefore falls on the same day.
	olds := make([]string, len(roles))
	for i, r := range roles {
		if olds[i], err = secretSerial(ctx, c, r.secret); err != nil {
			return err
		}
		for _, p := range r.pods {
			served, err := servedSerial(ctx, c, client, p, r.port, r.name(p))
			if err != nil {
				return fmt.Errorf("%s before the renewal: %w", p, err)
			}
			if served != olds[i] {
				return fmt.Errorf("%s serves certificate %s, its Secret holds %s", p, served, olds[i])
			}
		}
	}
	for _, r := range roles {
		// What cmctl renew does: the condition added to the others.
		cond := fmt.Sprintf(`[{"op":"add","path":"/status/conditions/-","value":{"type":"Issuing","status":"True","reason":"ManuallyTriggered","message":"renewed by TestProdOverlay","lastTransitionTime":%q}}]`,
			time.Now().UTC().Format(time.RFC3339))
		if err := c.Kubectl(ctx, nil, "-n", prodNamespace, "patch", "certificate", r.cert, "--subresource=status", "--type=json", "-p", cond); err != nil {
			return err
		}
	}
	for i, r := range roles {
		var renewed string
		if err := waitFor(ctx, 2*time.Minute, "a new certificate in "+r.secret, func() error {
			s, err := secretSerial(ctx, c, r.secret)
			if err != nil {
				return err
			}
			if s == olds[i] {
				return fmt.Errorf("still %s", s)
			}
			renewed = s
			return nil
		}); err != nil {
			return err
		}
		renewedAt := time.Now()
		// kubelet refreshes Secret volumes on its sync (up to about a
		// minute), walship reads the files every --tls-reload-interval.
		for _, p := range r.pods {
			if err := waitFor(ctx, 3*time.Minute, p+" serving the renewed certificate", func() error {
				s, err := servedSerial(ctx, c, client, p, r.port, r.name(p))
				if err != nil {
					return err
				}
				if s != renewed {
					return fmt.Errorf("serves %s, want %s", s, renewed)
				}
				return nil
			}); err != nil {
				return err
			}
		}
		t.Logf("%s renewed (serial %s → %s); every pod serves it %v after the Secret changed",
			r.cert, olds[i], renewed, time.Since(renewedAt).Round(time.Second))
	}
	after, err := restarts()
	if err != nil {
		return err
	}
	if after != before {
		return fmt.Errorf("containers restarted during the renewal: restart counts %s, then %s", before, after)
	}
	var failed []string
	for _, op := range h.Ops() {
		if op.Call > began && op.Output.Unknown {
			failed = append(failed, op.Output.Err)
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("%d operations failed during the renewal: %v", len(failed), failed)
	}
	return nil
}
