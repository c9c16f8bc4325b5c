//! Holding a pod's DNS answer until the addresses in it are allowed (docs/design.md, "Names in the
//! agent's enforcement"). A pod whose policies allow outside services by name (`spec.egressNames`,
//! carried to the agent by the rendered NetworkPolicy's annotation) may reach an address the moment it
//! can read the answer that gave it, and no longer than the answer's TTL plus the grace.
//!
//! How: a table of its own (`inet <table>_dns`) copies the UDP DNS queries of those pods to an NFLOG
//! group (the query goes on at once) and sends the answers to them to an NFQUEUE (at the `forward`,
//! `input` and `output` hooks). One thread reads both from one socket ([`socket`]), in the order the
//! packets passed: a query is noted; an answer is believed only for a noted query (same socket,
//! server, transaction id and question, [`crate::dns::tracker`]), and for each address resolved from
//! an allowed name a grant (pod, address, ports) is put into the enforcement table's name sets, with
//! the TTL plus the grace as its timeout, *before* the answer is let through. Every answer is let
//! through: the hold delays, it never drops. Answers with nothing new go on at once: a kernel check
//! ([`check`]) in the queue rule finds them (its mirror of the grants says every address is granted
//! long enough), and they never reach the thread.
//!
//! Reading order:
//! - [`queue_rule`]: the rule that queues (over netlink: `nft` has no `queue` on kernels without
//!   `nft_queue`; the xtables `NFQUEUE` target runs through `nft_compat`);
//! - [`check`]: the kernel check that lets answers with nothing new through, and its grants' mirror;
//! - [`socket`]: the one socket of the queue and the query group (messages read purely);
//! - [`packet`]: a queued or copied packet read as a UDP datagram (pure);
//! - [`netlink`]: nf_tables batches written without `nft`;
//! - [`grants`]: what each pod may reach and until when (pure); [`set_elements`]: those grants put
//!   into the enforcement table's name sets, over netlink (an `nft` process costs milliseconds);
//! - this module: the table, the reader thread, and installing the enforcement table together with
//!   the grants (one lock, so a grant is never lost to a table replaced at the same moment).
//!
//! Failure: without a reader (the agent stopped) the queue rule's bypass lets packets through; when
//! the kernel refuses the queue rule, the agent runs without the hold (logged) and names are enforced
//! from the addresses the controller renders, as with any CNI.

pub mod check;
pub mod grants;
mod netlink;
pub mod packet;
pub mod queue_rule;
pub mod set_elements;
pub mod socket;

use crate::clock::monotonic_now;
use crate::dns::tracker::{self, Pod, Refused, Tracker};
use crate::enforce::compile::{NameAllowance, Ruleset};
use crate::enforce::metrics::{EnforcementMetrics, OutcomeLabel};
use crate::enforce::nft::{self, NftError};
use check::{Check, Mirror};
use grants::Grants;
use socket::{Held, HoldSocket};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The default NFQUEUE number (`--enforcement-dns-hold-queue`).
pub const DEFAULT_QUEUE: u16 = 8410;
/// The default NFLOG group of the held pods' queries (`--enforcement-dns-hold-query-group`): not the
/// deny evidence's default group (8410), a group has one reader.
pub const DEFAULT_QUERY_GROUP: u16 = 8411;
/// Messages waiting in the kernel for the reader; past it, they pass unheld (fail open).
const QUEUE_MAX_LEN: u32 = 4096;
/// Grants on the node; past it, new ones are refused (counted) and the pod waits for the controller's
/// rendering, as without the hold.
pub const MAX_GRANTS: usize = 100_000;

/// Query copies the kernel gathers before it sends them (the group is bound with the same threshold,
/// [`socket::COPIES_BATCH`]; a rule's own threshold can only lower the group's). Gathered copies go
/// out when the batch is full, after [`socket::COPIES_FLUSH_CENTISECONDS`], or before any answer is
/// queued: the queue rule's first action logs to the group with a threshold of 1.
const COPIES_BATCH: u16 = socket::COPIES_BATCH as u16;

/// How often ended grants are forgotten while answers come in (the kernel has dropped them already).
const EXPIRE_EVERY: Duration = Duration::from_secs(10);

/// Why the hold could not start.
#[derive(Debug, thiserror::Error)]
pub enum HoldError {
    #[error("creating the hold table: {0}")]
    Table(#[source] NftError),
    #[error(
        "the kernel refused the queue rule ({0}): it needs nft_compat and the xtables NFQUEUE target \
         (xt_NFQUEUE)"
    )]
    QueueRule(#[source] std::io::Error),
    #[error("the hold's socket: {0}")]
    Socket(#[from] socket::SocketError),
    #[error("starting the hold's reader thread: {0}")]
    Thread(#[source] std::io::Error),
}

/// A pod of this node with names: its addresses and what its policies allow by name.
#[derive(Debug)]
struct PodNames {
    ips: Vec<IpAddr>,
    allowances: Vec<Arc<NameAllowance>>,
}

/// What the reader and the installer share.
#[derive(Debug)]
struct State {
    tracker: Tracker,
    grants: Grants,
    /// By each of the pod's addresses.
    pods: HashMap<IpAddr, Arc<PodNames>>,
    /// When ended grants were last forgotten (they count towards the bound until then).
    expired_at: Duration,
    /// The kernel check, when it runs; `None`: every answer is queued.
    check: Option<Check>,
    /// The check's counts last added to the metrics, and when.
    checked: ((u64, u64), Duration),
    grace: Duration,
}

/// What is done after an answer went on.
#[derive(Debug, Default)]
struct Later {
    /// Grants whose end moves later.
    extended: Vec<(grants::Grant, Duration)>,
    /// Entries of the kernel check's mirror, and the generation they were worked out under.
    mirror: Vec<Mirror>,
    generation: u64,
}

/// The running hold. See the module docs.
#[derive(Debug)]
pub struct Hold {
    /// The enforcement table (its name sets get the grants).
    table: String,
    state: Mutex<State>,
    metrics: EnforcementMetrics,
}

impl Hold {
    /// Creates the hold table (replacing one an earlier agent left), its queue rule, and the reader
    /// thread on `queue` (answers) and `query_group` (copies of queries); `grace` is how long past
    /// its TTL an answer's addresses stay reachable.
    pub fn start(
        table: &str,
        queue: u16,
        query_group: u16,
        grace: Duration,
        metrics: EnforcementMetrics,
    ) -> Result<Arc<Hold>, HoldError> {
        let hold_table = nft::dns_hold_table(table);
        // Bound before the table exists: no query is copied before someone reads the group.
        let socket = HoldSocket::open(queue, query_group, QUEUE_MAX_LEN)?;
        nft::apply(&hold_table_script(&hold_table, query_group)).map_err(HoldError::Table)?;
        let mut check = Check::load()
            .inspect_err(|error| {
                tracing::warn!(%error, "the DNS hold queues every answer (no kernel check)")
            })
            .ok();
        let insert = |fd| {
            queue_rule::insert(
                queue_rule::Family::Inet,
                &hold_table,
                "hold",
                (queue, query_group),
                fd,
            )
        };
        let inserted = match check.as_ref().and_then(Check::program_fd) {
            Some(fd) => insert(Some(fd)).or_else(|error| {
                tracing::warn!(%error, "the kernel refused the check in the queue rule (it needs the xtables bpf match, xt_bpf): the DNS hold queues every answer");
                check = None;
                insert(None)
            }),
            None => insert(None),
        };
        if let Err(e) = inserted {
            let _ = nft::clear(&hold_table);
            return Err(HoldError::QueueRule(e));
        }
        let hold = Arc::new(Hold {
            table: table.to_string(),
            state: Mutex::new(State {
                tracker: Tracker::new(tracker::Limits {
                    grace,
                    // Answers the kernel check lets through never reach this tracker.
                    replace_oldest_pending: true,
                    ..tracker::Limits::default()
                }),
                grants: Grants::new(MAX_GRANTS),
                pods: HashMap::new(),
                expired_at: Duration::ZERO,
                check,
                checked: ((0, 0), Duration::ZERO),
                grace,
            }),
            metrics,
        });
        let running = hold.clone();
        std::thread::Builder::new()
            .name("dns-hold".into())
            .spawn(move || running.read(&socket))
            .map_err(HoldError::Thread)?;
        Ok(hold)
    }

    /// Installs `ruleset` with the grants that hold now and makes its pods with names the ones whose
    /// DNS is held: one `nft` transaction, under the lock the reader takes to add grants.
    pub fn install(&self, ruleset: &Ruleset, log_group: Option<u16>) -> Result<(), NftError> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let now = monotonic_now();
        state.grants.expire(now);
        let mut script = nft::render_with(ruleset, &self.table, log_group, &state.grants.live(now));
        let pods = pods_with_names(ruleset);
        script.push_str(&held_pods_script(
            &nft::dns_hold_table(&self.table),
            pods.keys(),
        ));
        // Before the new allowances are in the kernel: no answer may pass on entries worked out
        // under the old ones once they are.
        if pods_changed(&state.pods, &pods)
            && let Some(check) = state.check.as_mut()
            && let Err(error) = check.new_generation()
        {
            // Old entries may let an answer through that would now grant more ports: the pod then
            // waits for the controller's rendering of them, as without the hold.
            tracing::error!(%error, "the DNS hold's kernel check keeps its old mirror");
        }
        nft::apply(&script)?;
        state.pods = pods;
        self.metrics.name_grants.set(state.grants.len() as i64);
        Ok(())
    }

    /// The reader thread: query copies are noted; each queued answer is judged, then let through.
    fn read(&self, socket: &HoldSocket) {
        let mut buf = vec![0u8; socket::RECEIVE_BYTES];
        loop {
            self.report_counts();
            let n = match socket.receive(&mut buf) {
                Ok(n) => n,
                Err(error) if error.raw_os_error() == Some(libc::ENOBUFS) => {
                    // Query copies lost (their answers will be unsolicited: no grant, the pod
                    // waits for the controller's rendering); answers pass unheld (fail-open).
                    self.count("socket_overrun");
                    tracing::debug!("the DNS hold's socket overran; query copies were lost");
                    continue;
                }
                Err(error) => {
                    tracing::warn!(%error, "reading the DNS hold's socket failed; retrying");
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
            };
            for message in socket::messages(&buf[..n]) {
                match message {
                    Ok(Held::Copy(packet)) => {
                        let (outcome, later) = self.judge(packet, false);
                        self.count(outcome);
                        self.after(later);
                    }
                    Ok(Held::Answer { id, packet }) => {
                        let started = Instant::now();
                        let (outcome, later) = self.judge(packet, true);
                        if let Err(error) = socket.accept(id) {
                            tracing::warn!(%error, "letting a held DNS answer through failed");
                        }
                        self.metrics
                            .dns_hold_seconds
                            .observe(started.elapsed().as_secs_f64());
                        self.count(outcome);
                        self.after(later);
                    }
                    Err(error) => {
                        self.count("unreadable");
                        tracing::debug!(%error, "an unreadable message on the DNS hold's socket");
                    }
                }
            }
        }
    }

    fn count(&self, outcome: &'static str) {
        self.metrics
            .dns_hold
            .get_or_create(&OutcomeLabel { outcome })
            .inc();
    }

    /// Extends grants and renews the kernel check's mirror, after their answer went on.
    fn after(&self, later: Later) {
        if !later.extended.is_empty()
            && let Err(error) = set_elements::write(&self.table, &[], &later.extended)
        {
            self.count("nft_failed");
            tracing::warn!(%error, "extending name grants failed (they end at their old time)");
            // Neither the mirror nor this agent's own record may promise what the kernel does not
            // have: removed and forgotten, the grants are made anew by the next answer.
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            if let Err(error) = set_elements::remove(&self.table, &later.extended) {
                tracing::warn!(%error, "removing name grants whose extension failed failed too");
            }
            for (grant, _) in &later.extended {
                state.grants.forget(grant);
            }
            return;
        }
        if later.mirror.is_empty() {
            return;
        }
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(check) = state.check.as_mut()
            && let Err(error) = check.mirror(&later.mirror, later.generation)
        {
            // A missing entry only makes an answer wait.
            tracing::debug!(%error, "the DNS hold's kernel check lacks an entry");
        }
    }

    /// Adds what the kernel check decided since the last time, and what the tracker dropped, to the
    /// metrics, once a second at most (the reader wakes at least every 2 s: the socket's receive
    /// timeout).
    fn report_counts(&self) {
        let now = monotonic_now();
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if now.saturating_sub(state.checked.1) < Duration::from_secs(1) {
            return;
        }
        let tracker = state.tracker.counters().clone();
        let checked = state.check.as_ref().map(Check::counts);
        let ((was_passed, was_queued), _) = state.checked;
        state.checked = (checked.unwrap_or_default(), now);
        drop(state);
        // The tracker's counts are cumulative: the counters are brought up to them.
        for (outcome, total) in [
            ("pending_full", tracker.pending_full),
            ("pending_replaced", tracker.pending_replaced),
            ("names_full", tracker.names_full),
        ] {
            let counter = self
                .metrics
                .dns_hold_tracker_dropped
                .get_or_create(&OutcomeLabel { outcome });
            counter.inc_by(total.saturating_sub(counter.get()));
        }
        let Some((passed, queued)) = checked else {
            return;
        };
        for (outcome, n) in [
            ("passed", passed.saturating_sub(was_passed)),
            ("queued", queued.saturating_sub(was_queued)),
        ] {
            self.metrics
                .dns_hold_checked
                .get_or_create(&OutcomeLabel { outcome })
                .inc_by(n);
        }
    }

    /// Entries in the kernel check's mirror now (`None` without the check). The mirror is written
    /// just after an answer went on, so an answer right behind it may still be queued once.
    pub fn mirrored(&self) -> Option<usize> {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.check.as_ref().map(Check::entries)
    }

    /// Answers the kernel check let through at once and answers it queued, since the hold started;
    /// `None` without the check.
    pub fn checked(&self) -> Option<(u64, u64)> {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.check.as_ref().map(Check::counts)
    }

    /// Reads one queued or copied packet; installs its new grants before returning. Returns the
    /// outcome (a metric label) and what to do after the message went on.
    fn judge(&self, packet: &[u8], queued: bool) -> (&'static str, Later) {
        let Some(datagram) = packet::udp(packet) else {
            return ("not_udp", Later::default());
        };
        let now = monotonic_now();
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if datagram.to.port() == 53 {
            let pod: Pod = datagram.from.ip().to_string().into();
            state
                .tracker
                .query(&pod, datagram.from, datagram.to, datagram.payload, now);
            return ("query", Later::default());
        }
        let Some(names) = state.pods.get(&datagram.to.ip()).cloned() else {
            return ("not_held", Later::default());
        };
        let pod: Pod = datagram.to.ip().to_string().into();
        let believed = match state.tracker.answer_until(
            &pod,
            datagram.to,
            datagram.from,
            datagram.payload,
            now,
        ) {
            Ok(believed) => believed,
            Err(Refused::Unsolicited) => return ("unsolicited", Later::default()),
            Err(Refused::Dns(_)) => return ("malformed", Later::default()),
        };
        // Not per answer: expiring scans every resolution the node holds, and the answer waits.
        // Until then a lapsed resolution only takes room (`name_of` and the grants check `until`).
        if now.saturating_sub(state.expired_at) >= EXPIRE_EVERY {
            state.tracker.expire(now);
            state.grants.expire(now);
            state.expired_at = now;
        }
        let (mut new, mut later, mut refused) = (Vec::new(), Later::default(), 0);
        let checked = state.check.is_some();
        later.generation = state.check.as_ref().map_or(0, Check::generation);
        for (address, name, until) in believed {
            let admitted =
                state
                    .grants
                    .admit(&names.ips, (&name, address, until), &names.allowances, now);
            // Renewed when the answer was queued (the check found an entry missing or old) or
            // when the grants changed; an answer the check let through changes nothing.
            let renew = queued || !admitted.new.is_empty() || !admitted.extended.is_empty();
            new.extend(admitted.new);
            later.extended.extend(admitted.extended);
            refused += admitted.refused;
            if checked
                && renew
                && let Some(end) = admitted.settled
            {
                later.mirror.extend(check::entry(
                    datagram.to.ip(),
                    address,
                    &name,
                    end,
                    state.grace,
                ));
            }
        }
        if refused > 0 {
            self.metrics
                .dns_hold
                .get_or_create(&OutcomeLabel {
                    outcome: "grants_full",
                })
                .inc_by(refused as u64);
        }
        self.metrics.name_grants.set(state.grants.len() as i64);
        if new.is_empty() {
            let outcome = if later.extended.is_empty() {
                "nothing_new"
            } else {
                "extended"
            };
            return (outcome, later);
        }
        // Under the lock: a table being replaced right now would not carry these grants otherwise.
        match set_elements::write(&self.table, &new, &[]) {
            Ok(()) => ("granted", later),
            Err(error) => {
                tracing::warn!(%error, "installing name grants failed; the answer goes on without them");
                // Neither the mirror nor this record may promise grants the kernel does not have:
                // the next answer makes them anew.
                later.mirror.clear();
                for (grant, _) in &new {
                    state.grants.forget(grant);
                }
                ("nft_failed", later)
            }
        }
    }
}

/// Whether any pod's allowances by name differ between `old` and `new`.
fn pods_changed(
    old: &HashMap<IpAddr, Arc<PodNames>>,
    new: &HashMap<IpAddr, Arc<PodNames>>,
) -> bool {
    old.len() != new.len()
        || new
            .iter()
            .any(|(ip, pod)| old.get(ip).is_none_or(|o| o.allowances != pod.allowances))
}

/// The pods of `ruleset` that may reach names, by each of their addresses.
fn pods_with_names(ruleset: &Ruleset) -> HashMap<IpAddr, Arc<PodNames>> {
    let mut pods = HashMap::new();
    for pod in &ruleset.pods {
        let Some(egress) = pod.egress.as_ref().filter(|e| !e.names.is_empty()) else {
            continue;
        };
        let names = Arc::new(PodNames {
            ips: pod.ips.clone(),
            allowances: egress.names.clone(),
        });
        for ip in &pod.ips {
            pods.insert(*ip, names.clone());
        }
    }
    pods
}

/// The hold table, created empty of pods: the queue rule goes into `hold` afterwards
/// ([`queue_rule::insert`]). Replacing the whole table also drops an earlier agent's queue rule.
/// Queries are copied to `query_group` in batches (a copy sent at once wakes the reader); the queue
/// rule sends the batch before it queues an answer, so a query is always noted before its answer is
/// judged. Answers the kernel check lets through are not copied: a copy cost the pod 10-25 µs at
/// p50 on this machine, for bookkeeping only (the tracker forgets their queries instead,
/// `replace_oldest_pending`).
fn hold_table_script(table: &str, query_group: u16) -> String {
    let rule = |family: &str, set: &str, field: &str, port: &str, then: &str| {
        format!("    {family} {field} @{set} udp {port} 53 {then}\n")
    };
    let queries = |then: &str| {
        rule("ip", "held4", "saddr", "dport", then) + &rule("ip6", "held6", "saddr", "dport", then)
    };
    let answers = rule("ip", "held4", "daddr", "sport", "jump hold")
        + &rule("ip6", "held6", "daddr", "sport", "jump hold");
    let copy = format!("log group {query_group} queue-threshold {COPIES_BATCH}");
    // Answers to held pods and their queries; `input` and `output` for a resolver on the node itself.
    // Before the enforcement table's chains (priority filter - 10): what enforcement then drops was
    // only noted.
    let chain = |name: &str, hook: &str, rules: String| {
        format!(
            "  chain {name} {{\n    type filter hook {hook} priority filter - 10; policy accept;\n{rules}  }}\n"
        )
    };
    let mut out = String::new();
    let _ = writeln!(out, "table inet {table} {{}}\ndelete table inet {table}");
    let _ = writeln!(out, "table inet {table} {{");
    out.push_str(
        "  set held4 {\n    type ipv4_addr\n  }\n  set held6 {\n    type ipv6_addr\n  }\n",
    );
    // Only the queue rule ([`queue_rule::insert`]); what its check lets through goes on.
    out.push_str("  chain hold {\n  }\n");
    out.push_str(&chain(
        "forward",
        "forward",
        answers.clone() + &queries(&copy),
    ));
    out.push_str(&chain("input", "input", queries(&copy)));
    out.push_str(&chain("output", "output", answers));
    out.push_str("}\n");
    out
}

/// Makes `pods` the held ones (same transaction as the enforcement table).
fn held_pods_script<'a>(table: &str, pods: impl Iterator<Item = &'a IpAddr>) -> String {
    let (v4, v6): (Vec<&IpAddr>, Vec<&IpAddr>) = pods.partition(|ip| ip.is_ipv4());
    let mut out = String::new();
    for (set, ips) in [("held4", v4), ("held6", v6)] {
        let _ = writeln!(out, "flush set inet {table} {set}");
        if !ips.is_empty() {
            let list: Vec<String> = ips.iter().map(|ip| ip.to_string()).collect();
            let _ = writeln!(
                out,
                "add element inet {table} {set} {{ {} }}",
                list.join(", ")
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hold_table_copies_queries_and_queues_answers_at_three_hooks_and_the_held_set_is_replaced()
     {
        let script = hold_table_script("ne_dns", 8411);
        assert!(script.starts_with("table inet ne_dns {}\ndelete table inet ne_dns\n"));
        // A query never waits for user space: only answers are queued.
        assert!(!script.contains("dport 53 jump hold"), "{script}");
        for line in [
            "type filter hook forward priority filter - 10; policy accept;",
            "ip daddr @held4 udp sport 53 jump hold",
            "ip6 saddr @held6 udp dport 53 log group 8411 queue-threshold 64\n",
            "chain hold {\n  }",
            "type filter hook input priority filter - 10;",
            "type filter hook output priority filter - 10;",
        ] {
            assert!(script.contains(line), "{line} in\n{script}");
        }
        let ips: Vec<IpAddr> = vec!["10.0.0.5".parse().unwrap(), "fd00::5".parse().unwrap()];
        assert_eq!(
            held_pods_script("ne_dns", ips.iter()),
            "flush set inet ne_dns held4\nadd element inet ne_dns held4 { 10.0.0.5 }\n\
             flush set inet ne_dns held6\nadd element inet ne_dns held6 { fd00::5 }\n"
        );
        assert_eq!(
            held_pods_script("ne_dns", [].iter()),
            "flush set inet ne_dns held4\nflush set inet ne_dns held6\n"
        );
    }
}
