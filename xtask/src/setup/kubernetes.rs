//! Kubernetes v1.20.2 built from Debian bookworm's `kubernetes` source package with Debian's Go 1.19,
//! and the node parts from Debian (see docs/local-cluster.md). Everything lands in
//! `~/.cache/network-enforcer/kubernetes`; each step is skipped when its result is already there.
//!
//! Two fixes make the Debian tree build and run (both found on this machine):
//! - the generated OpenAPI definitions are missing from the source package: we build the vendored
//!   `openapi-gen` and generate them, as the upstream Makefile does;
//! - the vendored `github.com/modern-go/reflect2` 1.0.1 crashes under Go ≥ 1.18: we swap in Debian's
//!   `golang-github-modern-go-reflect2-dev` (1.0.2).

use anyhow::{Context, Result, bail};
use network_enforcer_tests::cluster::layout::{kubernetes_bin, kubernetes_dir, kubernetes_src_dir};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use crate::run;

/// Debian packages: the Go toolchain and reflect2 for the build, the node's runtime parts, the tools
/// images are made from (busybox-static, socat, dnsmasq-base, gcc for pause, binutils to strip ours;
/// buildah and debootstrap for ours, built from docker/*.Dockerfile on a local Debian base).
const PACKAGES: &[&str] = &[
    "golang-1.19-go",
    "golang-github-modern-go-reflect2-dev",
    "dpkg-dev",
    "etcd-server",
    "containerd",
    "runc",
    "containernetworking-plugins",
    "iptables",
    "nftables",
    "conntrack",
    "iproute2",
    "socat",
    "dnsmasq-base",
    "busybox-static",
    "gcc",
    "binutils",
    "libc6-dev",
    "buildah",
    "debootstrap",
];

/// The binaries we build, in the order `cmd/<name>` is built.
const BINARIES: &[&str] = &[
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubelet",
    "kube-proxy",
    "kubectl",
];

/// Written into the source tree once it is fetched and patched, so that a later run skips those steps.
const PREPARED_MARKER: &str = ".network-enforcer-prepared";

/// Builds/installs the local cluster parts when missing.
pub fn install() -> Result<()> {
    let start = Instant::now();
    crate::setup::apt_install(PACKAGES)?;
    prepare_source().context("preparing the Kubernetes source tree")?;
    for binary in BINARIES {
        build(binary).with_context(|| format!("building {binary}"))?;
    }
    network_enforcer_tests::images::ensure_base_images().context("building the base images")?;
    network_enforcer_tests::buildah::ensure_debian_base()
        .context("making the Debian base our images are built on")?;
    println!(
        "    kubernetes: v1.20.2 binaries in {} ({:.1}s)",
        kubernetes_bin("").display(),
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Fetches the source package, swaps reflect2, lays out the GOPATH and generates the OpenAPI code.
fn prepare_source() -> Result<()> {
    let src = kubernetes_src_dir();
    if src.join(PREPARED_MARKER).exists() {
        return Ok(());
    }
    if src.exists() {
        // A previous run stopped half-way: start the tree again (the Go build cache stays).
        fs::remove_dir_all(&src)?;
    }
    fetch_source(&src)?;

    println!("    kubernetes: replacing vendored reflect2 with Debian's 1.0.2");
    let vendored = src.join("vendor/github.com/modern-go/reflect2");
    fs::remove_dir_all(&vendored).with_context(|| format!("removing {}", vendored.display()))?;
    run::status(
        Command::new("cp")
            .arg("-rL")
            .arg("/usr/share/gocode/src/github.com/modern-go/reflect2")
            .arg(&vendored),
    )?;

    // The 1.20 build tools (and the vendor directory) expect GOPATH mode with the tree at
    // $GOPATH/src/k8s.io/kubernetes.
    let link = tree_in_gopath();
    fs::create_dir_all(link.parent().unwrap())?;
    let _ = fs::remove_file(&link);
    std::os::unix::fs::symlink(&src, &link)?;

    generate_openapi()?;
    fs::write(src.join(PREPARED_MARKER), "")?;
    Ok(())
}

/// `apt-get source kubernetes` from a `deb-src` entry for the machine's own Debian mirror.
fn fetch_source(src: &Path) -> Result<()> {
    let sources = Path::new("/etc/apt/sources.list.d/network-enforcer-src.sources");
    if !sources.exists() {
        // The same mirrors and suites as the machine's binary entries (the package's fixed version is
        // in bookworm-security).
        let debian = fs::read_to_string("/etc/apt/sources.list.d/debian.sources").context(
            "reading /etc/apt/sources.list.d/debian.sources (the machine's Debian mirror)",
        )?;
        fs::write(sources, debian.replace("Types: deb\n", "Types: deb-src\n"))?;
        run::status(Command::new("apt-get").args(["update", "-qq"]))?;
    }
    let fetch = kubernetes_dir().join("fetch");
    let _ = fs::remove_dir_all(&fetch);
    fs::create_dir_all(&fetch)?;
    println!("    kubernetes: apt-get source kubernetes");
    run::status(
        Command::new("apt-get")
            .current_dir(&fetch)
            .args(["source", "-qq", "kubernetes"]),
    )?;
    let unpacked = fs::read_dir(&fetch)?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.is_dir()
                && p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("kubernetes-"))
        })
        .context("apt-get source unpacked no kubernetes-* directory")?;
    fs::rename(&unpacked, src)?;
    fs::remove_dir_all(&fetch)?;
    Ok(())
}

/// Generates `pkg/generated/openapi/zz_generated.openapi.go` for every package tagged
/// `+k8s:openapi-gen=` (the selection `build/root/Makefile.generated_files` makes for its KUBE target).
fn generate_openapi() -> Result<()> {
    println!("    kubernetes: generating the OpenAPI definitions");
    let tool = kubernetes_dir().join("tools/openapi-gen");
    run::status(
        go().args(["build", "-o"])
            .arg(&tool)
            .arg("./vendor/k8s.io/kube-openapi/cmd/openapi-gen"),
    )?;
    let src = kubernetes_src_dir();
    let mut packages: Vec<String> = tagged_dirs(&src)?
        .into_iter()
        .map(|dir| format!("k8s.io/kubernetes/{dir}"))
        .collect();
    packages.sort();
    packages.dedup();
    let report = kubernetes_dir().join("tools/openapi-violations.report");
    run::status(
        Command::new(&tool)
            .current_dir(tree_in_gopath())
            .env("PWD", tree_in_gopath())
            .env("GOPATH", gopath())
            .env("GO111MODULE", "off")
            .arg("--logtostderr")
            .arg("-i")
            .arg(packages.join(","))
            .args(["-p", "k8s.io/kubernetes/pkg/generated/openapi"])
            .args(["-O", "zz_generated.openapi"])
            .args(["-h", "vendor/k8s.io/code-generator/hack/boilerplate.go.txt"])
            .arg("-r")
            .arg(&report),
    )
}

/// Directories (relative, with `staging/src/` spelled `vendor/` as Go sees it) holding a Go file with a
/// `// +k8s:` tag line that mentions `+k8s:openapi-gen=`, outside `vendor/` proper, code-generator and
/// sample-apiserver.
fn tagged_dirs(src: &Path) -> Result<Vec<String>> {
    fn walk(dir: &Path, rel: &str, out: &mut Vec<String>) -> Result<()> {
        for entry in fs::read_dir(dir)?.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = entry.path();
            let rel_path = if rel.is_empty() {
                name.clone()
            } else {
                format!("{rel}/{name}")
            };
            let ty = entry.file_type()?;
            if ty.is_dir() {
                if name.starts_with('_') || name.starts_with('.') || rel_path == "vendor" {
                    continue;
                }
                walk(&path, &rel_path, out)?;
            } else if ty.is_file() && name.ends_with(".go") {
                let text = fs::read_to_string(&path).unwrap_or_default();
                let tagged = text.lines().any(|l| {
                    l.strip_prefix("//")
                        .is_some_and(|r| r.trim_start().starts_with("+k8s:"))
                });
                if tagged && text.contains("+k8s:openapi-gen=") {
                    out.push(rel.replacen("staging/src/", "vendor/", 1));
                }
            }
        }
        Ok(())
    }
    let mut dirs = Vec::new();
    walk(src, "", &mut dirs)?;
    dirs.retain(|d| {
        !d.starts_with("vendor/k8s.io/code-generator/")
            && !d.starts_with("vendor/k8s.io/sample-apiserver/")
    });
    if dirs.is_empty() {
        bail!("found no +k8s:openapi-gen packages in {}", src.display());
    }
    Ok(dirs)
}

/// `go build cmd/<binary>` into the cache, unless the binary is there.
fn build(binary: &str) -> Result<()> {
    let out = kubernetes_bin(binary);
    if out.exists() {
        return Ok(());
    }
    println!("    kubernetes: go build cmd/{binary} (minutes on a cold cache)");
    let start = Instant::now();
    // What hack/lib/version.sh would stamp, so that `kubectl version` and the Node report v1.20.2.
    let version_pkg = "k8s.io/kubernetes/vendor/k8s.io/component-base/version";
    let ldflags = format!(
        "-s -w -X {version_pkg}.gitVersion=v1.20.2 -X {version_pkg}.gitMajor=1 -X {version_pkg}.gitMinor=20 \
         -X {version_pkg}.gitTreeState=clean -X k8s.io/kubernetes/vendor/k8s.io/client-go/pkg/version.gitVersion=v1.20.2"
    );
    let tmp = out.with_extension("partial");
    run::status(
        go().args(["build", "-ldflags", &ldflags, "-o"])
            .arg(&tmp)
            .arg(format!("./cmd/{binary}")),
    )?;
    fs::rename(&tmp, &out)?;
    println!(
        "    kubernetes: {binary} built in {:.0}s",
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

fn gopath() -> PathBuf {
    kubernetes_dir().join("gopath")
}

/// The source tree as GOPATH mode sees it (a symlink to [`kubernetes_src_dir`]).
fn tree_in_gopath() -> PathBuf {
    gopath().join("src/k8s.io/kubernetes")
}

/// Debian's Go 1.19 in GOPATH mode inside the tree, with the build cache in our cache directory, at low
/// priority (the machine has two cores shared with everything else).
fn go() -> Command {
    let path = std::env::var("PATH").unwrap_or_default();
    let mut cmd = Command::new("nice");
    cmd.args(["-n", "10", "/usr/lib/go-1.19/bin/go"])
        .current_dir(tree_in_gopath())
        // Go takes the working directory from $PWD when it names the same directory: without this it
        // sees the symlink's target, outside GOPATH, and finds no vendored packages.
        .env("PWD", tree_in_gopath())
        .env("PATH", format!("/usr/lib/go-1.19/bin:{path}"))
        .env("GOPATH", gopath())
        .env("GO111MODULE", "off")
        .env("GOFLAGS", "")
        .env("CGO_ENABLED", "0")
        .env("GOCACHE", kubernetes_dir().join("gocache"));
    cmd
}
