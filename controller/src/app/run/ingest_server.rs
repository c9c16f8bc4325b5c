//! The agents' gRPC endpoint as `run` serves it: TLS (with certificate reloads) or, when asked,
//! plaintext, with small HTTP/2 windows.

use crate::ingest::tls;
use crate::runtime::metrics::ControllerMetrics;
use anyhow::{Context as _, Result};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

/// Each agent has its own connection: what the controller has not read yet waits in its HTTP/2
/// windows. 64 KiB instead of hyper's 1 MiB keeps a thousand agents that send faster than the merge
/// within ~64 MiB (128 KiB peaked 65 MiB higher at 1,000 agents); a slow controller slows its agents
/// down instead. 64 KiB per round trip still carries ~1 MB/s per agent at 50 ms, several times what
/// a busy node sends.
pub const INGEST_WINDOW_BYTES: u32 = 64 * 1024;

/// The server future, until Ctrl-C.
pub type Serving = Pin<Box<dyn Future<Output = Result<(), tonic::transport::Error>> + Send>>;

/// Serves `ingest` on `listener` (bound to `address`) over `transport`.
pub fn serve(
    address: SocketAddr,
    listener: tokio::net::TcpListener,
    transport: tls::Transport,
    ingest: crate::ingest::IngestService,
    metrics: &ControllerMetrics,
) -> Result<Serving> {
    let router = tonic::transport::Server::builder()
        .initial_stream_window_size(INGEST_WINDOW_BYTES)
        .initial_connection_window_size(INGEST_WINDOW_BYTES)
        .add_service(ingest.into_server());
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    Ok(match transport {
        tls::Transport::Tls { cert, key } => {
            let reload_failures = prometheus_client::metrics::counter::Counter::<u64>::default();
            metrics.register(
                "ingest_tls_reload_failures",
                "Rotated ingest certificate files that did not load (the previous pair stays in use)",
                reload_failures.clone(),
            );
            let handshake_failures = prometheus_client::metrics::counter::Counter::<u64>::default();
            metrics.register(
                "ingest_tls_handshake_failures",
                "Agent connections whose TLS handshake failed or timed out",
                handshake_failures.clone(),
            );
            let cert = tls::ReloadingCert::new(&cert, &key, move |_| {
                reload_failures.inc();
            })
            .context("loading the ingest TLS certificate (--ingest-tls-cert-file / --ingest-tls-key-file)")?;
            let config = tls::server_config(Arc::new(cert))?;
            tracing::info!(%address, "ingest endpoint serving TLS");
            Box::pin(router.serve_with_incoming_shutdown(
                tls::incoming(listener, config, move || {
                    handshake_failures.inc();
                }),
                shutdown,
            ))
        }
        tls::Transport::Insecure => {
            tracing::warn!(%address,
                "INSECURE: the ingest endpoint serves PLAINTEXT (--ingest-insecure); agents' tokens and \
                 flows travel unencrypted. Set --ingest-tls-cert-file/--ingest-tls-key-file in production");
            Box::pin(router.serve_with_incoming_shutdown(
                tokio_stream::wrappers::TcpListenerStream::new(listener),
                shutdown,
            ))
        }
    })
}
