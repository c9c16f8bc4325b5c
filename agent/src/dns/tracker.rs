//! Which names each pod resolved to which addresses, believed only for answers to queries the pod
//! sent: a pending query is keyed by the pod, its socket, the server it asked and the transaction id,
//! and an answer counts only when it matches one (same key, same question). What is believed is kept
//! until the answer's TTL plus a grace. Everything is bounded per pod and per node, with a counter for
//! each refusal. Plain data; times are kernel CLOCK_MONOTONIC durations, the clock the captured
//! messages and connection events carry, so they compare directly. The capture is the caller's.

use super::answer::{self, DnsError};
use super::wire::{self, Message};
use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet, VecDeque};
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
    /// At a bound, forget the oldest pending query (of the pod, or of the node) to note the new one,
    /// instead of not noting the new one. For a tracker that does not see every answer (the DNS
    /// hold's: answers with nothing new pass it by), whose pending queries would otherwise fill it.
    pub replace_oldest_pending: bool,
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
            replace_oldest_pending: false,
        }
    }
}

/// Names added to the tracker's set between two sweeps of the names nobody holds
/// ([`Tracker::intern`]).
pub(super) const NAMES_SLACK: usize = 4_096;

/// The maps' hasher: fast on the small keys, keyed at random per process (the keys are partly chosen
/// by the pods: ports, transaction ids, addresses).
type Hasher = ahash::RandomState;

/// A pod's number within the tracker ([`Slot`]): the maps key on it rather than on the pod's UID, so
/// an exchange hashes the UID once.
type PodId = u32;

/// One exchange: the pod's socket, the server it asked and the transaction id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Exchange {
    pod: PodId,
    client: SocketAddr,
    server: SocketAddr,
    id: u16,
}

/// A pod with something held: its pending queries and resolved addresses. A pod with neither has no
/// slot (its number is reused), so the tracker stays bounded as pods come and go.
#[derive(Debug, Default)]
struct Slot {
    pod: Option<Pod>,
    pending: usize,
    resolved: usize,
    /// With [`Limits::replace_oldest_pending`], the pod's entries of `pending_order`, oldest first
    /// (some answered or asked again since): its oldest pending query is found without a scan.
    order: VecDeque<(Duration, Exchange)>,
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
    /// Pending queries forgotten for a newer one ([`Limits::replace_oldest_pending`]).
    pub pending_replaced: u64,
    /// Resolutions not kept because the pod's or the node's bound was reached.
    pub names_full: u64,
}

/// The node's DNS state. See the module docs.
#[derive(Debug)]
pub struct Tracker {
    limits: Limits,
    pending: HashMap<Exchange, (Arc<str>, Duration), Hasher>,
    /// The pending queries in the order they came, for expiry without a scan. An entry of a pod whose
    /// number was reused since matches no pending query of the new pod unless that one is as old (and
    /// so expires with it).
    pending_order: VecDeque<(Duration, Exchange)>,
    resolved: HashMap<(PodId, IpAddr), Resolution, Hasher>,
    /// The names pending queries and resolutions hold, one allocation per name: a query takes the
    /// name it asks from here, and a resolution answered again compares its name by address.
    /// Names nobody holds any more (here or in what the caller kept of the answers) are dropped by
    /// [`Tracker::expire`], or once [`NAMES_SLACK`] names were added since the last sweep.
    names: HashSet<Arc<str>, Hasher>,
    /// The size of `names` at which it is swept next: what the last sweep kept plus the slack, so a
    /// sweep costs a constant per name added, whoever holds the names.
    sweep_names_at: usize,
    /// Sweeps of `names` so far (for the tests).
    name_sweeps: usize,
    /// The pods' numbers, and their slots (by number) with the numbers free for reuse.
    ids: HashMap<Pod, PodId, Hasher>,
    slots: Vec<Slot>,
    free: Vec<PodId>,
    counters: Counters,
}

impl Tracker {
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            pending: HashMap::default(),
            pending_order: VecDeque::new(),
            resolved: HashMap::default(),
            names: HashSet::default(),
            sweep_names_at: NAMES_SLACK,
            name_sweeps: 0,
            ids: HashMap::default(),
            slots: Vec::new(),
            free: Vec::new(),
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
        let Ok(message) = Message::parse(payload) else {
            self.counters.malformed += 1;
            return;
        };
        let (1, Some(question)) = (message.questions, message.question()) else {
            return;
        };
        if message.is_response() {
            return;
        }
        let mut text = [0u8; answer::MAX_NAME_LEN];
        let Ok(asked) = answer::lower_host_name(&question, &mut text) else {
            self.counters.malformed += 1;
            return;
        };
        self.counters.queries += 1;
        self.expire_pending(now);
        let limits = (self.limits.pending_per_pod, self.limits.pending);
        let full = |of_pod: usize, pending: usize| of_pod >= limits.0 || pending >= limits.1;
        let slot = match self.ids.get(pod) {
            Some(&slot) => slot,
            // Nothing of the pod is held: the query is new.
            None if full(0, self.pending.len()) && !self.limits.replace_oldest_pending => {
                self.counters.pending_full += 1;
                return;
            }
            None => self.assign(pod),
        };
        let key = Exchange {
            pod: slot,
            client,
            server,
            id: message.id,
        };
        if self.limits.replace_oldest_pending && !self.pending.contains_key(&key) {
            self.make_room(slot);
        }
        let (of_pod, pending) = (self.slot(slot).pending, self.pending.len());
        let name = self.intern(asked);
        match self.pending.entry(key) {
            Entry::Vacant(_) if full(of_pod, pending) => {
                self.counters.pending_full += 1;
                return;
            }
            // Asked again: pending from now, for the name asked last.
            Entry::Occupied(mut held) => *held.get_mut() = (name, now),
            Entry::Vacant(new) => {
                new.insert((name, now));
                self.slots[slot as usize].pending += 1;
            }
        }
        self.pending_order.push_back((now, key));
        if self.limits.replace_oldest_pending {
            self.slots[slot as usize].order.push_back((now, key));
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
        let mut believed = Vec::new();
        self.believe(pod, client, server, payload, now, |address, name, _| {
            believed.push((address, name.clone()));
        })?;
        Ok(believed)
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
        let mut believed = Vec::new();
        self.believe(pod, client, server, payload, now, |address, name, until| {
            believed.push((address, name.clone(), until));
        })?;
        Ok(believed)
    }

    /// [`Tracker::answer_until`], handing each address believed to `believed`.
    fn believe(
        &mut self,
        pod: &Pod,
        client: SocketAddr,
        server: SocketAddr,
        payload: &[u8],
        now: Duration,
        mut believed: impl FnMut(IpAddr, &Arc<str>, Duration),
    ) -> Result<(), Refused> {
        // The question is compared with the pending query's name (a host name) below, and checked
        // on its own only when it is not that name.
        let response = answer::read_response_unchecked(payload).map_err(|e| {
            self.counters.malformed += 1;
            Refused::Dns(e)
        })?;
        self.expire_pending(now);
        let key = self.ids.get(pod).map(|&slot| Exchange {
            pod: slot,
            client,
            server,
            id: response.id,
        });
        // The same pod socket, server and id, and the same question (case aside).
        let pending = key.and_then(|key| match self.pending.entry(key) {
            Entry::Occupied(held) if wire::name_is(&response.question, &held.get().0) => {
                Some(held.remove().0)
            }
            _ => None,
        });
        let (Some(key), Some(asked)) = (key, pending) else {
            if let Err(e) = answer::check_host_name(&response.question) {
                self.counters.malformed += 1;
                return Err(Refused::Dns(e));
            }
            self.counters.unsolicited += 1;
            return Err(Refused::Unsolicited);
        };
        let slot = key.pod;
        self.slots[slot as usize].pending -= 1;
        self.counters.answers += 1;
        for (address, ttl) in response.addresses {
            let until = now + Duration::from_secs(u64::from(ttl)) + self.limits.grace;
            let (of_pod, held) = (self.slot(slot).resolved, self.resolved.len());
            match self.resolved.entry((slot, address)) {
                // Resolved again while it still counts (from the same name): the pod has known it
                // since the first answer, so connections made between the two stay named.
                Entry::Occupied(mut entry) => {
                    let r = entry.get_mut();
                    if !(r.name == asked && now < r.until) {
                        r.since = now;
                    }
                    r.name = asked.clone();
                    r.until = until;
                }
                Entry::Vacant(_)
                    if of_pod >= self.limits.names_per_pod || held >= self.limits.names =>
                {
                    self.counters.names_full += 1;
                    continue;
                }
                Entry::Vacant(entry) => {
                    entry.insert(Resolution {
                        name: asked.clone(),
                        since: now,
                        until,
                    });
                    self.slots[slot as usize].resolved += 1;
                }
            }
            believed(address, &asked, until);
        }
        self.release_if_empty(slot);
        Ok(())
    }

    /// The name `pod` resolved `address` from, if a connection at `at` was made to that name: the
    /// answer came before `at`, and its TTL plus the grace had not ended.
    pub fn name_of(&self, pod: &Pod, address: IpAddr, at: Duration) -> Option<&str> {
        let slot = *self.ids.get(pod)?;
        self.resolved
            .get(&(slot, address))
            .filter(|r| r.since <= at && at < r.until)
            .map(|r| &*r.name)
    }

    /// Forgets what no longer counts at `now`: resolutions past their TTL and grace, queries past
    /// their timeout, and the names neither holds.
    pub fn expire(&mut self, now: Duration) {
        self.expire_pending(now);
        let mut emptied = Vec::new();
        let slots = &mut self.slots;
        self.resolved.retain(|(slot, _), r| {
            if now < r.until {
                return true;
            }
            if let Some(held) = slots.get_mut(*slot as usize) {
                held.resolved -= 1;
                if held.resolved == 0 {
                    emptied.push(*slot);
                }
            }
            false
        });
        for slot in emptied {
            self.release_if_empty(slot);
        }
        self.drop_unheld_names();
    }

    /// The host name `text` (checked, lower-case), shared with every query and resolution of it.
    fn intern(&mut self, text: &str) -> Arc<str> {
        if let Some(held) = self.names.get(text) {
            return held.clone();
        }
        // Names whose queries were asked again for another name are held by nothing until the next
        // expiry: bounded here to what is held plus the slack.
        if self.names.len() >= self.sweep_names_at {
            self.drop_unheld_names();
        }
        let name: Arc<str> = Arc::from(text);
        self.names.insert(name.clone());
        name
    }

    fn drop_unheld_names(&mut self) {
        self.names.retain(|name| Arc::strong_count(name) > 1);
        self.sweep_names_at = self.names.len() + NAMES_SLACK;
        self.name_sweeps += 1;
    }

    /// Forgets everything of a pod that is gone.
    pub fn forget_pod(&mut self, pod: &Pod) {
        let Some(&slot) = self.ids.get(pod) else {
            return;
        };
        self.pending.retain(|key, _| key.pod != slot);
        self.pending_order.retain(|(_, key)| key.pod != slot);
        self.resolved.retain(|(p, _), _| *p != slot);
        if let Some(held) = self.slots.get_mut(slot as usize) {
            (held.pending, held.resolved) = (0, 0);
            held.order.clear();
        }
        self.release_if_empty(slot);
    }

    /// Forgets the oldest pending queries, of pod `slot` while it is at its bound, then of the node
    /// while it is at its bound ([`Limits::replace_oldest_pending`]).
    fn make_room(&mut self, slot: PodId) {
        while self.slot(slot).pending >= self.limits.pending_per_pod {
            let Some((at, key)) = self.slots[slot as usize].order.pop_front() else {
                break;
            };
            // Its entry in `pending_order` stays, stale, until it expires.
            if self.pending.get(&key).is_some_and(|p| p.1 == at) {
                self.forget_pending(key);
            }
        }
        while self.pending.len() >= self.limits.pending {
            let Some((at, key)) = self.pending_order.pop_front() else {
                break;
            };
            self.drop_from_pods_order(at, key);
            if self.pending.get(&key).is_some_and(|p| p.1 == at) {
                self.forget_pending(key);
                if key.pod != slot {
                    self.release_if_empty(key.pod);
                }
            }
        }
    }

    /// An entry leaving `pending_order`: the pod's own order keeps the same entries in the same
    /// order, minus those it forgot first, so it is that order's first or already gone.
    fn drop_from_pods_order(&mut self, at: Duration, key: Exchange) {
        if let Some(held) = self.slots.get_mut(key.pod as usize)
            && held.order.front() == Some(&(at, key))
        {
            held.order.pop_front();
        }
    }

    fn forget_pending(&mut self, key: Exchange) {
        self.pending.remove(&key);
        self.slots[key.pod as usize].pending -= 1;
        self.counters.pending_replaced += 1;
    }

    fn expire_pending(&mut self, now: Duration) {
        while let Some((at, _)) = self.pending_order.front() {
            if now.saturating_sub(*at) < self.limits.query_timeout {
                break;
            }
            let Some((at, key)) = self.pending_order.pop_front() else {
                break;
            };
            self.drop_from_pods_order(at, key);
            // A key asked again since is pending from its later time.
            if let Entry::Occupied(pending) = self.pending.entry(key) {
                if pending.get().1 == at {
                    pending.remove();
                    self.slots[key.pod as usize].pending -= 1;
                    self.release_if_empty(key.pod);
                }
            }
        }
    }

    /// Distinct names held, and the sweeps so far (for the tests).
    #[cfg(test)]
    pub(super) fn names_held(&self) -> (usize, usize) {
        (self.names.len(), self.name_sweeps)
    }

    /// Pods holding something, and the numbers ever given (for the tests: numbers are reused).
    #[cfg(test)]
    pub(super) fn pods_held(&self) -> (usize, usize) {
        (self.ids.len(), self.slots.len())
    }

    fn slot(&self, slot: PodId) -> &Slot {
        &self.slots[slot as usize]
    }

    /// A number for `pod`, which has none.
    fn assign(&mut self, pod: &Pod) -> PodId {
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => {
                self.slots.push(Slot::default());
                // Only pods holding a pending query or a resolution have a number: far fewer than
                // u32::MAX within any `Limits` that fit in memory.
                (self.slots.len() - 1) as PodId
            }
        };
        self.slots[slot as usize] = Slot {
            pod: Some(pod.clone()),
            pending: 0,
            resolved: 0,
            order: VecDeque::new(),
        };
        self.ids.insert(pod.clone(), slot);
        slot
    }

    /// Frees `slot`'s number when its pod holds nothing any more.
    fn release_if_empty(&mut self, slot: PodId) {
        let Some(held) = self.slots.get_mut(slot as usize) else {
            return;
        };
        if held.pending > 0 || held.resolved > 0 {
            return;
        }
        if let Some(pod) = held.pod.take() {
            self.ids.remove(&pod);
            self.free.push(slot);
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
