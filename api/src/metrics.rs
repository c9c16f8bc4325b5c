//! The Prometheus `/metrics` endpoint of the agent and the controller: the registry as OpenMetrics
//! text, and the route that serves it (behind the `metrics` feature, so that the crates that only need
//! the contracts do not build an HTTP stack).

use axum::http::header;
use prometheus_client::registry::Registry;

/// The `Content-Type` of [`render`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The registry's metrics in the OpenMetrics text format.
pub fn render(registry: &Registry) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, registry);
    out
}

/// `GET` that answers with `metrics()` (usually [`render`] of a registry) as [`CONTENT_TYPE`].
pub fn route<S>(
    metrics: impl Fn() -> String + Clone + Send + Sync + 'static,
) -> axum::routing::MethodRouter<S>
where
    S: Clone + Send + Sync + 'static,
{
    axum::routing::get(move || {
        let text = metrics();
        async move { ([(header::CONTENT_TYPE, CONTENT_TYPE)], text) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;
    use tower::ServiceExt;

    #[tokio::test]
    async fn serves_the_registry_as_openmetrics_text() {
        let mut registry = Registry::with_prefix("example");
        let counter = Counter::<u64>::default();
        registry.register("things", "Things seen", counter.clone());
        counter.inc_by(3);
        let text = render(&registry);
        assert_eq!(
            text,
            "# HELP example_things Things seen.\n\
             # TYPE example_things counter\n\
             example_things_total 3\n\
             # EOF\n"
        );
        let registry = std::sync::Arc::new(registry);
        let app: axum::Router =
            axum::Router::new().route("/metrics", route(move || render(&registry)));
        let response = app
            .oneshot(
                axum::http::Request::get("/metrics")
                    .body(axum::body::Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()[header::CONTENT_TYPE], CONTENT_TYPE);
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        assert_eq!(body, text.as_bytes());
    }
}
