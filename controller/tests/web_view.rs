//! The web view (docs/ui.md) in a real browser: the controller binary against the local cluster's API
//! server, the end-to-end scenario's proposals and policy (docs/development.md) created in a test
//! namespace, and Debian's headless Chromium driven through chromedriver's WebDriver HTTP API (plain
//! JSON over HTTP). Asserts that the graph shows the scenario's edges with their states, that a
//! violation written into the policy's status is highlighted within 5 s, that the workload page
//! shows the promote command, and that the diff page renders; writes a screenshot of each page to
//! `target/ui/*.png`. Needs `cargo xtask setup` (chromium, chromium-driver) and the local cluster.

use anyhow::{Context, Result, bail, ensure};
use base64::Engine as _;
use kube::api::{Patch, PatchParams, PostParams};
use network_enforcer_api::{WorkloadNetworkPolicy, WorkloadNetworkPolicyProposal};
use network_enforcer_tests::fixture::TestNamespace;
use serde_json::{Value, json};
use std::io::{Read as _, Write as _};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The scenario's learned objects: http-client calls http-server on TCP 18080 and the cluster DNS,
/// and an outside address calls http-server too; the client's egress proposal is promoted into a
/// monitor policy (the controller then deletes that proposal, as after a real promotion).
const OBJECTS: &str = r#"
apiVersion: networkenforcer.kubewarden.io/v1alpha1
kind: WorkloadNetworkPolicyProposal
metadata: {name: deployment-http-client-egress}
spec:
  backend: kubernetes
  direction: Egress
  targetRef: {kind: Deployment, name: http-client}
  kubernetes:
    podSelector: {matchLabels: {app: http-client}}
    policyTypes: [Egress]
    egress:
      - to: [{podSelector: {matchLabels: {app: http-server}}}]
        ports: [{protocol: TCP, port: 18080}]
      - to: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: kube-system}}, podSelector: {matchLabels: {k8s-app: kube-dns}}}]
        ports: [{protocol: UDP, port: 53}]
---
apiVersion: networkenforcer.kubewarden.io/v1alpha1
kind: WorkloadNetworkPolicyProposal
metadata: {name: deployment-http-server-ingress}
spec:
  backend: kubernetes
  direction: Ingress
  targetRef: {kind: Deployment, name: http-server}
  kubernetes:
    podSelector: {matchLabels: {app: http-server}}
    policyTypes: [Ingress]
    ingress:
      - from: [{podSelector: {matchLabels: {app: http-client}}}]
        ports: [{protocol: TCP, port: 18080}]
      - from: [{ipBlock: {cidr: 203.0.113.7/32}}]
        ports: [{protocol: TCP, port: 18080}]
---
apiVersion: networkenforcer.kubewarden.io/v1alpha1
kind: WorkloadNetworkPolicy
metadata:
  name: deployment-http-client-egress
  labels: {networkenforcer.kubewarden.io/promoted-from: deployment-http-client-egress}
spec:
  backend: kubernetes
  direction: Egress
  mode: monitor
  targetRef: {kind: Deployment, name: http-client}
  kubernetes:
    podSelector: {matchLabels: {app: http-client}}
    policyTypes: [Egress]
    egress:
      - to: [{podSelector: {matchLabels: {app: http-server}}}]
        ports: [{protocol: TCP, port: 18080}]
      - to: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: kube-system}}, podSelector: {matchLabels: {k8s-app: kube-dns}}}]
        ports: [{protocol: UDP, port: 53}]
"#;

/// A child process killed when dropped (a failed test leaves nothing running).
struct Running(std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// One HTTP/1.1 request on loopback with `Connection: close`: (status, body).
fn http(port: u16, method: &str, path: &str, body: Option<&Value>) -> Result<(u16, String)> {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(60)))?;
    let body = body.map(Value::to_string).unwrap_or_default();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    // chromedriver keeps the connection open despite `Connection: close`: read by Content-Length.
    let mut raw = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    let head_end = loop {
        if let Some(at) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let read = stream.read(&mut buf)?;
        ensure!(read > 0, "the connection closed before the headers ended");
        raw.extend_from_slice(&buf[..read]);
    };
    let head = String::from_utf8_lossy(&raw[..head_end]).to_ascii_lowercase();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("a status line")?;
    let length = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok());
    match length {
        Some(length) => {
            while raw.len() < head_end + length {
                let read = stream.read(&mut buf)?;
                ensure!(read > 0, "the connection closed before the body ended");
                raw.extend_from_slice(&buf[..read]);
            }
            raw.truncate(head_end + length);
        }
        None => {
            stream.read_to_end(&mut raw)?;
        }
    }
    let rest = String::from_utf8_lossy(&raw[head_end..]).into_owned();
    let body = if head.contains("transfer-encoding: chunked") {
        dechunk(&rest)
    } else {
        rest
    };
    Ok((status, body))
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(&rest[..size]);
        s = rest[size..].trim_start_matches("\r\n");
    }
    out
}

/// A WebDriver session of headless Chromium, through chromedriver.
struct Browser {
    port: u16,
    session: String,
    _driver: Running,
}

impl Browser {
    fn start(profile: &std::path::Path) -> Result<Self> {
        let port = free_port()?;
        let driver = std::process::Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .context(
                "starting chromedriver (Debian chromium-driver; `cargo xtask setup` installs it)",
            )?;
        let driver = Running(driver);
        let deadline = Instant::now() + Duration::from_secs(20);
        while http(port, "GET", "/status", None).is_err() {
            ensure!(
                Instant::now() < deadline,
                "chromedriver did not answer on port {port}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        // The flags this machine's closed network needs (docs/development.md, browser tests).
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                         "--no-first-run", "--disable-background-networking",
                         "--disable-component-update", "--disable-sync",
                         "--window-size=1400,900",
                         format!("--user-data-dir={}", profile.display())]
            }
        }}});
        let (status, body) = http(port, "POST", "/session", Some(&capabilities))?;
        ensure!(
            status == 200,
            "creating a Chromium session: {status} {body}"
        );
        let answer: Value = serde_json::from_str(&body)?;
        let session = answer["value"]["sessionId"]
            .as_str()
            .context("a session id")?
            .to_string();
        Ok(Self {
            port,
            session,
            _driver: driver,
        })
    }

    fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value> {
        let (status, text) = http(
            self.port,
            method,
            &format!("/session/{}{path}", self.session),
            body,
        )?;
        ensure!(status == 200, "WebDriver {method} {path}: {status} {text}");
        Ok(serde_json::from_str::<Value>(&text)?["value"].take())
    }

    fn open(&self, url: &str) -> Result<()> {
        self.call("POST", "/url", Some(&json!({ "url": url })))
            .map(drop)
    }

    /// Runs `script` (a function body) in the page; its return value.
    fn run(&self, script: &str) -> Result<Value> {
        self.call(
            "POST",
            "/execute/sync",
            Some(&json!({ "script": script, "args": [] })),
        )
    }

    /// Polls `script` every 100 ms until it returns something truthy (not null/false/""); its value.
    fn wait_for(&self, what: &str, timeout: Duration, script: &str) -> Result<Value> {
        let deadline = Instant::now() + timeout;
        loop {
            let value = self.run(script)?;
            let truthy =
                !matches!(&value, Value::Null | Value::Bool(false)) && value.as_str() != Some("");
            if truthy {
                return Ok(value);
            }
            if Instant::now() > deadline {
                let page = self.run("return document.body.innerText.slice(0, 2000)")?;
                bail!("timed out after {timeout:?} waiting for {what}; the page says:\n{page}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn screenshot(&self, path: &std::path::Path) -> Result<()> {
        let png = self.call("GET", "/screenshot", None)?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(png.as_str().context("base64 PNG")?)?;
        ensure!(bytes.starts_with(b"\x89PNG"), "a PNG screenshot");
        std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = http(
            self.port,
            "DELETE",
            &format!("/session/{}", self.session),
            None,
        );
    }
}

/// The graph's edges as `state from>to ports` lines, sorted.
const EDGES_SCRIPT: &str = "return Array.from(document.querySelectorAll('#graph g.edge')).map(e => \
    `${e.dataset.state} ${e.dataset.from}>${e.dataset.to} ${e.dataset.ports}`).sort().join('\\n')";

#[tokio::test(flavor = "multi_thread")]
async fn the_web_view_shows_the_graph_a_new_violation_and_the_promote_command() -> Result<()> {
    let ns = TestNamespace::create_with_crds("web-view").await?;
    let n = ns.name.clone();
    for document in OBJECTS.split("\n---\n") {
        let mut value: Value = serde_yaml::from_str(document)?;
        value["metadata"]["namespace"] = json!(n);
        if value["kind"] == "WorkloadNetworkPolicy" {
            ns.api::<WorkloadNetworkPolicy>()
                .create(&PostParams::default(), &serde_json::from_value(value)?)
                .await?;
        } else {
            ns.api::<WorkloadNetworkPolicyProposal>()
                .create(&PostParams::default(), &serde_json::from_value(value)?)
                .await?;
        }
    }
    let (ui, metrics, ingest) = (free_port()?, free_port()?, free_port()?);
    let _controller = Running(
        std::process::Command::new(env!("CARGO_BIN_EXE_network-enforcer-controller"))
            .arg("run")
            .env("KUBECONFIG", ns.kubeconfig())
            .env("WATCH_NAMESPACE", &n)
            .env("POD_NAMESPACE", &n)
            .env("POD_NAME", "controller-0")
            .env("LEADER_ELECT", "false")
            .env("CONTROLLER_PROVIDER", "ebpf")
            .env("INGEST_ADDRESS", format!("127.0.0.1:{ingest}"))
            .env("INGEST_INSECURE", "true")
            .env("METRICS_ADDRESS", format!("127.0.0.1:{metrics}"))
            .env("UI_ADDRESS", format!("127.0.0.1:{ui}"))
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .stdout(std::process::Stdio::null())
            .spawn()?,
    );
    let client = format!("w:{n}/Deployment/http-client");
    let server = format!("w:{n}/Deployment/http-server");
    let dns = "s:kube-system/{k8s-app=kube-dns}";

    // The JSON API first: the graph the page will draw.
    let graph_path = format!("/api/v1/namespaces/{n}/graph");
    let started = Instant::now();
    let graph: Value = loop {
        if let Ok((200, body)) = http(ui, "GET", &graph_path, None) {
            let graph: Value = serde_json::from_str(&body)?;
            if graph["edges"].as_array().is_some_and(|e| e.len() >= 3) {
                break graph;
            }
        }
        ensure!(
            started.elapsed() < Duration::from_secs(60),
            "the web view's API did not answer the graph of {n}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let mut states: Vec<String> = graph["edges"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            format!(
                "{} {}>{}",
                e["state"].as_str().unwrap_or("?"),
                e["from"],
                e["to"]
            )
        })
        .collect();
    states.sort();
    assert_eq!(
        states,
        [
            format!("allowed \"{client}\">\"{dns}\""),
            format!("allowed \"{client}\">\"{server}\""),
            format!("learned \"x:*\">\"{server}\""),
        ],
        "the client's policy allows both of its rules; the outside caller is only learned"
    );

    let out = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/ui");
    std::fs::create_dir_all(&out)?;
    let profile = std::env::temp_dir().join(format!("ne-web-view-chromium-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&profile);
    let browser = Browser::start(&profile)?;
    let base = format!("http://127.0.0.1:{ui}/");

    // The graph page shows the scenario's edges, coloured by state.
    browser.open(&format!("{base}#/graph/{n}"))?;
    let expected = [
        format!("allowed {client}>{dns} UDP 53"),
        format!("allowed {client}>{server} TCP 18080"),
        format!("learned x:*>{server} TCP 18080"),
    ]
    .join("\n");
    let shown = browser.wait_for(
        "the graph's edges",
        Duration::from_secs(20),
        &format!(
            "const s = (function() {{ {EDGES_SCRIPT} }})(); return s === {} ? s : null",
            json!(expected)
        ),
    );
    if shown.is_err() {
        let now = browser.run(EDGES_SCRIPT)?;
        bail!("the graph shows\n{now}\nnot\n{expected}");
    }
    browser.screenshot(&out.join("graph.png"))?;

    // A violation written into the status appears highlighted (red, pulsing) within 5 s.
    let policies = ns.api::<WorkloadNetworkPolicy>();
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let status = json!({"status": {
        "violationCount": 1,
        "activeViolationCount": 1,
        "violations": [{
            "id": 1, "timestamp": now,
            "source": {"namespace": n, "ownerKind": "Deployment", "ownerName": "http-client"},
            "dest": {"namespace": n, "ownerKind": "Deployment", "ownerName": "db"},
            "protocol": "TCP", "dstPort": 5432, "action": "monitor", "direction": "Egress",
            "denyingPolicyNamespace": n, "denyingPolicyName": "deployment-http-client-egress"
        }]
    }});
    policies
        .patch_status(
            "deployment-http-client-egress",
            &PatchParams::default(),
            &Patch::Merge(&status),
        )
        .await?;
    let updated = Instant::now();
    let db = format!("w:{n}/Deployment/db");
    browser.wait_for(
        "the violation edge, highlighted",
        Duration::from_secs(5),
        &format!(
            "const e = document.querySelector('#graph g.edge.violation.highlight[data-to={}]'); \
             return e ? getComputedStyle(e.querySelector('path')).stroke : null",
            json!(db)
        ),
    )?;
    let latency = updated.elapsed();
    eprintln!("violation highlighted {latency:?} after the status update");
    assert!(latency < Duration::from_secs(5), "{latency:?}");
    let stroke = browser.run(&format!(
        "return getComputedStyle(document.querySelector('#graph g.edge.violation[data-to={}] path')).stroke",
        json!(db)
    ))?;
    assert_eq!(stroke, json!("rgb(211, 47, 47)"), "violations are red");
    browser.screenshot(&out.join("graph-violation.png"))?;

    // The client's page: the acknowledge command of its violation.
    browser.open(&format!("{base}#/workload/{n}/http-client"))?;
    browser.wait_for(
        "the acknowledge command",
        Duration::from_secs(10),
        &format!(
            "return Array.from(document.querySelectorAll('code.command.acknowledge')).some(c => c.textContent.includes({}))",
            json!("networkenforcer.kubewarden.io/acknowledge-1=")
        ),
    )?;
    browser.screenshot(&out.join("workload-violation.png"))?;

    // The server's page: the exact command that promotes its proposal.
    browser.open(&format!("{base}#/workload/{n}/http-server"))?;
    let promote = format!(
        "kubectl label wnpp -n {n} deployment-http-server-ingress networkenforcer.kubewarden.io/promote=monitor --overwrite"
    );
    browser.wait_for(
        "the promote command",
        Duration::from_secs(10),
        &format!(
            "return Array.from(document.querySelectorAll('code.command.promote')).some(c => c.textContent === {})",
            json!(promote)
        ),
    )?;
    browser.screenshot(&out.join("workload.png"))?;

    // The proposal diff page: both learned peers would be newly allowed.
    browser.open(&format!("{base}#/diff/{n}/deployment-http-server-ingress"))?;
    let rows = browser.wait_for(
        "the diff table",
        Duration::from_secs(10),
        "const t = document.querySelector('table#diff'); return t ? t.rows.length : null",
    )?;
    // Header and the two learned peers.
    assert_eq!(rows, json!(3), "diff rows");
    browser.screenshot(&out.join("diff.png"))?;
    drop(browser);
    let _ = std::fs::remove_dir_all(&profile);
    Ok(())
}
