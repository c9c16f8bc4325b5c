//! TLS for the ingest endpoint, with certificates reloaded when their files change.
//!
//! cert-manager rotates the Secret behind `--ingest-tls-cert-file` / `--ingest-tls-key-file`, and the kubelet
//! swaps the mounted files atomically. The listener stays up: every handshake asks [`ReloadingCert`] for
//! the current certificate, which re-reads the files when their modification time or size changed. A
//! pair that does not load (half-rotated, mismatched) keeps the previous one and is logged and counted;
//! connections already established keep their session. Handshakes run concurrently, off the accept loop,
//! so a slow or hostile client cannot hold up others.

use futures::Stream;
use std::fmt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::crypto::ring;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert};
use tokio_rustls::rustls::sign::CertifiedKey;
use tokio_rustls::rustls::{self, ServerConfig};
use tokio_rustls::server::TlsStream;

/// The rustls server configuration type, for callers that pass [`server_config`]'s result around.
pub use tokio_rustls::rustls::ServerConfig as TlsServerConfig;

/// Why the certificate pair could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} holds no PEM certificate")]
    NoCertificate { path: PathBuf },
    #[error("{path}: no usable PEM private key (PKCS#8, PKCS#1 or SEC1): {detail}")]
    Key { path: PathBuf, detail: String },
    #[error("the key in {path} is not supported: {source}")]
    UnsupportedKey {
        path: PathBuf,
        source: rustls::Error,
    },
    #[error("building the TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}

/// Modification time and size: what tells a rotated file from the loaded one.
type Stamp = (Option<SystemTime>, u64);

fn stamp(path: &Path) -> Stamp {
    std::fs::metadata(path)
        .map(|m| (m.modified().ok(), m.len()))
        .unwrap_or((None, 0))
}

/// Loads a certificate chain and its key from PEM files.
pub fn load(cert_path: &Path, key_path: &Path) -> Result<CertifiedKey, TlsError> {
    let read = |path: &Path| {
        std::fs::read(path).map_err(|source| TlsError::Read {
            path: path.to_path_buf(),
            source,
        })
    };
    let cert_pem = read(cert_path)?;
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
        .filter_map(Result::ok)
        .collect();
    if chain.is_empty() {
        return Err(TlsError::NoCertificate {
            path: cert_path.to_path_buf(),
        });
    }
    let key = PrivateKeyDer::from_pem_slice(&read(key_path)?).map_err(|e| TlsError::Key {
        path: key_path.to_path_buf(),
        detail: e.to_string(),
    })?;
    let signer =
        ring::sign::any_supported_type(&key).map_err(|source| TlsError::UnsupportedKey {
            path: key_path.to_path_buf(),
            source,
        })?;
    let certified = CertifiedKey::new(chain, signer);
    // A certificate that does not belong to the key would fail every handshake: refuse it now.
    certified.keys_match()?;
    Ok(certified)
}

/// The server certificate, re-read from its files when they change.
pub struct ReloadingCert {
    cert_path: PathBuf,
    key_path: PathBuf,
    current: Mutex<Loaded>,
    /// Called with each failed reload (a metric in the controller).
    on_error: Box<dyn Fn(&TlsError) + Send + Sync>,
}

struct Loaded {
    stamps: (Stamp, Stamp),
    key: Arc<CertifiedKey>,
    /// When the files were last looked at: a burst of handshakes stats them at most once a second.
    checked: std::time::Instant,
}

impl fmt::Debug for ReloadingCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReloadingCert")
            .field("cert_path", &self.cert_path)
            .field("key_path", &self.key_path)
            .finish()
    }
}

impl ReloadingCert {
    /// Loads the pair now (an error here is a startup error) and watches it afterwards.
    pub fn new(
        cert_path: impl Into<PathBuf>,
        key_path: impl Into<PathBuf>,
        on_error: impl Fn(&TlsError) + Send + Sync + 'static,
    ) -> Result<Self, TlsError> {
        let (cert_path, key_path) = (cert_path.into(), key_path.into());
        let stamps = (stamp(&cert_path), stamp(&key_path));
        let key = Arc::new(load(&cert_path, &key_path)?);
        Ok(Self {
            cert_path,
            key_path,
            current: Mutex::new(Loaded {
                stamps,
                key,
                checked: std::time::Instant::now(),
            }),
            on_error: Box::new(on_error),
        })
    }

    /// The certificate to present now, reloading it first if the files changed.
    pub fn current(&self) -> Arc<CertifiedKey> {
        let mut loaded = self.current.lock().expect("certificate lock");
        if loaded.checked.elapsed() < Duration::from_secs(1) {
            return loaded.key.clone();
        }
        loaded.checked = std::time::Instant::now();
        let stamps = (stamp(&self.cert_path), stamp(&self.key_path));
        if stamps != loaded.stamps {
            match load(&self.cert_path, &self.key_path) {
                Ok(key) => {
                    tracing::info!(cert = %self.cert_path.display(), "ingest TLS certificate reloaded");
                    loaded.key = Arc::new(key);
                    loaded.stamps = stamps;
                }
                Err(error) => {
                    // Retried at the next handshake after the next second; the old pair stays in use.
                    tracing::warn!(%error, "ingest TLS certificate changed but does not load; keeping the previous one");
                    (self.on_error)(&error);
                }
            }
        }
        loaded.key.clone()
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// A rustls server configuration (ring, TLS 1.2 and 1.3, ALPN `h2` for gRPC) that presents `cert`.
pub fn server_config(cert: Arc<ReloadingCert>) -> Result<Arc<ServerConfig>, TlsError> {
    let mut config = ServerConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(cert);
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// The stream of TLS connections accepted on `listener`, for `serve_with_incoming`. Failed handshakes
/// are logged and passed to `on_failure` (a metric), never handed to the server.
pub fn incoming(
    listener: TcpListener,
    config: Arc<ServerConfig>,
    on_failure: impl Fn() + Send + Sync + 'static,
) -> Pin<Box<dyn Stream<Item = Result<TlsStream<TcpStream>, std::io::Error>> + Send>> {
    let acceptor = TlsAcceptor::from(config);
    let on_failure = Arc::new(on_failure);
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let (tcp, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors and the like: wait a little instead of spinning.
                    tracing::warn!(%error, "accepting an ingest connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            if tx.is_closed() {
                break;
            }
            let (acceptor, tx, on_failure) = (acceptor.clone(), tx.clone(), on_failure.clone());
            tokio::spawn(async move {
                match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => {
                        let _ = tx.send(Ok(tls)).await;
                    }
                    Ok(Err(error)) => {
                        tracing::info!(%peer, %error, "ingest TLS handshake failed");
                        on_failure();
                    }
                    Err(_) => {
                        tracing::info!(%peer, "ingest TLS handshake timed out");
                        on_failure();
                    }
                }
            });
        }
    });
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}

/// How the ingest endpoint is served, from the flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    /// TLS with this certificate and key (PEM files, reloaded when they change).
    Tls { cert: PathBuf, key: PathBuf },
    /// Plaintext, asked for explicitly.
    Insecure,
}

/// The flags do not describe one transport.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransportError {
    #[error(
        "the ingest endpoint needs TLS: set --ingest-tls-cert-file and --ingest-tls-key-file \
         (INGEST_TLS_CERT_FILE, INGEST_TLS_KEY_FILE), or --ingest-insecure (INGEST_INSECURE=true) to \
         accept agents' tokens and flows in plaintext"
    )]
    Missing,
    #[error(
        "--ingest-tls-cert-file and --ingest-tls-key-file go together (INGEST_TLS_CERT_FILE, \
         INGEST_TLS_KEY_FILE); only one is set"
    )]
    Half,
    #[error(
        "--ingest-insecure (INGEST_INSECURE) and TLS certificate files are both set: choose one"
    )]
    Both,
}

/// Decides the transport: TLS when both files are given, plaintext only when asked for and no files
/// are given, an error otherwise.
pub fn transport(
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    insecure: bool,
) -> Result<Transport, TransportError> {
    match (cert, key, insecure) {
        (Some(cert), Some(key), false) => Ok(Transport::Tls { cert, key }),
        (None, None, true) => Ok(Transport::Insecure),
        (None, None, false) => Err(TransportError::Missing),
        (Some(_), Some(_), true) => Err(TransportError::Both),
        _ => Err(TransportError::Half),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plaintext_only_when_asked_and_tls_needs_both_files() {
        let p = |s: &str| Some(PathBuf::from(s));
        assert_eq!(
            transport(p("c"), p("k"), false),
            Ok(Transport::Tls {
                cert: "c".into(),
                key: "k".into()
            })
        );
        assert_eq!(transport(None, None, true), Ok(Transport::Insecure));
        assert_eq!(transport(None, None, false), Err(TransportError::Missing));
        assert_eq!(transport(p("c"), None, false), Err(TransportError::Half));
        assert_eq!(transport(None, p("k"), true), Err(TransportError::Half));
        assert_eq!(transport(p("c"), p("k"), true), Err(TransportError::Both));
        assert!(
            TransportError::Missing
                .to_string()
                .contains("INGEST_INSECURE=true")
        );
    }

    fn pair(name: &str) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec![name.to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        (cert.pem(), key.serialize_pem())
    }

    #[test]
    fn a_rotated_pair_is_picked_up_and_a_broken_one_keeps_the_old() {
        let dir = std::env::temp_dir().join(format!("ne-ingest-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (cert_path, key_path) = (dir.join("tls.crt"), dir.join("tls.key"));
        let (c1, k1) = pair("one");
        std::fs::write(&cert_path, &c1).unwrap();
        std::fs::write(&key_path, &k1).unwrap();
        let failures = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = failures.clone();
        let cert = ReloadingCert::new(&cert_path, &key_path, move |_| {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        })
        .unwrap();
        let first = cert.current().cert[0].clone();
        // A certificate whose key is still the old one: refused, the old pair stays.
        let (c2, k2) = pair("two");
        std::fs::write(&cert_path, &c2).unwrap();
        cert.current.lock().unwrap().checked -= Duration::from_secs(2);
        assert_eq!(cert.current().cert[0], first);
        assert_eq!(failures.load(std::sync::atomic::Ordering::SeqCst), 1);
        // The key arrives: the new pair is served.
        std::fs::write(&key_path, &k2).unwrap();
        cert.current.lock().unwrap().checked -= Duration::from_secs(2);
        assert_ne!(cert.current().cert[0], first);
        assert!(matches!(
            load(&dir.join("missing"), &key_path),
            Err(TlsError::Read { .. })
        ));
        std::fs::write(dir.join("empty"), "").unwrap();
        assert!(matches!(
            load(&dir.join("empty"), &key_path),
            Err(TlsError::NoCertificate { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
