//! Leader election as `run` uses it: the Lease, readiness that follows leadership (the ingest Service
//! routes agents to the leader only), the wait for the lead, and its loss.

use super::RunArgs;
use crate::reconcile::Settings;
use crate::runtime::http::Component;
use crate::runtime::leader;
use crate::runtime::metrics::ControllerMetrics;
use anyhow::{Context as _, Result};

/// This replica's part in the election; `None` (in [`Election::start`]'s result) when
/// `--leader-elect=false`: a single replica that always leads.
pub struct Election {
    leadership: tokio::sync::watch::Receiver<leader::Leadership>,
    lease: leader::Settings,
}

impl Election {
    /// Starts electing with `--leader-election-lease`, or marks this replica the leader when
    /// election is off.
    pub fn start(
        args: &RunArgs,
        client: &kube::Client,
        settings: &Settings,
        metrics: &ControllerMetrics,
    ) -> Result<Option<Self>> {
        if !args.leader_elect {
            metrics.leader.set(1);
            return Ok(None);
        }
        let identity = settings
            .instance
            .clone()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .context("leader election needs this replica's name: --instance / POD_NAME")?;
        let lease =
            leader::Settings::new(&args.pod_namespace, &args.leader_election_lease, &identity);
        let elector = leader::Elector::new(client.clone(), lease.clone());
        let leadership = elector.subscribe();
        tokio::spawn(elector.run());
        tracing::info!(lease = %lease.name, namespace = %lease.namespace, %identity, "leader election on");
        Ok(Some(Self { leadership, lease }))
    }

    pub fn leadership(&self) -> tokio::sync::watch::Receiver<leader::Leadership> {
        self.leadership.clone()
    }

    /// Lets a successor take over without waiting for the Lease to expire.
    pub async fn release(&self, client: kube::Client) {
        leader::release(client, &self.lease).await;
    }
}

/// Keeps `ingest` ready while this replica leads (always, without an election), and the leader
/// gauge current.
pub async fn readiness(
    election: Option<&Election>,
    ingest: Component,
    serving: String,
    metrics: ControllerMetrics,
) {
    let Some(mut leadership) = election.map(Election::leadership) else {
        ingest.ready(serving);
        return std::future::pending().await;
    };
    loop {
        let now = leadership.borrow_and_update().clone();
        metrics.leader.set(i64::from(now.leader));
        if now.leader {
            ingest.ready(format!("leader; {serving}"));
        } else {
            ingest.not_ready(format!(
                "not the leader (leader: {}); agent streams are refused with UNAVAILABLE",
                now.holder.as_deref().unwrap_or("unknown")
            ));
        }
        if leadership.changed().await.is_err() {
            return std::future::pending().await;
        }
    }
}

/// Returns once this replica leads (at once without an election).
pub async fn until_leading(election: Option<&Election>) {
    if let Some(mut leadership) = election.map(Election::leadership) {
        let _ = leadership.wait_for(|l| l.leader).await;
    }
}

/// Returns once this replica, having led, lost the lead; never without an election.
pub async fn lost(election: Option<&Election>) {
    match election.map(Election::leadership) {
        Some(mut leadership) => {
            let _ = leadership.wait_for(|l| l.leader).await;
            let _ = leadership.wait_for(|l| !l.leader).await;
        }
        None => std::future::pending().await,
    }
}
