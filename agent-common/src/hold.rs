//! What the DNS hold's kernel check (`agent-ebpf/src/hold.rs`) and the agent (`agent/src/enforce/dns_hold/`)
//! share. The check runs on each answer to a held pod before the queue rule: an answer whose every
//! address the pod holds a grant for, from the name it asked, long enough that the agent would not
//! extend it, brings nothing new and goes on without ever reaching user space. The agent mirrors its
//! grants into [`GRANTS_MAP`] as it makes them.
//! Layouts are `#[repr(C)]` with explicit padding, like the rest of this crate.

/// The check, a socket-filter program run by the xtables `bpf` match of the queue rule: non-zero
/// means "queue this answer".
pub const PROGRAM: &str = "dns_hold_needed";
/// The mirror of the agent's grants: [`GrantKey`] → [`GrantValue`].
pub const GRANTS_MAP: &str = "HOLD_GRANTS";
/// One `u64`: the generation of the pods' allowances; entries of another generation count as absent.
pub const GENERATION_MAP: &str = "HOLD_GENERATION";
/// Per-CPU counters, indexed by [`Counter`].
pub const COUNTERS_MAP: &str = "HOLD_COUNTERS";
/// Entries of the mirror (an LRU map: an entry pushed out costs one more queued answer, nothing else).
pub const GRANTS_MAX: u32 = 16_384;
/// Answers longer than this are queued without being read.
pub const MESSAGE_BYTES: usize = 512;
/// Answers with more records than this are queued without being read.
pub const MAX_ANSWERS: usize = 16;
/// Bytes of a name in wire form, at most (RFC 1035).
pub const MAX_NAME_BYTES: usize = 255;

/// The check's counters.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    /// Answers that went on at once (nothing new).
    Passed = 0,
    /// Answers sent to the queue.
    Queued = 1,
}

/// Counter slots.
pub const COUNTERS: u32 = 2;

/// A grant as the check looks it up: the pod (the answer's destination), an address in the answer,
/// and the hash of the name the pod asked ([`name_hash`]). Addresses in network byte order, IPv4 in
/// the first 4 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GrantKey {
    pub pod: [u8; 16],
    pub address: [u8; 16],
    pub name: u64,
    /// `AF_INET` or `AF_INET6`.
    pub family: u16,
    pub _pad: [u8; 6],
}

/// Until when (`CLOCK_MONOTONIC` nanoseconds, as `bpf_ktime_get_ns`) an answer changes nothing:
/// an answer whose TTL ends before `settled_until_ns` is nothing new for the pod.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrantValue {
    pub settled_until_ns: u64,
    /// The [`GENERATION_MAP`] value this entry was written under.
    pub generation: u64,
}

/// FNV-1a, 64 bits: the check hashes the question's bytes as it reads them.
pub const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
pub const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// One step of [`name_hash`]: the check makes the same steps over the question in wire form.
#[inline(always)]
pub fn hash_step(hash: u64, byte: u8) -> u64 {
    (hash ^ u64::from(byte.to_ascii_lowercase())).wrapping_mul(FNV_PRIME)
}

/// The hash of `name` (dotted, without the root's dot) as the check computes it over its wire form:
/// each label's length, then its bytes in lower case, then the root's zero.
pub fn name_hash(name: &str) -> u64 {
    let mut hash = FNV_OFFSET;
    for label in name
        .trim_end_matches('.')
        .split('.')
        .filter(|l| !l.is_empty())
    {
        hash = hash_step(hash, label.len() as u8);
        for &byte in label.as_bytes() {
            hash = hash_step(hash, byte);
        }
    }
    hash_step(hash, 0)
}

#[cfg(feature = "user")]
mod user {
    // SAFETY: `#[repr(C)]`, `Copy`, only integers and byte arrays, explicit padding: every bit pattern is
    // valid and there are no uninitialised bytes.
    unsafe impl aya::Pod for super::GrantKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::GrantValue {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_is_of_the_wire_form_in_lower_case() {
        // api.Partner.test in wire form: 3 a p i 7 P a r t n e r 4 t e s t 0.
        let wire = b"\x03api\x07Partner\x04test\x00";
        let by_bytes = wire.iter().fold(FNV_OFFSET, |h, &b| hash_step(h, b));
        assert_eq!(name_hash("api.partner.test"), by_bytes);
        assert_eq!(name_hash("API.partner.test."), by_bytes);
        assert_ne!(name_hash("api.partner.tes"), by_bytes);
        assert_eq!(core::mem::size_of::<GrantKey>(), 48);
        assert_eq!(core::mem::size_of::<GrantValue>(), 16);
    }
}
