//! The controller's HTTP endpoint (`--metrics-address`, default `0.0.0.0:8080`):
//!
//! - `GET /metrics`: Prometheus text ([`crate::runtime::metrics::ControllerMetrics`]).
//! - `GET /healthz`: liveness; 200 as long as the process serves HTTP.
//! - `GET /readyz`: readiness; 200 when every *required* component is ready, 503 otherwise. The body is
//!   JSON listing every component, required or not:
//!   `{"ready":false,"components":{"index":{"ready":true,"required":true,"detail":"all watches listed"},
//!   "ingest":{"ready":false,"required":true,"detail":"not the leader (holder: controller-1)"}}}`.
//!
//! # Adding a component (flow sources, ...)
//!
//! Components report into a shared [`Health`] registry; the process owns one and hands out clones.
//!
//! ```
//! use network_enforcer_controller::runtime::http::Health;
//! let health = Health::default();
//! // Required: readiness fails while it is not ready (the Service stops routing to this pod).
//! let index = health.component("index", true);
//! // Optional: reported in the body, never fails readiness (a flow source that is down must not take
//! // the controller out of its Service).
//! let hubble = health.component("source/hubble", false);
//! index.ready("all watches listed");
//! hubble.not_ready("connecting to hubble-relay:4245: connection refused");
//! assert!(health.ready());
//! ```
//!
//! A component starts not ready with detail `starting`. A registration with the same name replaces the
//! earlier one's state (a restarted source re-registers).

use crate::runtime::metrics::ControllerMetrics;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// One component's state, as `/readyz` reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ComponentState {
    pub ready: bool,
    /// Required components decide readiness; optional ones are only reported.
    pub required: bool,
    /// Why it is (not) ready, for people.
    pub detail: String,
}

/// The readiness registry. Cheap to clone.
#[derive(Clone, Default)]
pub struct Health {
    components: Arc<Mutex<BTreeMap<String, ComponentState>>>,
}

/// A handle a component uses to report its state.
#[derive(Clone)]
pub struct Component {
    name: String,
    health: Health,
}

/// The `/readyz` body.
#[derive(Debug, Serialize)]
pub struct Readiness {
    pub ready: bool,
    pub components: BTreeMap<String, ComponentState>,
}

impl Health {
    /// Registers component `name` (not ready yet) and returns its handle.
    pub fn component(&self, name: &str, required: bool) -> Component {
        self.components.lock().expect("health lock").insert(
            name.to_string(),
            ComponentState {
                ready: false,
                required,
                detail: "starting".into(),
            },
        );
        Component {
            name: name.to_string(),
            health: self.clone(),
        }
    }

    /// True when every required component is ready.
    pub fn ready(&self) -> bool {
        self.readiness().ready
    }

    /// Every component's state and the verdict.
    pub fn readiness(&self) -> Readiness {
        let components = self.components.lock().expect("health lock").clone();
        Readiness {
            ready: components.values().all(|c| c.ready || !c.required),
            components,
        }
    }
}

impl Component {
    /// Marks the component ready.
    pub fn ready(&self, detail: impl Into<String>) {
        self.set(true, detail.into());
    }

    /// Marks the component not ready.
    pub fn not_ready(&self, detail: impl Into<String>) {
        self.set(false, detail.into());
    }

    /// Sets the state; logs transitions (not every repeat).
    pub fn set(&self, ready: bool, detail: String) {
        let mut components = self.health.components.lock().expect("health lock");
        let state = components
            .entry(self.name.clone())
            .or_insert_with(|| ComponentState {
                ready: !ready,
                required: true,
                detail: String::new(),
            });
        if state.ready != ready {
            tracing::info!(component = %self.name, ready, %detail, "readiness changed");
        }
        state.ready = ready;
        state.detail = detail;
    }
}

/// The router: `/metrics`, `/healthz`, `/readyz`.
pub fn router(metrics: ControllerMetrics, health: Health) -> axum::Router {
    axum::Router::new()
        .route(
            "/metrics",
            network_enforcer_api::metrics::route(move || metrics.encode()),
        )
        .route("/healthz", axum::routing::get(|| async { "ok\n" }))
        .route(
            "/readyz",
            axum::routing::get(move || {
                let health = health.clone();
                async move {
                    let readiness = health.readiness();
                    let code = if readiness.ready {
                        StatusCode::OK
                    } else {
                        StatusCode::SERVICE_UNAVAILABLE
                    };
                    (
                        code,
                        [(header::CONTENT_TYPE, "application/json")],
                        serde_json::to_string(&readiness).unwrap_or_default(),
                    )
                        .into_response()
                }
            }),
        )
}

/// Serves the router on `listener` until the process ends.
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: ControllerMetrics,
    health: Health,
) -> std::io::Result<()> {
    axum::serve(listener, router(metrics, health)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn required_components_decide_optional_ones_are_reported() {
        let health = Health::default();
        assert!(health.ready(), "nothing registered: nothing to wait for");
        let index = health.component("index", true);
        let source = health.component("source/hubble", false);
        assert!(!health.ready(), "a required component starts not ready");
        index.ready("listed");
        assert!(health.ready(), "an optional component does not block");
        source.not_ready("connection refused");
        let r = health.readiness();
        assert!(r.ready);
        assert_eq!(r.components["source/hubble"].detail, "connection refused");
        index.not_ready("relisting");
        assert!(!health.ready());
        let body = serde_json::to_value(health.readiness()).unwrap();
        assert_eq!(body["components"]["index"]["required"], true);
        assert_eq!(body["ready"], false);
    }

    #[tokio::test]
    async fn endpoints_answer_over_http() {
        let metrics = ControllerMetrics::new();
        metrics.records_received.inc_by(7);
        let health = Health::default();
        let ingest = health.component("ingest", true);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve(listener, metrics, health));
        let get = |path: &'static str| async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            s.write_all(
                format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
            )
            .await
            .unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).await.unwrap();
            out
        };
        assert!(get("/healthz").await.starts_with("HTTP/1.1 200"));
        let not_ready = get("/readyz").await;
        assert!(not_ready.starts_with("HTTP/1.1 503"), "{not_ready}");
        assert!(
            not_ready.contains("\"ingest\":{\"ready\":false"),
            "{not_ready}"
        );
        ingest.ready("serving");
        assert!(get("/readyz").await.starts_with("HTTP/1.1 200"));
        let metrics = get("/metrics").await;
        assert!(
            metrics.contains("network_enforcer_controller_records_received_total 7"),
            "{metrics}"
        );
    }
}
