//! Label and annotation keys (docs/api.md, "Labels and annotations"). All product keys share the prefix
//! [`PREFIX`].

/// The prefix of every label and annotation key owned by the product, and the CRD API group.
pub const PREFIX: &str = "networkenforcer.kubewarden.io";

/// The API group of the custom resources.
pub const GROUP: &str = PREFIX;

/// Label a user sets on a proposal to promote it: value [`PROMOTE_MONITOR`] or [`PROMOTE_PROTECT`].
pub const PROMOTE_LABEL: &str = "networkenforcer.kubewarden.io/promote";

/// Value of [`PROMOTE_LABEL`] that promotes into a policy in `monitor` mode.
pub const PROMOTE_MONITOR: &str = "monitor";

/// Value of [`PROMOTE_LABEL`] that promotes into a policy in `protect` mode.
pub const PROMOTE_PROTECT: &str = "protect";

/// Label the controller sets on a policy it created by promotion; the value is
/// [`crate::naming::promoted_from_value`] of the proposal name (the proposal name itself when it fits).
pub const PROMOTED_FROM_LABEL: &str = "networkenforcer.kubewarden.io/promoted-from";

/// Prefix of the annotation a user sets on a policy to acknowledge violation `<id>`:
/// `networkenforcer.kubewarden.io/acknowledge-<id>: <reason>`.
pub const ACKNOWLEDGE_ANNOTATION_PREFIX: &str = "networkenforcer.kubewarden.io/acknowledge-";

/// Istio's annotation that makes an AuthorizationPolicy dry-run; set to `"true"` in monitor mode only.
pub const ISTIO_DRY_RUN_ANNOTATION: &str = "istio.io/dry-run";

/// Annotation on every NetworkPolicy and AuthorizationPolicy the controller renders: the
/// `metadata.generation` of the WorkloadNetworkPolicy it was rendered from. Only valid generations are
/// rendered, so a rendering carrying it stays in force while its policy is invalid (docs/api.md).
pub const RENDERED_GENERATION_ANNOTATION: &str =
    "networkenforcer.kubewarden.io/rendered-generation";

/// Annotation the controller sets on every proposal it writes: an HMAC of the proposal's spec under a
/// key only the controller holds. A proposal whose spec does not match it is not promoted (docs/install.md,
/// "Who can promote what").
pub const LEARNED_DIGEST_ANNOTATION: &str = "networkenforcer.kubewarden.io/learned-digest";

/// On a rendered NetworkPolicy: the names of `spec.egressNames` its `ipBlock`s stand for (a
/// NetworkPolicy has no names; the addresses are what the workload's pods resolved them to).
pub const EGRESS_NAMES_ANNOTATION: &str = "networkenforcer.kubewarden.io/egress-names";

/// On a rendered NetworkPolicy: `spec.egressNames` itself, as JSON (`[{"names": [...], "ports": [...]}]`),
/// for the agent's enforcement, which lets a pod reach what it resolved from these names the moment
/// the answer arrives (docs/behaviour.md §4.7). Left out when it would not fit an annotation.
pub const EGRESS_NAME_RULES_ANNOTATION: &str = "networkenforcer.kubewarden.io/egress-name-rules";

/// Annotation on a WorkloadNetworkPolicy (or the proposal it is promoted from): `strict` keeps a protect
/// policy in monitor while replaying the observed traffic shows flows it would block (docs/api.md,
/// "Protect gate").
pub const PROTECT_GATE_ANNOTATION: &str = "networkenforcer.kubewarden.io/protect-gate";

/// The value of [`PROTECT_GATE_ANNOTATION`] that holds a policy.
pub const PROTECT_GATE_STRICT: &str = "strict";

/// The field manager name used for every write the controller makes.
pub const FIELD_MANAGER: &str = "network-enforcer";

/// The well-known namespace-name label Kubernetes sets on every namespace; learned peers select
/// namespaces by it.
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// The message of the chart's ValidatingAdmissionPolicy for a bad promote label value.
pub const PROMOTE_LABEL_MESSAGE: &str =
    r#"networkenforcer.kubewarden.io/promote must be "monitor" or "protect""#;

/// Returns the violation id named by an acknowledge annotation key, `None` for other keys.
/// A key with the prefix but a non-numeric suffix yields `Some(Err(suffix))`, so the caller can
/// report and remove it.
pub fn acknowledged_id(annotation_key: &str) -> Option<Result<i64, &str>> {
    let suffix = annotation_key.strip_prefix(ACKNOWLEDGE_ANNOTATION_PREFIX)?;
    Some(suffix.parse::<i64>().map_err(|_| suffix))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acknowledge_annotation_ids() {
        assert_eq!(
            acknowledged_id("networkenforcer.kubewarden.io/acknowledge-42"),
            Some(Ok(42))
        );
        assert_eq!(
            acknowledged_id("networkenforcer.kubewarden.io/acknowledge-x1"),
            Some(Err("x1"))
        );
        assert_eq!(
            acknowledged_id("networkenforcer.kubewarden.io/promote"),
            None
        );
    }
}
