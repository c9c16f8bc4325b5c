//! Developer and CI tasks: `cargo xtask <command>`. Run `cargo xtask --help`.

mod bench;
mod cluster;
mod demo;
mod fuzz;
mod gen_crds;
mod image;
mod layout;
mod run;
mod setup;

use anyhow::{Context as _, Result};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "network-enforcer developer and CI tasks")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Install everything builds and tests need (idempotent, cached; a second run takes seconds).
    Setup,
    /// Regenerate the CRD manifests under charts/network-enforcer/crds from the Rust types.
    Gen,
    /// The full check CI runs: setup, fmt, clippy, every test tier.
    Ci,
    /// Manage the local single-node Kubernetes cluster used by tests and the demo.
    Cluster {
        #[command(subcommand)]
        action: cluster::Action,
    },
    /// Build our agent/controller image as a docker-archive and import it into the local cluster.
    Image {
        /// Which image.
        #[arg(value_enum)]
        name: image::Which,
    },
    /// Run a benchmark; figures go to `target/bench/<name>.json` and a table on stdout.
    Bench {
        /// The benchmark's name (see `xtask/src/bench/`).
        #[arg(value_enum)]
        name: bench::Name,
    },
    /// The product's main job, locally: cluster, chart, an app whose traffic is learned.
    Demo,
    /// Check the layout rule (docs/development.md): no source file over 800 code lines, no inline
    /// test module over 300 lines (prints the largest files); no controller import against the
    /// stage order.
    Layout,
    /// The fuzz tests in release, 100,000 cases per target (NE_FUZZ_CASES); figures in
    /// target/bench/fuzz.json.
    Fuzz,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Setup => setup::run(),
        Command::Gen => gen_crds::write(),
        Command::Ci => ci(),
        Command::Cluster { action } => cluster::run(action),
        Command::Image { name } => image::build(name),
        Command::Bench { name } => bench::run(name),
        Command::Demo => demo::run(),
        Command::Layout => layout::check(&run::workspace_root()),
        Command::Fuzz => fuzz::run(),
    }
}

fn ci() -> Result<()> {
    let root = run::workspace_root();
    setup::run()?;
    let env = setup::tool_env()?;
    run::step(
        "format",
        run::cargo(&root, &env, &["fmt", "--all", "--check"]),
    )?;
    println!("==> layout");
    layout::check(&root).context("step `layout` failed")?;
    run::step(
        "lint",
        run::cargo(
            &root,
            &env,
            &[
                "clippy",
                "--workspace",
                "--all-targets",
                "--locked",
                "--",
                "-D",
                "warnings",
            ],
        ),
    )?;
    // Docs whose intra-doc links resolve (private items too: most of the code is documented for its
    // maintainers, not as a public API).
    let mut doc_env = env.clone();
    doc_env.push((
        "RUSTDOCFLAGS".to_string(),
        "-D warnings -A rustdoc::private_intra_doc_links".to_string(),
    ));
    run::step(
        "docs",
        run::cargo(
            &root,
            &doc_env,
            &[
                "doc",
                "--workspace",
                "--no-deps",
                "--document-private-items",
                "--locked",
            ],
        ),
    )?;
    let tests = run::step(
        "tests",
        run::cargo(
            &root,
            &env,
            &["test", "--workspace", "--locked", "--no-fail-fast"],
        ),
    );
    // Tests leave the local cluster running for the next run; a CI machine has no next run.
    if std::env::var_os("CI").is_some() {
        if let Err(e) = cluster::run(cluster::Action::Down) {
            eprintln!("warning: stopping the local cluster after the tests failed: {e:#}");
        }
    }
    tests
}
