//! The controller process.

use super::*;

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

impl Controller {
    pub(super) fn start(
        bin: &Path,
        kubeconfig: &Path,
        fleet: &Fleet,
        settings: &Settings,
        tls: &Pki,
        log: &Path,
    ) -> Result<Self> {
        let (ingest_port, metrics_port) = (free_port()?, free_port()?);
        let log =
            std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let child = Command::new(bin)
            .arg("run")
            .env("KUBECONFIG", kubeconfig)
            .env("WATCH_NAMESPACE", &fleet.apps_ns.name)
            .env("POD_NAMESPACE", &fleet.agents_ns.name)
            .env("POD_NAME", "fleet-controller")
            .env(
                "AGENT_SERVICE_ACCOUNT",
                format!("{}/{AGENT_SA}", fleet.agents_ns.name),
            )
            .env("CONTROLLER_PROVIDER", "ebpf")
            .env("LEADER_ELECT", "false")
            .env("INGEST_ADDRESS", format!("127.0.0.1:{ingest_port}"))
            .env("INGEST_TLS_CERT_FILE", tls.dir.join("tls.crt"))
            .env("INGEST_TLS_KEY_FILE", tls.dir.join("tls.key"))
            .env("METRICS_ADDRESS", format!("127.0.0.1:{metrics_port}"))
            .env("UI_ADDRESS", "")
            .env("FLUSH_INTERVAL_SECONDS", settings.flush_seconds.to_string())
            // As a production install sets them: external peers outside are not held for the grace.
            .env(
                "CLUSTER_CIDRS",
                format!(
                    "{},{}",
                    network_enforcer_tests::cluster::layout::CLUSTER_CIDR,
                    network_enforcer_tests::cluster::layout::SERVICE_CIDR
                ),
            )
            .env("LOG_LEVEL", "warn")
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        Ok(Self {
            child,
            metrics_port,
            ingest_port,
        })
    }

    pub(super) async fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!("the controller exited with {status} before it was ready");
            }
            if let Some((200, _)) = http_get(self.metrics_port, "/readyz").await {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("the controller was not ready within 180 s");
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    pub(super) async fn metrics(&self) -> String {
        http_get(self.metrics_port, "/metrics")
            .await
            .map(|(_, body)| body)
            .unwrap_or_default()
    }

    pub(super) fn proc(&self) -> ProcSample {
        ProcSample::of(&format!("/proc/{}", self.child.id()))
    }

    /// SIGTERM (the controller writes what is pending), then kill after 20 s.
    pub(super) async fn stop(mut self) {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `GET path` on 127.0.0.1:port (HTTP/1.0): status and body, `None` while nothing answers.
async fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.ok()?;
    let status = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())?;
    Some((status, body))
}

/// The sum of every sample of `name` (with any labels) whose labels contain each of `labels`.
pub(super) fn metric_sum(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            let (series, value) = rest.rsplit_once(' ')?;
            if !(series.is_empty() || series.starts_with('{')) {
                return None;
            }
            labels
                .iter()
                .all(|want| series.contains(want))
                .then(|| value.trim().parse::<f64>().ok())
                .flatten()
        })
        .sum()
}

/// TokenReviews the API server has answered so far (every client's).
pub(super) async fn api_token_reviews(client: &Client) -> f64 {
    let request = match tonic::codegen::http::Request::get("/metrics").body(Vec::new()) {
        Ok(r) => r,
        Err(_) => return f64::NAN,
    };
    match client.request_text(request).await {
        Ok(text) => metric_sum(
            &text,
            "apiserver_request_total",
            &["resource=\"tokenreviews\"", "verb=\"POST\""],
        ),
        Err(_) => f64::NAN,
    }
}

impl ProcSample {
    pub(super) fn of(dir: &str) -> Self {
        let stat = std::fs::read_to_string(format!("{dir}/stat")).unwrap_or_default();
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.split_whitespace().collect())
            .unwrap_or_default();
        // After the command name: state is field 3, utime 14 and stime 15 (1-based, whole line).
        let ticks = |i: usize| {
            fields
                .get(i)
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        let cpu_seconds = (ticks(11) + ticks(12)) / clock_ticks();
        let status = std::fs::read_to_string(format!("{dir}/status")).unwrap_or_default();
        let hwm_kib = status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .unwrap_or(0.0);
        Self {
            cpu_seconds,
            hwm_mib: hwm_kib / 1024.0,
        }
    }
}

fn clock_ticks() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// Busy and total jiffies of the whole machine (`/proc/stat`).
pub(super) fn machine_jiffies() -> (f64, f64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let values: Vec<f64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    let total: f64 = values.iter().take(8).sum();
    // idle + iowait
    let idle = values.get(3).copied().unwrap_or(0.0) + values.get(4).copied().unwrap_or(0.0);
    (total - idle, total)
}
