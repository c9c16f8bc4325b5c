//! What the policy reconciler does with a policy that breaks a rule of the CRDs (docs/api.md, "Invalid
//! policies"). The rules themselves are [`network_enforcer_api::validation`]; this module holds the
//! decisions around them:
//!
//! - [`Backends`]: the backend each policy had when the controller first saw it, so that the CRDs'
//!   transition rule (`backend` is immutable) can be checked without `oldSelf`.
//! - [`on_invalid`]: whether an object rendered before the policy became invalid stays in force.
//! - [`invalid_message`]: the `Ready=False` message: the rules' messages, then what is in force.

use kube::ResourceExt;
use network_enforcer_api::keys::RENDERED_GENERATION_ANNOTATION;
use network_enforcer_api::validation::{self, Violation};
use network_enforcer_api::{Backend, WorkloadNetworkPolicy};
use std::collections::{BTreeMap, HashMap, HashSet};

/// The `Ready=False` reason (and the Warning Event's reason) of a policy or proposal that breaks a rule.
pub const INVALID_REASON: &str = "Invalid";

/// One [`Backends`] memory, shared by the policy reconciler (which fills it) and the status sync, so
/// both judge validity, and so which policy governs a target, alike.
pub type SharedBackends = std::sync::Arc<std::sync::Mutex<Backends>>;

/// The backend of each policy (by uid) as first seen by this controller process.
///
/// The API server's transition rule compares with the stored object; the controller only sees the
/// new one, so it remembers. The memory is per process: it is seeded from what the policy has
/// rendered (a NetworkPolicy means kubernetes, an AuthorizationPolicy istio), which survives restarts
/// and leader changes; a policy that has rendered nothing (kubernetes in monitor mode) whose backend
/// changes while no controller runs is taken with its new backend.
#[derive(Debug, Default)]
pub struct Backends {
    seen: HashMap<String, Backend>,
}

impl Backends {
    /// The backend remembered for `uid`, if any.
    pub fn remembered(&self, uid: &str) -> Option<Backend> {
        self.seen.get(uid).copied()
    }

    /// The backend to check the policy against: the remembered one, or else the one its rendered
    /// objects show (`rendered`), or else `current`, which is then remembered.
    pub fn previous(&mut self, uid: &str, current: Backend, rendered: Option<Backend>) -> Backend {
        *self
            .seen
            .entry(uid.to_string())
            .or_insert(rendered.unwrap_or(current))
    }

    /// Forgets the policies that no longer exist (`live`: the uids of every policy in scope).
    pub fn retain_live<'a>(&mut self, live: impl IntoIterator<Item = &'a str>) {
        let live: HashSet<&str> = live.into_iter().collect();
        self.seen.retain(|uid, _| live.contains(uid.as_str()));
    }

    /// Whether `policy` passes every rule of the CRDs, its backend checked against the one remembered
    /// for it (none remembered yet: that rule is not checked). The validity the duplicate-target rule
    /// ([`crate::policy::uniqueness`]) goes by, the same in the reconciler and in the monitor; once the
    /// reconciler has checked a policy it agrees with that check.
    pub fn is_valid(&self, policy: &WorkloadNetworkPolicy) -> bool {
        let previous = self.remembered(&policy.uid().unwrap_or_default());
        validation::validate(&policy.spec, previous).is_ok()
    }

    /// How many policies are remembered.
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    /// True when nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }
}

/// What happens to an object the policy rendered earlier, now that the policy is invalid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OnInvalid {
    /// It was rendered from a valid generation of the policy: it stays in force, as it would have on a
    /// cluster that runs the CEL rules (the invalid update would have been refused).
    Keep {
        /// The policy generation it was rendered from.
        generation: String,
    },
    /// It carries no rendered-generation annotation, so an older controller rendered it, possibly from
    /// this very invalid spec (an empty podSelector isolating the whole namespace): it is removed.
    Remove,
}

/// Decides from the rendered object's annotations.
pub fn on_invalid(annotations: Option<&BTreeMap<String, String>>) -> OnInvalid {
    match annotations.and_then(|a| a.get(RENDERED_GENERATION_ANNOTATION)) {
        Some(generation) => OnInvalid::Keep {
            generation: generation.clone(),
        },
        None => OnInvalid::Remove,
    }
}

/// The `Ready=False` message of an invalid policy: the broken rules' messages (the API server's own
/// sentences), then what is still in force (`kept`: e.g. `NetworkPolicy web (generation 3)`).
pub fn invalid_message(violations: &[Violation], kept: &[String]) -> String {
    let rules = validation::describe(violations);
    if kept.is_empty() {
        format!("{rules}. Nothing is rendered until the policy is fixed")
    } else {
        format!(
            "{rules}. The last valid rendering stays in force until the policy is fixed: {}",
            kept.join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use network_enforcer_api::crd::rules;
    use network_enforcer_api::validation::Rule;

    #[test]
    fn the_first_backend_seen_is_remembered_and_seeded_from_renderings() {
        let mut b = Backends::default();
        // Nothing rendered: the current backend is the reference from now on.
        assert_eq!(
            b.previous("a", Backend::Kubernetes, None),
            Backend::Kubernetes
        );
        assert_eq!(b.previous("a", Backend::Istio, None), Backend::Kubernetes);
        // After a restart the rendered NetworkPolicy tells the backend it had.
        assert_eq!(
            b.previous("b", Backend::Istio, Some(Backend::Kubernetes)),
            Backend::Kubernetes
        );
        assert_eq!(b.remembered("b"), Some(Backend::Kubernetes));
        b.retain_live(["b"]);
        assert_eq!(b.remembered("a"), None);
        assert_eq!(b.len(), 1);
    }

    #[test]
    fn renderings_of_a_valid_generation_stay_others_go() {
        let marked =
            BTreeMap::from([(RENDERED_GENERATION_ANNOTATION.to_string(), "3".to_string())]);
        assert_eq!(
            on_invalid(Some(&marked)),
            OnInvalid::Keep {
                generation: "3".into()
            }
        );
        let dry_run = BTreeMap::from([("istio.io/dry-run".to_string(), "true".to_string())]);
        assert_eq!(on_invalid(Some(&dry_run)), OnInvalid::Remove);
        assert_eq!(on_invalid(None), OnInvalid::Remove);
    }

    #[test]
    fn the_message_starts_with_the_rules_and_says_what_is_in_force() {
        let v = [Violation {
            rule: Rule::PodSelectorNotEmpty,
        }];
        let nothing = invalid_message(&v, &[]);
        assert!(
            nothing.starts_with(rules::POD_SELECTOR_NOT_EMPTY_MSG),
            "{nothing}"
        );
        assert!(nothing.ends_with("Nothing is rendered until the policy is fixed"));
        let kept = invalid_message(&v, &["NetworkPolicy web (generation 3)".into()]);
        assert!(
            kept.starts_with(rules::POD_SELECTOR_NOT_EMPTY_MSG),
            "{kept}"
        );
        assert!(kept.ends_with(
            "stays in force until the policy is fixed: NetworkPolicy web (generation 3)"
        ));
    }
}
