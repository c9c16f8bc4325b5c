//! `cargo xtask image <name>`: local images for the local cluster.
//! `pause`, `dns`, `test`: the cluster's base images (written directly, no container engine). `agent`,
//! `controller`: built with buildah from the shipped `docker/<name>.Dockerfile` on a local Debian base,
//! with our binary (debug profile, or release with `NETWORK_ENFORCER_IMAGE_PROFILE=release`) as its
//! prebuilt binary, as `network-enforcer.local/<name>:dev` (see `network_enforcer_tests::buildah`).
//! `all`: both of ours.
//! The image is written to `~/.cache/network-enforcer/images/<name>.tar` and, when the cluster runs,
//! imported into its containerd (pods use it with `imagePullPolicy: Never`).

use anyhow::Result;
use network_enforcer_tests::cluster::{self, components, layout::State, process};
use network_enforcer_tests::{e2e, images};
use std::path::Path;

use crate::run;

/// Builds the agent's and the controller's debug binaries and imports their images into the running
/// cluster, as the demo and the end-to-end bench run them.
pub fn ours_from_debug_build() -> Result<()> {
    let root = run::workspace_root();
    let env = crate::setup::tool_env()?;
    run::step(
        "cargo build --bins (agent, controller)",
        run::cargo(
            &root,
            &env,
            &[
                "build",
                "--locked",
                "--bin",
                "network-enforcer-agent",
                "--bin",
                "network-enforcer-controller",
            ],
        ),
    )?;
    e2e::release::images_from_debug_build()
}

/// The images `cargo xtask image` builds (clap lists them in `--help` and refuses others).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Which {
    Agent,
    Controller,
    /// The agent and the controller.
    All,
    Pause,
    Dns,
    Test,
}

/// Builds image `which` (see the module docs) and imports it into the running cluster.
pub fn build(which: Which) -> Result<()> {
    match which {
        Which::All => {
            build(Which::Agent)?;
            build(Which::Controller)
        }
        Which::Agent => component("agent"),
        Which::Controller => component("controller"),
        Which::Pause => base("pause"),
        Which::Dns => base("dns"),
        Which::Test => base("test"),
    }
}

/// Our component's image, from its workspace binary.
fn component(name: &str) -> Result<()> {
    let binary = format!("network-enforcer-{name}");
    let root = run::workspace_root();
    let env = crate::setup::tool_env()?;
    // The debug profile by default: tests have usually built it already, and a release build
    // of every dependency costs minutes on two cores. Debug info is stripped from the image.
    let release = std::env::var("NETWORK_ENFORCER_IMAGE_PROFILE").as_deref() == Ok("release");
    let mut args = vec!["build", "--locked", "--bin", &binary];
    if release {
        args.push("--release");
    }
    run::step(
        &format!("cargo {}", args.join(" ")),
        run::cargo(&root, &env, &args),
    )?;
    let built = root
        .join("target")
        .join(if release { "release" } else { "debug" })
        .join(&binary);
    let tar = e2e::release::build_image(name, &built)?;
    println!(
        "    image {}/{name}:{} -> {}",
        images::REGISTRY,
        images::TAG,
        tar.display()
    );
    report_import(name);
    Ok(())
}

/// A base image: built once; rebuilt by removing its tar.
fn base(name: &str) -> Result<()> {
    let _ = std::fs::remove_file(images::tar_path(name));
    images::ensure_base_images()?;
    import_if_running(name, &images::tar_path(name))
}

/// [`e2e::release::build_image`] imports when the cluster runs; say which happened.
fn report_import(name: &str) {
    if process::running_pid(&State::new(), "containerd").is_none() {
        println!(
            "    the local cluster is not running: `cargo xtask cluster up` imports {name} when it starts"
        );
    } else {
        println!(
            "    imported into the local cluster ({})",
            cluster::server_url()
        );
    }
}

fn import_if_running(name: &str, tar: &Path) -> Result<()> {
    let state = State::new();
    if process::running_pid(&state, "containerd").is_none() {
        println!(
            "    the local cluster is not running: `cargo xtask cluster up` imports {name} when it starts"
        );
        return Ok(());
    }
    components::import_image(&state, tar)?;
    println!(
        "    imported into the local cluster ({})",
        cluster::server_url()
    );
    Ok(())
}
