# syntax=docker/dockerfile:1
# The controller image, for users' own builds (the local test cluster uses `cargo xtask image controller`,
# no container engine needed). Build from the repository root:
#
#   docker build -f docker/controller.Dockerfile -t <registry>/network-enforcer/controller:<tag> .
#
# Two stages: `build` compiles the release binary with the workspace's locked dependencies; `runtime` is
# distroless (glibc + libgcc only, no shell, no package manager) and runs as the unprivileged user 65532,
# matching the chart's securityContext (runAsNonRoot, read-only root file system).

ARG RUST_VERSION=1.95
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot

FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
COPY . .
# The controller needs no eBPF toolchain: it does not depend on the agent crate. protox compiles the
# .proto files in Rust (no protoc).
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --locked --release --package network-enforcer-controller --bin network-enforcer-controller \
    && install -D -m 0755 target/release/network-enforcer-controller /out/network-enforcer-controller

FROM ${RUNTIME_IMAGE} AS runtime
COPY --from=build /out/network-enforcer-controller /usr/local/bin/network-enforcer-controller
USER 65532:65532
# ingest (gRPC) and HTTP (/metrics, /healthz, /readyz); the chart sets both addresses.
EXPOSE 9443 8080
ENTRYPOINT ["/usr/local/bin/network-enforcer-controller"]
CMD ["run"]
