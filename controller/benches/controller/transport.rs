//! The `transport` stage: what the ingest's stream costs before a record is taken in, alone. A
//! server that acknowledges each batch as it arrives (all accepted, nothing decoded past the gRPC
//! message), served as the controller serves ingest (TLS with a certificate of its own, HTTP/2 with
//! the controller's 64 KiB windows, the same message bound), on a thread of its own whose CPU time
//! is read from outside (`/proc/self/task/<tid>/schedstat`); a client on the bench's runtime streams
//! the same batches the other stages take in, a few in flight as an agent's uplink keeps them.

use network_enforcer_api::uplink::encoded::{
    self,
    flow_uplink_server::{FlowUplink, FlowUplinkServer},
};
use network_enforcer_api::uplink::{
    BatchAck, FlowBatch, FlowRecord, flow_uplink_client::FlowUplinkClient,
};
use network_enforcer_controller::ingest::{MAX_BATCH_BYTES, tls};
use prost::Message;
use std::pin::Pin;
use std::sync::Arc;
use tokio_stream::Stream;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};
use tonic::{Request, Response, Status, Streaming};

/// The controller's HTTP/2 windows for agent streams (`app::run::ingest_server`).
const WINDOW_BYTES: u32 = 64 * 1024;

/// Batches in flight at once, as the agent's uplink pipelines them.
const IN_FLIGHT: usize = 4;

/// The name in the bench's certificate.
const SERVER_NAME: &str = "network-enforcer-controller.bench.svc";

/// Acknowledges every batch as it arrives: the stream without the take-in.
struct AckOnly;

#[tonic::async_trait]
impl FlowUplink for AckOnly {
    type StreamStream = Pin<Box<dyn Stream<Item = Result<BatchAck, Status>> + Send>>;

    async fn stream(
        &self,
        request: Request<Streaming<encoded::FlowBatch>>,
    ) -> Result<Response<Self::StreamStream>, Status> {
        let mut inbound = request.into_inner();
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        tokio::spawn(async move {
            while let Ok(Some(batch)) = inbound.message().await {
                let ack = BatchAck {
                    sequence: batch.sequence,
                    accepted: batch.records.len() as u32,
                    rejected: 0,
                    reason: String::new(),
                };
                if tx.send(Ok(ack)).await.is_err() {
                    break;
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}

/// CPU seconds of the thread at `/proc/<task>` (Linux schedstat), 0 when unknown.
fn task_cpu_seconds(task: &std::path::Path) -> f64 {
    std::fs::read_to_string(std::path::Path::new("/proc").join(task).join("schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0.0, |ns| ns as f64 / 1e9)
}

/// A CA and a server certificate it signed, as PEM files in a directory of their own (the server
/// loads them as the controller does); returns the directory and the CA's PEM.
fn pki() -> (std::path::PathBuf, String) {
    let dir = std::env::temp_dir().join(format!("ne-bench-transport-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, rcgen::KeyPair::generate().unwrap())
        .unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec![SERVER_NAME.to_string()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    std::fs::write(dir.join("tls.key"), key.serialize_pem()).unwrap();
    std::fs::write(dir.join("tls.crt"), cert.pem()).unwrap();
    (dir, ca.pem())
}

/// CPU nanoseconds per record the server thread spends streaming the records of `input`, in batches
/// of `per_batch`, `passes` times over TLS and acknowledging them; runs the client on `runtime`.
pub fn ns_per_record(
    runtime: &tokio::runtime::Runtime,
    input: &[encoded::FlowBatch],
    per_batch: usize,
    passes: usize,
) -> f64 {
    // As the agent sends them: records as messages (the same bytes on the wire).
    let records: Vec<FlowRecord> = input
        .iter()
        .flat_map(|b| &b.records)
        .map(|r| FlowRecord::decode(r.clone()).unwrap())
        .collect();
    let input: Vec<FlowBatch> = records
        .chunks(per_batch)
        .zip(1..)
        .map(|(records, sequence)| FlowBatch {
            sequence,
            node: input[0].node.clone(),
            instance: input[0].instance,
            health: None,
            records: records.to_vec(),
        })
        .collect();
    let (dir, ca) = pki();
    let cert = tls::ReloadingCert::new(dir.join("tls.crt"), dir.join("tls.key"), |_| {}).unwrap();
    let config = tls::server_config(Arc::new(cert)).unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    listener.set_nonblocking(true).unwrap();
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = std::thread::spawn(move || {
        // `<pid>/task/<tid>`: where the bench reads this thread's CPU time from outside.
        let task = std::fs::read_link("/proc/thread-self").unwrap_or_default();
        tid_tx.send(task).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            tonic::transport::Server::builder()
                .initial_stream_window_size(WINDOW_BYTES)
                .initial_connection_window_size(WINDOW_BYTES)
                .add_service(
                    FlowUplinkServer::new(AckOnly).max_decoding_message_size(MAX_BATCH_BYTES),
                )
                .serve_with_incoming_shutdown(tls::incoming(listener, config, || {}), async {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
        });
    });
    let task = tid_rx.recv().unwrap();
    let per_record = runtime.block_on(async {
        let channel = Endpoint::from_shared(format!("https://{addr}"))
            .unwrap()
            .tls_config(
                ClientTlsConfig::new()
                    .ca_certificate(Certificate::from_pem(ca))
                    .domain_name(SERVER_NAME),
            )
            .unwrap()
            .connect()
            .await
            .expect("the bench's TLS server answers");
        let mut client = FlowUplinkClient::new(channel).max_encoding_message_size(MAX_BATCH_BYTES);
        let (tx, rx) = tokio::sync::mpsc::channel(IN_FLIGHT);
        let mut acks = client
            .stream(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        // One pass to warm up (the handshake, buffers), then measure.
        let run = |passes: usize| {
            let tx = tx.clone();
            let batches: Vec<FlowBatch> = (0..passes).flat_map(|_| input.iter().cloned()).collect();
            async move {
                let n = batches.len();
                let records: usize = batches.iter().map(|b| b.records.len()).sum();
                let sending = tokio::spawn(async move {
                    for b in batches {
                        tx.send(b).await.unwrap();
                    }
                });
                (n, records, sending)
            }
        };
        let (n, _, sending) = run(1).await;
        // (Sequences repeat from pass to pass: this server does not look.)
        for _ in 0..n {
            acks.message().await.unwrap().unwrap();
        }
        sending.await.unwrap();
        let cpu = task_cpu_seconds(&task);
        let (n, records, sending) = run(passes).await;
        let mut accepted = 0usize;
        for _ in 0..n {
            accepted += acks.message().await.unwrap().unwrap().accepted as usize;
        }
        sending.await.unwrap();
        let cpu = task_cpu_seconds(&task) - cpu;
        assert_eq!(accepted, records, "every record acknowledged");
        cpu * 1e9 / records as f64
    });
    let _ = stop.send(());
    server.join().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    per_record
}
