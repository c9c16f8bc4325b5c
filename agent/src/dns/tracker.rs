//! Which names each pod resolved to which addresses, believed only for answers to queries the pod
//! sent: a pending query is keyed by the pod, its socket, the server it asked and the transaction id,
//! and an answer counts only when it matches one (same key, same question). What is believed is kept
//! until the answer's TTL plus a grace. Everything is bounded per pod and per node, with a counter for
//! each refusal. Plain data; times are kernel CLOCK_MONOTONIC durations, the clock the captured
//! messages and connection events carry, so they compare directly. The capture is the caller's.

use super::answer::{DnsError, read_answer};
use simple_dns::{Packet, PacketFlag};
use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

/// A pod, as the caller names it (its UID, or namespace/name).
pub type Pod = Arc<str>;

/// Bounds and times of a [`Tracker`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Queries of one pod waiting for their answer (a pod querying random names cannot take the room of
    /// the others).
    pub pending_per_pod: usize,
    /// Queries waiting on the node.
    pub pending: usize,
    /// How long a query waits for its answer (resolvers retry after 5 s).
    pub query_timeout: Duration,
    /// Resolved addresses kept per pod.
    pub names_per_pod: usize,
    /// Resolved addresses kept on the node.
    pub names: usize,
    /// How long past its TTL an address still counts as resolved from its name (clients cache answers a
    /// little longer than the TTL, and connections open just before it ends).
    pub grace: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            pending_per_pod: 64,
            pending: 8_192,
            query_timeout: Duration::from_secs(5),
            names_per_pod: 1_024,
            names: 100_000,
            grace: Duration::from_secs(30),
        }
    }
}

/// One exchange: the pod's socket, the server it asked and the transaction id.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Exchange {
    pod: Pod,
    client: SocketAddr,
    server: SocketAddr,
    id: u16,
}

/// An address a pod resolved from a name, and until when it counts.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Resolution {
    name: Arc<str>,
    /// When the answer came: a connection before it was not to the name.
    since: Duration,
    until: Duration,
}

/// What was refused or dropped, by reason (for the agent's metrics).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub queries: u64,
    pub answers: u64,
    /// Responses that did not parse or broke a bound ([`DnsError`]).
    pub malformed: u64,
    /// Responses no pending query of the pod matches (unsolicited, late, or spoofed).
    pub unsolicited: u64,
    /// Queries not tracked because the pod's or the node's pending bound was reached.
    pub pending_full: u64,
    /// Resolutions not kept because the pod's or the node's bound was reached.
    pub names_full: u64,
}

/// The node's DNS state. See the module docs.
#[derive(Debug)]
pub struct Tracker {
    limits: Limits,
    pending: HashMap<Exchange, (Arc<str>, Duration)>,
    /// The pending queries in the order they came, for expiry without a scan.
    pending_order: VecDeque<(Duration, Exchange)>,
    pending_of: HashMap<Pod, usize>,
    resolved: HashMap<(Pod, IpAddr), Resolution>,
    resolved_of: HashMap<Pod, usize>,
    counters: Counters,
}

impl Tracker {
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            pending: HashMap::new(),
            pending_order: VecDeque::new(),
            pending_of: HashMap::new(),
            resolved: HashMap::new(),
            resolved_of: HashMap::new(),
            counters: Counters::default(),
        }
    }

    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Addresses held as resolved from a name, over all pods.
    pub fn resolved(&self) -> usize {
        self.resolved.len()
    }

    /// A query `pod` sent from `client` to `server` (`payload`: the DNS message). Queries that are not
    /// one question for a host name are not tracked (their answers will be unsolicited).
    pub fn query(
        &mut self,
        pod: &Pod,
        client: SocketAddr,
        server: SocketAddr,
        payload: &[u8],
        now: Duration,
    ) {
        let Ok(packet) = Packet::parse(payload) else {
            self.counters.malformed += 1;
            return;
        };
        let [question] = packet.questions.as_slice() else {
            return;
        };
        if packet.has_flags(PacketFlag::RESPONSE) {
            return;
        }
        let Ok(name) = super::answer::host_name(&question.qname) else {
            self.counters.malformed += 1;
            return;
        };
        self.counters.queries += 1;
        self.expire_pending(now);
        let key = Exchange {
            pod: pod.clone(),
            client,
            server,
            id: packet.id(),
        };
        let of_pod = self.pending_of.get(pod).copied().unwrap_or(0);
        if !self.pending.contains_key(&key)
            && (of_pod >= self.limits.pending_per_pod || self.pending.len() >= self.limits.pending)
        {
            self.counters.pending_full += 1;
            return;
        }
        self.pending_order.push_back((now, key.clone()));
        if self.pending.insert(key, (name.into(), now)).is_none() {
            *self.pending_of.entry(pod.clone()).or_default() += 1;
        }
    }

    /// An answer `server` sent to `pod`'s socket `client`: the addresses it resolves the pending
    /// query's name to, now believed until their TTL plus the grace. Empty for a negative answer;
    /// an error for a response nothing matches or that is refused.
    pub fn answer(
        &mut self,
        pod: &Pod,
        client: SocketAddr,
        server: SocketAddr,
        payload: &[u8],
        now: Duration,
    ) -> Result<Vec<(IpAddr, Arc<str>)>, Refused> {
        let believed = self.answer_until(pod, client, server, payload, now)?;
        Ok(believed
            .into_iter()
            .map(|(address, name, _)| (address, name))
            .collect())
    }

    /// [`Tracker::answer`], with the time each address is believed until (the TTL plus the grace).
    pub fn answer_until(
        &mut self,
        pod: &Pod,
        client: SocketAddr,
        server: SocketAddr,
        payload: &[u8],
        now: Duration,
    ) -> Result<Vec<(IpAddr, Arc<str>, Duration)>, Refused> {
        let answer = read_answer(payload).map_err(|e| {
            self.counters.malformed += 1;
            Refused::Dns(e)
        })?;
        self.expire_pending(now);
        let key = Exchange {
            pod: pod.clone(),
            client,
            server,
            id: answer.id,
        };
        let asked = match self.pending.get(&key) {
            Some((asked, _)) if **asked == *answer.name => asked.clone(),
            _ => {
                self.counters.unsolicited += 1;
                return Err(Refused::Unsolicited);
            }
        };
        self.forget_pending(&key);
        self.counters.answers += 1;
        let mut believed = Vec::new();
        for (address, ttl) in answer.addresses {
            let until = now + Duration::from_secs(u64::from(ttl)) + self.limits.grace;
            let at = (pod.clone(), address);
            if !self.resolved.contains_key(&at) {
                let of_pod = self.resolved_of.get(pod).copied().unwrap_or(0);
                if of_pod >= self.limits.names_per_pod || self.resolved.len() >= self.limits.names {
                    self.counters.names_full += 1;
                    continue;
                }
                *self.resolved_of.entry(pod.clone()).or_default() += 1;
            }
            // Resolved again while it still counts (from the same name): the pod has known it
            // since the first answer, so connections made between the two stay named.
            let since = match self.resolved.get(&at) {
                Some(held) if held.name == asked && now < held.until => held.since,
                _ => now,
            };
            self.resolved.insert(
                at,
                Resolution {
                    name: asked.clone(),
                    since,
                    until,
                },
            );
            believed.push((address, asked.clone(), until));
        }
        Ok(believed)
    }

    /// The name `pod` resolved `address` from, if a connection at `at` was made to that name: the
    /// answer came before `at`, and its TTL plus the grace had not ended.
    pub fn name_of(&self, pod: &Pod, address: IpAddr, at: Duration) -> Option<&str> {
        self.resolved
            .get(&(pod.clone(), address))
            .filter(|r| r.since <= at && at < r.until)
            .map(|r| &*r.name)
    }

    /// Forgets what no longer counts at `now`: resolutions past their TTL and grace, and queries past
    /// their timeout.
    pub fn expire(&mut self, now: Duration) {
        self.expire_pending(now);
        let ended: Vec<(Pod, IpAddr)> = self
            .resolved
            .iter()
            .filter(|(_, r)| now >= r.until)
            .map(|(at, _)| at.clone())
            .collect();
        for at in ended {
            self.resolved.remove(&at);
            decrement(&mut self.resolved_of, &at.0);
        }
    }

    /// Forgets everything of a pod that is gone.
    pub fn forget_pod(&mut self, pod: &Pod) {
        self.pending.retain(|key, _| key.pod != *pod);
        self.pending_order.retain(|(_, key)| key.pod != *pod);
        self.pending_of.remove(pod);
        self.resolved.retain(|(p, _), _| p != pod);
        self.resolved_of.remove(pod);
    }

    fn expire_pending(&mut self, now: Duration) {
        while let Some((at, _)) = self.pending_order.front() {
            if now.saturating_sub(*at) < self.limits.query_timeout {
                break;
            }
            let Some((at, key)) = self.pending_order.pop_front() else {
                break;
            };
            // A key asked again since is pending from its later time.
            if self
                .pending
                .get(&key)
                .is_some_and(|(_, since)| *since == at)
            {
                self.forget_pending(&key);
            }
        }
    }

    fn forget_pending(&mut self, key: &Exchange) {
        if self.pending.remove(key).is_some() {
            decrement(&mut self.pending_of, &key.pod);
        }
    }
}

fn decrement(counts: &mut HashMap<Pod, usize>, pod: &Pod) {
    if let Some(n) = counts.get_mut(pod) {
        *n -= 1;
        if *n == 0 {
            counts.remove(pod);
        }
    }
}

/// Why an answer was not believed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error(transparent)]
    Dns(#[from] DnsError),
    #[error("no query of the pod waits for this answer (unsolicited, late or spoofed)")]
    Unsolicited,
}
