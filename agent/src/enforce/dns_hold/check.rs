//! The hold's kernel check (`agent-ebpf/src/hold.rs`): loaded here, run by the queue rule's xtables
//! `bpf` match ([`super::queue_rule`]), fed with a mirror of the grants. An answer the check finds
//! nothing new in goes on without ever reaching this agent.
//!
//! The mirror says, per (pod, address, name asked), until when an answer changes nothing: the
//! earliest end of that name's grants for the pod, plus [`super::grants::EXTEND_STEP`], minus the
//! grace (an answer's grants end at its TTL plus the grace, and the agent extends a grant only by a
//! step or more), and never past that end (after it, an answer makes the grant anew). When the pods' allowances change, a new generation makes every entry count as
//! absent (an allowance may now name more ports): the next answer of each name waits once more.

use aya::maps::{Array, HashMap, MapData, PerCpuArray};
use aya::programs::SocketFilter;
use aya::{Ebpf, EbpfLoader};
use network_enforcer_agent_common::hold::{
    self, COUNTERS_MAP, Counter, GENERATION_MAP, GRANTS_MAP, GrantKey, GrantValue, PROGRAM,
};
use network_enforcer_agent_common::{AF_INET, AF_INET6};
use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::time::Duration;

/// The check's object, compiled by `build.rs` from `agent-ebpf/src/hold.rs`.
static HOLD_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(
    env!("OUT_DIR"),
    "/network-enforcer-agent-ebpf-hold"
));

/// Why the check is not running (the hold then queues every answer).
#[derive(Debug, thiserror::Error)]
#[error("loading the DNS hold's kernel check: {0}")]
pub struct CheckError(String);

/// One mirror entry to write: see the module docs.
pub type Mirror = (GrantKey, GrantValue);

/// The loaded check and its maps.
pub struct Check {
    /// Keeps the program loaded (the rule holds its own reference once written).
    ebpf: Ebpf,
    grants: HashMap<MapData, GrantKey, GrantValue>,
    generation_map: Array<MapData, u64>,
    counters: PerCpuArray<MapData, u64>,
    generation: u64,
}

impl std::fmt::Debug for Check {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Check")
            .field("generation", &self.generation)
            .finish_non_exhaustive()
    }
}

impl Check {
    /// Loads the program and its maps.
    pub fn load() -> Result<Check, CheckError> {
        let error = |e: &dyn std::fmt::Display| CheckError(e.to_string());
        let mut ebpf = EbpfLoader::new().load(HOLD_OBJECT).map_err(|e| error(&e))?;
        let program: &mut SocketFilter = ebpf
            .program_mut(PROGRAM)
            .ok_or_else(|| error(&format!("the object has no program `{PROGRAM}`")))?
            .try_into()
            .map_err(|e| error(&e))?;
        program.load().map_err(|e| {
            // The verifier's log is in the source chain.
            error(&crate::error::chain(&e))
        })?;
        let mut take = |name: &str| {
            ebpf.take_map(name)
                .ok_or_else(|| error(&format!("the object has no map `{name}`")))
        };
        let grants = HashMap::try_from(take(GRANTS_MAP)?).map_err(|e| error(&e))?;
        let generation_map = Array::try_from(take(GENERATION_MAP)?).map_err(|e| error(&e))?;
        let counters = PerCpuArray::try_from(take(COUNTERS_MAP)?).map_err(|e| error(&e))?;
        Ok(Check {
            ebpf,
            grants,
            generation_map,
            counters,
            generation: 0,
        })
    }

    /// The program, for the rule's match (the kernel takes its own reference when the rule is
    /// written).
    pub fn program_fd(&self) -> Option<RawFd> {
        let program: &SocketFilter = self.ebpf.program(PROGRAM)?.try_into().ok()?;
        Some(program.fd().ok()?.as_fd().as_raw_fd())
    }

    /// The generation entries are written under now.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Writes mirror entries worked out under `generation`; none when the allowances changed since
    /// (they may not cover what the new ones allow).
    pub fn mirror(&mut self, entries: &[Mirror], generation: u64) -> Result<(), CheckError> {
        if generation != self.generation {
            return Ok(());
        }
        for (key, value) in entries {
            let value = GrantValue {
                generation: self.generation,
                ..*value
            };
            self.grants
                .insert(key, value, 0)
                .map_err(|e| CheckError(format!("writing the grants' mirror: {e}")))?;
        }
        Ok(())
    }

    /// Entries of the current generation in the mirror.
    pub fn entries(&self) -> usize {
        self.grants
            .iter()
            .filter_map(Result::ok)
            .filter(|(_, value)| value.generation == self.generation)
            .count()
    }

    /// Makes every entry written so far count as absent.
    pub fn new_generation(&mut self) -> Result<(), CheckError> {
        let next = self.generation + 1;
        self.generation_map
            .set(0, next, 0)
            .map_err(|e| CheckError(format!("writing the generation: {e}")))?;
        self.generation = next;
        Ok(())
    }

    /// Answers that went on at once and answers queued, since the check was loaded.
    pub fn counts(&self) -> (u64, u64) {
        let total = |counter: Counter| {
            self.counters
                .get(&(counter as u32), 0)
                .map(|values| values.iter().sum())
                .unwrap_or(0)
        };
        (total(Counter::Passed), total(Counter::Queued))
    }
}

/// The mirror entry for `pod` having resolved `address` from `name`, whose grants end at `end`
/// (the earliest of them, monotonic time): answers whose TTL ends before the returned time change
/// nothing. `None` when no answer could be nothing new (the step does not cover the grace).
pub fn entry(
    pod: IpAddr,
    address: IpAddr,
    name: &str,
    end: Duration,
    grace: Duration,
) -> Option<Mirror> {
    let settled = (end + super::grants::EXTEND_STEP)
        .checked_sub(grace)?
        .min(end);
    let (mut pod_bytes, mut address_bytes) = ([0u8; 16], [0u8; 16]);
    let family = match (pod, address) {
        (IpAddr::V4(p), IpAddr::V4(a)) => {
            pod_bytes[..4].copy_from_slice(&p.octets());
            address_bytes[..4].copy_from_slice(&a.octets());
            AF_INET
        }
        (IpAddr::V6(p), IpAddr::V6(a)) => {
            pod_bytes = p.octets();
            address_bytes = a.octets();
            AF_INET6
        }
        _ => return None,
    };
    Some((
        GrantKey {
            pod: pod_bytes,
            address: address_bytes,
            name: hold::name_hash(name),
            family,
            _pad: [0; 6],
        },
        GrantValue {
            settled_until_ns: u64::try_from(settled.as_nanos()).unwrap_or(u64::MAX),
            generation: 0,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_says_until_when_an_answer_changes_nothing() {
        let s = Duration::from_secs;
        let pod: IpAddr = "10.0.0.5".parse().unwrap();
        let address: IpAddr = "203.0.113.10".parse().unwrap();
        // Grants end at 160 s; with a 30 s grace and a 5 s step, an answer whose TTL ends before
        // 135 s would end them before 165 s: nothing to extend.
        let (key, value) = entry(pod, address, "Api.partner.test", s(160), s(30)).unwrap();
        assert_eq!(value.settled_until_ns, 135_000_000_000);
        assert_eq!(key.family, AF_INET);
        assert_eq!(&key.pod[..4], &[10, 0, 0, 5]);
        assert_eq!(key.pod[4..], [0; 12]);
        assert_eq!(&key.address[..4], &[203, 0, 113, 10]);
        assert_eq!(key.name, hold::name_hash("api.partner.test"));
        // Families must agree; a grace longer than the grants' end leaves nothing settled.
        assert!(entry(pod, "2001:db8::1".parse().unwrap(), "a.test", s(160), s(30)).is_none());
        assert!(entry(pod, address, "a.test", s(10), s(30)).is_none());
        // A grace shorter than the step: never past the grants' end (an answer after it makes the
        // grant anew, so it must wait).
        let (_, short) = entry(pod, address, "a.test", s(160), s(1)).unwrap();
        assert_eq!(short.settled_until_ns, 160_000_000_000);
        let (v6, _) = entry(
            "fd00::5".parse().unwrap(),
            "2001:db8::1".parse().unwrap(),
            "a.test",
            s(160),
            s(30),
        )
        .unwrap();
        assert_eq!(v6.family, AF_INET6);
    }
}

#[cfg(test)]
mod load_tests {
    use super::*;

    #[test]
    fn the_verifier_accepts_the_check() {
        if unsafe { libc::geteuid() } != 0 {
            return;
        }
        let started = std::time::Instant::now();
        let check = Check::load().expect("loading the check");
        let program: &SocketFilter = check.ebpf.program(PROGRAM).unwrap().try_into().unwrap();
        let info = program.info().unwrap();
        eprintln!(
            "loaded in {:?}, verified instructions {:?}",
            started.elapsed(),
            info.verified_instruction_count()
        );
    }
}
