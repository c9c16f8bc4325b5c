//! Just enough of a BTF reader to find kernel struct member offsets.
//!
//! Rust eBPF has no CO-RE relocations, so the programs cannot ask the loader to fix up
//! `sk->__sk_common.skc_net` for the running kernel. Instead user space reads the kernel's own type
//! information (`/sys/kernel/btf/vmlinux`), computes the byte offsets of the few members the programs read,
//! and patches them into the programs as globals ([`network_enforcer_agent_common::KernelOffsets`]).
//!
//! The format is documented in the kernel's `Documentation/bpf/btf.rst`: a header, a type section
//! (`struct btf_type` records, each followed by kind-specific data) and a string section.

use network_enforcer_agent_common::KernelOffsets;

/// Where the kernel publishes its own BTF.
pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// Why BTF could not be read, or a member not found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BtfError {
    /// The bytes are not BTF (bad magic, truncated, offsets out of range).
    #[error("malformed BTF: {0}")]
    Malformed(String),
    /// No struct with this name.
    #[error("no struct `{0}` in the kernel's BTF")]
    NoStruct(String),
    /// The struct has no member along this path.
    #[error("struct `{strukt}` has no member `{path}`")]
    NoMember {
        /// The struct searched.
        strukt: String,
        /// The dotted member path.
        path: String,
    },
    /// Members are not where the programs expect them relative to each other.
    #[error("unexpected layout: {0}")]
    Layout(String),
    /// The member is a bit field, which the programs cannot read by byte offset.
    #[error("member `{strukt}.{path}` is a bit field")]
    BitField {
        /// The struct searched.
        strukt: String,
        /// The dotted member path.
        path: String,
    },
}

const BTF_MAGIC: u16 = 0xeb9f;

// Kinds (`BTF_KIND_*`).
const KIND_INT: u32 = 1;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;

/// One member of a struct or union.
#[derive(Debug, Clone, Copy)]
struct Member {
    name_off: u32,
    type_id: u32,
    /// Offset in bits from the start of the containing struct.
    bit_offset: u32,
    /// Non-zero for a bit field.
    bitfield_size: u32,
}

/// One type record: its kind, name, the type it refers to (typedef, const, ...) and where its members
/// are (struct and union only).
#[derive(Debug, Clone, Copy)]
struct Type {
    kind: u32,
    kind_flag: bool,
    name_off: u32,
    /// For modifiers and typedefs: the referenced type id.
    type_ref: u32,
    /// Byte offset of the first member record in the type section, and how many there are.
    members_at: usize,
    vlen: usize,
}

/// Parsed BTF: the kernel's bytes as read, and where each type record starts (index 0 is `void`).
/// Records are decoded when asked for: the kernel's BTF has over 100,000 types, and a decoded copy of
/// each (with its members) cost the agent more memory at start than everything it holds later.
pub struct Btf {
    data: Vec<u8>,
    /// The type section's and the string section's byte ranges in `data`.
    types: std::ops::Range<usize>,
    strings: std::ops::Range<usize>,
    /// Offset of every type record in the type section; `u32::MAX` for `void`.
    offsets: Vec<u32>,
}

fn read_u16(data: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(data.get(at..at + 2)?.try_into().ok()?))
}

fn read_u32(data: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(data.get(at..at + 4)?.try_into().ok()?))
}

impl Btf {
    /// Reads the running kernel's BTF.
    pub fn from_kernel() -> Result<Self, crate::Error> {
        let path = VMLINUX_BTF;
        let data = std::fs::read(path).map_err(|source| crate::Error::Read {
            path: path.into(),
            source,
        })?;
        Self::parse_owned(data).map_err(crate::Error::Btf)
    }

    /// Parses little-endian BTF (the only byte order on the architectures we run on).
    pub fn parse(data: &[u8]) -> Result<Self, BtfError> {
        Self::parse_owned(data.to_vec())
    }

    fn parse_owned(data: Vec<u8>) -> Result<Self, BtfError> {
        let bad = |what: &str| BtfError::Malformed(what.to_string());
        if read_u16(&data, 0) != Some(BTF_MAGIC) {
            return Err(bad("bad magic (not little-endian BTF)"));
        }
        let header = |at| read_u32(&data, at).ok_or_else(|| bad("truncated header"));
        let hdr_len = header(4)? as usize;
        let (type_off, type_len) = (header(8)? as usize, header(12)? as usize);
        let (str_off, str_len) = (header(16)? as usize, header(20)? as usize);
        let types = hdr_len + type_off..hdr_len + type_off + type_len;
        let strings = hdr_len + str_off..hdr_len + str_off + str_len;
        let type_section = data
            .get(types.clone())
            .ok_or_else(|| bad("type section out of range"))?;
        if data.get(strings.clone()).is_none() {
            return Err(bad("string section out of range"));
        }

        let mut offsets = vec![u32::MAX];
        let mut at = 0;
        while at < type_section.len() {
            let info = read_u32(type_section, at + 4).ok_or_else(|| bad("truncated type"))?;
            read_u32(type_section, at + 8).ok_or_else(|| bad("truncated type"))?;
            offsets.push(u32::try_from(at).map_err(|_| bad("type section too large"))?);
            let vlen = (info & 0xffff) as usize;
            let kind = (info >> 24) & 0x1f;
            let extra = match kind {
                KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
                KIND_ARRAY => 12,
                KIND_STRUCT | KIND_UNION => {
                    if type_section.len() < at + 12 + 12 * vlen {
                        return Err(bad("truncated member"));
                    }
                    12 * vlen
                }
                KIND_ENUM | KIND_FUNC_PROTO => 8 * vlen,
                KIND_DATASEC | KIND_ENUM64 => 12 * vlen,
                // PTR, FWD, TYPEDEF, VOLATILE, CONST, RESTRICT, FUNC, FLOAT, TYPE_TAG: nothing more.
                2 | 7 | KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | 12 | 16
                | KIND_TYPE_TAG => 0,
                other => return Err(BtfError::Malformed(format!("unknown kind {other}"))),
            };
            at += 12 + extra;
        }
        Ok(Self {
            data,
            types,
            strings,
            offsets,
        })
    }

    /// The type record `id`; `None` for `void` and unknown ids.
    fn get(&self, id: u32) -> Option<Type> {
        let at = *self.offsets.get(id as usize)?;
        if at == u32::MAX {
            return None;
        }
        let section = &self.data[self.types.clone()];
        let at = at as usize;
        let word = |i: usize| read_u32(section, at + 4 * i).unwrap_or(0);
        let info = word(1);
        Some(Type {
            kind: (info >> 24) & 0x1f,
            kind_flag: info >> 31 == 1,
            name_off: word(0),
            type_ref: word(2),
            members_at: at + 12,
            vlen: (info & 0xffff) as usize,
        })
    }

    /// The members of a struct or union (checked in bounds by the parse).
    fn members(&self, t: Type) -> impl Iterator<Item = Member> + '_ {
        let section = &self.data[self.types.clone()];
        let count = if matches!(t.kind, KIND_STRUCT | KIND_UNION) {
            t.vlen
        } else {
            0
        };
        (0..count).map(move |i| {
            let m = |j: usize| read_u32(section, t.members_at + 12 * i + 4 * j).unwrap_or(0);
            let offset = m(2);
            let (bit_offset, bitfield_size) = if t.kind_flag {
                (offset & 0x00ff_ffff, offset >> 24)
            } else {
                (offset, 0)
            };
            Member {
                name_off: m(0),
                type_id: m(1),
                bit_offset,
                bitfield_size,
            }
        })
    }

    fn name(&self, off: u32) -> &str {
        let strings = &self.data[self.strings.clone()];
        let rest = strings.get(off as usize..).unwrap_or_default();
        let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        std::str::from_utf8(&rest[..end]).unwrap_or("")
    }

    /// Follows typedefs and qualifiers to the underlying type id.
    fn resolve(&self, mut id: u32) -> u32 {
        for _ in 0..32 {
            match self.get(id) {
                Some(t)
                    if matches!(
                        t.kind,
                        KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG
                    ) =>
                {
                    id = t.type_ref
                }
                _ => break,
            }
        }
        id
    }

    /// Finds `name` among the members of struct/union `id`, looking inside anonymous members too.
    /// Returns the member and its bit offset from the start of `id`.
    fn find_member(&self, id: u32, name: &str) -> Option<(Member, u32)> {
        let t = self.get(self.resolve(id))?;
        if !matches!(t.kind, KIND_STRUCT | KIND_UNION) {
            return None;
        }
        if let Some(m) = self.members(t).find(|m| self.name(m.name_off) == name) {
            return Some((m, m.bit_offset));
        }
        // Anonymous structs and unions (`union { ... };`) contribute their members to the parent.
        self.members(t)
            .filter(|m| m.name_off == 0 || self.name(m.name_off).is_empty())
            .find_map(|m| {
                self.find_member(m.type_id, name)
                    .map(|(inner, off)| (inner, m.bit_offset + off))
            })
    }

    /// Byte offset of `path` (dotted, e.g. `__sk_common.skc_net`) inside struct `strukt`.
    pub fn member_offset(&self, strukt: &str, path: &str) -> Result<u32, BtfError> {
        let root = (1..self.offsets.len() as u32)
            .find(|&id| {
                self.get(id)
                    .is_some_and(|t| t.kind == KIND_STRUCT && self.name(t.name_off) == strukt)
            })
            .ok_or_else(|| BtfError::NoStruct(strukt.to_string()))?;
        let no_member = || BtfError::NoMember {
            strukt: strukt.to_string(),
            path: path.to_string(),
        };
        let mut id = root;
        let mut bits = 0u32;
        for part in path.split('.') {
            let (member, off) = self.find_member(id, part).ok_or_else(no_member)?;
            if member.bitfield_size != 0 || off % 8 != 0 {
                return Err(BtfError::BitField {
                    strukt: strukt.to_string(),
                    path: path.to_string(),
                });
            }
            bits += off;
            id = member.type_id;
        }
        Ok(bits / 8)
    }

    /// The offsets the kernel programs need. A member this kernel lacks is reported as
    /// [`KernelOffsets::UNKNOWN`] (the programs then report 0 for what depends on it) and listed in the
    /// second value, so the caller can say what is missing.
    pub fn kernel_offsets(&self) -> (KernelOffsets, Vec<BtfError>) {
        let mut missing = Vec::new();
        let mut get = |strukt: &str, path: &str| match self.member_offset(strukt, path) {
            Ok(off) => off,
            Err(err) => {
                missing.push(err);
                KernelOffsets::UNKNOWN
            }
        };
        let mut offsets = KernelOffsets {
            sock_net: get("sock", "__sk_common.skc_net.net"),
            net_inum: get("net", "ns.inum"),
            sock_cgroup: get("sock", "sk_cgrp_data.cgroup"),
            cgroup_kn: get("cgroup", "kn"),
            kernfs_node_id: get("kernfs_node", "id"),
            sock_err: get("sock", "sk_err"),
            task_nsproxy: get("task_struct", "nsproxy"),
            nsproxy_net_ns: get("nsproxy", "net_ns"),
            sock_addr_kern_sk: get("bpf_sock_addr_kern", "sk"),
            sock_protocol: get("sock", "sk_protocol"),
            sock_head: get("sock", "__sk_common.skc_daddr"),
            sock_v6_daddr: get("sock", "__sk_common.skc_v6_daddr"),
            sock_v6_rcv_saddr: get("sock", "__sk_common.skc_v6_rcv_saddr"),
            inet_sport: get("inet_sock", "inet_sport"),
        };
        // The raw TCP program reads daddr, rcv_saddr, hash, dport, num and family in one read from
        // `sock_head` (the typed one at the same offsets from it): they must follow each other as
        // they always have.
        let head = offsets.sock_head;
        for (path, at) in [
            ("__sk_common.skc_rcv_saddr", 4),
            ("__sk_common.skc_dport", 12),
            ("__sk_common.skc_num", 14),
            ("__sk_common.skc_family", 16),
        ] {
            match self.member_offset("sock", path) {
                Ok(off) if head != KernelOffsets::UNKNOWN && off == head + at => {}
                Ok(off) => {
                    missing.push(BtfError::Layout(format!(
                        "struct sock: {path} at {off}, expected skc_daddr + {at}"
                    )));
                    offsets.sock_head = KernelOffsets::UNKNOWN;
                }
                Err(err) => {
                    missing.push(err);
                    offsets.sock_head = KernelOffsets::UNKNOWN;
                }
            }
        }
        (offsets, missing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds a tiny BTF blob: `struct inner { int a; union { int b; int c; }; }`,
    /// `typedef struct inner inner_t;`, `struct outer { int x; inner_t in; int bits:3; }`.
    fn sample() -> Vec<u8> {
        let strings = b"\0int\0inner\0a\0b\0c\0inner_t\0outer\0x\0in\0bits\0";
        let s = |name: &str| {
            let needle = format!("\0{name}\0");
            strings
                .windows(needle.len())
                .position(|w| w == needle.as_bytes())
                .unwrap() as u32
                + 1
        };
        let mut types: Vec<u32> = Vec::new();
        let info = |kind: u32, vlen: u32, kind_flag: bool| {
            (kind << 24) | vlen | ((kind_flag as u32) << 31)
        };
        // 1: int
        types.extend([s("int"), info(KIND_INT, 0, false), 4, 32]);
        // 2: anonymous union { int b; int c; }
        types.extend([0, info(KIND_UNION, 2, false), 4]);
        types.extend([s("b"), 1, 0, s("c"), 1, 0]);
        // 3: struct inner { int a; union {...}; }  (union at byte 4)
        types.extend([s("inner"), info(KIND_STRUCT, 2, false), 8]);
        types.extend([s("a"), 1, 0, 0, 2, 32]);
        // 4: typedef inner_t -> 3
        types.extend([s("inner_t"), info(KIND_TYPEDEF, 0, false), 3]);
        // 5: struct outer { int x; inner_t in; int bits:3 }  (in at byte 8, bits at bit 128)
        types.extend([s("outer"), info(KIND_STRUCT, 3, true), 20]);
        types.extend([s("x"), 1, 0, s("in"), 4, 64, s("bits"), 1, (3 << 24) | 128]);
        let type_bytes: Vec<u8> = types.iter().flat_map(|w| w.to_le_bytes()).collect();
        let mut out = Vec::new();
        out.extend(BTF_MAGIC.to_le_bytes());
        out.extend([1u8, 0]);
        for w in [
            24u32,
            0,
            type_bytes.len() as u32,
            type_bytes.len() as u32,
            strings.len() as u32,
        ] {
            out.extend(w.to_le_bytes());
        }
        out.extend(type_bytes);
        out.extend(strings);
        out
    }

    #[test]
    fn finds_members_through_typedefs_and_anonymous_unions() {
        let btf = Btf::parse(&sample()).unwrap();
        assert_eq!(btf.member_offset("outer", "x"), Ok(0));
        assert_eq!(btf.member_offset("outer", "in"), Ok(8));
        assert_eq!(btf.member_offset("outer", "in.a"), Ok(8));
        assert_eq!(btf.member_offset("outer", "in.c"), Ok(12));
        assert_eq!(btf.member_offset("inner", "b"), Ok(4));
    }

    #[test]
    fn reports_what_is_missing() {
        let btf = Btf::parse(&sample()).unwrap();
        assert!(matches!(
            btf.member_offset("nope", "x"),
            Err(BtfError::NoStruct(_))
        ));
        assert!(matches!(
            btf.member_offset("outer", "in.zz"),
            Err(BtfError::NoMember { .. })
        ));
        assert!(matches!(
            btf.member_offset("outer", "bits"),
            Err(BtfError::BitField { .. })
        ));
        assert!(matches!(Btf::parse(b"junk"), Err(BtfError::Malformed(_))));
    }

    #[test]
    fn finds_every_offset_in_this_kernels_btf() {
        // Every kernel we support has BTF; the offsets the programs need must all be found.
        if !std::path::Path::new(VMLINUX_BTF).exists() {
            panic!(
                "{} is missing: the agent requires a kernel with BTF",
                VMLINUX_BTF
            );
        }
        let btf = Btf::from_kernel().unwrap();
        let (offsets, missing) = btf.kernel_offsets();
        assert!(missing.is_empty(), "{missing:?}");
        // `struct sock` starts with `struct sock_common`, whose network namespace pointer is early on.
        assert!(offsets.sock_net < 64, "{offsets:?}");
        assert_eq!(
            offsets.sock_head, 0,
            "skc_daddr opens struct sock: {offsets:?}"
        );
    }
}
