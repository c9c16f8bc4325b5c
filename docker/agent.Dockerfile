# syntax=docker/dockerfile:1
# The node agent image, for users' own builds (the local test cluster uses `cargo xtask image agent`, no
# container engine needed). Build from the repository root:
#
#   docker build -f docker/agent.Dockerfile -t <registry>/network-enforcer/agent:<tag> .
#
# Four stages:
#   ebpf-toolchain  what `cargo xtask setup` installs (xtask/src/setup/ebpf.rs): Debian's Rust with the
#                   prebuilt `core` for bpfel-unknown-none, LLVM 22, bpf-linker 0.13.0 built against it,
#                   and Debian's toolchain linked into rustup as `debian-bpf` (aya-build runs
#                   `rustup run debian-bpf cargo build` for the kernel programs; .cargo/config.toml names it).
#   build           the release agent; its build script compiles agent-ebpf and embeds the ELF.
#   nft             Debian's nftables: the nft binary and the libraries it loads (the agent's NetworkPolicy
#                   enforcement installs its rules with nft).
#   runtime         distroless (glibc + libgcc only, no shell) plus nft. The agent runs as root with only the
#                   capabilities the chart grants (BPF, PERFMON, NET_ADMIN): loading eBPF programs and
#                   reading the host's /proc need uid 0 plus those capabilities.
#
# A binary built beforehand can go in instead of `build`'s: put it at prebuilt/network-enforcer-agent in
# the build context and pass --build-arg BINARY=prebuilt (the local test cluster does this, with
# DEBIAN_IMAGE and RUNTIME_IMAGE pointing at a Debian base it made itself, as it cannot pull). BuildKit
# builds only the stages the target needs.

ARG RUST_VERSION=1.95
ARG BUILD_IMAGE=docker.io/library/rust:${RUST_VERSION}-bookworm
ARG DEBIAN_IMAGE=docker.io/library/debian:bookworm-slim
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12
ARG BINARY=build

FROM ${BUILD_IMAGE} AS ebpf-toolchain
ARG BPF_LINKER_VERSION=0.13.0
# rustc-web/cargo-web and LLVM 22 come from bookworm-security, which the base image's sources include.
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
       rustc-web cargo-web libstd-rust-web-dev-bpf llvm-22-dev zlib1g-dev libzstd-dev \
    && rm -rf /var/lib/apt/lists/* \
    && ls /usr/lib/rustlib/bpfel-unknown-none/lib/libcore-*.rlib
ENV LLVM_PREFIX=/usr/lib/llvm-22
RUN cargo install --locked "bpf-linker@${BPF_LINKER_VERSION}" --no-default-features --features llvm-22 \
    && rustup toolchain link debian-bpf /usr

FROM ebpf-toolchain AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --locked --release --package network-enforcer-agent --bin network-enforcer-agent \
    && install -D -m 0755 target/release/network-enforcer-agent /out/network-enforcer-agent

FROM scratch AS prebuilt
COPY prebuilt/network-enforcer-agent /out/network-enforcer-agent

FROM ${BINARY} AS binary

FROM ${DEBIAN_IMAGE} AS nft
# glibc itself comes with the runtime image; everything else nft loads is gathered under /out. A base
# that has nftables already (the local test cluster's) needs no package download. The libraries go
# into their real directory (/usr/lib/...): on a merged-/usr runtime base /lib is a symlink, which
# copying a /lib directory would replace, taking the dynamic loader with it.
RUN (dpkg -s nftables >/dev/null 2>&1 \
        || (apt-get update \
            && apt-get install -y --no-install-recommends nftables \
            && rm -rf /var/lib/apt/lists/*)) \
    && install -D -m 0755 /usr/sbin/nft /out/usr/sbin/nft \
    && for lib in $(ldd /usr/sbin/nft | awk '/=> \// {print $3}' | grep -v -e '/libc\.so' -e '/ld-linux'); do \
         dir="/out$(readlink -f "$(dirname "$lib")")" && mkdir -p "$dir" && cp -L "$lib" "$dir/" || exit 1; \
       done

FROM ${RUNTIME_IMAGE} AS runtime
COPY --from=binary /out/network-enforcer-agent /usr/local/bin/network-enforcer-agent
COPY --from=nft /out/ /
USER 0:0
# Prometheus /metrics on the node (the agent uses the host network).
EXPOSE 9464
ENTRYPOINT ["/usr/local/bin/network-enforcer-agent"]
CMD ["run"]
