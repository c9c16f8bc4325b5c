//! What each isolated pod may reach because it resolved it: (pod address, resolved address, ports)
//! until the answer's TTL plus the grace. Plain data; times are CLOCK_MONOTONIC durations, as the
//! DNS tracker's. The kernel holds the same grants as elements of the enforcement table's name sets,
//! each with its timeout, so a grant ends on time even when the agent is gone.

use crate::enforce::compile::{NameAllowance, PortRange};
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

/// A grant is extended in the kernel only when the new answer moves its end by at least this much: a
/// pod asking every second for a name with a 30 s TTL costs one kernel write per step, not per answer.
pub const EXTEND_STEP: Duration = Duration::from_secs(5);

/// One element of a name set: `pod` may reach `address` on `ports`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Grant {
    pub pod: IpAddr,
    pub address: IpAddr,
    pub ports: PortRange,
}

impl Grant {
    /// The element as `nft` writes it: `pod . address . protocol . ports`.
    pub fn element(&self) -> String {
        let PortRange {
            protocol,
            first,
            last,
        } = self.ports;
        let protocol = protocol.as_lowercase_str();
        if first == last {
            format!("{} . {} . {protocol} . {first}", self.pod, self.address)
        } else {
            format!(
                "{} . {} . {protocol} . {first}-{last}",
                self.pod, self.address
            )
        }
    }
}

/// What one resolved address changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Admitted {
    /// Grants the kernel does not have yet: the answer waits until they are installed.
    pub new: Vec<(Grant, Duration)>,
    /// Grants the kernel has, with a later end: installed after the answer went on.
    pub extended: Vec<(Grant, Duration)>,
    /// Grants not made because the node's bound was reached.
    pub refused: usize,
    /// The earliest end of the address's grants now, when it has grants and none was refused: until
    /// then an answer with the same address changes nothing but by the step (the kernel check's
    /// mirror, [`super::check`]).
    pub settled: Option<Duration>,
}

/// The port ranges `allowances` give `name`, overlapping and adjacent ones merged. The kernel's
/// interval set refuses an element that shares its first or last port with another of the same pod
/// and address (`443` and `443-500`, which two entries of one policy may well allow), and one refused
/// element fails the whole write: the answer would go on without any of its grants.
fn ranges_allowing(name: &str, allowances: &[Arc<NameAllowance>]) -> Vec<PortRange> {
    let ranges: Vec<(PortRange, ())> = allowances
        .iter()
        .filter(|a| a.allows(name))
        .flat_map(|a| a.ports.iter().map(|&p| (p, ())))
        .collect();
    merged(ranges, |(), ()| ())
        .into_iter()
        .map(|(r, ())| r)
        .collect()
}

/// `ranges` with the overlapping and adjacent ones of a protocol merged, in order of protocol and
/// first port; the values of merged ranges are combined with `combine`.
fn merged<T>(mut ranges: Vec<(PortRange, T)>, combine: impl Fn(T, T) -> T) -> Vec<(PortRange, T)> {
    ranges.sort_unstable_by_key(|(r, _)| *r);
    let mut out: Vec<(PortRange, T)> = Vec::with_capacity(ranges.len());
    for (range, value) in ranges {
        match out.pop() {
            Some((mut last, held))
                if last.protocol == range.protocol
                    && u32::from(range.first) <= u32::from(last.last) + 1 =>
            {
                last.last = last.last.max(range.last);
                out.push((last, combine(held, value)));
            }
            Some(last) => {
                out.push(last);
                out.push((range, value));
            }
            None => out.push((range, value)),
        }
    }
    out
}

/// A grant's end, and the names whose answers made it (a resolved address may serve several).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Holding {
    end: Duration,
    names: Vec<Arc<str>>,
}

impl Holding {
    fn note(&mut self, name: &Arc<str>) {
        if !self.names.contains(name) {
            self.names.push(name.clone());
        }
    }
}

/// The node's grants. See the module docs.
#[derive(Clone, Debug)]
pub struct Grants {
    held: HashMap<Grant, Holding>,
    max: usize,
}

impl Grants {
    /// At most `max` grants on the node; past it, new ones are refused (counted by the caller).
    pub fn new(max: usize) -> Self {
        Self {
            held: HashMap::new(),
            max,
        }
    }

    pub fn len(&self) -> usize {
        self.held.len()
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// The grants for a pod with addresses `pod_ips` that resolved `address` from `name`, believed
    /// until `until`, under `allowances` (the pod's `egressNames`): one per port range of the
    /// allowances naming `name` ([`ranges_allowing`]), for the pod's address of the same family.
    pub fn admit(
        &mut self,
        pod_ips: &[IpAddr],
        (name, address, until): (&Arc<str>, IpAddr, Duration),
        allowances: &[Arc<NameAllowance>],
        now: Duration,
    ) -> Admitted {
        let mut admitted = Admitted::default();
        if until <= now {
            return admitted;
        }
        let Some(&pod) = pod_ips.iter().find(|ip| ip.is_ipv4() == address.is_ipv4()) else {
            return admitted;
        };
        let mut earliest: Option<Duration> = None;
        for ports in ranges_allowing(name, allowances) {
            let grant = Grant {
                pod,
                address,
                ports,
            };
            let full = self.held.len() >= self.max;
            match self.held.get_mut(&grant) {
                Some(held) if held.end > now => {
                    held.note(name);
                    if until >= held.end + EXTEND_STEP {
                        held.end = until;
                        admitted.extended.push((grant, until - now));
                    }
                }
                Some(held) => {
                    // Ended (the kernel removed it): a new grant.
                    *held = Holding {
                        end: until,
                        names: vec![name.clone()],
                    };
                    admitted.new.push((grant, until - now));
                }
                None if full => admitted.refused += 1,
                None => {
                    self.held.insert(
                        grant,
                        Holding {
                            end: until,
                            names: vec![name.clone()],
                        },
                    );
                    admitted.new.push((grant, until - now));
                }
            }
            if let Some(held) = self.held.get(&grant) {
                earliest = Some(earliest.map_or(held.end, |e| e.min(held.end)));
            }
        }
        if admitted.refused == 0 {
            admitted.settled = earliest;
        }
        admitted
    }

    /// Forgets `grant` (the kernel did not take its new end).
    pub fn forget(&mut self, grant: &Grant) {
        self.held.remove(grant);
    }

    /// Forgets grants that ended by `now`.
    pub fn expire(&mut self, now: Duration) {
        self.held.retain(|_, held| held.end > now);
    }

    /// Brings the grants of the pods whose allowances changed (`allowances_of` gives a pod address's
    /// allowances now; `None`: it may reach no name) in line with them, for an install that writes
    /// the whole table: each (pod, address)'s grants become the ranges its names are allowed now,
    /// merged (overlapping and adjacent ranges, each until the latest end among them), so a widened
    /// entry reaches its new ports and a narrowed one loses the old ones at once, without waiting for
    /// the next answer, and no grant left from before shares a first or last port with a new one.
    pub fn reallow(
        &mut self,
        changed: impl Fn(IpAddr) -> bool,
        allowances_of: impl Fn(IpAddr) -> Option<Vec<Arc<NameAllowance>>>,
        now: Duration,
    ) {
        self.expire(now);
        let mut by_address: HashMap<(IpAddr, IpAddr), Vec<Holding>> = HashMap::new();
        self.held.retain(|grant, held| {
            if !changed(grant.pod) {
                return true;
            }
            by_address
                .entry((grant.pod, grant.address))
                .or_default()
                .push(held.clone());
            false
        });
        for ((pod, address), holdings) in by_address {
            let Some(allowances) = allowances_of(pod) else {
                continue;
            };
            // Each name until the latest end of the grants it made.
            let mut ends: Vec<(Arc<str>, Duration)> = Vec::new();
            for held in holdings {
                for name in held.names {
                    match ends.iter_mut().find(|(n, _)| *n == name) {
                        Some((_, end)) => *end = (*end).max(held.end),
                        None => ends.push((name, held.end)),
                    }
                }
            }
            let ranges = ends
                .into_iter()
                .flat_map(|(name, end)| {
                    ranges_allowing(&name, &allowances)
                        .into_iter()
                        .map(move |r| {
                            (
                                r,
                                Holding {
                                    end,
                                    names: vec![name.clone()],
                                },
                            )
                        })
                })
                .collect();
            for (ports, held) in merged(ranges, |mut a, b| {
                a.end = a.end.max(b.end);
                for name in &b.names {
                    a.note(name);
                }
                a
            }) {
                if self.held.len() >= self.max {
                    break;
                }
                let grant = Grant {
                    pod,
                    address,
                    ports,
                };
                self.held.insert(grant, held);
            }
        }
    }

    /// The grants that hold at `now`, each with the time it has left, in a stable order.
    pub fn live(&self, now: Duration) -> Vec<(Grant, Duration)> {
        let mut live: Vec<(Grant, Duration)> = self
            .held
            .iter()
            .filter(|(_, held)| held.end > now)
            .map(|(grant, held)| (*grant, held.end - now))
            .collect();
        live.sort();
        live
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use network_enforcer_api::Protocol;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    fn tcp(first: u16, last: u16) -> PortRange {
        PortRange {
            protocol: Protocol::TCP,
            first,
            last,
        }
    }

    fn allowance(names: &[&str], ports: &[PortRange]) -> Arc<NameAllowance> {
        Arc::new(NameAllowance {
            names: names.iter().map(|n| n.to_string()).collect(),
            ports: ports.to_vec(),
        })
    }

    const S: fn(u64) -> Duration = Duration::from_secs;

    fn n(name: &str) -> Arc<str> {
        name.into()
    }

    #[test]
    fn an_allowed_name_grants_its_ports_to_the_pods_address_of_the_same_family() {
        let mut grants = Grants::new(100);
        let pod = [ip("10.0.0.5"), ip("fd00::5")];
        let allowances = [
            allowance(&["api.partner.test"], &[tcp(443, 443)]),
            allowance(&["*.cdn.partner.test"], &[tcp(80, 80), tcp(8000, 8099)]),
        ];
        let admitted = grants.admit(
            &pod,
            (&n("api.partner.test"), ip("203.0.113.10"), S(130)),
            &allowances,
            S(100),
        );
        let expected = Grant {
            pod: ip("10.0.0.5"),
            address: ip("203.0.113.10"),
            ports: tcp(443, 443),
        };
        assert_eq!(admitted.new, [(expected, S(30))]);
        assert_eq!(expected.element(), "10.0.0.5 . 203.0.113.10 . tcp . 443");
        // An AAAA answer grants to the pod's IPv6 address; a wildcard's ranges come out whole.
        let admitted = grants.admit(
            &pod,
            (&n("eu.cdn.partner.test"), ip("2001:db8::7"), S(160)),
            &allowances,
            S(100),
        );
        let elements: Vec<String> = admitted.new.iter().map(|(g, _)| g.element()).collect();
        assert_eq!(
            elements,
            [
                "fd00::5 . 2001:db8::7 . tcp . 80",
                "fd00::5 . 2001:db8::7 . tcp . 8000-8099"
            ]
        );
        // A name no allowance names, an answer already over, a family the pod lacks: nothing.
        for (name, address, until) in [
            (&n("other.test"), ip("203.0.113.11"), S(130)),
            (&n("api.partner.test"), ip("203.0.113.12"), S(100)),
        ] {
            assert_eq!(
                grants.admit(&pod, (&n(name), address, until), &allowances, S(100)),
                Admitted::default()
            );
        }
        assert_eq!(
            grants.admit(
                &pod[..1],
                (&n("api.partner.test"), ip("2001:db8::1"), S(130)),
                &allowances,
                S(100)
            ),
            Admitted::default()
        );
        assert_eq!(grants.len(), 3);
    }

    /// Two entries of one policy whose ports overlap or touch (`443` and `443-450`) make one grant
    /// each merged range: the kernel refuses elements that share a first or last port, and one
    /// refused element failed the answer's whole write.
    #[test]
    fn overlapping_and_adjacent_ports_of_a_name_make_one_grant() {
        let udp = |first, last| PortRange {
            protocol: Protocol::UDP,
            ..tcp(first, last)
        };
        let allowances = [
            allowance(&["api.partner.test"], &[tcp(443, 443), udp(443, 443)]),
            allowance(
                &["*.partner.test"],
                &[tcp(443, 450), tcp(451, 460), tcp(8443, 8443)],
            ),
            allowance(&["api.partner.test"], &[tcp(445, 446), tcp(8000, 9000)]),
        ];
        let mut grants = Grants::new(100);
        let admitted = grants.admit(
            &[ip("10.0.0.5")],
            (&n("api.partner.test"), ip("203.0.113.10"), S(130)),
            &allowances,
            S(100),
        );
        let elements: Vec<String> = admitted.new.iter().map(|(g, _)| g.element()).collect();
        assert_eq!(
            elements,
            [
                "10.0.0.5 . 203.0.113.10 . tcp . 443-460",
                "10.0.0.5 . 203.0.113.10 . tcp . 8000-9000",
                "10.0.0.5 . 203.0.113.10 . udp . 443",
            ]
        );
        // A name only the wildcard allows gets the wildcard's ranges, merged alike.
        let admitted = grants.admit(
            &[ip("10.0.0.5")],
            (&n("www.partner.test"), ip("203.0.113.11"), S(130)),
            &allowances,
            S(100),
        );
        let elements: Vec<String> = admitted.new.iter().map(|(g, _)| g.element()).collect();
        assert_eq!(
            elements,
            [
                "10.0.0.5 . 203.0.113.11 . tcp . 443-460",
                "10.0.0.5 . 203.0.113.11 . tcp . 8443"
            ]
        );
    }

    /// At an install whose allowances changed for a pod, its grants follow them at once: a widened
    /// entry's address is reachable on the added ports without a new answer (and no old grant shares
    /// a first port with the new one), a narrowed one loses the ports it no longer allows, an entry
    /// gone takes its grants; another pod keeps its own.
    #[test]
    fn grants_follow_a_changed_entry_at_the_install() {
        let (pod, other) = (ip("10.0.0.5"), ip("10.0.0.6"));
        let address = ip("203.0.113.10");
        let narrow = [allowance(
            &["api.partner.test", "www.partner.test"],
            &[tcp(8442, 8442)],
        )];
        let mut grants = Grants::new(100);
        for (at, name, until) in [
            (pod, "api.partner.test", 130),
            (pod, "www.partner.test", 160),
            (other, "api.partner.test", 130),
        ] {
            grants.admit(&[at], (&n(name), address, S(until)), &narrow, S(100));
        }
        let elements = |g: &Grants| -> Vec<(String, Duration)> {
            g.live(S(100))
                .into_iter()
                .map(|(g, left)| (g.element(), left))
                .collect()
        };
        assert_eq!(
            elements(&grants),
            [
                ("10.0.0.5 . 203.0.113.10 . tcp . 8442".to_string(), S(60)),
                ("10.0.0.6 . 203.0.113.10 . tcp . 8442".to_string(), S(30)),
            ]
        );
        let wide = vec![
            allowance(&["api.partner.test"], &[tcp(8442, 8443)]),
            allowance(&["www.partner.test"], &[tcp(8444, 8450), tcp(9000, 9000)]),
        ];
        grants.reallow(|ip| ip == pod, |_| Some(wide.clone()), S(100));
        assert_eq!(
            elements(&grants),
            [
                (
                    "10.0.0.5 . 203.0.113.10 . tcp . 8442-8450".to_string(),
                    S(60)
                ),
                ("10.0.0.5 . 203.0.113.10 . tcp . 9000".to_string(), S(60)),
                ("10.0.0.6 . 203.0.113.10 . tcp . 8442".to_string(), S(30)),
            ]
        );
        // Narrowed: only api's 8443 is left, until the latest end of the grants api made.
        let narrower = vec![allowance(&["api.partner.test"], &[tcp(8443, 8443)])];
        grants.reallow(|ip| ip == pod, |_| Some(narrower.clone()), S(100));
        assert_eq!(
            elements(&grants),
            [
                ("10.0.0.5 . 203.0.113.10 . tcp . 8443".to_string(), S(60)),
                ("10.0.0.6 . 203.0.113.10 . tcp . 8442".to_string(), S(30)),
            ]
        );
        // The answer that comes next settles on the grant as it is now.
        let again = grants.admit(
            &[pod],
            (&n("api.partner.test"), address, S(131)),
            &narrower,
            S(101),
        );
        assert_eq!((again.new.len(), again.settled), (0, Some(S(160))));
        // No entry left: no grant.
        grants.reallow(|ip| ip == pod, |_| None, S(100));
        assert_eq!(
            elements(&grants),
            [("10.0.0.6 . 203.0.113.10 . tcp . 8442".to_string(), S(30))]
        );
    }

    #[test]
    fn a_grant_is_extended_by_steps_renewed_after_its_end_and_bounded() {
        let mut grants = Grants::new(2);
        let pod = [ip("10.0.0.5")];
        let allowances = [allowance(&["api.partner.test"], &[tcp(443, 443)])];
        let name = n("api.partner.test");
        let answer = |address: &str, until: u64| (&name, ip(address), S(until));
        assert_eq!(
            grants
                .admit(&pod, answer("203.0.113.10", 130), &allowances, S(100))
                .new
                .len(),
            1
        );
        // The same answer a little later: nothing to do (settled until the grant's end); past the
        // step: extended.
        let again = grants.admit(&pod, answer("203.0.113.10", 134), &allowances, S(104));
        assert_eq!(
            again,
            Admitted {
                settled: Some(S(130)),
                ..Admitted::default()
            }
        );
        let later = grants.admit(&pod, answer("203.0.113.10", 140), &allowances, S(110));
        assert_eq!(later.settled, Some(S(140)));
        assert_eq!(later.extended.len(), 1);
        assert_eq!(later.extended[0].1, S(30));
        // Ended: the kernel removed it, so it is new again.
        let renewed = grants.admit(&pod, answer("203.0.113.10", 200), &allowances, S(170));
        assert_eq!(renewed.new.len(), 1);
        // The bound: a second address fits, a third is refused.
        assert_eq!(
            grants
                .admit(&pod, answer("203.0.113.11", 200), &allowances, S(170))
                .new
                .len(),
            1
        );
        let full = grants.admit(&pod, answer("203.0.113.12", 200), &allowances, S(170));
        assert_eq!((full.new.len(), full.refused), (0, 1));
        // Refused: never settled, so the kernel check always queues its answers.
        assert_eq!(full.settled, None);
        // Expiry frees room; live lists what is left with its time.
        grants.expire(S(200));
        assert!(grants.is_empty());
        assert!(grants.live(S(200)).is_empty());
    }
}
