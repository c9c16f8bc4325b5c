//! Leader election with a `coordination.k8s.io/v1` Lease, in the manner of client-go's elector.
//!
//! Every replica runs an [`Elector`]: every `retry_period` (2 s) it reads the Lease and
//! - creates it, holding it, when there is none;
//! - renews it (`renewTime`) when it holds it; a leader that could not renew for `renew_deadline` (10 s)
//!   steps down;
//! - takes it over when the holder has not renewed for `lease_duration` (15 s) *as seen on this replica's
//!   clock* (the time the record last changed here, not the holder's timestamp: clocks may disagree), or
//!   when the holder released it.
//!
//! Every write carries the resourceVersion read, so two candidates cannot both win: the loser gets a
//! conflict and stays a follower. What a replica does with leadership is up to the caller: the controller
//! runs its writers and reconcilers only while leading, refuses agent streams when following (see
//! docs/behaviour.md §8.1), and exits when it loses leadership so that it restarts clean.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::PostParams;
use kube::{Api, Client};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Timings and names of the election.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The Lease's namespace (the controller's own).
    pub namespace: String,
    /// The Lease's name.
    pub name: String,
    /// This replica's identity (the pod name).
    pub identity: String,
    /// How long a Lease not renewed still counts as held.
    pub lease_duration: Duration,
    /// How long a leader keeps leading without a successful renewal.
    pub renew_deadline: Duration,
    /// How often the Lease is read and renewed.
    pub retry_period: Duration,
}

impl Settings {
    /// 15 s lease, 10 s renew deadline, 2 s retry period.
    pub fn new(namespace: &str, name: &str, identity: &str) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// Who leads, as this replica knows it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Leadership {
    /// This replica holds the Lease.
    pub leader: bool,
    /// The holder last seen (`None`: nobody, or not read yet).
    pub holder: Option<String>,
}

/// Whether this replica leads, for what must refuse work when it does not (ingest refuses agents'
/// streams: they reconnect to the leader).
pub trait Leading: Send + Sync {
    /// Whether this replica may write (always, without leader election).
    fn is_leader(&self) -> bool;
    /// The leader last seen, for the hint in refusals.
    fn leader_hint(&self) -> Option<String>;
}

/// What to do with the Lease as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// There is no Lease: create it, held by us.
    Create,
    /// We hold it: renew it.
    Renew,
    /// The holder let it expire or released it: take it over.
    TakeOver,
    /// Someone else holds it.
    Follow { holder: String },
}

/// Decides from the Lease's spec and how long its record has been unchanged on our clock. Pure.
pub fn decide(
    spec: Option<&LeaseSpec>,
    identity: &str,
    unchanged_for: Duration,
    lease_duration: Duration,
) -> Decision {
    let Some(spec) = spec else {
        return Decision::Create;
    };
    match spec.holder_identity.as_deref() {
        Some(holder) if holder == identity => Decision::Renew,
        None | Some("") => Decision::TakeOver,
        Some(holder) => {
            let duration = spec
                .lease_duration_seconds
                .map(|s| Duration::from_secs(u64::try_from(s).unwrap_or(0)))
                .unwrap_or(lease_duration);
            if unchanged_for >= duration {
                Decision::TakeOver
            } else {
                Decision::Follow {
                    holder: holder.into(),
                }
            }
        }
    }
}

/// Runs the election for one replica.
pub struct Elector {
    api: Api<Lease>,
    settings: Settings,
    state: watch::Sender<Leadership>,
    /// The record last read (holder, renewTime, transitions) and when it was first seen like that.
    observed: Option<(String, Instant)>,
    last_renewal: Option<Instant>,
}

fn now() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

impl Elector {
    /// An elector; [`Elector::subscribe`] before [`Elector::run`] to follow its state.
    pub fn new(client: Client, settings: Settings) -> Self {
        Self {
            api: Api::namespaced(client, &settings.namespace),
            settings,
            state: watch::Sender::new(Leadership::default()),
            observed: None,
            last_renewal: None,
        }
    }

    /// Leadership changes.
    pub fn subscribe(&self) -> watch::Receiver<Leadership> {
        self.state.subscribe()
    }

    /// Runs until the process ends (abort the task to stop; [`release`] hands the Lease over at once).
    pub async fn run(mut self) {
        loop {
            self.round().await;
            tokio::time::sleep(self.settings.retry_period).await;
        }
    }

    fn publish(&self, leader: bool, holder: Option<String>) {
        let next = Leadership { leader, holder };
        self.state.send_if_modified(|current| {
            if *current == next {
                return false;
            }
            if current.leader != next.leader {
                if next.leader {
                    tracing::info!(lease = %self.settings.name, identity = %self.settings.identity, "became the leader");
                } else {
                    tracing::warn!(lease = %self.settings.name, holder = ?next.holder, "not the leader any more");
                }
            }
            *current = next;
            true
        });
    }

    /// One read-decide-write round.
    async fn round(&mut self) {
        let lease = match self.api.get_opt(&self.settings.name).await {
            Ok(lease) => lease,
            Err(error) => {
                tracing::warn!(%error, lease = %self.settings.name, "reading the leader Lease failed");
                self.check_deadline();
                return;
            }
        };
        let spec = lease.as_ref().and_then(|l| l.spec.clone());
        let record = format!(
            "{:?}/{:?}/{:?}",
            spec.as_ref().and_then(|s| s.holder_identity.clone()),
            spec.as_ref().and_then(|s| s.renew_time.clone()),
            spec.as_ref().and_then(|s| s.lease_transitions)
        );
        let unchanged_for = match &self.observed {
            Some((seen, since)) if *seen == record => since.elapsed(),
            _ => {
                self.observed = Some((record, Instant::now()));
                Duration::ZERO
            }
        };
        let decision = decide(
            spec.as_ref(),
            &self.settings.identity,
            unchanged_for,
            self.settings.lease_duration,
        );
        let seconds = i32::try_from(self.settings.lease_duration.as_secs()).unwrap_or(15);
        let params = PostParams::default();
        let me = Some(self.settings.identity.clone());
        let result = match (&decision, lease) {
            (Decision::Create, _) => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.settings.name.clone()),
                        namespace: Some(self.settings.namespace.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(LeaseSpec {
                        holder_identity: me.clone(),
                        lease_duration_seconds: Some(seconds),
                        acquire_time: Some(now()),
                        renew_time: Some(now()),
                        lease_transitions: Some(0),
                        ..LeaseSpec::default()
                    }),
                };
                self.api.create(&params, &lease).await.map(drop)
            }
            (Decision::Renew | Decision::TakeOver, Some(mut lease)) => {
                let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
                if decision == Decision::TakeOver {
                    spec.holder_identity = me.clone();
                    spec.acquire_time = Some(now());
                    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
                }
                spec.lease_duration_seconds = Some(seconds);
                spec.renew_time = Some(now());
                // resourceVersion stays as read: a concurrent writer makes this a 409.
                self.api
                    .replace(&self.settings.name, &params, &lease)
                    .await
                    .map(drop)
            }
            (Decision::Follow { holder }, _) => {
                self.last_renewal = None;
                self.publish(false, Some(holder.clone()));
                return;
            }
            (_, None) => return,
        };
        match result {
            Ok(()) => {
                self.last_renewal = Some(Instant::now());
                self.observed = None;
                self.publish(true, me);
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {
                // Someone else wrote first: read again next round.
                self.check_deadline();
            }
            Err(error) => {
                tracing::warn!(%error, ?decision, lease = %self.settings.name, "writing the leader Lease failed");
                self.check_deadline();
            }
        }
    }

    /// A leader that has not renewed within the deadline steps down.
    fn check_deadline(&mut self) {
        let expired = self
            .last_renewal
            .is_none_or(|at| at.elapsed() >= self.settings.renew_deadline);
        if expired {
            self.last_renewal = None;
            let holder = self.state.borrow().holder.clone();
            self.publish(false, holder);
        }
    }
}

/// Gives the Lease up (holder cleared) if `identity` holds it, so a successor need not wait for it to
/// expire. Best effort: on error, the Lease expires on its own.
pub async fn release(client: Client, settings: &Settings) {
    let api: Api<Lease> = Api::namespaced(client, &settings.namespace);
    let Ok(Some(mut lease)) = api.get_opt(&settings.name).await else {
        return;
    };
    let Some(spec) = lease.spec.as_mut() else {
        return;
    };
    if spec.holder_identity.as_deref() != Some(settings.identity.as_str()) {
        return;
    }
    spec.holder_identity = None;
    spec.renew_time = Some(now());
    if let Err(error) = api
        .replace(&settings.name, &PostParams::default(), &lease)
        .await
    {
        tracing::warn!(%error, "releasing the leader Lease failed; it expires on its own");
    } else {
        tracing::info!(lease = %settings.name, "released the leader Lease");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held_by(holder: Option<&str>) -> LeaseSpec {
        LeaseSpec {
            holder_identity: holder.map(Into::into),
            lease_duration_seconds: Some(15),
            ..LeaseSpec::default()
        }
    }

    #[test]
    fn decisions() {
        let d = Duration::from_secs(15);
        assert_eq!(decide(None, "a", Duration::ZERO, d), Decision::Create);
        let mine = held_by(Some("a"));
        assert_eq!(
            decide(Some(&mine), "a", Duration::from_secs(60), d),
            Decision::Renew
        );
        let theirs = held_by(Some("b"));
        assert_eq!(
            decide(Some(&theirs), "a", Duration::from_secs(14), d),
            Decision::Follow { holder: "b".into() }
        );
        assert_eq!(
            decide(Some(&theirs), "a", Duration::from_secs(15), d),
            Decision::TakeOver,
            "not renewed for a whole lease duration on our clock"
        );
        assert_eq!(
            decide(Some(&held_by(None)), "a", Duration::ZERO, d),
            Decision::TakeOver,
            "released"
        );
        let short = LeaseSpec {
            lease_duration_seconds: Some(5),
            ..theirs
        };
        assert_eq!(
            decide(Some(&short), "a", Duration::from_secs(6), d),
            Decision::TakeOver,
            "the Lease's own duration counts"
        );
    }
}
