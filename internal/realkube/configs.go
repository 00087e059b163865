package realkube

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
)

// containerdConfig is containerd 1.6's (Debian bookworm) config, version 2.
// The native snapshotter copies layers instead of overlaying them: slower
// to unpack, but it works on any filesystem, and the images here are one
// small layer each. Cgroups are cgroupfs (v1), as kubelet's.
func containerdConfig(dir, sock string) string {
	return fmt.Sprintf(`version = 2
root = %q
state = %q
[grpc]
  address = %q
[ttrpc]
  address = %q
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.grpc.v1.cri"]
  # Root here lacks CAP_SYS_RESOURCE, so runc cannot set a negative
  # oom_score_adj (the sandbox's -998): it failed every sandbox with
  # "can't get final child's PID from pipe: EOF". Restricted, no
  # container's score goes below containerd's own.
  restrict_oom_score_adj = true
  sandbox_image = %q
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %q
    conf_dir = %q
`, filepath.Join(dir, "containerd", "root"), filepath.Join(dir, "containerd", "state"),
		sock, sock+".ttrpc", PauseImage, cniBinDir, filepath.Join(dir, "cni", "conf"))
}

// cniBinDir is where Debian's containernetworking-plugins puts the CNI
// plugins containerd runs.
const cniBinDir = "/usr/lib/cni"

// cniConfig puts the pods on a bridge of their own. hairpinMode lets a pod
// reach itself through a Service (a primary dialing walship-rw). The
// firewall plugin accepts the pods' traffic in FORWARD: Docker sets its
// policy to DROP, and with bridge-nf-call-iptables bridged pod-to-pod
// packets pass through it (seen: walship-0 could not reach any log store).
func cniConfig(ipamDir string) string {
	return fmt.Sprintf(`{
  "cniVersion": "0.4.0",
  "name": "realkube",
  "plugins": [
    {
      "type": "bridge",
      "bridge": %q,
      "isGateway": true,
      "ipMasq": true,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": %q,
        "ranges": [[{"subnet": %q}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}},
    {"type": "firewall", "backend": "iptables"},
    {"type": "loopback"}
  ]
}
`, bridgeName, ipamDir, PodCIDR)
}

// kubeletConfig: cgroupfs on cgroup v1, no swap check, eviction thresholds
// that a shared build machine's disk does not trip, and the kubelet API
// open to anyone (test only).
func kubeletConfig(c *Cluster, ports map[string]string) string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://%s
cgroupDriver: cgroupfs
failSwapOn: false
address: %s
port: %s
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: %s
clusterDomain: cluster.local
clusterDNS: [%s]
resolvConf: /etc/resolv.conf
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization:
  mode: AlwaysAllow
podLogsDir: %s
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%%
  imagefs.available: 1%%
imageGCHighThresholdPercent: 100
serializeImagePulls: false
registerNode: true
staticPodPath: ""
`, c.ctdSock, c.HostIP, ports["kubelet"], ports["kubelet-healthz"], DNSIP, filepath.Join(c.cfg.Dir, "pods"))
}

func proxyConfig(c *Cluster, ports map[string]string) string {
	var sync string
	if d := c.cfg.ProxyMinSyncPeriod; d > 0 {
		sync = fmt.Sprintf("iptables:\n  minSyncPeriod: %s\n", d)
	}
	return sync + fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection:
  kubeconfig: %s
clusterCIDR: %s
healthzBindAddress: 127.0.0.1:%s
metricsBindAddress: 127.0.0.1:%s
conntrack:
  # Leave the host's conntrack table size alone.
  maxPerCore: 0
  min: 0
`, c.Kubeconfig, PodCIDR, ports["proxy-healthz"], ports["proxy-metrics"])
}

// corefile serves cluster.local from the API server. No cache: a pod
// replaced by the StatefulSet keeps its name and gets a new address, and a
// peer must find the new one at once.
func corefile(c *Cluster, port string) string {
	return fmt.Sprintf(`.:%s {
    bind %s
    errors
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig %s
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
}
`, port, c.HostIP, c.Kubeconfig)
}

// dnsObjects is the kube-dns Service at the cluster DNS address, pointing
// at CoreDNS on the host.
func dnsObjects(hostIP, port string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata:
  name: kube-dns
  namespace: kube-system
spec:
  clusterIP: %s
  ports:
  - {name: dns, port: 53, targetPort: %s, protocol: UDP}
  - {name: dns-tcp, port: 53, targetPort: %s, protocol: TCP}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kube-dns-host
  namespace: kube-system
  labels:
    kubernetes.io/service-name: kube-dns
addressType: IPv4
endpoints:
- addresses: [%q]
  conditions: {ready: true}
ports:
- {name: dns, port: %s, protocol: UDP}
- {name: dns-tcp, port: %s, protocol: TCP}
`, DNSIP, port, port, hostIP, port, port)
}

func kubeconfig(url, ca string) []byte {
	return []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: realkube
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: admin
  user:
    token: %s
contexts:
- name: realkube
  context:
    cluster: realkube
    user: admin
current-context: realkube
`, url, ca, adminToken))
}

// writeKey writes a new service-account signing key.
func writeKey(path string) error {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(k)}), 0o600)
}
