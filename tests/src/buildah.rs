//! Our images built from the Dockerfiles users get (`docker/*.Dockerfile`) with buildah (Debian's; no
//! daemon; root with chroot isolation). Two things differ from a user's build, because nothing can be
//! pulled here:
//!
//! - the base images: one Debian bookworm base made on this machine from Debian's packages by debootstrap
//!   (minbase plus nftables), [`DEBIAN_BASE`], stands in for every `FROM` (the Dockerfiles take them as
//!   build arguments). `cargo xtask setup` makes it and keeps its root file system in the cache, so a
//!   test never downloads anything;
//! - the binary: the one the tests built, through the Dockerfiles' `prebuilt` stage
//!   (`--build-arg BINARY=prebuilt`), instead of a release build inside the image (minutes per image on
//!   two cores).
//!
//! Everything else — the stages, the nft libraries, the user, the entrypoint — is the shipped file's.

use anyhow::{Context, Result, bail};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::cluster::layout::images_dir;
use crate::cluster::process::output;

/// The local Debian base image, in buildah's storage.
pub const DEBIAN_BASE: &str = "network-enforcer.local/debian:bookworm";

/// The base's root file system, kept in the image cache (not a `.tar`: the cluster imports those).
fn rootfs_archive() -> PathBuf {
    images_dir().join("debian-bookworm-rootfs.tgz")
}

fn buildah() -> Command {
    let mut cmd = Command::new("buildah");
    // Root's default storage (/var/lib/containers); say so, so that a user's config cannot move it.
    cmd.arg("--storage-driver=overlay");
    cmd
}

fn require_tools() -> Result<()> {
    for tool in ["buildah", "debootstrap"] {
        if crate::cluster::which(tool).is_none() {
            bail!("{tool} is missing: `cargo xtask setup` installs it (Debian package {tool})");
        }
    }
    Ok(())
}

/// Makes [`DEBIAN_BASE`] when buildah's storage lacks it: from the cached root file system, or, the
/// first time, from a debootstrap of bookworm (the one step that downloads, from Debian's mirror; setup
/// runs it).
pub fn ensure_debian_base() -> Result<()> {
    require_tools()?;
    if buildah()
        .args(["inspect", "--type", "image", DEBIAN_BASE])
        .output()
        .is_ok_and(|o| o.status.success())
    {
        return Ok(());
    }
    let archive = rootfs_archive();
    if !archive.exists() {
        debootstrap(&archive)?;
    }
    let container = output(buildah().args(["from", "scratch"]))?
        .trim()
        .to_string();
    let imported = (|| -> Result<()> {
        let mount = output(buildah().args(["mount", &container]))?;
        output(
            Command::new("tar")
                .args(["-xzf"])
                .arg(&archive)
                .arg("-C")
                .arg(mount.trim()),
        )?;
        output(buildah().args(["umount", &container]))?;
        output(buildah().args(["commit", "--rm", &container, DEBIAN_BASE]))?;
        Ok(())
    })();
    if imported.is_err() {
        let _ = buildah().args(["rm", &container]).output();
    }
    imported.with_context(|| format!("making the base image {DEBIAN_BASE}"))
}

/// debootstrap's minimal bookworm with nftables (the agent image's nft stage takes it from there),
/// without documentation and package lists, archived to `archive`.
fn debootstrap(archive: &Path) -> Result<()> {
    let dir = images_dir().join("debian-bookworm-rootfs");
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(images_dir())?;
    eprintln!("    debootstrap bookworm (minbase + nftables) for the image base");
    output(
        Command::new("debootstrap")
            .args(["--variant=minbase", "--include=nftables", "bookworm"])
            .arg(&dir)
            .arg("http://deb.debian.org/debian"),
    )
    .context("debootstrap of Debian bookworm (needs Debian's mirror, as apt does)")?;
    for trim in [
        "usr/share/doc",
        "usr/share/man",
        "usr/share/info",
        "usr/share/locale",
        "var/cache/apt",
        "var/lib/apt/lists",
    ] {
        let _ = fs::remove_dir_all(dir.join(trim));
    }
    let partial = archive.with_extension("partial");
    output(
        Command::new("tar")
            .arg("-czf")
            .arg(&partial)
            .arg("-C")
            .arg(&dir)
            .arg("."),
    )?;
    fs::rename(&partial, archive)?;
    fs::remove_dir_all(&dir)?;
    Ok(())
}

/// Builds `docker/<component>.Dockerfile` with `binary` (already stripped) as the prebuilt binary and
/// the local base, tags it `reference` and writes it to `tar` as a docker-archive (what the cluster's
/// containerd imports). One build of a component at a time (callers in one process take turns; test
/// binaries run one after another).
pub fn build(component: &str, binary: &Path, reference: &str, tar: &Path) -> Result<()> {
    ensure_debian_base()?;
    let dockerfile = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../docker")
        .join(format!("{component}.Dockerfile"));
    let context = images_dir().join(format!("context-{component}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&context);
    let prebuilt = context.join("prebuilt");
    fs::create_dir_all(&prebuilt)?;
    fs::copy(
        binary,
        prebuilt.join(format!("network-enforcer-{component}")),
    )
    .with_context(|| format!("copying {} into the build context", binary.display()))?;
    let base = |arg: &str| format!("{arg}={DEBIAN_BASE}");
    let built = output(
        buildah()
            .args([
                "build",
                "--isolation=chroot",
                "--pull=never",
                "--layers",
                "--quiet",
                "--build-arg=BINARY=prebuilt",
            ])
            .arg(format!("--build-arg={}", base("BUILD_IMAGE")))
            .arg(format!("--build-arg={}", base("DEBIAN_IMAGE")))
            .arg(format!("--build-arg={}", base("RUNTIME_IMAGE")))
            .arg("-f")
            .arg(&dockerfile)
            .args(["-t", reference])
            .arg(&context),
    )
    .with_context(|| format!("buildah build of {}", dockerfile.display()));
    let _ = fs::remove_dir_all(&context);
    built?;
    let partial = tar.with_extension(format!("partial-{}", std::process::id()));
    let _ = fs::remove_file(&partial);
    output(buildah().args([
        "push",
        "--quiet",
        reference,
        &format!("docker-archive:{}:{reference}", partial.display()),
    ]))
    .with_context(|| format!("writing {reference} to {}", partial.display()))?;
    fs::rename(&partial, tar)?;
    // The tar is the image now; drop the tag (the layers stay cached for the next build).
    let _ = buildah().args(["rmi", reference]).output();
    Ok(())
}
