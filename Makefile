# walship — build, test, lint, generate, bench, fuzz.
# Tool versions are pinned in tools/go.mod; `make tools` builds them into bin/.

GO      ?= go
BIN     := $(CURDIR)/bin
export PATH := $(BIN):$(PATH)
# `make test` runs the whole suite, including tests of real processes; they
# find the walship binary and the tools through these.
export WALSHIP_BIN := $(BIN)/walship
export WALSHIP_GRPCURL := $(BIN)/grpcurl
# The Kubernetes tests run a real API server (internal/kubetest) built from
# tools/kube/go.mod; etcd comes from Debian's etcd-server.
export WALSHIP_KUBE_APISERVER := $(BIN)/kube-apiserver
export WALSHIP_KUBECTL := $(BIN)/kubectl
# The archive tests run a real S3-compatible server, SeaweedFS, built from
# tools/seaweedfs/go.mod.
export WALSHIP_WEED := $(BIN)/weed

TOOL_PKGS := \
	buf=github.com/bufbuild/buf/cmd/buf \
	protoc-gen-go=google.golang.org/protobuf/cmd/protoc-gen-go \
	protoc-gen-go-grpc=google.golang.org/grpc/cmd/protoc-gen-go-grpc \
	grpcurl=github.com/fullstorydev/grpcurl/cmd/grpcurl \
	benchstat=golang.org/x/perf/cmd/benchstat
tool_pkg = $(patsubst $(1)=%,%,$(filter $(1)=%,$(TOOL_PKGS)))

# A count, not a duration: go1.26's fuzz coordinator can fail a target with
# "context deadline exceeded" when a duration expires mid-exec (go.dev/issue/75804).
FUZZTIME ?= 5000x
BENCHCOUNT ?= 6
# make sim: the failover simulation's long run (go test runs 1,000,000 steps).
SIMSTEPS ?= 100000000
SIMFIRST ?= 1

.PHONY: all build tools kube kube-node coredns certmanager kube-up kube-down realkube seaweedfs test lint generate check-generate manifests bench fuzz sim ci clean

all: build

build: $(BIN)/walship

# The same flags as `go run` and `go test`, so that it shares their build
# cache (a static, trimmed build shares none of it: 12 minutes cold on two
# cores). `make image` builds the static one.
$(BIN)/walship: FORCE
	$(GO) build -o $@ ./cmd/walship

FORCE:

# Binaries are built with `go run -exec cp`: since go1.24, go run keeps the
# executable it links in Go's build cache, and -exec cp copies it to bin/.
# A fresh clone on a machine whose build cache is warm then links nothing
# (the cluster's binaries alone took about 7 minutes to link in every
# clone). The programs the tests run are static and trimmed; go run leaves
# out the debugging information (DWARF), which nothing here reads.
cached_build = $(GO) run $(1) -exec 'cp -f' $(2) $(abspath $@)
STATIC := CGO_ENABLED=0

$(BIN)/buf $(BIN)/protoc-gen-go $(BIN)/protoc-gen-go-grpc $(BIN)/grpcurl $(BIN)/benchstat: tools/go.mod tools/go.sum
	@mkdir -p $(BIN)
	$(call cached_build,-modfile=tools/go.mod,$(call tool_pkg,$(notdir $@)))

# kube-apiserver and kubectl from k8s.io/kubernetes (about 3 minutes the
# first time, mostly downloading).
$(BIN)/kube-apiserver $(BIN)/kubectl: tools/kube/go.mod tools/kube/go.sum
	@mkdir -p $(BIN)
	$(STATIC) $(call cached_build,-modfile=tools/kube/go.mod -trimpath,k8s.io/kubernetes/cmd/$(notdir $@))

kube: $(BIN)/kube-apiserver $(BIN)/kubectl

# The rest of a single-node cluster for internal/realkube, from the same
# module and flags (so they share kube-apiserver's build cache).
KUBE_NODE_BINS := $(addprefix $(BIN)/,kubelet kube-controller-manager kube-scheduler kube-proxy)
$(KUBE_NODE_BINS): tools/kube/go.mod tools/kube/go.sum
	@mkdir -p $(BIN)
	$(STATIC) $(call cached_build,-modfile=tools/kube/go.mod -trimpath,k8s.io/kubernetes/cmd/$(notdir $@))

kube-node: kube $(KUBE_NODE_BINS)

# CoreDNS (Apache-2.0), the realkube cluster's DNS, run on the host.
$(BIN)/coredns: tools/coredns/go.mod tools/coredns/go.sum
	@mkdir -p $(BIN)
	$(STATIC) $(call cached_build,-modfile=tools/coredns/go.mod -trimpath,github.com/coredns/coredns)

coredns: $(BIN)/coredns

# cert-manager's controllers (Apache-2.0), run on the host by the realkube
# prod test to issue components/tls's Certificates (tools/certmanager).
$(BIN)/cert-manager-controller: tools/certmanager/go.mod tools/certmanager/go.sum tools/certmanager/main.go
	@mkdir -p $(BIN)
	cd tools/certmanager && $(STATIC) $(call cached_build,-trimpath,.)

certmanager: $(BIN)/cert-manager-controller

# Root runs the real-cluster tests in make test, so it builds their binaries.
IS_ROOT := $(filter 0,$(shell id -u))
REALKUBE_BINS := $(if $(IS_ROOT),$(KUBE_NODE_BINS) $(BIN)/coredns $(BIN)/cert-manager-controller)

# A single-node cluster (internal/realkube) in KUBE_DIR, started in the
# background: make kube-up prints the KUBECONFIG to use; make kube-down
# stops every process it started, by PID. Root only (containerd, kubelet,
# iptables); needs Debian's etcd-server containerd runc
# containernetworking-plugins iptables conntrack.
KUBE_DIR ?= /tmp/walship-realkube
kube-up: kube-node $(BIN)/coredns
	mkdir -p $(KUBE_DIR)
	$(GO) build -o $(BIN)/realkube ./internal/realkube/cmd/realkube
	nohup $(BIN)/realkube up $(BIN) $(KUBE_DIR) > $(KUBE_DIR)/up.log 2>&1 &
	$(BIN)/realkube wait $(KUBE_DIR)

kube-down:
	$(GO) build -o $(BIN)/realkube ./internal/realkube/cmd/realkube
	$(BIN)/realkube down $(KUBE_DIR)

# SeaweedFS's weed (Apache-2.0), the S3 server of the archive tests (about
# 4 minutes and 230 MB the first time; never committed).
$(BIN)/weed: tools/seaweedfs/go.mod tools/seaweedfs/go.sum
	@mkdir -p $(BIN)
	$(STATIC) $(call cached_build,-modfile=tools/seaweedfs/go.mod -trimpath,github.com/seaweedfs/seaweedfs/weed)

seaweedfs: $(BIN)/weed

tools: $(BIN)/buf $(BIN)/protoc-gen-go $(BIN)/protoc-gen-go-grpc $(BIN)/grpcurl $(BIN)/benchstat

# The README's test command. Everything runs with the race detector.
# As root, it also runs internal/realkube (a single-node Kubernetes with a
# kubelet, containerd and kube-proxy; the cluster binaries are built here
# first) on its own after the rest, so that its pods do not share the
# cores with the other packages' tests; not as root, realkube skips and
# says why.
test: $(BIN)/walship $(BIN)/grpcurl $(BIN)/kube-apiserver $(BIN)/kubectl $(BIN)/weed $(REALKUBE_BINS)
	env -u WALSHIP_REALKUBE_BIN $(GO) test -race -count=1 -timeout 20m ./...
	# The deploy tests are a module of their own (kustomize, k8s.io/api and
	# the Prometheus Operator's API are theirs, not the server's).
	cd internal/deploytest && $(GO) test -race -count=1 -timeout 20m ./...
	# Allocation targets only hold without the race detector's instrumentation.
	$(GO) test -count=1 -run 'Allocs' ./pkg/codec
	$(if $(IS_ROOT),$(MAKE) realkube)

# internal/realkube alone, on the cluster it starts (root; Debian's
# etcd-server containerd runc containernetworking-plugins iptables
# conntrack). About 3 minutes once the binaries are built.
realkube: $(KUBE_NODE_BINS) $(BIN)/kube-apiserver $(BIN)/kubectl $(BIN)/coredns $(BIN)/cert-manager-controller $(BIN)/weed
	WALSHIP_REALKUBE_BIN=$(BIN) $(GO) test -race -count=1 -timeout 30m ./internal/realkube/

lint: $(BIN)/buf
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$unformatted" ]; then echo "gofmt needed: $$unformatted"; exit 1; fi
	$(GO) vet ./...
	cd internal/deploytest && $(GO) vet ./...
	buf lint
	@if git rev-parse --verify -q main >/dev/null && git cat-file -e main:buf.yaml 2>/dev/null; then \
		echo "buf breaking --against .git#branch=main"; buf breaking --against '.git#branch=main'; \
	else echo "buf breaking: no proto on main yet, skipped"; fi

generate: $(BIN)/buf $(BIN)/protoc-gen-go $(BIN)/protoc-gen-go-grpc
	rm -rf gen
	buf generate
	# Descriptors with comments, served by reflection (internal/apidesc).
	buf build -o internal/apidesc/walship.binpb

# The monitoring manifests deploy/k8s builds from deploy/prometheus and
# deploy/grafana (internal/deploytest fails when they are stale).
manifests:
	cd internal/deploytest && $(GO) run ./gen -root ../..

# Fails when the committed generated code differs from what `make generate` produces.
check-generate: generate
	@git add -N gen internal/apidesc >/dev/null 2>&1 || true
	@git diff --exit-code --stat -- gen internal/apidesc/walship.binpb || { echo "generated code is stale: run make generate and commit"; exit 1; }

bench: $(BIN)/benchstat
	$(GO) test -run='^$$' -bench=. -benchmem -count=$(BENCHCOUNT) ./... | tee bench.out
	benchstat bench.out

# The failover protocol's deterministic simulation, SIMSTEPS steps over as
# many seeds as it takes from SIMFIRST, and each re-injected bug found
# within them; a tenth as many with membership changes of data nodes
# (TestSimMembership) and of log stores (TestSimLogStores, and under the
# default policy TestSimLogStoresDefaultPolicy). A failure
# prints its seed; replay it with
# go test -run 'TestSim$$' ./internal/failover -seed N (or that test's name)
sim:
	$(GO) test -count=1 -v -timeout 30m -run '^TestSim(FindsInjectedBugs|Membership|LogStores|LogStoresDefaultPolicy)?$$' ./internal/failover -sim.steps $(SIMSTEPS) -sim.first $(SIMFIRST)

# Every fuzz target for FUZZTIME each (CI runs a short pass; run longer locally: make fuzz FUZZTIME=2000000x).
# FuzzGRPC drives a whole TLS cluster per input (about 0.3 s each under the
# race detector), so it runs FUZZTIME_GRPC inputs instead.
FUZZTIME_GRPC ?= 200x

fuzz:
	@set -e; for pkg in $$($(GO) list ./...); do \
		for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz' || true); do \
			t=$(FUZZTIME); if [ "$$f" = FuzzGRPC ]; then t=$(FUZZTIME_GRPC); fi; \
			echo "fuzz $$pkg $$f ($$t)"; \
			$(GO) test -run='^$$' -fuzz="^$$f\$$" -fuzztime=$$t $$pkg; \
		done; \
	done

ci: check-generate lint test fuzz

clean:
	rm -rf bin gen-tmp bench.out

# --- container image --------------------------------------------------------
# `make image` builds a static walship binary and an image FROM scratch around
# it: no base image to pull, so it works without a registry. It runs as
# 65532:65532 with /data owned by that user, like the Dockerfile's
# distroless image (which needs golang and distroless pulled). Load it into a
# local cluster with e.g. `kind load docker-image walship:dev`.
IMAGE ?= walship:dev
IMAGE_VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
IMAGE_CTX := $(CURDIR)/dist/image

.PHONY: image
image:
	rm -rf $(IMAGE_CTX) && mkdir -p $(IMAGE_CTX)/data
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w -X github.com/walship/walship/app/cli.Version=$(IMAGE_VERSION)" -o $(IMAGE_CTX)/walship ./cmd/walship
	printf '%s\n' 'FROM scratch' 'COPY walship /walship' 'COPY --chown=65532:65532 data /data' 'USER 65532:65532' \
		'EXPOSE 7400 7401 7402 9400 9401 9402' 'ENTRYPOINT ["/walship"]' 'CMD ["help"]' > $(IMAGE_CTX)/Dockerfile
	docker build -t $(IMAGE) $(IMAGE_CTX)
