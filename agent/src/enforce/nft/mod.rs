//! The kernel side of enforcement: a [`Ruleset`] rendered as one nftables table in the host's network
//! namespace, and the `nft` runs that install or remove it.
//!
//! Why nftables in the host namespace (see docs/design.md, "Enforcement by the agent"): its `forward` hook sees every
//! packet between pods after kube-proxy's DNAT (so Service traffic is judged against the backend pod
//! it reaches) and before SNAT (so the source is still the pod), on routed and — with
//! `br_netfilter` — bridged CNIs alike; conntrack lets replies and established connections through in
//! the kernel without any rule walk; a verdict map keyed by pod address reaches an isolated pod's
//! chain in one hash lookup, so pods without policies cost one lookup per new connection; and the
//! table outlives the agent process, so a restart or an upgrade never opens isolated pods.
//!
//! The layout:
//! ```text
//! table inet <name>
//!   map ingress4/ingress6   pod address : jump in_<k>     (pods isolated for ingress)
//!   map egress4/egress6     pod address : jump eg_<k>     (pods isolated for egress)
//!   chain forward (hook forward)  established/related accept; source's egress; destination's ingress
//!   chain input   (hook input)    established/related accept; source's egress (pod → this node)
//!   chain in_<k> / eg_<k>         one rule per allowance ending in `return`; then log and drop
//!                                 (with ClusterNetworkPolicies: the Admin tier's rules, whose Pass
//!                                 and end go to the chain of the NetworkPolicy tier, or of the
//!                                 Baseline tier where no NetworkPolicy isolates the pod)
//! ```
//! Traffic the node itself sends to its pods (kubelet probes) takes the `output` hook, which the
//! table leaves alone.
//!
//! A new ruleset replaces the old one in one `nft -f` transaction: there is never a moment without
//! rules.

use crate::enforce::compile::{Allow, Peers, PortRange, Ruleset, Side, TierRule};
use crate::enforce::dns_hold::grants::Grant;
use netpol::cluster::Action;
use network_enforcer_api::Protocol;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::io::Write as _;
use std::net::IpAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

/// The NFLOG prefixes of denied packets: which side of the isolated pod refused them.
pub const DENY_PREFIX_INGRESS: &str = "ne-deny ingress";
pub const DENY_PREFIX_EGRESS: &str = "ne-deny egress";

/// Errors of the `nft` runs.
#[derive(Debug, thiserror::Error)]
pub enum NftError {
    #[error(
        "running `nft` failed: {0} (enforcement needs the nft binary in PATH and CAP_NET_ADMIN)"
    )]
    Spawn(#[source] std::io::Error),
    #[error("`nft {action}` was refused: {stderr}")]
    Refused { action: String, stderr: String },
}

/// The DNS hold's table beside enforcement table `table` ([`crate::enforce::dns_hold`]): cleared
/// with it.
pub fn dns_hold_table(table: &str) -> String {
    format!("{table}_dns")
}

/// A valid nftables table name of ours: letters, digits and `_`, starting with a letter, at most 64.
pub fn valid_table_name(name: &str) -> Result<String, String> {
    let ok = name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_alphabetic())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ok {
        Ok(name.to_string())
    } else {
        Err(format!(
            "{name:?} is not a usable nftables table name: use letters, digits and _, starting with a letter, at most 64 characters"
        ))
    }
}

/// The `nft -f` script that replaces table `table` with `ruleset` (atomically). With `log_group`,
/// denied packets are sent to that NFLOG group first (the deny evidence).
pub fn render(ruleset: &Ruleset, table: &str, log_group: Option<u16>) -> String {
    render_with(ruleset, table, log_group, &[])
}

/// The set of (pod, address, protocol, ports) an isolated pod may reach because it resolved the
/// address from a name its policies allow ([`crate::enforce::dns_hold`]), per address family. Elements
/// carry their own timeout (the answer's TTL plus the grace): the kernel removes them, the agent need
/// not be there.
pub const NAMES_SET_V4: &str = "names4";
/// See [`NAMES_SET_V4`].
pub const NAMES_SET_V6: &str = "names6";

/// [`render`], with the name grants that hold now, each with the time it has left.
pub fn render_with(
    ruleset: &Ruleset,
    table: &str,
    log_group: Option<u16>,
    grants: &[(Grant, Duration)],
) -> String {
    let mut out = String::new();
    // Create-then-delete makes the delete valid when the table does not exist yet; all of it is one
    // transaction.
    let _ = writeln!(out, "table inet {table} {{}}\ndelete table inet {table}");
    let _ = writeln!(out, "table inet {table} {{");
    // Chains first into their own text: the address sets they use are collected on the way and must
    // be declared before them. Pods whose side reads the same (the same policies select them alike)
    // share one chain: the kernel parses and holds each distinct chain once.
    let mut sets = NamedSets::default();
    let mut chains = String::new();
    let mut names: HashMap<(&str, String), String> = HashMap::new();
    let (mut chains_in, mut chains_eg) = (0usize, 0usize);
    let mut maps: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for pod in &ruleset.pods {
        for (side, direction) in [(&pod.ingress, "in"), (&pod.egress, "eg")] {
            let Some(side) = side else {
                continue;
            };
            let how = match direction {
                "in" => ("saddr", DENY_PREFIX_INGRESS, log_group),
                _ => ("daddr", DENY_PREFIX_EGRESS, log_group),
            };
            let count = if direction == "in" {
                &mut chains_in
            } else {
                &mut chains_eg
            };
            let mut chain = |body: String| {
                names
                    .entry((direction, body))
                    .or_insert_with_key(|(_, body)| {
                        let name = format!("{direction}_{count}");
                        *count += 1;
                        let _ = write!(chains, "  chain {name} {{\n{body}  }}\n");
                        name
                    })
                    .clone()
            };
            // The NetworkPolicy tier (or, where none isolates, the Baseline tier), and in front of
            // it the Admin tier, whose Pass goes to it.
            let section = section_body(side, how, &mut sets);
            let name = if side.admin.is_empty() {
                chain(section)
            } else {
                let section = chain(section);
                chain(admin_body(side, how, &section, &mut sets))
            };
            for ip in &pod.ips {
                let map = match (direction, ip) {
                    ("in", IpAddr::V4(_)) => "ingress4",
                    ("in", IpAddr::V6(_)) => "ingress6",
                    (_, IpAddr::V4(_)) => "egress4",
                    (_, IpAddr::V6(_)) => "egress6",
                };
                maps.entry(map)
                    .or_default()
                    .push(format!("{ip} : jump {name}"));
            }
        }
    }
    for (map, kind) in [
        ("ingress4", "ipv4_addr"),
        ("ingress6", "ipv6_addr"),
        ("egress4", "ipv4_addr"),
        ("egress6", "ipv6_addr"),
    ] {
        let _ = writeln!(out, "  map {map} {{\n    type {kind} : verdict");
        if let Some(elements) = maps.get(map) {
            let _ = writeln!(out, "    elements = {{ {} }}", elements.join(", "));
        }
        let _ = writeln!(out, "  }}");
    }
    sets.declare(&mut out);
    if ruleset.has_names() {
        declare_names(&mut out, grants);
    }
    out.push_str(&chains);
    let _ = writeln!(
        out,
        "  chain forward {{\n    type filter hook forward priority filter; policy accept;\n    \
         ct state established,related accept\n    \
         ip saddr vmap @egress4\n    ip6 saddr vmap @egress6\n    \
         ip daddr vmap @ingress4\n    ip6 daddr vmap @ingress6\n  }}"
    );
    let _ = writeln!(
        out,
        "  chain input {{\n    type filter hook input priority filter; policy accept;\n    \
         ct state established,related accept\n    \
         ip saddr vmap @egress4\n    ip6 saddr vmap @egress6\n  }}"
    );
    let _ = writeln!(out, "}}");
    out
}

/// The two name sets, with `grants` as their elements.
fn declare_names(out: &mut String, grants: &[(Grant, Duration)]) {
    for (set, family, v4) in [
        (NAMES_SET_V4, "ipv4_addr", true),
        (NAMES_SET_V6, "ipv6_addr", false),
    ] {
        let _ = writeln!(
            out,
            "  set {set} {{\n    type {family} . {family} . inet_proto . inet_service\n    flags interval,timeout"
        );
        let elements: Vec<String> = grants
            .iter()
            .filter(|(g, _)| g.pod.is_ipv4() == v4)
            .map(|(g, left)| format!("{} timeout {}ms", g.element(), left.as_millis().max(1)))
            .collect();
        if !elements.is_empty() {
            let _ = writeln!(out, "    elements = {{ {} }}", elements.join(", "));
        }
        let _ = writeln!(out, "  }}");
    }
}

/// Named sets, one per distinct content: a policy's peers and ports are the same for every pod it
/// selects, so each set is written (and parsed by the kernel) once, not once per pod, and the kernel
/// handles a few named sets far better than thousands of anonymous ones.
#[derive(Default)]
struct NamedSets {
    /// (type, interval flag, elements) → name.
    names: BTreeMap<(&'static str, bool, Vec<String>), String>,
    /// The address sets of peers already named, by the shared set they came from (its address) and
    /// family: a peer's addresses are one `Arc` for every pod and rule that uses them, so each is
    /// written out once per render instead of once per use (a namespace peer of a cluster policy
    /// can hold thousands of addresses and be used by every pod the policy governs).
    by_source: HashMap<(usize, bool), Option<String>>,
}

impl NamedSets {
    /// The name of the set of the `v4` (else v6) addresses of `ips`; `None` when it has none.
    fn peer_addresses(&mut self, ips: &Arc<BTreeSet<IpAddr>>, v4: bool) -> Option<String> {
        let key = (Arc::as_ptr(ips) as usize, v4);
        if let Some(name) = self.by_source.get(&key) {
            return name.clone();
        }
        let family: Vec<IpAddr> = ips
            .iter()
            .filter(|ip| ip.is_ipv4() == v4)
            .copied()
            .collect();
        let name = (!family.is_empty()).then(|| self.addresses(&family));
        self.by_source.insert(key, name.clone());
        name
    }

    /// The name of the set of `kind` (`ipv4_addr`, `ipv6_addr`, `inet_service`) holding `elements`;
    /// `interval` for prefixes and ranges (merged where they overlap).
    fn name(&mut self, kind: &'static str, interval: bool, elements: Vec<String>) -> String {
        let next = self.names.len();
        self.names
            .entry((kind, interval, elements))
            .or_insert_with(|| {
                let prefix = match kind {
                    "ipv4_addr" => "a4",
                    "ipv6_addr" => "a6",
                    _ => "p",
                };
                format!("{prefix}_{next}")
            })
            .clone()
    }

    /// A set of addresses of one family.
    fn addresses(&mut self, ips: &[IpAddr]) -> String {
        let kind = if ips.first().is_some_and(IpAddr::is_ipv6) {
            "ipv6_addr"
        } else {
            "ipv4_addr"
        };
        self.name(kind, false, ips.iter().map(IpAddr::to_string).collect())
    }

    fn declare(&self, out: &mut String) {
        for ((kind, interval, elements), name) in &self.names {
            let flags = if *interval {
                "\n    flags interval\n    auto-merge"
            } else {
                ""
            };
            let _ = writeln!(
                out,
                "  set {name} {{\n    type {kind}{flags}\n    elements = {{ {} }}\n  }}",
                elements.join(", ")
            );
        }
    }
}

/// The Admin tier of one side: its rules in precedence order (Accept: `return`, on to the next
/// check; Deny: the deny; Pass: to the `section`), then the `section`.
fn admin_body(
    side: &Side,
    how: (&str, &str, Option<u16>),
    section: &str,
    sets: &mut NamedSets,
) -> String {
    let mut out = String::new();
    tier_rules(&mut out, &side.admin, how, &format!("goto {section}"), sets);
    let _ = writeln!(out, "    goto {section}");
    out
}

/// The rules of `rules` into `out`, `pass` being what a Pass does.
fn tier_rules(
    out: &mut String,
    rules: &[TierRule],
    how: (&str, &str, Option<u16>),
    pass: &str,
    sets: &mut NamedSets,
) {
    let (field, ..) = how;
    for rule in rules {
        let _ = writeln!(out, "    # {} {:?}", rule.name, rule.action);
        let verdict = match rule.action {
            Action::Accept => "return".to_string(),
            Action::Deny => deny(how),
            Action::Pass => pass.to_string(),
        };
        for m in &rule.matches {
            for line in allow_rules(m, field, sets, &verdict) {
                let _ = writeln!(out, "    {line}");
            }
        }
    }
}

/// The verdict of a denied packet: logged to the NFLOG group (the deny evidence) when there is one.
fn deny((_, prefix, log): (&str, &str, Option<u16>)) -> String {
    match log {
        Some(group) => format!("log prefix \"{prefix}\" group {group} counter drop"),
        None => "counter drop".to_string(),
    }
}

/// The NetworkPolicy tier of one side, which NetworkPolicies isolate: its allowances, each ending
/// in `return` (on to the next check), then the deny. A side no NetworkPolicy isolates gets the
/// Baseline tier's rules instead, and then passes. `how` is the peer's address field, the log
/// prefix and the log group.
fn section_body(side: &Side, how: (&str, &str, Option<u16>), sets: &mut NamedSets) -> String {
    let (field, ..) = how;
    let mut out = String::new();
    if !side.isolated {
        let _ = writeln!(out, "    # not isolated: the Baseline tier");
        tier_rules(&mut out, &side.baseline, how, "return", sets);
        return out;
    }
    let _ = writeln!(out, "    # {}", side.policies.join(", "));
    for allow in &side.allows {
        for line in allow_rules(allow, field, sets, "return") {
            let _ = writeln!(out, "    {line}");
        }
    }
    if !side.names.is_empty() {
        // The pod is the source (egress): what it resolved from an allowed name, on the name's ports.
        let _ = writeln!(
            out,
            "    ip saddr . ip daddr . meta l4proto . th dport @{NAMES_SET_V4} return\n    \
             ip6 saddr . ip6 daddr . meta l4proto . th dport @{NAMES_SET_V6} return"
        );
    }
    let _ = writeln!(out, "    {}", deny(how));
    out
}

/// The rules of one allowance: every address match times every protocol's port match.
fn allow_rules(allow: &Allow, field: &str, sets: &mut NamedSets, verdict: &str) -> Vec<String> {
    let addresses: Vec<String> = match &allow.peers {
        Peers::Any => vec![String::new()],
        Peers::Addresses(ips) => {
            let mut out = Vec::new();
            for (family, v4) in [("ip", true), ("ip6", false)] {
                if let Some(set) = sets.peer_addresses(ips, v4) {
                    out.push(format!("{family} {field} @{set} "));
                }
            }
            out
        }
        Peers::Block { cidr, except } => {
            let family = if cidr.addr().is_ipv4() { "ip" } else { "ip6" };
            let mut line = format!("{family} {field} {cidr} ");
            let except: Vec<String> = except
                .iter()
                .filter(|e| e.addr().is_ipv4() == cidr.addr().is_ipv4())
                .map(|e| e.to_string())
                .collect();
            match except.as_slice() {
                [] => {}
                [one] => {
                    let _ = write!(line, "{family} {field} != {one} ");
                }
                _ => {
                    let kind = if family == "ip" {
                        "ipv4_addr"
                    } else {
                        "ipv6_addr"
                    };
                    let set = sets.name(kind, true, except);
                    let _ = write!(line, "{family} {field} != @{set} ");
                }
            }
            vec![line]
        }
    };
    let ports: Vec<String> = match &allow.ports {
        None => vec![String::new()],
        Some(ranges) => {
            let mut by_protocol: BTreeMap<Protocol, Vec<PortRange>> = BTreeMap::new();
            for r in ranges {
                by_protocol.entry(r.protocol).or_default().push(*r);
            }
            by_protocol
                .into_iter()
                .filter_map(|(protocol, ranges)| {
                    // SCTP is not enforced (compile warns and allows nothing for it).
                    if protocol == Protocol::SCTP {
                        return None;
                    }
                    let name = protocol.as_lowercase_str();
                    if ranges.iter().any(PortRange::is_whole_protocol) {
                        return Some(format!("meta l4proto {name} "));
                    }
                    let mut list: Vec<String> = ranges
                        .iter()
                        .map(|r| {
                            if r.first == r.last {
                                r.first.to_string()
                            } else {
                                format!("{}-{}", r.first, r.last)
                            }
                        })
                        .collect();
                    list.sort();
                    list.dedup();
                    Some(match list.as_slice() {
                        [one] if !one.contains('-') => format!("{name} dport {one} "),
                        _ => format!("{name} dport @{} ", sets.name("inet_service", true, list)),
                    })
                })
                .collect()
        }
    };
    let mut rules = Vec::new();
    for a in &addresses {
        for p in &ports {
            rules.push(format!("{a}{p}{verdict}"));
        }
    }
    rules
}

/// Installs `script` (from [`render`]) with `nft -f -`.
pub fn apply(script: &str) -> Result<(), NftError> {
    run(&["-f", "-"], Some(script), "-f")
}

/// Removes table `table`; a table that does not exist is not an error (`Ok(false)`). Deleting
/// directly, because listing tables makes nft fetch the whole ruleset (a second with a big table).
pub fn clear(table: &str) -> Result<bool, NftError> {
    match run(&["delete", "table", "inet", table], None, "delete table") {
        Ok(()) => Ok(true),
        Err(NftError::Refused { stderr, .. }) if stderr.contains("No such file or directory") => {
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

/// Removes table `table` and the DNS hold's table beside it (uninstall, `enforcement clear`);
/// whether the enforcement table existed.
pub fn clear_all(table: &str) -> Result<bool, NftError> {
    let existed = clear(table)?;
    clear(&dns_hold_table(table))?;
    Ok(existed)
}

fn run(args: &[&str], input: Option<&str>, action: &str) -> Result<(), NftError> {
    run_program("nft", args, input, action)
}

/// Runs `program` (`nft`; a stand-in in tests) with `input` on its stdin. The child is always
/// waited for, also when writing its input fails (it exited early): an agent that enforces for
/// months must not collect zombies, and nft's own complaint says more than "broken pipe".
fn run_program(
    program: impl AsRef<std::ffi::OsStr>,
    args: &[&str],
    input: Option<&str>,
    action: &str,
) -> Result<(), NftError> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(NftError::Spawn)?;
    let written = match (input, child.stdin.take()) {
        // The pipe closes when `stdin` drops here, so nft sees the end of its input.
        (Some(input), Some(mut stdin)) => stdin.write_all(input.as_bytes()),
        _ => Ok(()),
    };
    let out = child.wait_with_output().map_err(NftError::Spawn)?;
    if !out.status.success() {
        return Err(NftError::Refused {
            action: action.into(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    written.map_err(NftError::Spawn)
}

#[cfg(test)]
mod tests;
