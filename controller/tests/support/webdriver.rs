//! A WebDriver client small enough to read: chromedriver's HTTP API (plain JSON over HTTP/1.1 on
//! loopback) driving Debian's headless Chromium, for the web view's browser test and bench.

#![allow(dead_code)] // each user takes what it needs

use anyhow::{Context, Result, ensure};
use base64::Engine as _;
use serde_json::{Value, json};
use std::io::{Read as _, Write as _};
use std::time::{Duration, Instant};

/// A child process killed when dropped (a failed test leaves nothing running).
pub struct Running(pub std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// One HTTP/1.1 request on loopback with `Connection: close`: (status, body).
pub fn http(port: u16, method: &str, path: &str, body: Option<&Value>) -> Result<(u16, String)> {
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
pub struct Browser {
    port: u16,
    session: String,
    _driver: Running,
}

impl Browser {
    pub fn start(profile: &std::path::Path) -> Result<Self> {
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

    pub fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value> {
        let (status, text) = http(
            self.port,
            method,
            &format!("/session/{}{path}", self.session),
            body,
        )?;
        ensure!(status == 200, "WebDriver {method} {path}: {status} {text}");
        Ok(serde_json::from_str::<Value>(&text)?["value"].take())
    }

    pub fn open(&self, url: &str) -> Result<()> {
        self.call("POST", "/url", Some(&json!({ "url": url })))
            .map(drop)
    }

    /// Runs `script` (a function body) in the page; its return value.
    pub fn run(&self, script: &str) -> Result<Value> {
        self.call(
            "POST",
            "/execute/sync",
            Some(&json!({ "script": script, "args": [] })),
        )
    }

    /// Polls `script` every 100 ms until it returns something truthy (not null/false/""); its value.
    pub fn wait_for(&self, what: &str, timeout: Duration, script: &str) -> Result<Value> {
        network_enforcer_tests::wait::poll(
            what,
            timeout,
            Duration::from_millis(100),
            || {
                let value = self.run(script)?;
                let truthy = !matches!(&value, Value::Null | Value::Bool(false))
                    && value.as_str() != Some("");
                Ok(truthy.then_some(value))
            },
            || {
                let page = self
                    .run("return document.body.innerText.slice(0, 2000)")
                    .map(|v| v.to_string())
                    .unwrap_or_else(|e| format!("(no page: {e:#})"));
                format!("the page says:\n{page}")
            },
        )
    }

    pub fn screenshot(&self, path: &std::path::Path) -> Result<()> {
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
