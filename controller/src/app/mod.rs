//! The controller as one value: [`App`], built by [`AppBuilder`]. The binary ([`run()`]), every test and
//! every bench build it the same way, so what they exercise is what runs in the cluster.
//!
//! An [`App`] holds the learning path of one record (docs/design.md, "Architecture"): the index the
//! watches feed ([`crate::cluster`]), the [`Learner`] (what was learned and not written yet), the
//! [`ProposalWriter`] (API writes) and the [`Flusher`] between them (the one owner of flushes and of
//! what acknowledgements wait for), the [`Learning`]
//! every source hands its records to (agents through [`App::ingest`], Goldmane), and optionally the
//! [`StatusSync`] that turns the same records into violations. [`run()`] adds what only a process in
//! the cluster has: leader election, TLS, the HTTP endpoints, the reconcilers and the web view.

pub mod explainer;
pub mod run;

pub use run::{RunArgs, run};

use crate::cluster::names::{self, ResolvedNames, WorkloadKey};
use crate::cluster::shared_watch::PolicyObjects;
use crate::cluster::watches::{self, SharedIndex};
use crate::ingest::admission::{Admission, StreamLimits};
use crate::ingest::evidence::EvidenceSink;
use crate::ingest::presence::Presence;
use crate::ingest::waiting::Waiting;
use crate::ingest::{Authenticate, IngestService, Learning, Limits};
use crate::learn::flush_report::FlushReport;
use crate::learn::flusher::Flusher;
use crate::learn::learner::Learner;
use crate::learn::proposal_writer::ProposalWriter;
use crate::learn::provenance::SigningKey;
use crate::monitor::otlp::ViolationSink;
use crate::monitor::status_sync::{self, StatusSync};
use crate::runtime::leader::Leadership;
use crate::runtime::metrics::ControllerMetrics;
use kube::Client;
use network_enforcer_api::Backend;
use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use tokio::sync::watch;

/// When an agent's batch is acknowledged (docs/behaviour.md §1.10).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Acknowledge {
    /// A batch that taught something is acknowledged once a flush has written it: nothing an agent
    /// was told is safe is lost if the controller stops. What the controller does.
    #[default]
    OnceWritten,
    /// Once merged in memory. For tests that read the acknowledgements first and then drive
    /// [`App::flush`] by hand, to look at one flush's report.
    OnceMerged,
}

/// See the module docs.
pub struct App {
    pub client: Client,
    pub metrics: ControllerMetrics,
    pub index: Arc<SharedIndex>,
    pub learner: Arc<Learner>,
    pub writer: Arc<ProposalWriter>,
    pub flusher: Arc<Flusher>,
    pub learning: Arc<Learning>,
    /// `None`: no violations are recorded (built without [`AppBuilder::status_sync`]).
    pub status_sync: Option<Arc<StatusSync>>,
    /// The one watch per kind of policies, proposals and NetworkPolicies that the status sync, the
    /// proposal writer (its cache), the reconcilers and the web view share.
    pub objects: Arc<PolicyObjects>,
    /// The addresses pods resolved names of outside services to, from the agents' resolutions.
    pub names: Arc<ResolvedNames>,
    /// Which workload got a new address; taken once by the policy reconciler
    /// ([`App::take_name_changes`]).
    name_changes: std::sync::Mutex<Option<tokio::sync::mpsc::Receiver<WorkloadKey>>>,
    acknowledge: Acknowledge,
    limits: Limits,
    admission: Arc<Admission>,
    /// Which nodes' agents stream to this process now (read by the coverage loop).
    pub presence: Arc<Presence>,
}

type ConfigureLearner = Box<dyn FnOnce(Learner) -> Learner + Send>;

/// Builds an [`App`]; every setting has the controller's default.
pub struct AppBuilder {
    client: Client,
    backend: Backend,
    excluded_namespaces: BTreeSet<String>,
    namespace: Option<String>,
    configure_learner: Option<ConfigureLearner>,
    signing_key: Option<Arc<SigningKey>>,
    leadership: Option<watch::Receiver<Leadership>>,
    objects: Option<Arc<PolicyObjects>>,
    index: Option<Arc<SharedIndex>>,
    status_sync: Option<(status_sync::Settings, Arc<dyn ViolationSink>)>,
    evidence: Option<Arc<dyn EvidenceSink>>,
    metrics: Option<ControllerMetrics>,
    acknowledge: Acknowledge,
    limits: Limits,
    stream_limits: StreamLimits,
    names: names::Settings,
    resolution_grace_ms: i64,
    cluster_cidrs: Vec<ipnet::IpNet>,
}

impl App {
    /// A builder of the controller learning for `backend` through `client`.
    pub fn builder(client: Client, backend: Backend) -> AppBuilder {
        AppBuilder {
            client,
            backend,
            excluded_namespaces: BTreeSet::new(),
            namespace: None,
            configure_learner: None,
            signing_key: None,
            leadership: None,
            objects: None,
            index: None,
            status_sync: None,
            evidence: None,
            metrics: None,
            acknowledge: Acknowledge::default(),
            limits: Limits::default(),
            stream_limits: StreamLimits::default(),
            names: names::Settings::default(),
            resolution_grace_ms: 0,
            cluster_cidrs: Vec::new(),
        }
    }

    /// The receiver of [`ResolvedNames`]' changes, for the policy reconciler (`None` after the first
    /// call).
    pub fn take_name_changes(&self) -> Option<tokio::sync::mpsc::Receiver<WorkloadKey>> {
        self.name_changes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    /// The gRPC service agents stream to, authenticating them with `authenticator`.
    pub fn ingest(&self, authenticator: Arc<dyn Authenticate>) -> IngestService {
        IngestService {
            authenticator,
            learning: self.learning.clone(),
            limits: self.limits.clone(),
            admission: self.admission.clone(),
            presence: self.presence.clone(),
            written: match self.acknowledge {
                Acknowledge::OnceWritten => Some(self.flusher.ledger().clone()),
                Acknowledge::OnceMerged => None,
            },
        }
    }

    /// Feeds the index from the cluster's watches; runs until dropped.
    pub fn watch_cluster(&self) -> impl Future<Output = ()> + Send + 'static {
        watches::run(self.client.clone(), self.index.clone())
    }

    /// One flush now ([`Flusher::flush`]).
    pub async fn flush(&self) -> FlushReport {
        self.flusher.flush().await
    }
}

impl AppBuilder {
    /// Learns nothing for workloads in these namespaces (they are still resolved as peers).
    pub fn excluded_namespaces(mut self, namespaces: impl IntoIterator<Item = String>) -> Self {
        self.excluded_namespaces = namespaces.into_iter().collect();
        self
    }

    /// Watches and learns for this namespace only (`None`: all namespaces).
    pub fn namespace(mut self, namespace: Option<String>) -> Self {
        self.namespace = namespace;
        self
    }

    /// Further settings of the learner (its limits, exclusions, resolution grace, trust).
    pub fn configure_learner(
        mut self,
        configure: impl FnOnce(Learner) -> Learner + Send + 'static,
    ) -> Self {
        self.configure_learner = Some(Box::new(configure));
        self
    }

    /// Lets what ingest cannot resolve yet wait up to `grace_ms` for the index
    /// ([`crate::ingest::waiting`]); without it (0, the default) every record is taken in as it
    /// resolves on arrival.
    pub fn resolution_grace(mut self, grace_ms: i64) -> Self {
        self.resolution_grace_ms = grace_ms;
        self
    }

    /// With the resolution grace: peers outside `cidrs` (the ranges the cluster gives pods and
    /// Services) never wait.
    pub fn cluster_cidrs(mut self, cidrs: Vec<ipnet::IpNet>) -> Self {
        self.cluster_cidrs = cidrs;
        self
    }

    /// Signs every proposal written with `key` ([`crate::learn::provenance`]); `None`: unsigned.
    pub fn signing_key(mut self, key: Option<Arc<SigningKey>>) -> Self {
        self.signing_key = key;
        self
    }

    /// Writes only while `leadership` says this replica leads (and the ingest refuses agents
    /// otherwise); without it this replica always leads.
    pub fn leadership(mut self, leadership: watch::Receiver<Leadership>) -> Self {
        self.leadership = Some(leadership);
        self
    }

    /// Shares these watches instead of new ones over the status sync's namespace (or, without a
    /// status sync, [`AppBuilder::namespace`]).
    pub fn policy_objects(mut self, objects: Arc<PolicyObjects>) -> Self {
        self.objects = Some(objects);
        self
    }

    /// Resolves against this index instead of a new one (e.g. one listed by hand).
    pub fn index(mut self, index: Arc<SharedIndex>) -> Self {
        self.index = Some(index);
        self
    }

    /// Records violations: every accepted record is also evidence for a status sync with `settings`,
    /// reporting to `sink`.
    pub fn status_sync(
        mut self,
        settings: status_sync::Settings,
        sink: Arc<dyn ViolationSink>,
    ) -> Self {
        self.status_sync = Some((settings, sink));
        self
    }

    /// Hands every accepted record to `sink` as violation evidence, instead of to the status sync's
    /// queue (e.g. to look at what a source delivers).
    pub fn evidence_sink(mut self, sink: Arc<dyn EvidenceSink>) -> Self {
        self.evidence = Some(sink);
        self
    }

    /// Counts into `metrics` (the process's registry).
    pub fn metrics(mut self, metrics: ControllerMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// When agents' batches are acknowledged.
    pub fn acknowledge(mut self, acknowledge: Acknowledge) -> Self {
        self.acknowledge = acknowledge;
        self
    }

    /// Per-stream limits of the ingest (records per batch, batches per second).
    pub fn ingest_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// How many agent streams at once, and for how long.
    pub fn stream_limits(mut self, limits: StreamLimits) -> Self {
        self.stream_limits = limits;
        self
    }

    /// Bounds and retention of the addresses names resolved to ([`names::Settings`]).
    pub fn names(mut self, settings: names::Settings) -> Self {
        self.names = settings;
        self
    }

    pub fn build(self) -> App {
        let metrics = self.metrics.unwrap_or_default();
        let index = self.index.unwrap_or_default();
        let objects = self.objects.unwrap_or_else(|| {
            let scope = match &self.status_sync {
                Some((settings, _)) => settings.namespace.as_deref(),
                None => self.namespace.as_deref(),
            };
            Arc::new(PolicyObjects::new(&self.client, scope))
        });
        metrics.register(
            "watch_objects_undecodable",
            "Objects the shared watches left out because they do not decode (a newer release's \
             values, an object no schema checked), by kind; each is named in a warning",
            objects.undecodable.clone(),
        );
        let status_sync = self.status_sync.map(|(settings, sink)| {
            let sync = StatusSync::new(
                self.client.clone(),
                index.clone(),
                objects.clone(),
                settings,
                sink,
            );
            sync.register_metrics(&metrics);
            sync
        });
        let evidence = self
            .evidence
            .or_else(|| status_sync.as_ref().map(|s| s.evidence()));
        let mut learner = Learner::new(self.backend, self.excluded_namespaces)
            .with_only_namespace(self.namespace)
            .with_metrics(metrics.clone());
        if let Some(configure) = self.configure_learner {
            learner = configure(learner);
        }
        let mut writer = ProposalWriter::new(self.client.clone(), self.backend)
            .with_limits(*learner.limits())
            .with_signing_key(self.signing_key)
            .with_metrics(metrics.clone());
        if let Some(leadership) = self.leadership {
            writer = writer.with_leader(leadership);
        }
        // Empty until the proposals' watch runs (the reconcilers start it): the writer reads from
        // the API what the cache does not hold.
        writer = writer.with_cache(objects.proposals.store());
        let (learner, writer) = (Arc::new(learner), Arc::new(writer));
        // Agents' batches and cluster-wide sources share one learning and evidence path.
        let (names, name_changes) = ResolvedNames::with_changes(self.names);
        let names = Arc::new(names);
        let learning = Arc::new(Learning {
            index: index.clone(),
            learner: learner.clone(),
            leader: writer.clone(),
            metrics: metrics.clone(),
            evidence,
            waiting: Waiting::new(
                self.resolution_grace_ms,
                self.cluster_cidrs,
                metrics.waits.clone(),
            ),
            names: Some(names.clone()),
            // The status sync persists them (when it does) and reads them back as a new leader.
            claims: status_sync
                .as_ref()
                .map_or_else(Default::default, |s| s.claims()),
        });
        let flusher = Flusher::new(index.clone(), learner.clone(), writer.clone())
            .with_waiting(learning.clone());
        App {
            client: self.client,
            metrics,
            flusher: Arc::new(flusher),
            index,
            learner,
            writer,
            learning,
            status_sync,
            objects,
            names,
            name_changes: std::sync::Mutex::new(Some(name_changes)),
            acknowledge: self.acknowledge,
            limits: self.limits,
            admission: Admission::new(self.stream_limits),
            presence: Arc::default(),
        }
    }
}
