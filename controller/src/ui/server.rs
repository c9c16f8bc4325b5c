//! The web view's HTTP server: the pages (embedded assets) and the JSON API under `/api/v1/`
//! (docs/ui.md). Every route only reads; answers are bounded (rows capped by the views, one request
//! computed at a time per [`MAX_CONCURRENT`] slot, each within [`REQUEST_TIMEOUT`]), errors are JSON
//! `{"error":{"code":404,"message":"..."}}`, and every request is counted by route and status.

use crate::monitor::edge_history::HistoryEdge;
use crate::runtime::metrics::ControllerMetrics;
use crate::ui::explain_view::{self, Explainer};
use crate::ui::objects::ObjectSource;
use crate::ui::{cluster_view, graph_view, overview, proposal_diff, workload_view};
use axum::extract::{Path, RawQuery};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use serde::Serialize;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The longest one API answer may take to compute.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// API answers computed at once; more wait up to [`REQUEST_TIMEOUT`], then get 503.
pub const MAX_CONCURRENT: usize = 4;
/// At most this many namespaces are listed.
pub const MAX_NAMESPACES: usize = 1_000;
/// At most this many observed edges are answered per namespace.
pub const MAX_EDGES: usize = 10_000;
/// How long the explain route may read the cluster (a few lists of the flow's namespaces).
pub const EXPLAIN_TIMEOUT: Duration = Duration::from_secs(15);
/// Explanations computed at once; more are answered 503 at once.
pub const MAX_CONCURRENT_EXPLAIN: usize = 2;

const INDEX_HTML: &str = include_str!("assets/index.html");
const APP_JS: &str = include_str!("assets/app.js");
const STYLE_CSS: &str = include_str!("assets/style.css");
/// The graph layout library (dagre, from the npm registry), embedded by `build.rs`.
const DAGRE_JS: &str = include_str!(concat!(env!("OUT_DIR"), "/dagre.min.js"));

/// Labels of `ui_requests_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub route: &'static str,
    /// The HTTP status code (`200`, `404`, ...); the label writes the number.
    pub status: u16,
}

/// Labels of `ui_request_duration_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabel {
    pub route: &'static str,
}

/// The web view's metrics (`ui_requests_total` by route and status, `ui_request_duration_seconds`
/// by route). Cheap to clone.
#[derive(Clone, Debug)]
pub struct UiMetrics {
    requests: Family<RequestLabels, Counter>,
    duration: Family<RouteLabel, Histogram, fn() -> Histogram>,
}

impl Default for UiMetrics {
    fn default() -> Self {
        fn buckets() -> Histogram {
            // 0.5 ms .. ~8 s.
            Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
                0.0005, 2.0, 15,
            ))
        }
        Self {
            requests: Family::default(),
            duration: Family::new_with_constructor(buckets as fn() -> Histogram),
        }
    }
}

impl UiMetrics {
    /// Registers these on the process's registry.
    pub fn register(&self, metrics: &ControllerMetrics) {
        metrics.register(
            "ui_requests",
            "Web view requests, by route and HTTP status",
            self.requests.clone(),
        );
        metrics.register(
            "ui_request_duration_seconds",
            "Time to answer one web view request, by route",
            self.duration.clone(),
        );
    }

    fn observe(&self, route: &'static str, status: StatusCode, seconds: f64) {
        self.requests
            .get_or_create(&RequestLabels {
                route,
                status: status.as_u16(),
            })
            .inc();
        self.duration
            .get_or_create(&RouteLabel { route })
            .observe(seconds);
    }

    /// Requests counted for `route` with `status` (tests).
    pub fn count(&self, route: &'static str, status: u16) -> u64 {
        self.requests
            .get_or_create(&RequestLabels { route, status })
            .get()
    }
}

/// The observed edges this controller holds (the protect gate's history, docs/api.md "Protect
/// gate"), for `/api/v1/namespaces/{ns}/edges`.
pub trait EdgeSource: Send + Sync {
    /// The edges with an end in `namespace`, newest first, at most `limit`; and whether more were
    /// left out. `None` while the history is not complete: the watches evidence is judged against
    /// have not listed yet (or never do here: a follower keeps no history).
    fn edges_in(&self, namespace: &str, limit: usize) -> Option<(Vec<HistoryEdge>, bool)>;
}

impl EdgeSource for crate::monitor::status_sync::StatusSync {
    fn edges_in(&self, namespace: &str, limit: usize) -> Option<(Vec<HistoryEdge>, bool)> {
        crate::monitor::status_sync::StatusSync::edges_in(self, namespace, limit)
    }
}

/// What the handlers share.
#[derive(Clone)]
pub struct UiState {
    pub source: Arc<dyn ObjectSource>,
    pub metrics: UiMetrics,
    /// `None`: this process keeps no edge history; the edges route answers 404.
    pub edges: Option<Arc<dyn EdgeSource>>,
    /// `None`: the explain route answers 404.
    pub explainer: Option<Arc<dyn Explainer>>,
    slots: Arc<tokio::sync::Semaphore>,
    explain_slots: Arc<tokio::sync::Semaphore>,
    /// Answer only requests addressed to a loopback name ([`UiState::loopback_hosts_only`]).
    loopback_hosts_only: bool,
}

impl UiState {
    pub fn new(source: Arc<dyn ObjectSource>, metrics: UiMetrics) -> Self {
        Self {
            source,
            metrics,
            edges: None,
            explainer: None,
            slots: Arc::new(tokio::sync::Semaphore::new(MAX_CONCURRENT)),
            explain_slots: Arc::new(tokio::sync::Semaphore::new(MAX_CONCURRENT_EXPLAIN)),
            loopback_hosts_only: false,
        }
    }

    /// Refuses (403) requests whose `Host` is not a loopback name (`localhost`, `127.0.0.1`,
    /// `[::1]`, any port): what `kubectl port-forward` sends. Served on loopback, the view is meant
    /// for the operator's own browser; a page from elsewhere open in that browser could otherwise
    /// read it through a name of its own that it points at 127.0.0.1 (DNS rebinding).
    pub fn loopback_hosts_only(mut self) -> Self {
        self.loopback_hosts_only = true;
        self
    }

    /// Also explains flows with `explainer`.
    pub fn with_explainer(mut self, explainer: Arc<dyn Explainer>) -> Self {
        self.explainer = Some(explainer);
        self
    }

    /// Also answers the observed edges from `edges`.
    pub fn with_edges(mut self, edges: Arc<dyn EdgeSource>) -> Self {
        self.edges = Some(edges);
        self
    }
}

/// The edges route's answer.
#[derive(Serialize)]
struct Edges {
    namespace: String,
    edges: Vec<HistoryEdge>,
    truncated: bool,
}

/// An API error: status and message, answered as JSON.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: ErrorDetail<'a>,
}

#[derive(Serialize)]
struct ErrorDetail<'a> {
    code: u16,
    message: &'a str,
}

fn json_response(status: StatusCode, body: String) -> Response {
    let mut response = (status, body).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::to_string(&ErrorBody {
            error: ErrorDetail {
                code: self.status.as_u16(),
                message: &self.message,
            },
        })
        .unwrap_or_default();
        json_response(self.status, body)
    }
}

/// Runs `compute` on a blocking thread within the concurrency slots and the timeout, counts the
/// request, and answers its JSON.
async fn answer<T, F>(state: &UiState, route: &'static str, compute: F) -> Response
where
    T: Serialize + Send + 'static,
    F: FnOnce(&dyn ObjectSource) -> Result<T, ApiError> + Send + 'static,
{
    let started = Instant::now();
    let result = tokio::time::timeout(REQUEST_TIMEOUT, async {
        let _slot = state
            .slots
            .acquire()
            .await
            .map_err(|_| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "shutting down"))?;
        if !state.source.ready() {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "the controller's watches have not listed policies and proposals yet; retry",
            ));
        }
        let source = state.source.clone();
        tokio::task::spawn_blocking(move || {
            let value = compute(source.as_ref())?;
            serde_json::to_string(&value).map_err(|e| {
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("encoding: {e}"))
            })
        })
        .await
        .map_err(|e| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("view failed: {e}"),
            )
        })?
    })
    .await
    .unwrap_or_else(|_| {
        Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the answer took longer than {REQUEST_TIMEOUT:?}"),
        ))
    });
    finish(state, route, started, result)
}

/// The explain route: the request parsed, then the explainer's reads of the cluster awaited within
/// [`MAX_CONCURRENT_EXPLAIN`] slots of its own and [`EXPLAIN_TIMEOUT`].
async fn explain(state: &UiState, ns: String, query: Option<String>) -> Response {
    let started = Instant::now();
    let result = async {
        valid_name("namespace", &ns)?;
        let request = explain_view::request(&ns, query.as_deref())?;
        let explainer = state.explainer.clone().ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "this process does not explain flows (it has no Kubernetes client)",
            )
        })?;
        // Its own few slots, never waited for: each explanation reads the cluster, and the other
        // views must not queue behind it.
        let _slot = state.explain_slots.clone().try_acquire_owned().map_err(|_| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "{MAX_CONCURRENT_EXPLAIN} explanations are being computed; retry in a moment"
                ),
            )
        })?;
        let explanation = tokio::time::timeout(EXPLAIN_TIMEOUT, explainer.explain(&request))
            .await
            .map_err(|_| {
                ApiError::new(
                    StatusCode::GATEWAY_TIMEOUT,
                    format!("reading the cluster took longer than {EXPLAIN_TIMEOUT:?}"),
                )
            })??;
        let encoded = if request.scenario_only {
            serde_json::to_string(&explanation.scenario)
        } else {
            serde_json::to_string(&explain_view::answer(&request, explanation))
        };
        encoded
            .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("encoding: {e}")))
    }
    .await;
    finish(state, "explain", started, result)
}

/// Answers `result` (a JSON body, or an error) and counts the request.
fn finish(
    state: &UiState,
    route: &'static str,
    started: Instant,
    result: Result<String, ApiError>,
) -> Response {
    let response = match result {
        Ok(body) => json_response(StatusCode::OK, body),
        Err(error) => {
            if error.status.is_server_error() {
                tracing::warn!(route, %error, "web view request failed");
            }
            error.into_response()
        }
    };
    state
        .metrics
        .observe(route, response.status(), started.elapsed().as_secs_f64());
    response
}

/// Refuses a namespace or object name that Kubernetes would not accept (it then names nothing).
fn valid_name(what: &str, name: &str) -> Result<(), ApiError> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.');
    if ok {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!(
                "{what} must be a Kubernetes name (lowercase letters, digits, '-', '.'; at most 253)"
            ),
        ))
    }
}

/// The query string's parameters (the last one wins).
fn params(query: Option<&str>) -> std::collections::BTreeMap<String, String> {
    form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

/// The graph query of `namespace` from the query string: `workload`, `window` (seconds), `ungroup`.
pub fn graph_query(
    namespace: &str,
    query: Option<&str>,
) -> Result<graph_view::GraphQuery, ApiError> {
    let params = params(query);
    let window_seconds = match params.get("window").map(String::as_str) {
        None | Some("") | Some("all") => None,
        Some(s) => Some(
            s.parse::<i64>()
                .ok()
                .filter(|s| (1..=366 * 86_400).contains(s))
                .ok_or_else(|| {
                    ApiError::new(
                        StatusCode::BAD_REQUEST,
                        "window must be a number of seconds between 1 and 31622400, or all",
                    )
                })?,
        ),
    };
    let workload = params.get("workload").filter(|w| !w.is_empty()).cloned();
    if let Some(w) = &workload {
        let name = w.rsplit('/').next().unwrap_or_default();
        valid_name("workload", name)?;
    }
    Ok(graph_view::GraphQuery {
        namespace: namespace.to_string(),
        workload,
        window_seconds,
        ungroup_external: params
            .get("ungroup")
            .is_some_and(|v| v == "1" || v == "true"),
    })
}

/// A namespace in the list.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct NamespaceSummary {
    name: String,
    proposals: usize,
    policies: usize,
    active_violations: i64,
}

#[derive(Serialize)]
struct Namespaces {
    namespaces: Vec<NamespaceSummary>,
    truncated: bool,
}

fn namespaces(source: &dyn ObjectSource) -> Namespaces {
    let snapshot = source.snapshot(None);
    let mut by_name: std::collections::BTreeMap<String, NamespaceSummary> = Default::default();
    for p in &snapshot.proposals {
        let ns = p.metadata.namespace.clone().unwrap_or_default();
        by_name
            .entry(ns.clone())
            .or_insert_with(|| summary(&ns))
            .proposals += 1;
    }
    for p in &snapshot.policies {
        let ns = p.namespace().to_string();
        let entry = by_name.entry(ns.clone()).or_insert_with(|| summary(&ns));
        entry.policies += 1;
        entry.active_violations += p
            .policy
            .status
            .as_ref()
            .map_or(0, |s| s.active_violation_count);
    }
    let truncated = by_name.len() > MAX_NAMESPACES;
    Namespaces {
        namespaces: by_name.into_values().take(MAX_NAMESPACES).collect(),
        truncated,
    }
}

fn summary(ns: &str) -> NamespaceSummary {
    NamespaceSummary {
        name: ns.to_string(),
        proposals: 0,
        policies: 0,
        active_violations: 0,
    }
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    // Everything the page needs is served from here: no script, style or image from elsewhere.
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("default-src 'self'; img-src 'self' data:"),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    response
}

/// Whether `host` (a `Host` header: a name or address, with or without a port) is a loopback name:
/// `localhost`, an address in 127.0.0.0/8 or `[::1]`.
pub fn is_loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(bracketed) => bracketed.split(']').next().unwrap_or_default(),
        None => host.rsplit_once(':').map_or(host, |(name, _port)| name),
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The layer of [`UiState::loopback_hosts_only`]. A request without `Host` (HTTP/1.0, no browser
/// sends one) passes.
async fn loopback_host_only(
    axum::extract::State(state): axum::extract::State<UiState>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let host = request
        .headers()
        .get(header::HOST)
        .map(|h| String::from_utf8_lossy(h.as_bytes()).into_owned());
    match host {
        Some(host) if !is_loopback_host(&host) => {
            state
                .metrics
                .observe("refused_host", StatusCode::FORBIDDEN, 0.0);
            tracing::debug!(%host, "web view request for another host refused");
            ApiError::new(
                StatusCode::FORBIDDEN,
                format!(
                    "the web view answers requests for localhost only (kubectl port-forward), not \
                     for {host:.100}; to reach it by another name, serve it with a Service \
                     (ui.service=true) behind an authenticating proxy (docs/ui.md)"
                ),
            )
            .into_response()
        }
        _ => next.run(request).await,
    }
}

/// The router: pages at `/`, assets under `/assets/`, the JSON API under `/api/v1/`.
pub fn router(state: UiState) -> axum::Router {
    use axum::routing::get;
    let loopback_only = state.loopback_hosts_only.then(|| state.clone());
    let s = state.clone();
    let graph = move |Path(ns): Path<String>, RawQuery(query): RawQuery| {
        let s = s.clone();
        async move {
            let route = "graph";
            let query =
                valid_name("namespace", &ns).and_then(|()| graph_query(&ns, query.as_deref()));
            let history = s.edges.clone();
            answer(&s, route, move |source| {
                let query = query?;
                // The observed flows when this process keeps them and they are complete; the
                // graph is drawn without them otherwise (a follower, a controller still listing).
                let (observed, cut) = history
                    .and_then(|h| h.edges_in(&query.namespace, MAX_EDGES))
                    .unwrap_or_default();
                let mut view =
                    graph_view::build(&source.snapshot(Some(&query.namespace)), &query, &observed);
                view.truncated |= cut;
                Ok(view)
            })
            .await
        }
    };
    let s = state.clone();
    let workload = move |Path((ns, name)): Path<(String, String)>, RawQuery(query): RawQuery| {
        let s = s.clone();
        async move {
            let kind = params(query.as_deref())
                .remove("kind")
                .filter(|k| !k.is_empty());
            answer(&s, "workload", move |source| {
                valid_name("namespace", &ns)?;
                valid_name("workload", &name)?;
                workload_view::build(&source.snapshot(Some(&ns)), &ns, &name, kind.as_deref())
                    .ok_or_else(|| {
                        ApiError::new(
                            StatusCode::NOT_FOUND,
                            format!(
                                "no proposal or policy targets workload {name} in namespace {ns}"
                            ),
                        )
                    })
            })
            .await
        }
    };
    let s = state.clone();
    let diff = move |Path((ns, name)): Path<(String, String)>| {
        let s = s.clone();
        async move {
            answer(&s, "proposal_diff", move |source| {
                valid_name("namespace", &ns)?;
                valid_name("proposal", &name)?;
                proposal_diff::build(&source.snapshot(Some(&ns)), &ns, &name).ok_or_else(|| {
                    ApiError::new(
                        StatusCode::NOT_FOUND,
                        format!("no proposal {name} in namespace {ns}"),
                    )
                })
            })
            .await
        }
    };
    let s = state.clone();
    let edges = move |Path(ns): Path<String>| {
        let s = s.clone();
        async move {
            let history = s.edges.clone();
            answer(&s, "edges", move |_| {
                valid_name("namespace", &ns)?;
                let history = history.ok_or_else(|| {
                    ApiError::new(
                        StatusCode::NOT_FOUND,
                        "this process keeps no history of observed edges",
                    )
                })?;
                let (edges, truncated) = history.edges_in(&ns, MAX_EDGES).ok_or_else(|| {
                    ApiError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "the observed edges are not complete: this controller has not listed the \
                         cluster yet, or is not the leader (only the leader keeps them); retry",
                    )
                })?;
                Ok(Edges {
                    namespace: ns,
                    edges,
                    truncated,
                })
            })
            .await
        }
    };
    let s = state.clone();
    let explain = move |Path(ns): Path<String>, RawQuery(query): RawQuery| {
        let s = s.clone();
        async move { explain(&s, ns, query).await }
    };
    let s = state.clone();
    let list = move || {
        let s = s.clone();
        async move { answer(&s, "namespaces", |source| Ok(namespaces(source))).await }
    };
    let s = state.clone();
    let overview = move || {
        let s = s.clone();
        async move {
            answer(&s, "overview", |source| {
                Ok(overview::build(&source.snapshot(None)))
            })
            .await
        }
    };
    let s = state.clone();
    let cluster = move || {
        let s = s.clone();
        async move {
            answer(&s, "cluster", |source| {
                Ok(cluster_view::build(&source.snapshot(None)))
            })
            .await
        }
    };
    let s = state.clone();
    let not_found = move || {
        let s = s.clone();
        async move {
            answer(&s, "not_found", |_| -> Result<(), ApiError> {
                Err(ApiError::new(
                    StatusCode::NOT_FOUND,
                    "no such route (see docs/ui.md)",
                ))
            })
            .await
        }
    };
    let page =
        |content_type: &'static str, body: &'static str, route: &'static str, state: UiState| {
            move || {
                let state = state.clone();
                async move {
                    state.metrics.observe(route, StatusCode::OK, 0.0);
                    asset(content_type, body)
                }
            }
        };
    let router = axum::Router::new()
        .route(
            "/",
            get(page(
                "text/html; charset=utf-8",
                INDEX_HTML,
                "page",
                state.clone(),
            )),
        )
        .route(
            "/assets/app.js",
            get(page(
                "text/javascript; charset=utf-8",
                APP_JS,
                "asset",
                state.clone(),
            )),
        )
        .route(
            "/assets/dagre.js",
            get(page(
                "text/javascript; charset=utf-8",
                DAGRE_JS,
                "asset",
                state.clone(),
            )),
        )
        .route(
            "/assets/style.css",
            get(page(
                "text/css; charset=utf-8",
                STYLE_CSS,
                "asset",
                state.clone(),
            )),
        )
        .route("/api/v1/overview", get(overview))
        .route("/api/v1/cluster", get(cluster))
        .route("/api/v1/namespaces", get(list))
        .route("/api/v1/namespaces/{ns}/graph", get(graph))
        .route("/api/v1/namespaces/{ns}/workloads/{name}", get(workload))
        .route("/api/v1/namespaces/{ns}/proposals/{name}/diff", get(diff))
        .route("/api/v1/namespaces/{ns}/edges", get(edges))
        .route("/api/v1/namespaces/{ns}/explain", get(explain))
        .fallback(get(not_found));
    match loopback_only {
        Some(state) => router.layer(axum::middleware::from_fn_with_state(
            state,
            loopback_host_only,
        )),
        None => router,
    }
}

/// Serves the web view on `listener` until the process ends.
pub async fn serve(listener: tokio::net::TcpListener, state: UiState) -> std::io::Result<()> {
    axum::serve(listener, router(state)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_labels_are_written_as_before() {
        let registry = ControllerMetrics::new();
        let metrics = UiMetrics::default();
        metrics.register(&registry);
        metrics.observe("graph", StatusCode::OK, 0.001);
        metrics.observe("graph", StatusCode::OK, 0.001);
        metrics.observe("not_found", StatusCode::NOT_FOUND, 0.001);
        metrics.observe("namespaces", StatusCode::SERVICE_UNAVAILABLE, 0.001);
        let text = registry.encode();
        for line in [
            "network_enforcer_controller_ui_requests_total{route=\"graph\",status=\"200\"} 2",
            "network_enforcer_controller_ui_requests_total{route=\"not_found\",status=\"404\"} 1",
            "network_enforcer_controller_ui_requests_total{route=\"namespaces\",status=\"503\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in {text}");
        }
        assert_eq!(metrics.count("graph", 200), 2);
    }
}
