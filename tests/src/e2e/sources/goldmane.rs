//! A fake Calico Goldmane for the `calico` provider: a tonic `goldmane.Flows` server built from our
//! proto, requiring client certificates (mutual TLS, as Goldmane's `RequireAndVerifyClientCert`), on a
//! port of this host. The controller pod reaches it as the operator's Service would be reached: a
//! Service `goldmane` (port 7443) without selector whose Endpoints point at the node's address, in a
//! namespace of the test that also holds the Secret `goldmane-key-pair` and the ConfigMap
//! `goldmane-ca-bundle` (key `tigera-ca-bundle.crt`) the chart tells the controller to read.
//!
//! Aggregation as Goldmane does it: flows reported during a window of
//! [`WINDOW_SECONDS`] are merged per flow key into a bucket; at each rollover the completed bucket is
//! pushed to every stream, one `FlowResult` per key with a per-key stable `id` and the bucket's edges
//! as start and end time. A connection that is still being retried at the rollover (the denied
//! datagrams of step 5) is in the next bucket too: the same key pushed again, which the controller
//! must count once. [`GoldmaneDataPlane`] reports the scenario's flows per reporter as Felix does:
//! allowed flows by both the source's and the destination's node, a flow denied at egress only by the
//! source, with the enforced policy trace (the end-of-tier deny triggered by our NetworkPolicy).

use anyhow::{Context, Result, bail};
use network_enforcer_api::goldmane::flows_server::{Flows, FlowsServer};
use network_enforcer_api::goldmane::{
    Action, EndpointType, Flow, FlowKey, FlowResult, FlowStreamRequest, PolicyHit, PolicyKind,
    PolicyTrace, Reporter,
};
use serde_json::json;
use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tokio_stream::wrappers::{TcpListenerStream, UnboundedReceiverStream};
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};
use tonic::{Request, Response, Status};

use super::super::poll;
use super::super::workload::Namespace;
use super::PodInfo;
use super::kubernetes::{DataPlane, Event, Pods};

/// Goldmane's aggregation window (`AGGREGATION_WINDOW` default).
pub const WINDOW_SECONDS: i64 = 15;
/// The Service port the Calico operator gives Goldmane.
pub const SERVICE_PORT: u16 = 7443;
/// The Secret with the key pair (`tls.crt`, `tls.key`).
pub const SECRET: &str = "goldmane-key-pair";
/// The ConfigMap with the CA bundle.
pub const CA_CONFIGMAP: &str = "goldmane-ca-bundle";
/// The CA bundle's key.
pub const CA_KEY: &str = "tigera-ca-bundle.crt";

#[derive(Default)]
struct State {
    /// Flows of the current window, by encoded key.
    bucket: BTreeMap<Vec<u8>, Flow>,
    /// Flows to put into the next window as well (still retried at the rollover).
    carry: Vec<Flow>,
    /// Per-key ids, stable while the server lives.
    ids: BTreeMap<Vec<u8>, i64>,
    subscribers: Vec<mpsc::UnboundedSender<Result<FlowResult, Status>>>,
    requests: Vec<FlowStreamRequest>,
    /// Buckets pushed so far, and results in them.
    pushed_buckets: u64,
    pushed_results: u64,
    /// Results sent on streams (over all subscribers).
    delivered: u64,
}

impl State {
    fn add(&mut self, flow: Flow) {
        use prost::Message;
        let key = flow
            .key
            .as_ref()
            .map(|k| k.encode_to_vec())
            .unwrap_or_default();
        match self.bucket.get_mut(&key) {
            Some(existing) => {
                existing.num_connections_started += flow.num_connections_started;
                existing.num_connections_completed += flow.num_connections_completed;
                existing.packets_in += flow.packets_in;
                existing.packets_out += flow.packets_out;
                existing.bytes_in += flow.bytes_in;
                existing.bytes_out += flow.bytes_out;
            }
            None => {
                self.bucket.insert(key, flow);
            }
        }
    }

    /// The rollover: pushes the completed bucket `[start, start + WINDOW)`, starts the next one with
    /// the carried flows.
    fn roll(&mut self, start: i64) {
        let bucket = std::mem::take(&mut self.bucket);
        for (key, mut flow) in bucket {
            let next = self.ids.len() as i64 + 1;
            let id = *self.ids.entry(key).or_insert(next);
            flow.start_time = start;
            flow.end_time = start + WINDOW_SECONDS;
            let result = FlowResult {
                id,
                flow: Some(flow),
            };
            self.subscribers
                .retain(|tx| tx.send(Ok(result.clone())).is_ok());
            self.delivered += self.subscribers.len() as u64;
            self.pushed_results += 1;
        }
        self.pushed_buckets += 1;
        for flow in std::mem::take(&mut self.carry) {
            self.add(flow);
        }
    }
}

#[derive(Clone, Default)]
struct Shared(Arc<Mutex<State>>);

type Results = Pin<Box<dyn Stream<Item = Result<FlowResult, Status>> + Send>>;

#[tonic::async_trait]
impl Flows for Shared {
    type StreamStream = Results;

    async fn stream(
        &self,
        request: Request<FlowStreamRequest>,
    ) -> Result<Response<Results>, Status> {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut state = self.0.lock().expect("goldmane state");
        state.requests.push(request.into_inner());
        // Live flows only: the start is not honoured, no backfill (a reconnect's and a new
        // leader's backfill are tested against the in-process Goldmane of controller/tests).
        state.subscribers.push(tx);
        Ok(Response::new(Box::pin(UnboundedReceiverStream::new(rx))))
    }
}

/// The test's PKI: a CA (the operator's), and Goldmane's key pair signed by it, naming the Service.
pub struct Pki {
    /// The CA certificate (PEM).
    pub ca: String,
    /// Goldmane's certificate (PEM); the controller presents the same key pair as its client
    /// certificate, as the reference does with `goldmane-key-pair`.
    pub cert: String,
    /// Its private key (PEM).
    pub key: String,
}

impl Pki {
    /// A CA and a key pair for Service `goldmane` in `namespace`.
    pub fn new(namespace: &str) -> Result<Self> {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
        let ca_key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "tigera-operator-signer (test)");
        let ca_cert = params.self_signed(&ca_key)?;
        let issuer = Issuer::new(params, ca_key);
        let names = vec![
            "goldmane".to_string(),
            format!("goldmane.{namespace}"),
            format!("goldmane.{namespace}.svc"),
            format!("goldmane.{namespace}.svc.cluster.local"),
        ];
        let key = KeyPair::generate()?;
        let mut leaf = CertificateParams::new(names)?;
        leaf.distinguished_name.push(DnType::CommonName, "goldmane");
        let cert = leaf.signed_by(&key, &issuer)?;
        Ok(Self {
            ca: ca_cert.pem(),
            cert: cert.pem(),
            key: key.serialize_pem(),
        })
    }
}

/// The fake Goldmane: serves on a host port until dropped.
pub struct FakeGoldmane {
    state: Shared,
    /// The port it listens on (all addresses).
    pub port: u16,
    runtime: Option<tokio::runtime::Runtime>,
}

impl FakeGoldmane {
    /// Listens on a free port of every address with mutual TLS from `pki`, rolling windows of
    /// [`WINDOW_SECONDS`] aligned to the clock as Goldmane's buckets are.
    pub fn start(pki: &Pki) -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        let state = Shared::default();
        let listener = runtime.block_on(tokio::net::TcpListener::bind("0.0.0.0:0"))?;
        let port = listener.local_addr()?.port();
        let tls = ServerTlsConfig::new()
            .identity(Identity::from_pem(&pki.cert, &pki.key))
            .client_ca_root(Certificate::from_pem(&pki.ca));
        let router = Server::builder()
            .tls_config(tls)
            .context("Goldmane TLS")?
            .add_service(FlowsServer::new(state.clone()));
        runtime.spawn(async move {
            if let Err(e) = router
                .serve_with_incoming(TcpListenerStream::new(listener))
                .await
            {
                eprintln!("fake Goldmane server ended: {e}");
            }
        });
        let roller = state.clone();
        runtime.spawn(async move {
            loop {
                let (now, nanos) = super::now();
                let next = (now / WINDOW_SECONDS + 1) * WINDOW_SECONDS;
                let wait = Duration::from_secs((next - now) as u64)
                    .saturating_sub(Duration::from_nanos(nanos as u64));
                tokio::time::sleep(wait).await;
                roller
                    .0
                    .lock()
                    .expect("goldmane state")
                    .roll(next - WINDOW_SECONDS);
            }
        });
        Ok(Self {
            state,
            port,
            runtime: Some(runtime),
        })
    }

    /// Adds `flow` to the current window; with `carry`, to the next one as well.
    pub fn report(&self, flow: Flow, carry: bool) {
        let mut state = self.state.0.lock().expect("goldmane state");
        if carry {
            state.carry.push(flow.clone());
        }
        state.add(flow);
    }

    /// Waits until everything reported so far (carried flows included) has been pushed.
    pub fn flush(&self) -> Result<()> {
        let target = {
            let s = self.state.0.lock().expect("goldmane state");
            s.pushed_buckets + 1 + u64::from(!s.carry.is_empty())
        };
        poll(
            "Goldmane to push the reported flows",
            Duration::from_secs(3 * WINDOW_SECONDS as u64 + 5),
            Duration::from_millis(200),
            || {
                let s = self.state.0.lock().expect("goldmane state");
                Ok((s.pushed_buckets >= target).then_some(()))
            },
            || self.describe(),
        )
    }

    /// Streams open now.
    pub fn open_streams(&self) -> usize {
        let mut s = self.state.0.lock().expect("goldmane state");
        s.subscribers.retain(|tx| !tx.is_closed());
        s.subscribers.len()
    }

    /// Requests received, buckets and results pushed.
    pub fn describe(&self) -> String {
        let s = self.state.0.lock().expect("goldmane state");
        format!(
            "requests: {:?}\nbuckets pushed: {}, results pushed: {}, delivered: {}, open streams: {}, pending in the window: {}",
            s.requests,
            s.pushed_buckets,
            s.pushed_results,
            s.delivered,
            s.subscribers.len(),
            s.bucket.len()
        )
    }

    /// The requests received so far.
    pub fn requests(&self) -> Vec<FlowStreamRequest> {
        self.state
            .0
            .lock()
            .expect("goldmane state")
            .requests
            .clone()
    }
}

impl Drop for FakeGoldmane {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// Puts the PKI into `ns` as the Calico operator does (Secret `goldmane-key-pair`, ConfigMap
/// `goldmane-ca-bundle`), and Service `goldmane` (port [`SERVICE_PORT`]) whose Endpoints are
/// `node_ip:port` (the fake on this host).
pub fn publish(ns: &Namespace, pki: &Pki, node_ip: &str, port: u16) -> Result<()> {
    use base64_lite::encode;
    ns.apply(
        &json!({
            "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": {"name": SECRET},
            "data": {"tls.crt": encode(pki.cert.as_bytes()), "tls.key": encode(pki.key.as_bytes())}
        })
        .to_string(),
    )?;
    ns.apply(
        &json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": CA_CONFIGMAP},
            "data": {CA_KEY: pki.ca}
        })
        .to_string(),
    )?;
    ns.apply(
        &json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "goldmane"},
            "spec": {"ports": [{"port": SERVICE_PORT, "targetPort": port, "protocol": "TCP"}]}
        })
        .to_string(),
    )?;
    ns.apply(
        &json!({
            "apiVersion": "v1", "kind": "Endpoints",
            "metadata": {"name": "goldmane"},
            "subsets": [{"addresses": [{"ip": node_ip}], "ports": [{"port": port, "protocol": "TCP"}]}]
        })
        .to_string(),
    )?;
    Ok(())
}

/// Standard base64 (the only encoding the manifests need).
mod base64_lite {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

    pub fn encode(bytes: &[u8]) -> String {
        let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
        for chunk in bytes.chunks(3) {
            let b = [
                chunk[0],
                chunk.get(1).copied().unwrap_or(0),
                chunk.get(2).copied().unwrap_or(0),
            ];
            let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
            for i in 0..4 {
                if i <= chunk.len() {
                    out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
                } else {
                    out.push('=');
                }
            }
        }
        out
    }

    #[cfg(test)]
    #[test]
    fn encodes_like_rfc_4648() {
        for (input, want) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(encode(input.as_bytes()), want);
        }
    }
}

/// The node's InternalIP.
pub fn node_ip(kubeconfig: &std::path::Path) -> Result<String> {
    let ip = crate::cluster::components::kubectl(
        kubeconfig,
        &[
            "get",
            "nodes",
            "-o",
            "jsonpath={.items[0].status.addresses[?(@.type==\"InternalIP\")].address}",
        ],
    )?;
    let ip = ip.trim();
    if ip.is_empty() {
        bail!("the node has no InternalIP");
    }
    Ok(ip.to_string())
}

/// Goldmane's name for a pod: `<generateName>*`, or the pod's name without a generateName.
fn endpoint_name(pod: &PodInfo) -> String {
    if pod.generate_name.is_empty() {
        pod.name.clone()
    } else {
        format!("{}*", pod.generate_name)
    }
}

/// The profile hits Calico reports for a flow no policy selects: the namespace profile allows.
fn profile_trace(pod: &PodInfo) -> PolicyTrace {
    PolicyTrace {
        enforced_policies: vec![PolicyHit {
            kind: PolicyKind::Profile as i32,
            name: format!("kns.{}", pod.namespace),
            action: Action::Allow as i32,
            rule_index: 0,
            ..PolicyHit::default()
        }],
        pending_policies: vec![],
    }
}

/// The hits Calico reports when NetworkPolicy `namespace/name` selects a flow and none of its rules
/// allows it: the default tier ends with a deny whose trigger is that policy.
pub fn end_of_tier_deny(namespace: &str, name: &str) -> PolicyTrace {
    let hit = |kind: PolicyKind| PolicyHit {
        kind: kind as i32,
        tier: "default".into(),
        action: Action::Deny as i32,
        policy_index: 0,
        rule_index: -1,
        ..PolicyHit::default()
    };
    PolicyTrace {
        enforced_policies: vec![PolicyHit {
            trigger: Some(Box::new(PolicyHit {
                namespace: namespace.into(),
                name: name.into(),
                ..hit(PolicyKind::NetworkPolicy)
            })),
            ..hit(PolicyKind::EndOfTier)
        }],
        pending_policies: vec![],
    }
}

/// Turns the scenario's events into Felix's flow reports and hands them to a [`FakeGoldmane`].
pub struct GoldmaneDataPlane {
    /// The server.
    pub goldmane: FakeGoldmane,
    log: Vec<String>,
}

impl GoldmaneDataPlane {
    /// A data plane reporting to `goldmane`.
    pub fn new(goldmane: FakeGoldmane) -> Self {
        Self {
            goldmane,
            log: Vec::new(),
        }
    }

    /// The flow `from → to:port/proto` through Service `service` (name, namespace, port name, port),
    /// reported by `reporter` with `action` and `trace`.
    #[allow(clippy::too_many_arguments)]
    fn flow(
        from: &PodInfo,
        to: &PodInfo,
        port: i64,
        proto: &str,
        service: (&str, &str, &str, i64),
        reporter: Reporter,
        action: Action,
        trace: PolicyTrace,
        connections: i64,
    ) -> Flow {
        let (now, _) = super::now();
        Flow {
            key: Some(FlowKey {
                source_name: endpoint_name(from),
                source_namespace: from.namespace.clone(),
                source_type: EndpointType::WorkloadEndpoint as i32,
                dest_name: endpoint_name(to),
                dest_namespace: to.namespace.clone(),
                dest_type: EndpointType::WorkloadEndpoint as i32,
                dest_port: port,
                dest_service_name: service.0.into(),
                dest_service_namespace: service.1.into(),
                dest_service_port_name: service.2.into(),
                dest_service_port: service.3,
                proto: proto.into(),
                reporter: reporter as i32,
                action: action as i32,
                policies: Some(trace),
            }),
            start_time: now,
            end_time: now,
            source_labels: from.labels.clone(),
            dest_labels: to.labels.clone(),
            packets_in: if action == Action::Allow {
                connections
            } else {
                0
            },
            packets_out: connections,
            bytes_in: if action == Action::Allow {
                6 * connections
            } else {
                0
            },
            bytes_out: 6 * connections,
            num_connections_started: connections,
            num_connections_completed: if proto == "tcp" { connections } else { 0 },
            num_connections_live: 0,
        }
    }

    /// An allowed flow as both nodes' Felix report it (both pods here are on one node: two reports).
    fn allowed(
        &self,
        from: &PodInfo,
        to: &PodInfo,
        port: i64,
        proto: &str,
        service: (&str, &str, &str, i64),
    ) {
        for (reporter, trace_of) in [(Reporter::Src, from), (Reporter::Dst, to)] {
            self.goldmane.report(
                Self::flow(
                    from,
                    to,
                    port,
                    proto,
                    service,
                    reporter,
                    Action::Allow,
                    profile_trace(trace_of),
                    1,
                ),
                false,
            );
        }
    }
}

impl DataPlane for GoldmaneDataPlane {
    fn report(&mut self, pods: &Pods, event: Event, egress_policy: (&str, &str)) -> Result<()> {
        let n = pods.client.namespace.as_str();
        let service = ("http-service", n);
        match event {
            Event::Dns => self.allowed(
                &pods.client,
                &pods.dns,
                53,
                "udp",
                ("kube-dns", "kube-system", "dns", 53),
            ),
            Event::Tcp18080 => self.allowed(
                &pods.client,
                &pods.server,
                18080,
                "tcp",
                (service.0, service.1, "tcp-18080", 18080),
            ),
            Event::Udp18083 => self.allowed(
                &pods.client,
                &pods.server,
                18081,
                "udp",
                (service.0, service.1, "udp-18083", 18083),
            ),
            Event::Udp18083Denied => {
                // The egress NetworkPolicy selects the client and no rule allows the flow: the
                // default tier ends with a deny whose trigger is that policy. Reported by the
                // source only (nothing reached the destination), and still retried at the rollover.
                let trace = end_of_tier_deny(egress_policy.0, egress_policy.1);
                self.goldmane.report(
                    Self::flow(
                        &pods.client,
                        &pods.server,
                        18081,
                        "udp",
                        (service.0, service.1, "udp-18083", 18083),
                        Reporter::Src,
                        Action::Deny,
                        trace,
                        3,
                    ),
                    true,
                );
            }
        }
        self.log.push(format!("{event:?}"));
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        self.goldmane.flush()
    }

    fn describe(&self) -> String {
        format!("reported: {:?}\n{}", self.log, self.goldmane.describe())
    }
}
