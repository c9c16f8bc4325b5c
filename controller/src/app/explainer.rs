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
}

impl Explainer for ClusterExplainer {
    fn explain<'a>(
        &'a self,
        request: &'a ExplainRequest,
    ) -> Pin<Box<dyn Future<Output = Result<Explanation, ApiError>> + Send + 'a>> {
        Box::pin(async move {
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
                ExplainError::Invalid(_) => {
                    ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, e.to_string())
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
