//! Authenticating agents: the bearer token of a stream, checked with a TokenReview.

use super::*;

/// The audience agents' projected tokens must be issued for.
pub const AUDIENCE: &str = "network-enforcer";

/// Who is on the other end of a stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentIdentity {
    /// The node the agent's pod runs on.
    pub node: String,
    /// The agent pod, `namespace/name`.
    pub pod: String,
}

/// Checks an agent's bearer token.
#[tonic::async_trait]
pub trait Authenticate: Send + Sync + 'static {
    async fn authenticate(&self, token: &str) -> Result<AgentIdentity, Status>;
}

/// Authenticates agents with a TokenReview against the API server.
pub struct TokenReviewAuthenticator {
    client: Client,
    /// `system:serviceaccount:<namespace>:<name>` of the agent.
    expected_user: String,
}

impl TokenReviewAuthenticator {
    /// Accepts tokens of ServiceAccount `namespace/name` only.
    pub fn new(client: Client, namespace: &str, name: &str) -> Self {
        Self {
            client,
            expected_user: format!("system:serviceaccount:{namespace}:{name}"),
        }
    }
}

/// What a TokenReview's status says of an agent: the name and uid of the pod its token is bound to,
/// or why it is refused. The token must be authenticated *for our audience* (an empty `audiences`
/// means it is valid for the API server's own audience only: a stolen API token, refused), and belong
/// to the agents' ServiceAccount `expected_user`.
pub(super) fn reviewed_agent(
    status: &k8s_openapi::api::authentication::v1::TokenReviewStatus,
    expected_user: &str,
) -> Result<(String, Option<String>), Status> {
    if status.authenticated != Some(true) {
        return Err(Status::unauthenticated(format!(
            "token rejected: {}",
            status.error.as_deref().unwrap_or("not authenticated")
        )));
    }
    if !status
        .audiences
        .as_ref()
        .is_some_and(|a| a.iter().any(|a| a == AUDIENCE))
    {
        return Err(Status::unauthenticated(format!(
            "the token is not issued for audience {AUDIENCE:?}; mount a projected token with that audience"
        )));
    }
    let user = status.user.clone().unwrap_or_default();
    if user.username.as_deref() != Some(expected_user) {
        return Err(Status::permission_denied(format!(
            "{} is not the agent ServiceAccount ({expected_user})",
            user.username.unwrap_or_default(),
        )));
    }
    let claim = |key: &str| {
        user.extra
            .as_ref()
            .and_then(|e| e.get(key))
            .and_then(|v| v.first())
            .cloned()
    };
    let pod_name = claim("authentication.kubernetes.io/pod-name").ok_or_else(|| {
        Status::permission_denied("the token is not bound to a pod; mount a projected token")
    })?;
    Ok((pod_name, claim("authentication.kubernetes.io/pod-uid")))
}

#[tonic::async_trait]
impl Authenticate for TokenReviewAuthenticator {
    async fn authenticate(&self, token: &str) -> Result<AgentIdentity, Status> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_string(),
                audiences: Some(vec![AUDIENCE.to_string()]),
            },
            ..TokenReview::default()
        };
        let reviewed = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| {
                tracing::warn!(error = %e, "TokenReview failed");
                Status::unavailable("could not verify the token right now; retry")
            })?;
        let status = reviewed.status.unwrap_or_default();
        let (pod_name, pod_uid) = reviewed_agent(&status, &self.expected_user)?;
        // The ServiceAccount (and so the pod) lives in the namespace of the username.
        let namespace = self
            .expected_user
            .split(':')
            .nth(2)
            .unwrap_or_default()
            .to_string();
        let pod = Api::<Pod>::namespaced(self.client.clone(), &namespace)
            .get_opt(&pod_name)
            .await
            .map_err(|_| Status::unavailable("could not look up the agent pod; retry"))?
            .ok_or_else(|| {
                Status::permission_denied(format!(
                    "agent pod {namespace}/{pod_name} does not exist"
                ))
            })?;
        if pod_uid.is_some() && pod.metadata.uid != pod_uid {
            return Err(Status::permission_denied("the token's pod was replaced"));
        }
        let node = pod
            .spec
            .and_then(|s| s.node_name)
            .ok_or_else(|| Status::permission_denied("the agent pod is not scheduled on a node"))?;
        Ok(AgentIdentity {
            node,
            pod: format!("{namespace}/{pod_name}"),
        })
    }
}
