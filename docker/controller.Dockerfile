# syntax=docker/dockerfile:1
# The controller image, for users' own builds (the local test cluster uses `cargo xtask image controller`,
# no container engine needed). Build from the repository root:
#
#   docker build -f docker/controller.Dockerfile -t <registry>/network-enforcer/controller:<tag> .
#
# Stages: `build` compiles the release binary with the workspace's locked dependencies; `runtime` is
# distroless (glibc + libgcc only, no shell, no package manager) and runs as the unprivileged user 65532,
# matching the chart's securityContext (runAsNonRoot, read-only root file system).
#
# A binary built beforehand can go in instead of `build`'s: put it at
# prebuilt/network-enforcer-controller in the build context and pass --build-arg BINARY=prebuilt (the
# local test cluster does this, with BUILD_IMAGE and RUNTIME_IMAGE pointing at a Debian base it made
# itself, as it cannot pull). BuildKit builds only the stages the target needs.

ARG RUST_VERSION=1.95
ARG BUILD_IMAGE=docker.io/library/rust:${RUST_VERSION}-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot
ARG BINARY=build

FROM ${BUILD_IMAGE} AS build
WORKDIR /src
COPY . .
# The controller needs no eBPF toolchain: it does not depend on the agent crate. protox compiles the
# .proto files in Rust (no protoc).
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --locked --release --package network-enforcer-controller --bin network-enforcer-controller \
    && install -D -m 0755 target/release/network-enforcer-controller /out/network-enforcer-controller

FROM scratch AS prebuilt
COPY prebuilt/network-enforcer-controller /out/network-enforcer-controller

FROM ${BINARY} AS binary

FROM ${RUNTIME_IMAGE} AS runtime
COPY --from=binary /out/network-enforcer-controller /usr/local/bin/network-enforcer-controller
USER 65532:65532
# ingest (gRPC) and HTTP (/metrics, /healthz, /readyz); the chart sets both addresses.
EXPOSE 9443 8080
ENTRYPOINT ["/usr/local/bin/network-enforcer-controller"]
CMD ["run"]
