//! The web view's explain panel answered by `check`'s evaluator: the two sibling stages meet here,
//! in the assembly, so neither imports the other.

use crate::tools::check::live::{self, ExplainError};
use crate::ui::explain_view::{ExplainRequest, Explainer, Explanation};
use crate::ui::server::ApiError;
use axum::http::StatusCode;
use std::future::Future;
use std::pin::Pin;

/// Explains a flow against the cluster as the API server has it now (as `check --from-cluster`).
pub struct ClusterExplainer {
    pub client: kube::Client,
    /// The namespace this controller watches (`--namespace`): flows with a workload elsewhere are
    /// refused, as the rest of the view shows nothing of them.
    pub scope: Option<String>,
}

impl Explainer for ClusterExplainer {
    fn explain<'a>(
        &'a self,
        request: &'a ExplainRequest,
    ) -> Pin<Box<dyn Future<Output = Result<Explanation, ApiError>> + Send + 'a>> {
        Box::pin(async move {
            if let Some(scope) = &self.scope {
                let outside = [&request.from, &request.to]
                    .into_iter()
                    .find(|side| !side.namespace.is_empty() && side.namespace != *scope);
                if let Some(side) = outside {
                    return Err(ApiError::new(
                        StatusCode::FORBIDDEN,
                        format!(
                            "namespace {} is outside the namespace this controller watches ({scope})",
                            side.namespace
                        ),
                    ));
                }
            }
            let input = live::load_flow(
                &self.client,
                &request.from,
                &request.to,
                request.protocol,
                request.port,
            )
            .await
            .map_err(|e| ApiError::new(StatusCode::BAD_GATEWAY, e.to_string()))?;
            // The evaluation is CPU work: off the runtime, as the other views.
            let explained = tokio::task::spawn_blocking(move || live::explain_flow(&input))
                .await
                .map_err(|e| {
                    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("explain: {e}"))
                })?;
            let explained = explained.map_err(|e| match e {
                ExplainError::NoPod(_) => ApiError::new(StatusCode::NOT_FOUND, e.to_string()),
                // The cluster's objects, not the request, are what does not parse.
                ExplainError::Invalid(_) => {
                    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
                }
            })?;
            let scenario = serde_json::to_value(&explained.scenario).map_err(|e| {
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("encoding: {e}"))
            })?;
            Ok(Explanation {
                allowed: explained.allowed,
                egress: explained.egress,
                ingress: explained.ingress,
                scenario,
            })
        })
    }
}
