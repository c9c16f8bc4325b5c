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
    let mut ranges: Vec<PortRange> = allowances
        .iter()
        .filter(|a| a.allows(name))
        .flat_map(|a| a.ports.iter().copied())
        .collect();
    // By protocol, then first port.
    ranges.sort_unstable();
    let mut merged: Vec<PortRange> = Vec::with_capacity(ranges.len());
    for range in ranges {
        match merged.last_mut() {
            Some(last)
                if last.protocol == range.protocol
                    && u32::from(range.first) <= u32::from(last.last) + 1 =>
            {
                last.last = last.last.max(range.last);
            }
            _ => merged.push(range),
        }
    }
    merged
}

/// The node's grants. See the module docs.
#[derive(Debug)]
pub struct Grants {
    held: HashMap<Grant, Duration>,
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
        (name, address, until): (&str, IpAddr, Duration),
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
                Some(end) if *end > now => {
                    if until >= *end + EXTEND_STEP {
                        *end = until;
                        admitted.extended.push((grant, until - now));
                    }
                }
                Some(end) => {
                    // Ended (the kernel removed it): a new grant.
                    *end = until;
                    admitted.new.push((grant, until - now));
                }
                None if full => admitted.refused += 1,
                None => {
                    self.held.insert(grant, until);
                    admitted.new.push((grant, until - now));
                }
            }
            if let Some(&end) = self.held.get(&grant) {
                earliest = Some(earliest.map_or(end, |e| e.min(end)));
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
        self.held.retain(|_, end| *end > now);
    }

    /// The grants that hold at `now`, each with the time it has left, in a stable order.
    pub fn live(&self, now: Duration) -> Vec<(Grant, Duration)> {
        let mut live: Vec<(Grant, Duration)> = self
            .held
            .iter()
            .filter(|(_, end)| **end > now)
            .map(|(grant, end)| (*grant, *end - now))
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
            ("api.partner.test", ip("203.0.113.10"), S(130)),
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
            ("eu.cdn.partner.test", ip("2001:db8::7"), S(160)),
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
            ("other.test", ip("203.0.113.11"), S(130)),
            ("api.partner.test", ip("203.0.113.12"), S(100)),
        ] {
            assert_eq!(
                grants.admit(&pod, (name, address, until), &allowances, S(100)),
                Admitted::default()
            );
        }
        assert_eq!(
            grants.admit(
                &pod[..1],
                ("api.partner.test", ip("2001:db8::1"), S(130)),
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
            ("api.partner.test", ip("203.0.113.10"), S(130)),
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
            ("www.partner.test", ip("203.0.113.11"), S(130)),
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

    #[test]
    fn a_grant_is_extended_by_steps_renewed_after_its_end_and_bounded() {
        let mut grants = Grants::new(2);
        let pod = [ip("10.0.0.5")];
        let allowances = [allowance(&["api.partner.test"], &[tcp(443, 443)])];
        let answer = |address: &str, until: u64| ("api.partner.test", ip(address), S(until));
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
