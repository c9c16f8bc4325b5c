//! The evidence claims ([`super::claims`]) persisted so that a new leader recognises a batch the last
//! one counted when its agent resends it (docs/behaviour.md §1.10): one ConfigMap in the controller's
//! namespace (`--evidence-claims-configmap`), written by the status sync after the statuses and
//! before the acknowledgements of what they counted, read by a new leader before it takes any
//! batch.
//!
//! The ConfigMap holds gzip-compressed JSON of every agent process's judged ranges of sequences
//! ([`Persisted`]); usually one range per process. Past [`MAX_BYTES`] compressed, only each process's
//! highest range is kept (counted as dropped). Beside them, the cursors of the cluster sources the
//! controller reads itself ([`super::source_cursors`]): an optional field, so that a controller of
//! the release before reads the claims and leaves the cursors alone. [`encode`] and [`decode`] are pure; [`ClaimsStore`] is
//! the thin Kubernetes part.

use super::claims::{Persisted, Ranges};
use super::source_cursors::PersistedCursor;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use network_enforcer_api::keys::FIELD_MANAGER;
use std::collections::BTreeMap;

/// The key of the data in the ConfigMap's `binaryData`.
pub const DATA_KEY: &str = "claims.json.gz";
/// The version of the format; data of another version is not read (and is said so).
const FORMAT: u32 = 1;
/// Compressed bytes at most (a ConfigMap holds 1 MiB in all).
pub const MAX_BYTES: usize = 900 * 1024;
/// The data never decompresses to more than this (a damaged ConfigMap cannot make the new leader
/// allocate without bound).
const MAX_DECOMPRESSED: u64 = 32 << 20;

#[derive(serde::Serialize, serde::Deserialize)]
struct Encoded {
    format: u32,
    claims: Vec<Persisted>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    cursors: Vec<PersistedCursor>,
}

/// What the ConfigMap holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stored {
    pub claims: Vec<Persisted>,
    pub cursors: Vec<PersistedCursor>,
}

/// Why persisted claims could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(
        "evidence claims in ConfigMap {name}: {message}; a resent batch the last leader counted may count again"
    )]
    Corrupt { name: String, message: String },
    #[error("{action} ConfigMap {name}: {source}")]
    Api {
        action: &'static str,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("ConfigMap {0}: no answer in time")]
    TimedOut(String),
}

impl StoreError {
    /// The API server refused for lack of permission (the chart's Role names the ConfigMap).
    pub fn is_forbidden(&self) -> bool {
        matches!(self, StoreError::Api { source: kube::Error::Api(status), .. } if status.code == 403)
    }
}

/// `claims` and `cursors` compressed within [`MAX_BYTES`], and how many sequences were left out to
/// fit (the cursors, a few each, always fit).
pub fn encode(claims: &[Persisted], cursors: &[PersistedCursor]) -> (Vec<u8>, u64) {
    let bytes = compress(claims, cursors);
    if bytes.len() <= MAX_BYTES {
        return (bytes, 0);
    }
    // Too many processes or too fragmented: the highest range of each (the newest batches, the ones
    // an agent may still resend).
    let mut dropped = 0;
    let cut: Vec<Persisted> = claims
        .iter()
        .map(|p| {
            let mut ranges = p.ranges.clone();
            dropped += ranges.keep_highest(1);
            Persisted {
                ranges,
                ..p.clone()
            }
        })
        .collect();
    let bytes = compress(&cut, cursors);
    if bytes.len() <= MAX_BYTES {
        return (bytes, dropped);
    }
    let all = claims
        .iter()
        .map(|p| p.ranges.len_sequences())
        .fold(0u64, u64::saturating_add);
    (compress(&[], cursors), all)
}

fn compress(claims: &[Persisted], cursors: &[PersistedCursor]) -> Vec<u8> {
    let json = serde_json::to_vec(&Encoded {
        format: FORMAT,
        claims: claims.to_vec(),
        cursors: cursors.to_vec(),
    })
    .unwrap_or_default();
    crate::runtime::gzip::compress(&json, 4)
}

/// The claims and cursors in `bytes` (read from ConfigMap `name`, for the error).
pub fn decode(name: &str, bytes: &[u8]) -> Result<Stored, StoreError> {
    let corrupt = |message: String| StoreError::Corrupt {
        name: name.to_string(),
        message,
    };
    let json = crate::runtime::gzip::decompress(bytes, MAX_DECOMPRESSED).map_err(corrupt)?;
    let stored: Encoded =
        serde_json::from_slice(&json).map_err(|e| corrupt(format!("not claims: {e}")))?;
    if stored.format != FORMAT {
        return Err(corrupt(format!(
            "format {} (this controller reads {FORMAT})",
            stored.format
        )));
    }
    // Written by hand or damaged: ranges normalised rather than trusted.
    let claims = stored
        .claims
        .into_iter()
        .map(|p| Persisted {
            ranges: Ranges::from_pairs(p.ranges.pairs().iter().copied()),
            ..p
        })
        .collect();
    Ok(Stored {
        claims,
        cursors: stored.cursors,
    })
}

/// The ConfigMap the claims are persisted in (see the module docs).
#[derive(Clone)]
pub struct ClaimsStore {
    api: Api<ConfigMap>,
    name: String,
}

impl std::fmt::Debug for ClaimsStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClaimsStore")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl ClaimsStore {
    /// The store in `namespace` (the controller's own), ConfigMap `name`.
    pub fn new(client: kube::Client, namespace: &str, name: &str) -> Self {
        ClaimsStore {
            api: Api::namespaced(client, namespace),
            name: name.to_string(),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The persisted claims and cursors: none when nothing was persisted yet.
    pub async fn load(&self) -> Result<Stored, StoreError> {
        let map = self
            .api
            .get_opt(&self.name)
            .await
            .map_err(|source| StoreError::Api {
                action: "reading",
                name: self.name.clone(),
                source,
            })?;
        let Some(map) = map else {
            return Ok(Stored::default());
        };
        let Some(bytes) = map.binary_data.as_ref().and_then(|d| d.get(DATA_KEY)) else {
            return Err(StoreError::Corrupt {
                name: self.name.clone(),
                message: format!("no {DATA_KEY}"),
            });
        };
        decode(&self.name, &bytes.0)
    }

    /// Writes `bytes` ([`encode`]).
    pub async fn save(&self, bytes: Vec<u8>) -> Result<(), StoreError> {
        let mut map = ConfigMap {
            binary_data: Some(BTreeMap::from([(DATA_KEY.to_string(), ByteString(bytes))])),
            ..ConfigMap::default()
        };
        map.metadata.name = Some(self.name.clone());
        map.metadata.labels = Some(BTreeMap::from([(
            "app.kubernetes.io/managed-by".to_string(),
            FIELD_MANAGER.to_string(),
        )]));
        let mut object = serde_json::to_value(&map).unwrap_or_default();
        object["apiVersion"] = "v1".into();
        object["kind"] = "ConfigMap".into();
        self.api
            .patch(
                &self.name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&object),
            )
            .await
            .map_err(|source| StoreError::Api {
                action: "writing",
                name: self.name.clone(),
                source,
            })?;
        Ok(())
    }

    /// Deletes the ConfigMap (an uninstall: `cleanup`); returns whether there was one.
    pub async fn remove(&self) -> Result<bool, StoreError> {
        match self.api.delete(&self.name, &Default::default()).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
            Err(source) => Err(StoreError::Api {
                action: "deleting",
                name: self.name.clone(),
                source,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(node: &str, instance: u64, ranges: &[(u64, u64)]) -> Persisted {
        Persisted {
            node: node.into(),
            instance,
            ranges: Ranges::from_pairs(ranges.iter().copied()),
        }
    }

    #[test]
    fn claims_round_trip() {
        let claims = vec![
            entry("a", 1, &[(1, 40), (50, 60)]),
            entry("b", 9, &[(7, 7)]),
        ];
        let cursors = vec![PersistedCursor {
            source: "goldmane/g:7443".into(),
            through: 1_800_000_015,
        }];
        let (bytes, dropped) = encode(&claims, &cursors);
        assert_eq!(dropped, 0);
        assert_eq!(
            decode("x", &bytes).unwrap(),
            Stored {
                claims: claims.clone(),
                cursors
            }
        );
        assert_eq!(decode("x", &encode(&[], &[]).0).unwrap(), Stored::default());
        // What the release before wrote (no cursors) is read; what this one writes without cursors
        // has no such field, as that release wrote it.
        let (bytes, _) = encode(&claims, &[]);
        let json =
            String::from_utf8(crate::runtime::gzip::decompress(&bytes, 1 << 20).unwrap()).unwrap();
        assert!(!json.contains("cursors"), "{json}");
        assert_eq!(decode("x", &bytes).unwrap().claims, claims);
    }

    #[test]
    fn a_thousand_nodes_fit_and_a_fleet_too_fragmented_keeps_each_process_highest_range() {
        let typical: Vec<Persisted> = (0..1_000)
            .flat_map(|n| {
                [1, 2].map(|i| {
                    entry(
                        &format!("node-{n:04}.example.internal"),
                        n * 10 + i,
                        &[(1, 8_000 + n)],
                    )
                })
            })
            .collect();
        let (bytes, dropped) = encode(&typical, &[]);
        assert_eq!(dropped, 0);
        assert!(bytes.len() < 100 * 1024, "{} bytes", bytes.len());

        // 4,000 processes with 16 scattered ranges each: too large whole.
        let ranges = |seed: u64| -> Vec<(u64, u64)> {
            (0..16)
                .map(|r| {
                    let lo =
                        seed.wrapping_mul(2_654_435_761).wrapping_add(r * 1_000_003) % (1 << 40);
                    (lo, lo + r)
                })
                .collect()
        };
        let fragmented: Vec<Persisted> = (0..4_000)
            .map(|n| entry(&format!("node-{n:04}"), n, &ranges(n)))
            .collect();
        let (bytes, dropped) = encode(&fragmented, &[]);
        assert!(bytes.len() <= MAX_BYTES);
        let read = decode("x", &bytes).unwrap().claims;
        let kept: u64 = read
            .iter()
            .flat_map(|p| p.ranges.pairs())
            .map(|(lo, hi)| hi - lo + 1)
            .sum();
        let all: u64 = fragmented
            .iter()
            .flat_map(|p| p.ranges.pairs())
            .map(|(lo, hi)| hi - lo + 1)
            .sum();
        assert_eq!(kept + dropped, all);
        if dropped > 0 {
            assert!(read.iter().all(|p| p.ranges.pairs().len() == 1));
        }
    }

    #[test]
    fn damaged_or_foreign_data_is_refused_and_ranges_are_normalised() {
        for (bytes, says) in [
            (b"not gzip".to_vec(), "not gzip"),
            (gzip(b"{\"format\": 1}"), "not claims"),
            (gzip(b"{\"format\": 2, \"claims\": []}"), "format 2"),
        ] {
            let error = decode("x", &bytes).unwrap_err().to_string();
            assert!(error.contains(says), "{error}");
        }
        let read = decode(
            "x",
            &gzip(br#"{"format": 1, "claims": [{"node": "a", "instance": 1, "ranges": [[9, 5], [1, 4]]}]}"#),
        )
        .unwrap();
        assert_eq!(read.claims, vec![entry("a", 1, &[(1, 9)])]);
    }

    fn gzip(json: &[u8]) -> Vec<u8> {
        crate::runtime::gzip::compress(json, 4)
    }
}
