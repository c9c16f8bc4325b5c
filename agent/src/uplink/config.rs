//! Where and how to reach the controller.

use super::*;

/// Where and how to reach the controller.
#[derive(Clone, Debug)]
pub struct UplinkConfig {
    /// The controller's ingest endpoint: `https://host:port` (with [`UplinkConfig::ca_file`]), or
    /// `http://host:port` only with [`UplinkConfig::insecure`].
    pub endpoint: String,
    /// The CA bundle (PEM) the controller's certificate must chain to; read again at every connect, so a
    /// rotated CA is picked up. Required for `https://`.
    pub ca_file: Option<PathBuf>,
    /// The name to check the controller's certificate against, when it differs from the URL's host
    /// (e.g. the URL names a node IP).
    pub server_name: Option<String>,
    /// Allow plaintext `http://` (tokens and flows travel unencrypted).
    pub insecure: bool,
    /// The projected ServiceAccount token (audience `network-enforcer`), read at every connect.
    pub token_file: PathBuf,
    /// This node's name, sent in every batch (the controller checks it against the token's pod).
    pub node: String,
    /// Unacknowledged batches kept for resending.
    pub max_pending_batches: usize,
    /// Records in those batches at most (bounds the memory whatever the batch sizes).
    pub max_pending_records: usize,
    /// Batches the data path may hand over before the uplink task takes them.
    pub queue_batches: usize,
    /// Records per batch at most (the controller refuses a stream whose batch has more than its limit,
    /// 10 000 by default).
    pub max_records_per_batch: usize,
    /// Batches written per second at most (the controller refuses a stream sending more than its limit,
    /// 20 by default).
    pub max_batches_per_second: u32,
    /// Waits between reconnects.
    pub backoff: Backoff,
    /// How long a TCP connect to the controller may take.
    pub connect_timeout: Duration,
}

impl UplinkConfig {
    /// The defaults: 256 batches and [`DEFAULT_MAX_PENDING_RECORDS`] records kept (about 40 minutes of
    /// 10-second flushes, about 12 MB), a queue of 16, at most
    /// 5000 records a batch and 10 batches a second (half the controller's default limits), backoff
    /// from 0.5 s up to 30 s, 5 s connect timeout.
    pub fn new(
        endpoint: impl Into<String>,
        token_file: impl Into<PathBuf>,
        node: impl Into<String>,
    ) -> Self {
        Self {
            endpoint: endpoint.into(),
            ca_file: None,
            server_name: None,
            insecure: false,
            token_file: token_file.into(),
            node: node.into(),
            max_pending_batches: 256,
            max_pending_records: DEFAULT_MAX_PENDING_RECORDS,
            queue_batches: 16,
            max_records_per_batch: 5000,
            max_batches_per_second: 10,
            backoff: Backoff::default(),
            connect_timeout: Duration::from_secs(5),
        }
    }
}

impl UplinkConfig {
    /// Allows a plaintext `http://` endpoint.
    pub fn insecure(mut self) -> Self {
        self.insecure = true;
        self
    }

    /// TLS: trust the CA bundle in `ca_file`, check the certificate against `server_name` when given.
    pub fn tls(mut self, ca_file: impl Into<PathBuf>, server_name: Option<String>) -> Self {
        self.ca_file = Some(ca_file.into());
        self.server_name = server_name;
        self
    }
}
