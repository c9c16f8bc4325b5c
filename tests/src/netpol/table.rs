//! The truth table of the conformance suite: every (source pod, destination pod, port, protocol) of the
//! x/y/z × a/b/c model, allowed or not. Expected tables are written by starting from "everything
//! allowed" and marking what a case's policies deny (or allow back), like the reachability matrix of
//! Kubernetes' own suite: a reader checks the expectation against the policy text, not against code.

use std::collections::BTreeMap;
use std::fmt::Write as _;

/// The model's namespaces, by their logical names (the real ones carry a per-run suffix).
pub const NAMESPACES: [&str; 3] = ["x", "y", "z"];
/// The pods of every namespace; each is labelled `pod=<name>`.
pub const PODS: [&str; 3] = ["a", "b", "c"];
/// Every pod serves TCP and UDP on both.
pub const PORTS: [u16; 2] = [80, 81];
/// Both protocols, on every port.
pub const PROTOCOLS: [Protocol; 2] = [Protocol::Tcp, Protocol::Udp];

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    Tcp,
    Udp,
}

impl Protocol {
    /// The Kubernetes spelling (`TCP`, `UDP`).
    pub fn kubernetes(self) -> &'static str {
        match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
        }
    }

    /// The echo server's spelling (`tcp`, `udp`).
    pub fn lower(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
        }
    }
}

/// A pod of the model by its logical names (`x/a`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodRef {
    pub ns: &'static str,
    pub pod: &'static str,
}

impl PodRef {
    /// Whether this is the pod written `ns/pod` (e.g. `"x/a"`).
    pub fn is(&self, name: &str) -> bool {
        name.split_once('/') == Some((self.ns, self.pod))
    }
}

impl std::fmt::Display for PodRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.ns, self.pod)
    }
}

/// The nine pods, x/a first.
pub fn all_pods() -> Vec<PodRef> {
    NAMESPACES
        .iter()
        .flat_map(|ns| PODS.iter().map(move |pod| PodRef { ns, pod }))
        .collect()
}

/// One connection attempt of the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Probe {
    pub from: PodRef,
    pub to: PodRef,
    pub port: u16,
    pub protocol: Protocol,
}

impl Probe {
    /// Shorthand for case expectations: destination port and protocol, e.g. `p.on(Tcp, 80)`.
    pub fn on(&self, protocol: Protocol, port: u16) -> bool {
        self.protocol == protocol && self.port == port
    }
}

impl std::fmt::Display for Probe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} -> {} {}/{}",
            self.from,
            self.to,
            self.protocol.lower(),
            self.port
        )
    }
}

/// Every probe of the table. A pod's traffic to itself is left out: it never leaves the pod's network
/// namespace (the kernel routes it over the pod's loopback), and Kubernetes' own suite ignores it for
/// the same reason (what a NetworkPolicy means for it is left to implementations).
pub fn all_probes() -> Vec<Probe> {
    let pods = all_pods();
    let mut probes = Vec::new();
    for from in &pods {
        for to in pods.iter().filter(|to| *to != from) {
            for protocol in PROTOCOLS {
                for port in PORTS {
                    probes.push(Probe {
                        from: *from,
                        to: *to,
                        port,
                        protocol,
                    });
                }
            }
        }
    }
    probes
}

/// Allowed or not, for every probe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Table(BTreeMap<Probe, bool>);

impl Table {
    /// Every probe `allowed`.
    pub fn all(allowed: bool) -> Self {
        Table(all_probes().into_iter().map(|p| (p, allowed)).collect())
    }

    /// The table of `verdicts`; every probe of the model must be there.
    pub fn from_verdicts(verdicts: BTreeMap<Probe, bool>) -> Result<Self, String> {
        if let Some(missing) = all_probes().iter().find(|p| !verdicts.contains_key(p)) {
            return Err(format!("no verdict for {missing}"));
        }
        Ok(Table(verdicts))
    }

    /// Marks every probe `which` selects as denied.
    pub fn deny(mut self, which: impl Fn(&Probe) -> bool) -> Self {
        self.0.iter_mut().for_each(|(p, v)| {
            if which(p) {
                *v = false;
            }
        });
        self
    }

    /// Marks every probe `which` selects as allowed.
    pub fn allow(mut self, which: impl Fn(&Probe) -> bool) -> Self {
        self.0.iter_mut().for_each(|(p, v)| {
            if which(p) {
                *v = true;
            }
        });
        self
    }

    /// Whether `probe` is allowed.
    pub fn allowed(&self, probe: &Probe) -> bool {
        self.0.get(probe).copied().unwrap_or(false)
    }

    /// Every probe in order with its verdict.
    pub fn iter(&self) -> impl Iterator<Item = (&Probe, bool)> {
        self.0.iter().map(|(p, v)| (p, *v))
    }

    /// How many probes are allowed.
    pub fn allowed_count(&self) -> usize {
        self.0.values().filter(|v| **v).count()
    }

    /// The probes where `self` and `other` differ: (probe, self's verdict, other's verdict).
    pub fn differences(&self, other: &Table) -> Vec<(Probe, bool, bool)> {
        self.iter()
            .filter_map(|(p, v)| {
                let o = other.allowed(p);
                (v != o).then_some((*p, v, o))
            })
            .collect()
    }

    /// A grid per protocol and port, sources down, destinations across, of `observed` against
    /// `self` (the expectation): `.` allowed and `x` blocked as expected, `A!` allowed but expected
    /// blocked, `B!` blocked but expected allowed, `-` a pod and itself (not probed). `what` names
    /// the two sides (e.g. "expected" / "observed"). Followed by the list of differences.
    pub fn render_against(&self, observed: &Table, what: (&str, &str)) -> String {
        let pods = all_pods();
        let mut out = format!(
            "legend: . allowed, x blocked (both agree); A! {1} allowed, {0} blocked; B! {1} blocked, {0} allowed\n",
            what.0, what.1
        );
        for protocol in PROTOCOLS {
            for port in PORTS {
                let corner = format!("{}/{port} from\\to", protocol.lower());
                let _ = write!(out, "\n{corner:<15}");
                for to in &pods {
                    let _ = write!(out, " {:>4}", to.to_string());
                }
                out.push('\n');
                for from in &pods {
                    let _ = write!(out, "{:>15}", from.to_string());
                    for to in &pods {
                        let probe = Probe {
                            from: *from,
                            to: *to,
                            port,
                            protocol,
                        };
                        let cell = if from == to {
                            "-"
                        } else {
                            match (self.allowed(&probe), observed.allowed(&probe)) {
                                (true, true) => ".",
                                (false, false) => "x",
                                (false, true) => "A!",
                                (true, false) => "B!",
                            }
                        };
                        let _ = write!(out, " {cell:>4}");
                    }
                    out.push('\n');
                }
            }
        }
        let differences = self.differences(observed);
        if !differences.is_empty() {
            let _ = writeln!(out, "\n{} differences:", differences.len());
            for (probe, mine, theirs) in differences.iter().take(60) {
                let _ = writeln!(
                    out,
                    "  {probe}: {} {}, {} {}",
                    what.0,
                    verdict(*mine),
                    what.1,
                    verdict(*theirs)
                );
            }
            if differences.len() > 60 {
                let _ = writeln!(out, "  ... and {} more", differences.len() - 60);
            }
        }
        out
    }
}

fn verdict(allowed: bool) -> &'static str {
    if allowed { "allowed" } else { "blocked" }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_has_every_pair_of_distinct_pods_on_every_port_and_protocol() {
        assert_eq!(all_probes().len(), 9 * 8 * 2 * 2);
        let t = Table::all(true).deny(|p| p.to.is("x/a"));
        // Eight sources, four port/protocol pairs each.
        assert_eq!(t.allowed_count(), 288 - 32);
        let back = t
            .clone()
            .allow(|p| p.to.is("x/a") && p.on(Protocol::Udp, 81));
        assert_eq!(back.differences(&t).len(), 8);
        let grid = t.render_against(&Table::all(true), ("expected", "observed"));
        assert!(
            grid.contains("A!") && grid.contains("32 differences"),
            "{grid}"
        );
    }
}
