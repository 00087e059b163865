# syntax=docker/dockerfile:1
#
# walship container image: a static binary on a minimal, non-root runtime.
#
#   docker build -t walship .
#   docker volume create walship-primary
#   docker run --rm -p 7401:7401 -p 9401:9401 -v walship-primary:/data \
#       walship primary --data-dir /data
#
# The image runs as uid/gid 65532 (distroless "nonroot") with /data owned by
# it, so a fresh named volume mounted there is writable. It has no shell.
# Where no registry is reachable, `make image` builds an equivalent image
# FROM scratch from a locally built binary.

ARG GO_VERSION=1.26

FROM golang:${GO_VERSION} AS build
WORKDIR /src
# Dependencies first, so that a source change does not download them again.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath \
        -ldflags "-s -w -X github.com/walship/walship/app/cli.Version=${VERSION}" \
        -o /out/walship ./cmd/walship \
    && mkdir -p /out/data

FROM gcr.io/distroless/static:nonroot
COPY --from=build /out/walship /walship
COPY --from=build --chown=65532:65532 /out/data /data
USER 65532:65532
# gRPC: log store 7400, primary 7401, replica 7402; metrics: 9400-9402.
EXPOSE 7400 7401 7402 9400 9401 9402
ENTRYPOINT ["/walship"]
CMD ["help"]
