//! The ClusterNetworkPolicies evidence is judged against (`policy.networking.k8s.io/v1alpha2`,
//! docs/behaviour.md §3.6), and the ClusterNetworkPolicyProposals whose monitor records violations.
//! The first kind is upstream's, installed by clusters that use it; the second ours, absent after an
//! upgrade that did not apply the CRDs: each watch starts once the API server serves the kind and
//! this controller may list it, and is looked for again every [`LOOK_AGAIN`] until then, so a CRD
//! installed later is picked up without a restart.
//!
//! Evidence waits for such a watch's first list only when the kind is served: a cluster without the
//! CRD never waits for it, and a cluster with it never judges a flow without its tiers.

use super::*;
use std::sync::atomic::AtomicU8;

/// How often a cluster without the kind (or without our permission to list it) is looked at again.
const LOOK_AGAIN: Duration = Duration::from_secs(60);

/// Whether the kind is watched: not looked yet, absent (or not ours to list), or served.
#[derive(Debug, Default)]
pub(super) struct Served(AtomicU8);

impl Served {
    const UNKNOWN: u8 = 0;
    const ABSENT: u8 = 1;
    const WATCHED: u8 = 2;

    fn set(&self, value: u8) {
        self.0.store(value, Ordering::Release);
    }

    /// The cluster serves no such kind (tests that stand in for the watches).
    #[cfg(test)]
    pub(super) fn set_absent(&self) {
        self.set(Self::ABSENT);
    }

    /// The cluster serves the kind and it is watched (tests that stand in for the watch).
    #[cfg(test)]
    pub(super) fn set_watched(&self) {
        self.set(Self::WATCHED);
    }

    /// Whether evidence may be judged as far as this watch goes: the kind is absent, or its store
    /// has listed.
    pub(super) fn listed<K>(&self, store: &Store<K>) -> bool
    where
        K: Resource<DynamicType = ()> + Clone + 'static,
    {
        match self.0.load(Ordering::Acquire) {
            Self::ABSENT => true,
            Self::WATCHED => listed::has_listed(store),
            _ => false,
        }
    }
}

impl StatusSync {
    /// Watches the cluster-scoped kind `K` into `writer` once the API server serves it and we may
    /// list it; `served` says how far it got.
    pub(super) async fn watch_when_served<K>(&self, served: &Served, writer: Writer<K>)
    where
        K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
    {
        let api = Api::<K>::all(self.client.clone());
        let (kind, group) = (K::kind(&()), K::api_version(&()));
        loop {
            match api.list(&kube::api::ListParams::default().limit(1)).await {
                Ok(_) => {
                    served.set(Served::WATCHED);
                    tracing::info!(%kind, %group, "watching a cluster-scoped kind evidence is judged against");
                    run::reflect(api, writer).await;
                    return;
                }
                Err(kube::Error::Api(status)) if status.code == 404 => {
                    tracing::debug!(%kind, "kind not served; looking again later");
                }
                Err(kube::Error::Api(status)) if status.code == 403 => {
                    tracing::warn!(%kind, %group,
                        "served, but this controller may not list it (ClusterRole): flows are \
                         judged without it until it may"
                    );
                }
                Err(error) => {
                    tracing::warn!(%kind, %error, "looking for the kind failed; looking again later");
                    // Unknown stays unknown: evidence keeps waiting rather than judging without.
                    if served.0.load(Ordering::Acquire) == Served::UNKNOWN {
                        tokio::time::sleep(LOOK_AGAIN / 12).await;
                        continue;
                    }
                }
            }
            served.set(Served::ABSENT);
            tokio::time::sleep(LOOK_AGAIN).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Evidence waits for this watch until the kind was looked for, and then only if it is served
    /// and has not listed.
    #[test]
    fn evidence_waits_for_cluster_policies_only_where_they_are_served() {
        let (store, mut writer) = reflector::store::<ClusterNetworkPolicy>();
        let served = Served::default();
        assert!(!served.listed(&store), "not looked for yet");
        served.set(Served::ABSENT);
        assert!(served.listed(&store), "no such kind");
        served.set(Served::WATCHED);
        assert!(!served.listed(&store), "served, not listed");
        writer.apply_watcher_event(&watcher::Event::InitDone);
        assert!(served.listed(&store), "served and listed");
    }
}
