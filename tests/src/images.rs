//! Local container images without a registry or a container engine: a docker-archive tar (manifest.json,
//! an image config, one layer tar) that `ctr images import` accepts. Every image is a handful of host
//! files — a static binary, or a dynamic one plus the shared libraries `ldd` lists — at their host paths.

use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::cluster::layout::{images_dir, kubernetes_src_dir};
use crate::cluster::process::output;

/// The registry-like prefix of our local image names (nothing is ever pulled from it).
pub const REGISTRY: &str = "network-enforcer.local";
/// The tag of every local image.
pub const TAG: &str = "dev";

/// The test workload image: busybox (static) for `sh` and friends, our `echo-server` for TCP/UDP echo
/// servers (and its `--check` load client), socat for clients (Debian busybox's `nc` has no UDP and its
/// `wget` crashes).
pub const TEST_IMAGE: &str = "network-enforcer.local/test:dev";

/// Where the test image has our echo server (`tests/src/bin/echo-server.rs`); on `PATH`.
pub const ECHO_SERVER: &str = "/usr/local/bin/echo-server";

/// What goes into one image.
#[derive(Default)]
pub struct ImageSpec {
    /// Full reference, e.g. `network-enforcer.local/pause:dev`.
    pub reference: String,
    /// Image path → contents and mode.
    files: BTreeMap<String, (Vec<u8>, u32)>,
    /// Image path → symlink target.
    symlinks: BTreeMap<String, String>,
    /// The container's entrypoint.
    pub entrypoint: Vec<String>,
    /// The container's default arguments.
    pub cmd: Vec<String>,
}

impl ImageSpec {
    /// An empty image named `network-enforcer.local/<name>:dev`, with `/etc/passwd` and `/etc/group`
    /// (root and nobody) so that programs looking users up work.
    pub fn new(name: &str) -> Self {
        let mut spec = Self {
            reference: format!("{REGISTRY}/{name}:{TAG}"),
            ..Self::default()
        };
        spec.add_bytes(
            "/etc/passwd",
            b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
            0o644,
        );
        spec.add_bytes("/etc/group", b"root:x:0:\nnogroup:x:65534:\n", 0o644);
        spec.add_bytes("/tmp/.keep", b"", 0o644);
        spec
    }

    /// Adds `contents` at `path` in the image.
    pub fn add_bytes(&mut self, path: &str, contents: &[u8], mode: u32) {
        self.files
            .insert(path.to_string(), (contents.to_vec(), mode));
    }

    /// Copies the host file `host` to `path` in the image (following symlinks).
    pub fn add_file(&mut self, host: &Path, path: &str) -> Result<()> {
        let contents = fs::read(host).with_context(|| format!("reading {}", host.display()))?;
        let mode = fs::metadata(host)?.permissions();
        use std::os::unix::fs::PermissionsExt;
        self.add_bytes(path, &contents, mode.mode() & 0o7777);
        Ok(())
    }

    /// Adds the host binary `host` at `path` plus every shared library it loads, at their host paths.
    pub fn add_binary_with_libraries(&mut self, host: &Path, path: &str) -> Result<()> {
        self.add_file(host, path)?;
        for lib in shared_libraries(host)? {
            let in_image = lib.to_string_lossy().into_owned();
            self.add_file(&lib, &in_image)?;
        }
        Ok(())
    }

    /// Adds a symlink `path` → `target`.
    pub fn add_symlink(&mut self, path: &str, target: &str) {
        self.symlinks.insert(path.to_string(), target.to_string());
    }

    /// Writes the docker-archive tar to `out`.
    pub fn write(&self, out: &Path) -> Result<()> {
        let layer = self.layer_tar()?;
        let diff_id = format!("sha256:{}", hex(&Sha256::digest(&layer)));
        let config = serde_json::json!({
            "architecture": "amd64",
            "os": "linux",
            "config": {
                "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
                "Entrypoint": if self.entrypoint.is_empty() { serde_json::Value::Null } else { self.entrypoint.clone().into() },
                "Cmd": if self.cmd.is_empty() { serde_json::Value::Null } else { self.cmd.clone().into() },
                "WorkingDir": "/",
            },
            "rootfs": { "type": "layers", "diff_ids": [diff_id] },
        });
        let config = serde_json::to_vec(&config)?;
        let config_name = format!("{}.json", hex(&Sha256::digest(&config)));
        let manifest = serde_json::to_vec(&serde_json::json!([{
            "Config": config_name,
            "RepoTags": [self.reference],
            "Layers": ["layer.tar"],
        }]))?;

        if let Some(dir) = out.parent() {
            fs::create_dir_all(dir)?;
        }
        let tmp = out.with_extension("tar.tmp");
        let mut archive = tar::Builder::new(fs::File::create(&tmp)?);
        append(&mut archive, "manifest.json", &manifest, 0o644)?;
        append(&mut archive, &config_name, &config, 0o644)?;
        append(&mut archive, "layer.tar", &layer, 0o644)?;
        archive.into_inner()?.sync_all()?;
        fs::rename(&tmp, out)?;
        Ok(())
    }

    /// The single layer: parent directories, files, symlinks.
    fn layer_tar(&self) -> Result<Vec<u8>> {
        let mut dirs = std::collections::BTreeSet::new();
        for path in self.files.keys().chain(self.symlinks.keys()) {
            let mut p = Path::new(path.trim_start_matches('/')).parent();
            while let Some(d) = p.filter(|d| !d.as_os_str().is_empty()) {
                dirs.insert(d.to_path_buf());
                p = d.parent();
            }
        }
        let mut layer = tar::Builder::new(Vec::new());
        for dir in &dirs {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Directory);
            h.set_mode(if dir == Path::new("tmp") {
                0o1777
            } else {
                0o755
            });
            h.set_size(0);
            layer.append_data(&mut h, dir, std::io::empty())?;
        }
        for (path, (contents, mode)) in &self.files {
            append(&mut layer, path.trim_start_matches('/'), contents, *mode)?;
        }
        for (path, target) in &self.symlinks {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Symlink);
            h.set_mode(0o777);
            h.set_size(0);
            layer.append_link(&mut h, path.trim_start_matches('/'), target)?;
        }
        Ok(layer.into_inner()?)
    }
}

fn append(
    archive: &mut tar::Builder<impl std::io::Write>,
    path: &str,
    data: &[u8],
    mode: u32,
) -> Result<()> {
    let mut h = tar::Header::new_gnu();
    h.set_size(data.len() as u64);
    h.set_mode(mode);
    h.set_entry_type(tar::EntryType::Regular);
    archive.append_data(&mut h, path, data)?;
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The shared libraries (and the dynamic loader) `ldd` lists for `binary`; empty for a static binary.
pub fn shared_libraries(binary: &Path) -> Result<Vec<PathBuf>> {
    let out = Command::new("ldd").arg(binary).output()?;
    // ldd exits non-zero with "not a dynamic executable" for static binaries.
    let text = String::from_utf8_lossy(&out.stdout);
    let mut libs = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.contains("not found") {
            bail!("{}: shared library missing: {line}", binary.display());
        }
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or "/lib64/ld-linux-x86-64.so.2 (0x...)"
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            libs.push(PathBuf::from(p));
        }
    }
    Ok(libs)
}

/// The path of image `name`'s tar in the cache.
pub fn tar_path(name: &str) -> PathBuf {
    images_dir().join(format!("{name}.tar"))
}

/// Every image tar in the cache.
pub fn all_tars() -> Result<Vec<PathBuf>> {
    let mut tars: Vec<PathBuf> = fs::read_dir(images_dir())?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "tar"))
        .collect();
    tars.sort();
    Ok(tars)
}

/// The images the cluster itself needs: pause (sandbox), dns (dnsmasq) and test (busybox, socat, our
/// echo server).
pub const BASE_IMAGES: [&str; 3] = ["pause", "dns", "test"];

/// Builds the base images whose tars are missing, or were built from other sources of ours than the
/// working tree's (see [`sources_fingerprint`]). Returns the tars of all of them.
pub fn ensure_base_images() -> Result<Vec<PathBuf>> {
    let mut tars = Vec::new();
    for name in BASE_IMAGES {
        let tar = tar_path(name);
        let fingerprint = sources_fingerprint(name)?;
        let recorded = recorded_fingerprint(name);
        if !is_current(name, fingerprint.as_deref()) {
            let spec = match name {
                "pause" => pause_image()?,
                "dns" => dns_image()?,
                _ => test_image()?,
            };
            spec.write(&tar)
                .with_context(|| format!("writing image {}", tar.display()))?;
            if let Some(fingerprint) = fingerprint {
                fs::write(&recorded, fingerprint)
                    .with_context(|| format!("writing {}", recorded.display()))?;
            }
            eprintln!("    image {} -> {}", spec.reference, tar.display());
        }
        tars.push(tar);
    }
    Ok(tars)
}

/// A hash of the sources of ours that image `name` compiles (`None`: only host packages, which change
/// with setup, not with the working tree). Recorded next to the tar: a cached image built from other
/// sources, or by code that predates the record, is rebuilt. Contents, not times: a checkout or an
/// older build can leave a tar newer than a source it does not contain.
/// Whether every base image was built from the working tree's sources: a running cluster whose
/// images are stale (a changed echo server, say) is not reused, since images are imported only when the
/// cluster starts.
pub fn base_images_current() -> bool {
    BASE_IMAGES
        .iter()
        .all(|name| sources_fingerprint(name).is_ok_and(|f| is_current(name, f.as_deref())))
}

/// Whether image `name`'s tar exists and was built from sources with `fingerprint` (`None`: the image
/// has no sources of ours to follow).
fn is_current(name: &str, fingerprint: Option<&str>) -> bool {
    tar_path(name).exists()
        && fingerprint
            .is_none_or(|f| fs::read_to_string(recorded_fingerprint(name)).is_ok_and(|r| r == f))
}

fn recorded_fingerprint(name: &str) -> PathBuf {
    images_dir().join(format!("{name}.sources"))
}

fn sources_fingerprint(name: &str) -> Result<Option<String>> {
    let sources = match name {
        "test" => vec![echo_server_source()],
        _ => return Ok(None),
    };
    let mut hash = Sha256::new();
    for source in sources {
        hash.update(fs::read(&source).with_context(|| format!("reading {}", source.display()))?);
    }
    Ok(Some(hex(&hash.finalize())))
}

/// Kubernetes' own pause program, compiled statically from the source tree setup unpacked.
fn pause_image() -> Result<ImageSpec> {
    let source = kubernetes_src_dir().join("build/pause/linux/pause.c");
    if !source.exists() {
        bail!("{} is missing: run `cargo xtask setup`", source.display());
    }
    let build = images_dir().join("build");
    fs::create_dir_all(&build)?;
    let binary = build.join("pause");
    output(
        Command::new("gcc")
            .args([
                "-Os",
                "-static",
                "-Wall",
                "-DVERSION=v3.4-network-enforcer",
                "-o",
            ])
            .arg(&binary)
            .arg(&source),
    )
    .context("compiling pause.c (needs gcc and libc6-dev)")?;
    let mut spec = ImageSpec::new("pause");
    spec.add_file(&binary, "/pause")?;
    spec.entrypoint = vec!["/pause".into()];
    Ok(spec)
}

/// dnsmasq and its libraries.
fn dns_image() -> Result<ImageSpec> {
    let mut spec = ImageSpec::new("dns");
    spec.add_binary_with_libraries(Path::new("/usr/sbin/dnsmasq"), "/usr/sbin/dnsmasq")?;
    spec.entrypoint = vec!["/usr/sbin/dnsmasq".into()];
    Ok(spec)
}

/// The echo server's source, a binary of this crate.
fn echo_server_source() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src/bin/echo-server.rs")
}

/// Compiles the echo server with plain `rustc`, like pause.c with gcc: the file needs nothing but std,
/// and this way the image builds wherever the cluster starts (tests, `cargo xtask cluster up`, the demo)
/// without first asking cargo for a binary of this crate (a test cannot run cargo: `cargo test` holds
/// the target directory's lock).
fn compile_echo_server() -> Result<PathBuf> {
    let source = echo_server_source();
    let build = images_dir().join("build");
    fs::create_dir_all(&build)?;
    let binary = build.join("echo-server");
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    output(
        Command::new(&rustc)
            .args([
                "--edition=2024",
                "--crate-type=bin",
                "--crate-name=echo_server",
                "-Copt-level=2",
                "-Cstrip=debuginfo",
                "-o",
            ])
            .arg(&binary)
            .arg(&source),
    )
    .with_context(|| format!("compiling {} with {rustc:?}", source.display()))?;
    Ok(binary)
}

/// busybox-static with a symlink per applet, socat, our echo server, and the libraries they load.
fn test_image() -> Result<ImageSpec> {
    let mut spec = ImageSpec::new("test");
    spec.add_file(Path::new("/bin/busybox"), "/bin/busybox")?;
    let applets = output(Command::new("/bin/busybox").arg("--list"))?;
    for applet in applets
        .lines()
        .map(str::trim)
        .filter(|a| !a.is_empty() && *a != "busybox")
    {
        spec.add_symlink(&format!("/bin/{applet}"), "busybox");
    }
    spec.add_binary_with_libraries(Path::new("/usr/bin/socat"), "/usr/bin/socat")?;
    spec.add_binary_with_libraries(&compile_echo_server()?, ECHO_SERVER)?;
    spec.cmd = vec!["sh".into()];
    Ok(spec)
}
