//! Proposal names and the `promoted-from` label value.
//!
//! A proposal is named `<kind>-<name>-<direction>` (docs/api.md, "Proposal names"), e.g.
//! `deployment-http-client-egress`. Workload names may be up to 253 characters, so that name can exceed
//! what Kubernetes accepts: an object name is at most 253 characters and a label value at most 63. Both
//! are shortened the same deterministic way, keeping what a human reads first and the direction suffix:
//!
//! ```text
//! <head truncated to fit>-<first 10 hex digits of sha256(full name)>-<direction>
//! ```
//!
//! The hash covers the full, unshortened name, so two long names that share a prefix never collide
//! in practice. Names that fit are never changed, so all short names match the reference exactly.

use crate::crd::{Direction, WorkloadKind};
use sha2::{Digest, Sha256};

/// Longest object name Kubernetes accepts (DNS-1123 subdomain).
pub const MAX_NAME_LEN: usize = 253;
/// Longest label value Kubernetes accepts.
pub const MAX_LABEL_VALUE_LEN: usize = 63;
/// Hex digits of the hash appended to shortened names.
const HASH_LEN: usize = 10;

/// The name of the proposal for `workload_name` of `kind` in `direction`, at most
/// [`MAX_NAME_LEN`] characters.
pub fn proposal_name(kind: WorkloadKind, workload_name: &str, direction: Direction) -> String {
    let full = format!(
        "{}-{}{}",
        kind.as_str().to_ascii_lowercase(),
        workload_name,
        direction_suffix(direction)
    );
    shorten(&full, direction_suffix(direction), MAX_NAME_LEN)
}

/// The value of the `promoted-from` label for a proposal name: the name itself when it is at most
/// [`MAX_LABEL_VALUE_LEN`] characters, else its deterministic shortening.
pub fn promoted_from_value(proposal_name: &str) -> String {
    let suffix = [Direction::Ingress, Direction::Egress]
        .into_iter()
        .map(direction_suffix)
        .find(|s| proposal_name.ends_with(s))
        .unwrap_or("");
    shorten(proposal_name, suffix, MAX_LABEL_VALUE_LEN)
}

fn direction_suffix(direction: Direction) -> &'static str {
    match direction {
        Direction::Ingress => "-ingress",
        Direction::Egress => "-egress",
    }
}

/// Shortens `full` to at most `max` characters, keeping `suffix` (which `full` ends with).
fn shorten(full: &str, suffix: &str, max: usize) -> String {
    if full.len() <= max {
        return full.to_string();
    }
    let digest = Sha256::digest(full.as_bytes());
    let hash: String = digest
        .iter()
        .flat_map(|b| [b >> 4, b & 0xf])
        .take(HASH_LEN)
        .map(|n| char::from_digit(u32::from(n), 16).expect("nibble is a hex digit"))
        .collect();
    let head = &full[..full.len() - suffix.len()];
    let room = max - 1 - HASH_LEN - suffix.len();
    // Names are ASCII (DNS-1123); find a char boundary anyway so odd input cannot panic.
    let mut cut = room.min(head.len());
    while !head.is_char_boundary(cut) {
        cut -= 1;
    }
    // The shortened name must stay a valid name/label value: end the head on an alphanumeric.
    let head = head[..cut].trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
    format!("{head}-{hash}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A workload name such that the full proposal name has exactly `len` characters.
    fn workload_name_for(len: usize, kind: WorkloadKind, direction: Direction) -> String {
        let fixed = kind.as_str().len() + 1 + direction_suffix(direction).len();
        "a".repeat(len - fixed)
    }

    fn is_label_value(s: &str) -> bool {
        s.len() <= MAX_LABEL_VALUE_LEN
            && (s.is_empty()
                || (s.starts_with(|c: char| c.is_ascii_alphanumeric())
                    && s.ends_with(|c: char| c.is_ascii_alphanumeric())
                    && s.chars()
                        .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))))
    }

    #[test]
    fn reference_names_are_unchanged() {
        assert_eq!(
            proposal_name(WorkloadKind::Deployment, "http-client", Direction::Egress),
            "deployment-http-client-egress"
        );
        assert_eq!(
            proposal_name(WorkloadKind::Deployment, "http-server", Direction::Ingress),
            "deployment-http-server-ingress"
        );
        assert_eq!(
            proposal_name(WorkloadKind::StatefulSet, "db", Direction::Ingress),
            "statefulset-db-ingress"
        );
        assert_eq!(
            promoted_from_value("deployment-http-client-egress"),
            "deployment-http-client-egress"
        );
    }

    #[test]
    fn object_names_at_the_253_limit() {
        for (len, shortened) in [(252, false), (253, false), (254, true)] {
            for direction in [Direction::Ingress, Direction::Egress] {
                let workload = workload_name_for(len, WorkloadKind::DaemonSet, direction);
                let name = proposal_name(WorkloadKind::DaemonSet, &workload, direction);
                assert!(name.len() <= MAX_NAME_LEN, "{len}: {} chars", name.len());
                assert!(crate::validation::is_dns1123_subdomain(&name), "{name}");
                assert!(name.ends_with(direction_suffix(direction)));
                assert!(name.starts_with("daemonset-aaa"));
                assert_eq!(name.len() != len, shortened, "{len}");
                if shortened {
                    assert_eq!(name.len(), MAX_NAME_LEN);
                }
            }
        }
    }

    #[test]
    fn label_values_at_the_63_limit() {
        for (len, shortened) in [(62, false), (63, false), (64, true)] {
            let workload = workload_name_for(len, WorkloadKind::Deployment, Direction::Egress);
            let name = proposal_name(WorkloadKind::Deployment, &workload, Direction::Egress);
            assert_eq!(name.len(), len, "object name is not shortened below 253");
            let value = promoted_from_value(&name);
            assert!(is_label_value(&value), "{value}");
            assert_eq!(value == name, !shortened, "{len}: {value}");
            assert_eq!(value.len(), len.min(MAX_LABEL_VALUE_LEN));
            assert!(value.ends_with("-egress"));
        }
    }

    #[test]
    fn shortening_is_deterministic_and_distinguishes_names() {
        let a = "x".repeat(300);
        let b = format!("{}y", "x".repeat(299));
        let na = proposal_name(WorkloadKind::Deployment, &a, Direction::Ingress);
        let nb = proposal_name(WorkloadKind::Deployment, &b, Direction::Ingress);
        assert_eq!(
            na,
            proposal_name(WorkloadKind::Deployment, &a, Direction::Ingress)
        );
        assert_ne!(na, nb, "a shared prefix must not collide");
        assert_ne!(promoted_from_value(&na), promoted_from_value(&nb));
    }

    #[test]
    fn truncation_never_ends_the_head_on_a_separator() {
        // Put a '.' and '-' exactly where the cut falls.
        let kind = WorkloadKind::Deployment;
        let room = MAX_LABEL_VALUE_LEN - 1 - HASH_LEN - "-egress".len();
        let mut workload = "b".repeat(room - "deployment-".len() - 2);
        workload.push_str("-.");
        workload.push_str(&"c".repeat(40));
        let name = proposal_name(kind, &workload, Direction::Egress);
        let value = promoted_from_value(&name);
        assert!(is_label_value(&value), "{value}");
        assert!(!value.contains("--") && !value.contains(".-"), "{value}");
    }
}
