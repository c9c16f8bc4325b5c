//! The protect gate's edge history, persisted so that a new leader answers as the last one did
//! (docs/behaviour.md §3.11): the leader writes the history every `--edge-history-persist-interval`
//! (and once more on its way out) into ConfigMaps of its own namespace, `<prefix>-0` … `<prefix>-N`;
//! a controller that becomes the leader reads them before it judges any evidence.
//!
//! Each ConfigMap holds one shard: gzip-compressed JSON of a workload table and rows that name
//! workloads by their place in it (a workload has many edges). Shards are cut to
//! [`Limits::shard_bytes`] (a ConfigMap holds at most 1 MiB) and there are at most
//! [`Limits::max_shards`]; past that the least recently seen edges are not persisted (counted).
//! Shard 0 says how many shards the last write made, so a reader never takes in a stale shard a
//! larger history left behind.
//!
//! [`encode`] and [`decode`] are pure; [`HistoryStore`] is the thin Kubernetes part.

use crate::monitor::edge_history::{EdgeStats, StoredEdge};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use network_enforcer_api::keys::FIELD_MANAGER;
use network_enforcer_api::{Protocol, WorkloadRef};
use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

/// The key of a shard's data in its ConfigMap's `binaryData`.
pub const DATA_KEY: &str = "edges.json.gz";
/// The annotation of shard 0 that says how many shards the last write made.
pub const SHARDS_ANNOTATION: &str = "networkenforcer.kubewarden.io/edge-history-shards";
/// The version of the shard format; a shard of another version is not read (and is said so).
const FORMAT: u32 = 1;
/// A shard never decompresses to more than this: a damaged or hostile ConfigMap cannot make the
/// new leader allocate without bound.
/// (A full shard of the bench's history decompresses to about 13 MiB.)
const MAX_DECOMPRESSED: u64 = 32 << 20;

/// Bounds of what is persisted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Compressed bytes per shard at most (a ConfigMap holds 1 MiB in all).
    pub shard_bytes: usize,
    /// Shards (ConfigMaps) at most; the chart's RBAC names each one.
    pub max_shards: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            shard_bytes: 900 * 1024,
            max_shards: 8,
        }
    }
}

/// Why persisted history could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("edge history shard {shard}: {message}; the gate starts from the violation records")]
    Corrupt { shard: usize, message: String },
    #[error("{action} ConfigMap {name}: {source}")]
    Api {
        action: &'static str,
        name: String,
        #[source]
        source: kube::Error,
    },
}

/// The history cut into shards by [`encode`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Encoded {
    /// Each shard's compressed bytes, shard 0 first.
    pub shards: Vec<Vec<u8>>,
    /// Edges in the shards.
    pub edges: usize,
    /// Edges left out by [`Limits::max_shards`] (the least recently seen).
    pub cut: usize,
}

/// One shard as JSON.
#[derive(serde::Serialize, serde::Deserialize)]
struct Shard<W> {
    format: u32,
    workloads: Vec<W>,
    edges: Vec<Row>,
}

/// An edge of a shard: source (workload index, address), destination (the same), protocol, port,
/// the name the destination was resolved from, first seen, last seen (ms), count, to the API server.
#[derive(serde::Serialize, serde::Deserialize)]
struct Row(
    u32,
    Option<IpAddr>,
    u32,
    Option<IpAddr>,
    Protocol,
    u16,
    Option<String>,
    i64,
    i64,
    u64,
    bool,
);

/// Cuts `edges` (most recently seen first, as [`crate::monitor::edge_history::EdgeHistory::export`]
/// gives them) into shards within `limits`.
pub fn encode(edges: &[StoredEdge], limits: Limits) -> Encoded {
    let mut encoded = Encoded::default();
    let mut rest = edges;
    // A first guess of edges per shard; then sized from the bytes per edge the last shard took, aiming
    // at nine tenths of the bound, and halved while a shard comes out too large.
    let mut per_shard = 20_000usize;
    while !rest.is_empty() && encoded.shards.len() < limits.max_shards {
        let take = per_shard.clamp(1, rest.len());
        let bytes = compress(&rest[..take]);
        if bytes.len() > limits.shard_bytes && take > 1 {
            per_shard = take / 2;
            continue;
        }
        if bytes.len() > limits.shard_bytes {
            // One edge alone does not fit (a limit far too small): nothing more can be written.
            break;
        }
        let per_edge = bytes.len().max(1) as f64 / take as f64;
        per_shard = ((limits.shard_bytes as f64 * 0.9) / per_edge) as usize;
        encoded.shards.push(bytes);
        encoded.edges += take;
        rest = &rest[take..];
    }
    encoded.cut = rest.len();
    encoded
}

fn compress<'a>(edges: &'a [StoredEdge]) -> Vec<u8> {
    let mut workloads: Vec<&'a WorkloadRef> = Vec::new();
    // By the shared name's address: the history hands out one allocation per name.
    let mut place: HashMap<usize, u32> = HashMap::new();
    let mut index_of = |workload: &'a Arc<WorkloadRef>| {
        *place
            .entry(Arc::as_ptr(workload) as usize)
            .or_insert_with(|| {
                workloads.push(&**workload);
                u32::try_from(workloads.len() - 1).unwrap_or(u32::MAX)
            })
    };
    let rows: Vec<Row> = edges
        .iter()
        .map(|e| {
            let (s, d) = (index_of(&e.source), index_of(&e.destination));
            Row(
                s,
                e.source_ip,
                d,
                e.destination_ip,
                e.protocol,
                e.port,
                e.peer_name.clone(),
                e.stats.first_seen_ms,
                e.stats.last_seen_ms,
                e.stats.count,
                e.stats.to_api_server,
            )
        })
        .collect();
    let shard = Shard {
        format: FORMAT,
        workloads,
        edges: rows,
    };
    // The JSON whole first: serde_json writes a token at a time, and each small write into the
    // compressor costs a call of its own (`cargo xtask bench edge_history`: 9.1 s for 1M edges that way, 0.19 s this way).
    let json = serde_json::to_vec(&shard).unwrap_or_default();
    crate::runtime::gzip::compress(&json, 8)
}

/// The edges of shard number `shard` (for the error only) from its compressed `bytes`.
pub fn decode(shard: usize, bytes: &[u8]) -> Result<Vec<StoredEdge>, StoreError> {
    let corrupt = |message: String| StoreError::Corrupt { shard, message };
    let json = crate::runtime::gzip::decompress(bytes, MAX_DECOMPRESSED).map_err(corrupt)?;
    let parsed: Shard<WorkloadRef> =
        serde_json::from_slice(&json).map_err(|e| corrupt(format!("not a shard: {e}")))?;
    if parsed.format != FORMAT {
        return Err(corrupt(format!(
            "format {} (this controller reads {FORMAT})",
            parsed.format
        )));
    }
    let table: Vec<Arc<WorkloadRef>> = parsed.workloads.into_iter().map(Arc::new).collect();
    let workload = |i: u32| {
        table
            .get(i as usize)
            .cloned()
            .ok_or_else(|| corrupt(format!("workload {i} is not in the shard's table")))
    };
    parsed
        .edges
        .iter()
        .map(
            |Row(s, sip, d, dip, protocol, port, name, first, last, count, api)| {
                Ok(StoredEdge {
                    source: workload(*s)?,
                    source_ip: *sip,
                    destination: workload(*d)?,
                    destination_ip: *dip,
                    protocol: *protocol,
                    port: *port,
                    peer_name: name.clone(),
                    stats: EdgeStats {
                        first_seen_ms: *first,
                        last_seen_ms: *last,
                        count: *count,
                        to_api_server: *api,
                    },
                })
            },
        )
        .collect()
}

/// The ConfigMaps the history is persisted in (see the module docs).
#[derive(Clone)]
pub struct HistoryStore {
    api: Api<ConfigMap>,
    prefix: String,
    pub limits: Limits,
}

impl std::fmt::Debug for HistoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HistoryStore")
            .field("prefix", &self.prefix)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl HistoryStore {
    /// The store in `namespace` (the controller's own), ConfigMaps named `<prefix>-<n>`.
    pub fn new(client: kube::Client, namespace: &str, prefix: &str, limits: Limits) -> Self {
        HistoryStore {
            api: Api::namespaced(client, namespace),
            prefix: prefix.to_string(),
            limits,
        }
    }

    fn name(&self, shard: usize) -> String {
        format!("{}-{shard}", self.prefix)
    }

    /// The persisted edges: none when nothing was persisted yet. A shard that cannot be read is an
    /// error for that shard only; the others are still taken in (returned with the errors).
    pub async fn load(&self) -> Result<(Vec<StoredEdge>, Vec<StoreError>), StoreError> {
        let first = self.name(0);
        let Some(zero) = self
            .api
            .get_opt(&first)
            .await
            .map_err(|source| StoreError::Api {
                action: "reading",
                name: first.clone(),
                source,
            })?
        else {
            return Ok((Vec::new(), Vec::new()));
        };
        let count = zero
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(SHARDS_ANNOTATION))
            .and_then(|n| n.parse::<usize>().ok())
            .unwrap_or(1)
            .min(self.limits.max_shards.max(1));
        let (mut edges, mut errors) = (Vec::new(), Vec::new());
        for shard in 0..count {
            let map = if shard == 0 {
                Some(zero.clone())
            } else {
                let name = self.name(shard);
                match self.api.get_opt(&name).await {
                    Ok(map) => map,
                    Err(source) => {
                        errors.push(StoreError::Api {
                            action: "reading",
                            name,
                            source,
                        });
                        continue;
                    }
                }
            };
            let Some(bytes) = map
                .as_ref()
                .and_then(|m| m.binary_data.as_ref())
                .and_then(|d| d.get(DATA_KEY))
            else {
                errors.push(StoreError::Corrupt {
                    shard,
                    message: format!("no {DATA_KEY} in ConfigMap {}", self.name(shard)),
                });
                continue;
            };
            match decode(shard, &bytes.0) {
                Ok(mut read) => edges.append(&mut read),
                Err(error) => errors.push(error),
            }
        }
        Ok((edges, errors))
    }

    /// Deletes every shard (an uninstall: `cleanup`); returns how many there were.
    pub async fn remove(&self) -> Result<usize, StoreError> {
        let mut removed = 0;
        for shard in 0..self.limits.max_shards {
            let name = self.name(shard);
            match self.api.delete(&name, &Default::default()).await {
                Ok(_) => removed += 1,
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(source) => {
                    return Err(StoreError::Api {
                        action: "deleting",
                        name,
                        source,
                    });
                }
            }
        }
        Ok(removed)
    }

    /// Writes `encoded`: the other shards first, shard 0 (which says how many there are) last, so
    /// that a reader never counts a shard this write has not made yet.
    pub async fn save(&self, encoded: &Encoded) -> Result<(), StoreError> {
        let shards = encoded.shards.len().max(1);
        for shard in (0..shards).rev() {
            let name = self.name(shard);
            let bytes = encoded.shards.get(shard).cloned().unwrap_or_default();
            let mut map = ConfigMap {
                binary_data: Some(BTreeMap::from([(DATA_KEY.to_string(), ByteString(bytes))])),
                ..ConfigMap::default()
            };
            map.metadata.name = Some(name.clone());
            map.metadata.labels = Some(BTreeMap::from([(
                "app.kubernetes.io/managed-by".to_string(),
                FIELD_MANAGER.to_string(),
            )]));
            if shard == 0 {
                map.metadata.annotations = Some(BTreeMap::from([(
                    SHARDS_ANNOTATION.to_string(),
                    encoded.shards.len().to_string(),
                )]));
            }
            let mut object = serde_json::to_value(&map).unwrap_or_default();
            object["apiVersion"] = "v1".into();
            object["kind"] = "ConfigMap".into();
            self.api
                .patch(
                    &name,
                    &PatchParams::apply(FIELD_MANAGER).force(),
                    &Patch::Apply(&object),
                )
                .await
                .map_err(|source| StoreError::Api {
                    action: "writing",
                    name: name.clone(),
                    source,
                })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
