//! What `run` reads from its command line and starts before the loop: the settings, the [`App`],
//! the probes' endpoint, the web view and the agents' ingest endpoint.

use super::{Election, Provider, RunArgs, ingest_server};
use crate::app::App;
use crate::ingest::TokenReviewAuthenticator;
use crate::ingest::admission::StreamLimits;
use crate::ingest::auth_cache::{self, CachedAuthenticator};
use crate::ingest::claims_store::ClaimsStore;
use crate::ingest::tls;
use crate::learn::learner::{ExcludedWorkload, Learner};
use crate::learn::provenance::SigningKey;
use crate::monitor::history_store::{self, HistoryStore};
use crate::monitor::status_sync::{self, StatusSync};
use crate::reconcile::Settings;
use crate::runtime::http::Health;
use crate::runtime::metrics::ControllerMetrics;
use anyhow::{Context as _, Result};
use network_enforcer_api::Backend;
use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// The command line read into what the parts share, checked before anything starts.
pub struct Setup {
    pub settings: Settings,
    pub signing_key: Option<Arc<SigningKey>>,
    /// The agents' service account (`namespace`, `name`): the only identity the ingest accepts.
    pub agent_account: (String, String),
    pub excluded: BTreeSet<String>,
    pub backend: Backend,
    pub transport: tls::Transport,
}

impl Setup {
    pub fn from_args(args: &RunArgs) -> Result<Self> {
        let signing_key = signing_key(args)?;
        let settings = Settings {
            namespace: args.namespace.clone(),
            instance: args.instance.clone(),
            resync: Duration::from_secs(args.resync_seconds),
            signing_key: signing_key.clone(),
            unused_rule_after: args.unused_rule_after,
            ..Settings::default()
        };
        let (agent_ns, agent_name) = args
            .agent_service_account
            .split_once('/')
            .context("--agent-service-account must be `namespace/name`")?;
        let excluded: BTreeSet<String> = if args.exclude_namespaces.is_empty() {
            BTreeSet::from([args.pod_namespace.clone()])
        } else {
            args.exclude_namespaces.iter().cloned().collect()
        };
        let backend = args.provider.backend();
        // Decided before anything starts: a missing certificate is a startup error, not a silent
        // plaintext.
        let transport = tls::transport(
            args.ingest_tls_cert_file.clone(),
            args.ingest_tls_key_file.clone(),
            args.ingest_insecure,
        )?;
        tracing::info!(namespace = ?settings.namespace, ?backend, ?excluded, ingest = %args.ingest_address, "starting controller");
        Ok(Self {
            settings,
            signing_key,
            agent_account: (agent_ns.to_string(), agent_name.to_string()),
            excluded,
            backend,
            transport,
        })
    }

    /// The [`App`]: index, learning, flusher, ingest and status sync, as the flags configure them.
    pub fn app(
        &self,
        args: &RunArgs,
        client: &kube::Client,
        metrics: &ControllerMetrics,
        violation_sink: Arc<dyn crate::monitor::otlp::ViolationSink>,
        election: Option<&Election>,
    ) -> App {
        let learner_settings = LearnerSettings::from(args);
        let mut builder = App::builder(client.clone(), self.backend)
            .excluded_namespaces(self.excluded.clone())
            .namespace(self.settings.namespace.clone())
            .metrics(metrics.clone())
            .configure_learner(move |l| learner_settings.apply(l))
            .resolution_grace(
                i64::try_from(args.resolution_grace_seconds.saturating_mul(1000))
                    .unwrap_or(i64::MAX),
            )
            .cluster_cidrs(args.cluster_cidrs.clone())
            .signing_key(self.signing_key.clone())
            .status_sync(
                status_sync_settings(args, client, &self.settings),
                violation_sink,
            )
            .stream_limits(StreamLimits {
                max_streams: args.max_agent_streams,
                max_age: Duration::from_secs(args.max_agent_stream_age_seconds),
                ..StreamLimits::default()
            })
            .names(crate::cluster::names::Settings {
                retention: args.name_address_retention,
                ..Default::default()
            });
        if let Some(election) = election {
            builder = builder.leadership(election.leadership());
        }
        builder.build()
    }
}

/// Binds `/metrics`, `/healthz` and `/readyz` (a port in use is a startup error) and serves them.
pub async fn serve_probes(
    args: &RunArgs,
    metrics: &ControllerMetrics,
    health: &Health,
) -> Result<impl Future<Output = std::io::Result<()>> + use<>> {
    let listener = tokio::net::TcpListener::bind(args.metrics_address)
        .await
        .with_context(|| format!("binding --metrics-address {}", args.metrics_address))?;
    tracing::info!(address = %args.metrics_address, "serving /metrics, /healthz, /readyz");
    Ok(crate::runtime::http::serve(
        listener,
        metrics.clone(),
        health.clone(),
    ))
}

/// Starts the web view (off with `--no-ui`).
pub async fn start_ui(
    args: &RunArgs,
    client: &kube::Client,
    app: &App,
    setup: &Setup,
    status_sync: Arc<StatusSync>,
    metrics: &ControllerMetrics,
) -> Result<crate::ui::Serving> {
    let address = if args.no_ui { "" } else { &args.ui_address };
    Ok(crate::ui::start(
        address,
        client.clone(),
        &app.objects,
        status_sync,
        Arc::new(crate::app::explainer::ClusterExplainer {
            client: client.clone(),
            scope: setup.settings.namespace.clone(),
        }),
        metrics,
    )
    .await?)
}

/// Binds the agents' ingest endpoint and serves it, each stream authenticated as the agents'
/// service account (reconnects within a short window reuse the last review: `auth_cache`).
pub async fn serve_ingest(
    args: &RunArgs,
    client: &kube::Client,
    app: &App,
    setup: &Setup,
    metrics: &ControllerMetrics,
) -> Result<ingest_server::Serving> {
    let (agent_ns, agent_name) = &setup.agent_account;
    let ingest = app.ingest(Arc::new(CachedAuthenticator::new(
        TokenReviewAuthenticator::new(client.clone(), agent_ns, agent_name),
        auth_cache::TTL,
    )));
    let listener = tokio::net::TcpListener::bind(args.ingest_address)
        .await
        .with_context(|| format!("binding --ingest-address {}", args.ingest_address))?;
    ingest_server::serve(
        args.ingest_address,
        listener,
        setup.transport.clone(),
        ingest,
        metrics,
    )
}

/// The key proposals are signed with; without one, any proposal is promoted (warned).
fn signing_key(args: &RunArgs) -> Result<Option<Arc<SigningKey>>> {
    Ok(match &args.proposal_signing_key_file {
        Some(path) => Some(Arc::new(SigningKey::from_file(path)?)),
        None => {
            tracing::warn!(
                "no --proposal-signing-key-file: any proposal is promoted, also one written by hand \
                 (anyone who may write proposals may then create NetworkPolicies through promotion)"
            );
            None
        }
    })
}

/// The status sync's settings from the command line.
fn status_sync_settings(
    args: &RunArgs,
    client: &kube::Client,
    settings: &Settings,
) -> status_sync::Settings {
    status_sync::Settings {
        namespace: settings.namespace.clone(),
        interval: args.status_update_interval,
        // Cilium gives in-cluster pods identities that CIDR rules do not match.
        ip_blocks_match_pods: !matches!(args.provider, Provider::Cilium),
        instance: settings.instance.clone(),
        history: crate::monitor::edge_history::Bounds {
            max_edges: args.edge_history_max_edges as usize,
            retention: args.edge_history_retention,
        },
        history_warmup: args.edge_history_warmup,
        history_store: (!args.edge_history_persist_interval.is_zero()).then(|| {
            HistoryStore::new(
                client.clone(),
                &args.pod_namespace,
                &args.edge_history_configmap,
                history_store::Limits::default(),
            )
        }),
        history_persist_every: args
            .edge_history_persist_interval
            .max(Duration::from_secs(1)),
        claims_store: (!args.evidence_claims_configmap.is_empty()).then(|| {
            ClaimsStore::new(
                client.clone(),
                &args.pod_namespace,
                &args.evidence_claims_configmap,
            )
        }),
        // The reconciler's memory: both elect the same policy per target.
        backends: settings.backends.clone(),
        ..status_sync::Settings::default()
    }
}

/// The learner's settings from the command line.
struct LearnerSettings {
    excluded_workloads: Vec<ExcludedWorkload>,
    max_external_peers_per_port: usize,
    max_ports_per_rule: usize,
    max_rules: usize,
    wildcard_min_names: usize,
    trust_remote_peers: bool,
}

impl From<&RunArgs> for LearnerSettings {
    fn from(args: &RunArgs) -> Self {
        Self {
            excluded_workloads: args.exclude_workloads.clone(),
            max_external_peers_per_port: args.max_external_peers_per_port,
            max_ports_per_rule: args.max_ports_per_rule,
            max_rules: args.max_rules,
            wildcard_min_names: args.wildcard_min_names,
            trust_remote_peers: args.trust_remote_peers,
        }
    }
}

impl LearnerSettings {
    fn apply(self, learner: Learner) -> Learner {
        learner
            .with_excluded_workloads(self.excluded_workloads)
            .with_max_external_peers(self.max_external_peers_per_port)
            .with_max_ports_per_rule(self.max_ports_per_rule)
            .with_max_rules(self.max_rules)
            .with_wildcard_min_names(self.wildcard_min_names)
            .with_trust_remote_peers(self.trust_remote_peers)
    }
}
