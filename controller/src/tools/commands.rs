//! The offline and maintenance commands of the controller binary: `check`, `graph` and `cleanup`
//! (arguments and the glue from files or the cluster to [`crate::tools`]).

use anyhow::{Context as _, Result};
use clap::ValueEnum;
use std::time::Duration;

#[derive(clap::Args)]
pub struct CleanupArgs {
    /// Only this namespace (default: all namespaces).
    #[arg(long, env = "WATCH_NAMESPACE")]
    namespace: Option<String>,
    /// The controller Deployment to stop first; a running controller would render the deleted objects
    /// again. Without it, only the deletion happens.
    #[arg(long, env = "CONTROLLER_DEPLOYMENT")]
    controller_deployment: Option<String>,
    /// The namespace of --controller-deployment (the release namespace).
    #[arg(long, env = "POD_NAMESPACE", default_value = "network-enforcer")]
    controller_namespace: String,
    /// How long the controller's pods may take to terminate, in seconds; the clean-up fails (and
    /// deletes nothing) if they are still there then.
    #[arg(long, env = "STOP_TIMEOUT_SECONDS", default_value_t = 120)]
    stop_timeout_seconds: u64,
    /// The name prefix of the ConfigMaps the controller persisted its protect gate's history in
    /// (in --controller-namespace); deleted after the rendered objects.
    #[arg(long, env = "EDGE_HISTORY_CONFIGMAP")]
    edge_history_configmap: Option<String>,
    /// The ConfigMap the controller persisted its evidence claims in (in --controller-namespace);
    /// deleted after the rendered objects.
    #[arg(long, env = "EVIDENCE_CLAIMS_CONFIGMAP")]
    evidence_claims_configmap: Option<String>,
}

#[derive(clap::Args)]
pub struct CheckArgs {
    /// The scenario: `namespaces`, `pods`, `policies`, `flows` (JSON or YAML; `-` for stdin).
    #[arg(
        long,
        required_unless_present = "from_cluster",
        conflicts_with = "from_cluster"
    )]
    scenario: Option<std::path::PathBuf>,
    /// Instead of a scenario file: the cluster as it is now (the namespace's pods, NetworkPolicies and
    /// WorkloadNetworkPolicies from KUBECONFIG), and as flows the traffic the controller observed
    /// there (its protect gate's history, read from its web view at --controller-url).
    #[arg(long, requires = "namespace")]
    from_cluster: bool,
    /// With --from-cluster: the namespace whose observed traffic is checked.
    #[arg(long)]
    namespace: Option<String>,
    /// With --from-cluster: the controller's web view, e.g. after
    /// `kubectl port-forward -n <release namespace> deploy/<release>-network-enforcer-controller 8090`.
    #[arg(long, default_value = "http://127.0.0.1:8090")]
    controller_url: String,
    /// Also replay recorded agent records (JSON lines of `network-enforcer-agent flows -o json`)
    /// against the scenario's policies and print the would-deny diff.
    #[arg(long)]
    flows_from: Option<std::path::PathBuf>,
    /// Name, for each side of each flow, the rule that allowed it or the policies that isolate it.
    #[arg(long)]
    explain: bool,
    /// Compare with these policies instead of the scenario's (NetworkPolicy and WorkloadNetworkPolicy
    /// objects: a list, a `kind: List` or `---` documents) and print the flows whose verdict changes,
    /// each side explained under both.
    #[arg(long, value_name = "NEW_POLICIES")]
    diff_policies: Option<std::path::PathBuf>,
    /// Instead of verdicts: the ClusterNetworkPolicies the flows need (an Admin isolation and a
    /// Baseline floor per namespace, docs/behaviour.md §1.11), as YAML to review and apply.
    #[arg(long, conflicts_with_all = ["explain", "diff_policies", "flows_from"])]
    propose_cluster_policies: bool,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = OutputFormat::Json)]
    output: OutputFormat,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum OutputFormat {
    Json,
    Table,
}

#[derive(clap::Args)]
pub struct GraphArgs {
    /// Only this namespace's proposals and policies (default: all namespaces).
    #[arg(long)]
    namespace: Option<String>,
    /// `dot` (Graphviz source) or `svg` (needs Graphviz's `dot` on PATH).
    #[arg(short = 'o', long = "output", value_enum, default_value_t = GraphFormat::Dot)]
    output: GraphFormat,
    /// Write here instead of stdout.
    #[arg(long)]
    out: Option<std::path::PathBuf>,
    /// Read WorkloadNetworkPolicy / WorkloadNetworkPolicyProposal objects from this YAML or JSON file
    /// (a list, a `kind: List`, or `---` documents) instead of the cluster.
    #[arg(long)]
    from_file: Option<std::path::PathBuf>,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum GraphFormat {
    Dot,
    Svg,
}

/// `cleanup`: stop the controller, then delete what it rendered (the chart's pre-delete hook).
pub async fn cleanup(args: CleanupArgs) -> Result<()> {
    use crate::tools::uninstall::{self, ControllerDeployment};
    // The hook Job's log is what a user reads when an uninstall fails.
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
        .init();
    let client = kube::Client::try_default()
        .await
        .context("connecting to Kubernetes (in-cluster config or KUBECONFIG)")?;
    let controller = args.controller_deployment.map(|name| ControllerDeployment {
        namespace: args.controller_namespace.clone(),
        name,
        timeout: Duration::from_secs(args.stop_timeout_seconds),
    });
    let removed = uninstall::uninstall(&client, controller.as_ref(), args.namespace.as_deref())
        .await
        .context("stopping the controller and removing rendered NetworkPolicies and AuthorizationPolicies")?;
    println!("removed {removed} rendered object(s)");
    if let Some(prefix) = &args.edge_history_configmap {
        use crate::monitor::history_store::{HistoryStore, Limits};
        let store = HistoryStore::new(
            client.clone(),
            &args.controller_namespace,
            prefix,
            Limits::default(),
        );
        let removed = store
            .remove()
            .await
            .context("removing the persisted edge history")?;
        println!("removed {removed} edge history ConfigMap(s)");
    }
    if let Some(name) = args
        .evidence_claims_configmap
        .as_deref()
        .filter(|n| !n.is_empty())
    {
        use crate::ingest::claims_store::ClaimsStore;
        let removed = ClaimsStore::new(client.clone(), &args.controller_namespace, name)
            .remove()
            .await
            .context("removing the persisted evidence claims")?;
        println!(
            "removed {} evidence claims ConfigMap(s)",
            usize::from(removed)
        );
    }
    Ok(())
}

/// `graph`: the workload graph from a file or the cluster, as DOT or SVG.
pub async fn graph(args: &GraphArgs) -> Result<()> {
    use crate::tools::graph;
    let input = match &args.from_file {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            graph::parse_objects(&text)
                .with_context(|| format!("invalid objects in {}", path.display()))?
        }
        None => {
            let client = kube::Client::try_default()
                .await
                .context("connecting to Kubernetes (in-cluster config or KUBECONFIG)")?;
            graph::load_from_cluster(&client, args.namespace.as_deref())
                .await
                .context("listing WorkloadNetworkPolicies and proposals")?
        }
    };
    let dot = graph::render_dot(&input, args.namespace.as_deref());
    let bytes = match args.output {
        GraphFormat::Dot => dot.into_bytes(),
        GraphFormat::Svg => graph::to_svg(&dot)?,
    };
    match &args.out {
        Some(path) => {
            std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))?
        }
        None => write_stdout(&bytes)?,
    }
    Ok(())
}

/// `check`: evaluate the scenario's flows (and replay records), print the report; invalid input is
/// an error naming the field.
pub async fn check(args: &CheckArgs) -> Result<()> {
    use crate::tools::check::{Checker, diff, live, parse_policies, parse_records, parse_scenario};
    let stdin = std::path::Path::new("-");
    let inputs = [
        args.scenario.as_ref(),
        args.flows_from.as_ref(),
        args.diff_policies.as_ref(),
    ];
    if inputs.iter().flatten().filter(|p| **p == stdin).count() > 1 {
        anyhow::bail!(
            "only one of --scenario, --flows-from and --diff-policies can read stdin (`-`); give the others as files"
        );
    }
    let read = |path: &std::path::Path| -> Result<String> {
        if path == std::path::Path::new("-") {
            return std::io::read_to_string(std::io::stdin()).context("reading stdin");
        }
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
    };
    let (scenario, source) = match (&args.scenario, &args.namespace) {
        (Some(path), _) => {
            let what = format!("scenario {}", path.display());
            let scenario =
                parse_scenario(&read(path)?).with_context(|| format!("invalid {what}"))?;
            (scenario, what)
        }
        (None, Some(namespace)) => {
            let client = kube::Client::try_default()
                .await
                .context("connecting to Kubernetes (in-cluster config or KUBECONFIG)")?;
            let input = live::load(&client, namespace, &args.controller_url).await?;
            let (scenario, skipped) = live::scenario(&input);
            eprintln!(
                "{} observed edges of namespace {namespace}{}; {skipped} left out (a workload with no pod now)",
                input.edges.len(),
                if input.truncated {
                    " (the controller's newest only)"
                } else {
                    ""
                },
            );
            (scenario, format!("cluster state of namespace {namespace}"))
        }
        (None, None) => anyhow::bail!("give --scenario FILE, or --from-cluster --namespace NS"),
    };
    if args.propose_cluster_policies {
        let proposed = crate::tools::check::propose_cluster_policies(&scenario)
            .with_context(|| format!("invalid {source}"))?;
        for note in &proposed.notes {
            eprintln!("note: {note}");
        }
        eprintln!(
            "{} ClusterNetworkPolicies from {} flows; each observed flow stays allowed",
            proposed.policies.len(),
            scenario.flows.len()
        );
        let mut yaml = String::new();
        for policy in &proposed.policies {
            yaml.push_str("---\n");
            yaml.push_str(&serde_yaml::to_string(policy)?);
        }
        return write_stdout(yaml.as_bytes());
    }
    let checker = Checker::new(scenario).with_context(|| format!("invalid {source}"))?;
    let report = if args.explain {
        checker.explain()
    } else {
        checker.run()
    };
    let changes = match &args.diff_policies {
        Some(path) => {
            let invalid = || format!("invalid policies file {}", path.display());
            let policies = parse_policies(&read(path)?).with_context(invalid)?;
            let new = checker.with_policies(policies).with_context(invalid)?;
            Some(diff(&checker.explain(), &new.explain()))
        }
        None => None,
    };
    let replay = match &args.flows_from {
        Some(path) => {
            let records = parse_records(&read(path)?)
                .with_context(|| format!("invalid records file {}", path.display()))?;
            Some(checker.replay(&records))
        }
        None => None,
    };
    let text = match args.output {
        OutputFormat::Json => {
            let mut value = serde_json::to_value(&report)?;
            if let Some(replay) = &replay {
                value["replay"] = serde_json::to_value(replay)?;
            }
            if let Some(changes) = &changes {
                value["diff"] = serde_json::to_value(changes)?;
            }
            if let Some(usage) = checker.rule_usage() {
                value["ruleUsage"] = serde_json::to_value(usage.rules)?;
            }
            format!("{}\n", serde_json::to_string_pretty(&value)?)
        }
        OutputFormat::Table => {
            let mut text = report.render_table();
            let tables = [
                replay.as_ref().map(|r| r.render_table()),
                changes.as_ref().map(|c| c.render_table()),
                checker.rule_usage().map(|u| u.render_table()),
            ];
            for table in tables.into_iter().flatten() {
                text.push('\n');
                text.push_str(&table);
            }
            text
        }
    };
    write_stdout(text.as_bytes())
}

/// Writes a command's output; a reader that stops early (`| head`) is no error worth a panic.
fn write_stdout(bytes: &[u8]) -> Result<()> {
    match std::io::Write::write_all(&mut std::io::stdout().lock(), bytes) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other.context("writing to stdout"),
    }
}
