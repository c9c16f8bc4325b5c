//! `network-enforcer-controller`: turns observed flows into policy proposals, promotes them, renders and
//! monitors policies. Run `network-enforcer-controller --help`.

use anyhow::{Context as _, Result};
use clap::{Parser, Subcommand, ValueEnum};
use network_enforcer_controller::reconcile::{self, Settings};
use std::time::Duration;

#[derive(Parser)]
#[command(
    version,
    about = "network-enforcer controller: learn proposals from flows, promote them into policies, \
             record violations (monitor) and render NetworkPolicies / AuthorizationPolicies (protect)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the controller against the cluster of the in-cluster config or KUBECONFIG.
    Run(RunArgs),
    /// Delete every NetworkPolicy and AuthorizationPolicy this controller rendered, so no enforcement
    /// outlives an uninstall (the chart's pre-delete hook runs this). Policies are kept.
    Cleanup {
        /// Only this namespace (default: all namespaces).
        #[arg(long, env = "WATCH_NAMESPACE")]
        namespace: Option<String>,
    },
    /// Print the CustomResourceDefinitions this controller serves, as YAML
    /// (e.g. `network-enforcer-controller crds | kubectl apply -f -`).
    Crds,
}

#[derive(clap::Args)]
struct RunArgs {
    /// Watch only this namespace (default: all namespaces).
    #[arg(long, env = "WATCH_NAMESPACE")]
    namespace: Option<String>,
    /// Log format: `json` in the cluster, `text` for people.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value_t = LogFormat::Json)]
    log_format: LogFormat,
    /// Log filter, e.g. `info` or `network_enforcer_controller=debug`.
    #[arg(long, env = "LOG_LEVEL", default_value = "info")]
    log_level: String,
    /// Reconcile every object at least this often, in seconds, even without changes.
    #[arg(long, env = "RESYNC_SECONDS", default_value_t = 36_000)]
    resync_seconds: u64,
    /// This instance's name in Events (the pod name in the cluster).
    #[arg(long, env = "POD_NAME")]
    instance: Option<String>,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Json,
    Text,
}

#[tokio::main]
async fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Crds => {
            for (_, yaml) in network_enforcer_api::crd_manifests() {
                print!("---\n{yaml}");
            }
            Ok(())
        }
        Command::Run(args) => run(args).await,
        Command::Cleanup { namespace } => {
            let client = kube::Client::try_default()
                .await
                .context("connecting to Kubernetes (in-cluster config or KUBECONFIG)")?;
            let removed = network_enforcer_controller::uninstall::remove_rendered_objects(
                &client,
                namespace.as_deref(),
            )
            .await
            .context("removing rendered NetworkPolicies and AuthorizationPolicies")?;
            println!("removed {removed} rendered object(s)");
            Ok(())
        }
    }
}

async fn run(args: RunArgs) -> Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_new(&args.log_level)
        .with_context(|| format!("invalid --log-level {:?}", args.log_level))?;
    let logs = tracing_subscriber::fmt().with_env_filter(filter);
    match args.log_format {
        LogFormat::Json => logs.json().init(),
        LogFormat::Text => logs.init(),
    }
    let client = kube::Client::try_default()
        .await
        .context("connecting to Kubernetes (in-cluster config or KUBECONFIG)")?;
    let settings = Settings {
        namespace: args.namespace,
        instance: args.instance,
        resync: Duration::from_secs(args.resync_seconds),
        ..Settings::default()
    };
    tracing::info!(namespace = ?settings.namespace, "starting controller");
    reconcile::run(client, settings).await;
    Ok(())
}
