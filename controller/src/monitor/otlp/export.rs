//! The OTLP exporter behind [`Otlp`]: an OpenTelemetry SDK logger whose processor puts records
//! into a bounded queue (full → dropped and counted, never waiting), drained by one Tokio task
//! that sends batches through `opentelemetry-otlp`'s exporter (gRPC with tonic, or http/protobuf
//! over hyper), each export bounded by the configured timeout.

use super::config::{OtlpConfig, OtlpProtocol};
use super::{
    AttributeValue, Event, EventSeverity, SCOPE_NAME, ViolationSink, acknowledged_event,
    observed_event,
};
use crate::monitor::violations::Observation;
use crate::runtime::metrics::ControllerMetrics;
use network_enforcer_api::crd::{AcknowledgedViolation, Backend};
use opentelemetry::InstrumentationScope;
use opentelemetry::logs::{AnyValue, LogRecord as _, Logger as _, LoggerProvider as _, Severity};
use opentelemetry_otlp::{LogExporter, WithExportConfig, WithHttpConfig, WithTonicConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::logs::{
    LogBatch, LogExporter as _, LogProcessor, SdkLogRecord, SdkLogger, SdkLoggerProvider,
};
use prometheus_client::metrics::counter::Counter;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio::sync::mpsc;

/// Why the exporter could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error(transparent)]
    Config(#[from] super::ConfigError),
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("TLS setup: {0}")]
    Tls(String),
    #[error("building the OTLP exporter: {0}")]
    Build(String),
}

/// Export counters, also on `/metrics` once [`ExportStats::register`]ed:
/// `network_enforcer_controller_otlp_events_{queued,dropped,exported,failed}_total`.
#[derive(Clone, Debug, Default)]
pub struct ExportStats {
    /// Events accepted into the queue.
    pub queued: Counter,
    /// Events dropped because the queue was full (the collector is slow or unreachable).
    pub dropped: Counter,
    /// Events the collector accepted.
    pub exported: Counter,
    /// Events whose export failed or timed out (not retried).
    pub failed: Counter,
}

impl ExportStats {
    /// Registers the counters on the controller's registry.
    pub fn register(&self, metrics: &ControllerMetrics) {
        metrics.register(
            "otlp_events_queued",
            "Violation events queued for OTLP export",
            self.queued.clone(),
        );
        metrics.register(
            "otlp_events_dropped",
            "Violation events dropped because the OTLP export queue was full",
            self.dropped.clone(),
        );
        metrics.register(
            "otlp_events_exported",
            "Violation events the OTLP collector accepted",
            self.exported.clone(),
        );
        metrics.register(
            "otlp_events_failed",
            "Violation events whose OTLP export failed or timed out",
            self.failed.clone(),
        );
    }
}

/// The OTLP sink. Create it inside a Tokio runtime; events are exported by a background task.
pub struct Otlp {
    provider: SdkLoggerProvider,
    logger: SdkLogger,
    stats: ExportStats,
    worker: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Otlp {
    /// Builds the exporter for `config` (reading certificate files now, so a bad path fails at
    /// start) and spawns the export task.
    pub fn start(config: OtlpConfig) -> Result<Self, TelemetryError> {
        let mut exporter = build_exporter(&config)?;
        let resource = Resource::builder_empty()
            .with_service_name(config.service_name.clone())
            .build();
        opentelemetry_sdk::logs::LogExporter::set_resource(&mut exporter, &resource);
        let scope = InstrumentationScope::builder(SCOPE_NAME)
            .with_version(env!("CARGO_PKG_VERSION"))
            .build();
        let stats = ExportStats::default();
        let (sender, receiver) = mpsc::channel(config.queue_size);
        let processor = QueueProcessor {
            sender: Mutex::new(Some(sender)),
            stats: stats.clone(),
            drops_logged: AtomicU64::new(0),
        };
        let provider = SdkLoggerProvider::builder()
            .with_resource(resource)
            .with_log_processor(processor)
            .build();
        let logger = provider.logger_with_scope(scope.clone());
        let worker = tokio::spawn(export_loop(
            exporter,
            scope,
            receiver,
            config.batch_size,
            config.timeout,
            stats.clone(),
        ));
        tracing::info!(endpoint = %config.endpoint, protocol = ?config.protocol, service = %config.service_name, "exporting violation events over OTLP");
        Ok(Otlp {
            provider,
            logger,
            stats,
            worker: Mutex::new(Some(worker)),
        })
    }

    /// The export counters.
    pub fn stats(&self) -> &ExportStats {
        &self.stats
    }

    /// Stops accepting events and waits (at most `timeout`) for the queued ones to be exported.
    pub async fn shutdown(&self, timeout: Duration) {
        let _ = self.provider.shutdown();
        let worker = self.worker.lock().expect("worker lock").take();
        if let Some(worker) = worker {
            if tokio::time::timeout(timeout, worker).await.is_err() {
                tracing::warn!("OTLP export did not finish in time; queued events are lost");
            }
        }
    }

    fn emit(&self, event: Event) {
        let mut record = self.logger.create_log_record();
        let now = SystemTime::now();
        record.set_timestamp(now);
        record.set_observed_timestamp(now);
        record.set_event_name(event.name);
        record.set_body(AnyValue::from(event.name));
        let (number, text) = match event.severity {
            EventSeverity::Info => (Severity::Info, "INFO"),
            EventSeverity::Warn => (Severity::Warn, "WARN"),
        };
        record.set_severity_number(number);
        record.set_severity_text(text);
        for (key, value) in event.attributes {
            match value {
                AttributeValue::String(s) => record.add_attribute(key, s),
                AttributeValue::Int(i) => record.add_attribute(key, i),
            }
        }
        self.logger.emit(record);
    }
}

impl ViolationSink for Otlp {
    fn observed(&self, backend: Backend, observation: &Observation) {
        self.emit(observed_event(backend, observation));
    }

    fn acknowledged(&self, acknowledged: &AcknowledgedViolation) {
        self.emit(acknowledged_event(acknowledged));
    }

    fn shutdown(
        &self,
        timeout: Duration,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>> {
        Box::pin(Otlp::shutdown(self, timeout))
    }
}

/// Hands records to the export task without waiting: a full queue drops the record.
#[derive(Debug)]
struct QueueProcessor {
    /// `None` after shutdown.
    sender: Mutex<Option<mpsc::Sender<SdkLogRecord>>>,
    stats: ExportStats,
    drops_logged: AtomicU64,
}

impl LogProcessor for QueueProcessor {
    fn emit(&self, record: &mut SdkLogRecord, _scope: &InstrumentationScope) {
        let sender = self.sender.lock().expect("sender lock");
        let sent = sender
            .as_ref()
            .is_some_and(|s| s.try_send(record.clone()).is_ok());
        if sent {
            self.stats.queued.inc();
        } else {
            let dropped = self.stats.dropped.inc() + 1;
            // One log line per power of two: visible without flooding the log.
            if dropped.is_power_of_two()
                && self.drops_logged.fetch_max(dropped, Ordering::Relaxed) < dropped
            {
                tracing::warn!(
                    dropped,
                    "OTLP export queue full or closed: violation events dropped"
                );
            }
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        // Closing the queue lets the export task drain it and end.
        self.sender.lock().expect("sender lock").take();
        Ok(())
    }
}

async fn export_loop(
    exporter: LogExporter,
    scope: InstrumentationScope,
    mut receiver: mpsc::Receiver<SdkLogRecord>,
    batch_size: usize,
    timeout: Duration,
    stats: ExportStats,
) {
    let mut batch = Vec::with_capacity(batch_size);
    loop {
        if receiver.recv_many(&mut batch, batch_size).await == 0 {
            break;
        }
        let count = batch.len() as u64;
        let refs: Vec<(&SdkLogRecord, &InstrumentationScope)> =
            batch.iter().map(|r| (r, &scope)).collect();
        let result = tokio::time::timeout(timeout, exporter.export(LogBatch::new(&refs))).await;
        match result {
            Ok(Ok(())) => {
                stats.exported.inc_by(count);
            }
            Ok(Err(error)) => {
                stats.failed.inc_by(count);
                tracing::warn!(%error, events = count, "OTLP export failed; events dropped");
            }
            Err(_) => {
                stats.failed.inc_by(count);
                tracing::warn!(
                    ?timeout,
                    events = count,
                    "OTLP export timed out; events dropped"
                );
            }
        }
        drop(refs);
        batch.clear();
    }
    let _ = exporter.shutdown();
}

fn read(path: &Path) -> Result<Vec<u8>, TelemetryError> {
    std::fs::read(path).map_err(|source| TelemetryError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn build_exporter(config: &OtlpConfig) -> Result<LogExporter, TelemetryError> {
    let ca = config.ca_certificate.as_deref().map(read).transpose()?;
    let identity = match (&config.client_certificate, &config.client_key) {
        (Some(cert), Some(key)) => Some((read(cert)?, read(key)?)),
        _ => None,
    };
    let build = |e: opentelemetry_otlp::ExporterBuildError| TelemetryError::Build(e.to_string());
    match config.protocol {
        OtlpProtocol::Grpc => {
            let mut endpoint = tonic::transport::Endpoint::from_shared(config.endpoint.clone())
                .map_err(|e| TelemetryError::Build(format!("endpoint {}: {e}", config.endpoint)))?
                .timeout(config.timeout)
                .connect_timeout(config.timeout);
            if config.tls() {
                let mut tls = tonic::transport::ClientTlsConfig::new();
                tls = match &ca {
                    Some(ca) => tls.ca_certificate(tonic::transport::Certificate::from_pem(ca)),
                    None => tls.with_native_roots(),
                };
                if let Some((cert, key)) = &identity {
                    tls = tls.identity(tonic::transport::Identity::from_pem(cert, key));
                }
                endpoint = endpoint
                    .tls_config(tls)
                    .map_err(|e| TelemetryError::Tls(e.to_string()))?;
            }
            let mut metadata = tonic::metadata::MetadataMap::new();
            for (key, value) in &config.headers {
                let key = tonic::metadata::MetadataKey::from_bytes(key.as_bytes())
                    .map_err(|e| TelemetryError::Build(format!("header {key}: {e}")))?;
                let value = value
                    .parse()
                    .map_err(|e| TelemetryError::Build(format!("header {key}: {e}")))?;
                metadata.insert(key, value);
            }
            LogExporter::builder()
                .with_tonic()
                .with_channel(endpoint.connect_lazy())
                .with_metadata(metadata)
                .with_timeout(config.timeout)
                .build()
                .map_err(build)
        }
        OtlpProtocol::HttpProtobuf => {
            let client = http_client(config, ca.as_deref(), identity.as_ref())?;
            let headers: HashMap<String, String> = config.headers.iter().cloned().collect();
            LogExporter::builder()
                .with_http()
                .with_endpoint(config.endpoint.clone())
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .with_timeout(config.timeout)
                .with_headers(headers)
                .with_http_client(client)
                .build()
                .map_err(build)
        }
    }
}

type HttpsConnector =
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>;

/// A hyper client on rustls (ring) trusting `ca` (else the system roots), presenting `identity`.
fn http_client(
    config: &OtlpConfig,
    ca: Option<&[u8]>,
    identity: Option<&(Vec<u8>, Vec<u8>)>,
) -> Result<opentelemetry_http::hyper::HyperClient<HttpsConnector>, TelemetryError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let tls_error =
        |what: &str, e: &dyn std::fmt::Display| TelemetryError::Tls(format!("{what}: {e}"));
    let mut roots = rustls::RootCertStore::empty();
    match ca {
        Some(ca) => {
            for cert in CertificateDer::pem_slice_iter(ca) {
                let cert = cert.map_err(|e| tls_error("CA certificate", &e))?;
                roots
                    .add(cert)
                    .map_err(|e| tls_error("CA certificate", &e))?;
            }
        }
        None => {
            for cert in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(cert);
            }
        }
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| tls_error("protocol versions", &e))?
    .with_root_certificates(roots);
    let tls = match identity {
        Some((cert, key)) => {
            let chain = CertificateDer::pem_slice_iter(cert)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| tls_error("client certificate", &e))?;
            let key =
                PrivateKeyDer::from_pem_slice(key).map_err(|e| tls_error("client key", &e))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| tls_error("client certificate", &e))?
        }
        None => builder.with_no_client_auth(),
    };
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .build();
    Ok(opentelemetry_http::hyper::HyperClient::new(
        connector,
        config.timeout,
        None,
    ))
}
