//! Provenance of proposals (docs/install.md, "Who can promote what"): only what the controller learned is
//! promoted.
//!
//! Promotion creates NetworkPolicies / AuthorizationPolicies with the controller's rights. Without a
//! check, anyone allowed to write a proposal in a namespace could write any rules into it (or create
//! one by hand) and have it promoted. So the controller signs the spec of every proposal it writes:
//! the annotation [`LEARNED_DIGEST_ANNOTATION`] holds an HMAC-SHA256 of the spec under a key only the
//! controller reads (a Secret the chart creates in the release namespace). A proposal whose
//! annotation is missing or does not match its spec was written or edited by someone else: it is not
//! promoted, and learning does not write into it (that would sign the foreign rules); deleting it lets
//! learning write it again. Field managers or labels would not do: any writer can choose them.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use network_enforcer_api::WorkloadNetworkPolicyProposal;
use network_enforcer_api::WorkloadNetworkPolicyProposalSpec;
use network_enforcer_api::keys::LEARNED_DIGEST_ANNOTATION;
use ring::hmac;
use std::path::Path;

/// The shortest key accepted, in bytes.
pub const MIN_KEY_BYTES: usize = 32;

/// What a proposal's signature says about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Provenance {
    /// Its spec is what the controller wrote.
    Learned,
    /// It has no signature: created by hand (or by a controller older than signing).
    Unsigned,
    /// Its spec changed after the controller wrote it (or the signature was forged).
    Edited,
}

impl Provenance {
    /// The `Promoted=False` reason of a proposal that is not [`Provenance::Learned`].
    pub fn reason(self) -> &'static str {
        match self {
            Provenance::Learned => "Learned",
            Provenance::Unsigned => "NotLearned",
            Provenance::Edited => "EditedAfterLearning",
        }
    }

    /// Why it is not promoted, and what to do.
    pub fn message(self) -> &'static str {
        match self {
            Provenance::Learned => "the spec is what the controller learned",
            Provenance::Unsigned => {
                "the proposal was not written by the controller (no learned-digest annotation), so it is \
                 not promoted; write a WorkloadNetworkPolicy instead, or delete the proposal so that \
                 learning writes it again"
            }
            Provenance::Edited => {
                "the proposal's spec changed after the controller wrote it, so it is not promoted and \
                 learning no longer writes into it; delete it so that learning writes it again, and edit \
                 the WorkloadNetworkPolicy after promotion instead"
            }
        }
    }
}

/// Why the signing key could not be used.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("reading the proposal signing key {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error(
        "the proposal signing key {path} has {len} bytes; it needs at least {MIN_KEY_BYTES} \
         (the chart generates one; or `head -c 48 /dev/urandom | base64`)"
    )]
    TooShort { path: String, len: usize },
}

/// The key proposals are signed with.
pub struct SigningKey(hmac::Key);

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SigningKey(..)")
    }
}

impl SigningKey {
    /// A key from its bytes (whitespace around them ignored).
    pub fn new(bytes: &[u8]) -> Option<Self> {
        let bytes = bytes.trim_ascii();
        (bytes.len() >= MIN_KEY_BYTES).then(|| Self(hmac::Key::new(hmac::HMAC_SHA256, bytes)))
    }

    /// Reads the key file (a mounted Secret).
    pub fn from_file(path: &Path) -> Result<Self, KeyError> {
        let bytes = std::fs::read(path).map_err(|source| KeyError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::new(&bytes).ok_or_else(|| KeyError::TooShort {
            path: path.display().to_string(),
            len: bytes.trim_ascii().len(),
        })
    }

    /// The signature of `spec`, as the annotation holds it.
    pub fn sign(&self, spec: &WorkloadNetworkPolicyProposalSpec) -> String {
        self.sign_spec(spec)
    }

    /// The signature of any proposal's spec (a ClusterNetworkPolicyProposal's too).
    pub fn sign_spec<S: serde::Serialize>(&self, spec: &S) -> String {
        let tag = hmac::sign(&self.0, &canonical(spec));
        hex(tag.as_ref())
    }

    /// Signs `proposal`'s spec into its annotation.
    pub fn sign_into(&self, proposal: &mut WorkloadNetworkPolicyProposal) {
        let signature = self.sign(&proposal.spec);
        proposal
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(LEARNED_DIGEST_ANNOTATION.to_string(), signature);
    }

    /// Whether `proposal`'s spec is what the controller signed.
    pub fn check(&self, proposal: &WorkloadNetworkPolicyProposal) -> Provenance {
        self.check_spec(&proposal.metadata, &proposal.spec)
    }

    /// Whether `spec` is what the controller signed into the annotation of `metadata`.
    pub fn check_spec<S: serde::Serialize>(&self, metadata: &ObjectMeta, spec: &S) -> Provenance {
        let Some(signature) = metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(LEARNED_DIGEST_ANNOTATION))
        else {
            return Provenance::Unsigned;
        };
        let Some(tag) = unhex(signature) else {
            return Provenance::Edited;
        };
        // Constant time: the signature is attacker-chosen.
        match hmac::verify(&self.0, &canonical(spec), &tag) {
            Ok(()) => Provenance::Learned,
            Err(_) => Provenance::Edited,
        }
    }
}

/// The bytes signed: the spec as JSON. The same typed value always serializes alike (struct fields in
/// declaration order, maps sorted), and the proposal CRD sets no defaults, so the object read back from
/// the API server gives the same bytes as the one written.
fn canonical<S: serde::Serialize>(spec: &S) -> Vec<u8> {
    serde_json::to_vec(spec).unwrap_or_default()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || text.len() > 128 {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn proposal(port: i64) -> WorkloadNetworkPolicyProposal {
        serde_json::from_value(json!({
            "apiVersion": "networkenforcer.kubewarden.io/v1alpha1",
            "kind": "WorkloadNetworkPolicyProposal",
            "metadata": {"name": "deployment-web-ingress", "namespace": "shop"},
            "spec": {
                "backend": "kubernetes",
                "direction": "Ingress",
                "targetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
                "kubernetes": {"ingress": [{"ports": [{"protocol": "TCP", "port": port}]}]}
            }
        }))
        .unwrap()
    }

    #[test]
    fn only_the_signed_spec_is_learned() {
        let key = SigningKey::new(&[7u8; 32]).unwrap();
        let other = SigningKey::new(&[8u8; 32]).unwrap();
        let mut signed = proposal(8080);
        key.sign_into(&mut signed);
        let mut edited = signed.clone();
        edited.spec = proposal(1).spec;
        let mut forged = proposal(1);
        other.sign_into(&mut forged);
        let mut garbage = proposal(8080);
        garbage.metadata.annotations =
            Some([(LEARNED_DIGEST_ANNOTATION.to_string(), "zz".repeat(40))].into());
        // (proposal, provenance)
        let cases = [
            (signed.clone(), Provenance::Learned),
            (proposal(8080), Provenance::Unsigned),
            (edited, Provenance::Edited),
            (forged, Provenance::Edited),
            (garbage, Provenance::Edited),
        ];
        for (i, (p, expected)) in cases.iter().enumerate() {
            assert_eq!(key.check(p), *expected, "case {i}");
        }
        // Read back through JSON (as from the API server): still learned.
        let round_trip: WorkloadNetworkPolicyProposal =
            serde_json::from_str(&serde_json::to_string(&signed).unwrap()).unwrap();
        assert_eq!(key.check(&round_trip), Provenance::Learned);
    }

    #[test]
    fn keys_must_be_long_enough() {
        assert!(SigningKey::new(&[1u8; MIN_KEY_BYTES - 1]).is_none());
        assert!(SigningKey::new(b"  short  ").is_none());
        assert!(SigningKey::new(&[1u8; MIN_KEY_BYTES]).is_some());
        let missing = SigningKey::from_file(Path::new("/nonexistent/key")).unwrap_err();
        assert!(
            missing.to_string().contains("/nonexistent/key"),
            "{missing}"
        );
    }

    #[test]
    fn hex_round_trips_and_refuses_junk() {
        assert_eq!(
            unhex(&hex(&[0, 1, 0xab, 0xff])),
            Some(vec![0, 1, 0xab, 0xff])
        );
        for junk in ["0", "zz", "é0", &"00".repeat(65)] {
            assert_eq!(unhex(junk), None, "{junk:?}");
        }
    }
}
