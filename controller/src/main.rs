//! `network-enforcer-controller`: turns observed flows into policy proposals, promotes them, renders and
//! monitors policies. Run `network-enforcer-controller --help`.

use anyhow::Result;
use clap::{Parser, Subcommand};

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
    /// Print the CustomResourceDefinitions this controller serves, as YAML
    /// (e.g. `network-enforcer-controller crds | kubectl apply -f -`).
    Crds,
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Crds => {
            for (_, yaml) in network_enforcer_api::crd_manifests() {
                print!("---\n{yaml}");
            }
        }
    }
    Ok(())
}
