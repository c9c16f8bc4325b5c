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
#[derive(Debug, Clone)]
struct Member {
    name_off: u32,
    type_id: u32,
    /// Offset in bits from the start of the containing struct.
    bit_offset: u32,
    /// Non-zero for a bit field.
    bitfield_size: u32,
}

/// One type record: its kind, name, the type it refers to (typedef, const, ...) and members.
#[derive(Debug, Clone)]
struct Type {
    kind: u32,
    name_off: u32,
    /// For modifiers and typedefs: the referenced type id.
    type_ref: u32,
    members: Vec<Member>,
}

/// Parsed BTF: types by id (index 0 is `void`) and the string section.
pub struct Btf {
    types: Vec<Type>,
    strings: Vec<u8>,
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
        let path = crate::kernel::host::VMLINUX_BTF;
        let data = std::fs::read(path).map_err(|source| crate::Error::Read {
            path: path.into(),
            source,
        })?;
        Self::parse(&data).map_err(crate::Error::Btf)
    }

    /// Parses little-endian BTF (the only byte order on the architectures we run on).
    pub fn parse(data: &[u8]) -> Result<Self, BtfError> {
        let bad = |what: &str| BtfError::Malformed(what.to_string());
        if read_u16(data, 0) != Some(BTF_MAGIC) {
            return Err(bad("bad magic (not little-endian BTF)"));
        }
        let header = |at| read_u32(data, at).ok_or_else(|| bad("truncated header"));
        let hdr_len = header(4)? as usize;
        let (type_off, type_len) = (header(8)? as usize, header(12)? as usize);
        let (str_off, str_len) = (header(16)? as usize, header(20)? as usize);
        let type_section = data
            .get(hdr_len + type_off..hdr_len + type_off + type_len)
            .ok_or_else(|| bad("type section out of range"))?;
        let strings = data
            .get(hdr_len + str_off..hdr_len + str_off + str_len)
            .ok_or_else(|| bad("string section out of range"))?
            .to_vec();

        let mut types = vec![Type {
            kind: 0,
            name_off: 0,
            type_ref: 0,
            members: Vec::new(),
        }];
        let mut at = 0;
        while at < type_section.len() {
            let word =
                |i: usize| read_u32(type_section, at + 4 * i).ok_or_else(|| bad("truncated type"));
            let (name_off, info, size_or_type) = (word(0)?, word(1)?, word(2)?);
            let vlen = (info & 0xffff) as usize;
            let kind = (info >> 24) & 0x1f;
            let kind_flag = info >> 31 == 1;
            at += 12;
            let mut members = Vec::new();
            let extra = match kind {
                KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
                KIND_ARRAY => 12,
                KIND_STRUCT | KIND_UNION => {
                    for i in 0..vlen {
                        let m = |j: usize| {
                            read_u32(type_section, at + 12 * i + 4 * j)
                                .ok_or_else(|| bad("truncated member"))
                        };
                        let offset = m(2)?;
                        let (bit_offset, bitfield_size) = if kind_flag {
                            (offset & 0x00ff_ffff, offset >> 24)
                        } else {
                            (offset, 0)
                        };
                        members.push(Member {
                            name_off: m(0)?,
                            type_id: m(1)?,
                            bit_offset,
                            bitfield_size,
                        });
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
            at += extra;
            types.push(Type {
                kind,
                name_off,
                type_ref: size_or_type,
                members,
            });
        }
        Ok(Self { types, strings })
    }

    fn name(&self, off: u32) -> &str {
        let start = off as usize;
        let rest = self.strings.get(start..).unwrap_or_default();
        let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        std::str::from_utf8(&rest[..end]).unwrap_or("")
    }

    /// Follows typedefs and qualifiers to the underlying type id.
    fn resolve(&self, mut id: u32) -> u32 {
        for _ in 0..32 {
            match self.types.get(id as usize) {
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
    fn find_member(&self, id: u32, name: &str) -> Option<(&Member, u32)> {
        let t = self.types.get(self.resolve(id) as usize)?;
        if !matches!(t.kind, KIND_STRUCT | KIND_UNION) {
            return None;
        }
        for m in &t.members {
            if self.name(m.name_off) == name {
                return Some((m, m.bit_offset));
            }
        }
        // Anonymous structs and unions (`union { ... };`) contribute their members to the parent.
        t.members
            .iter()
            .filter(|m| m.name_off == 0 || self.name(m.name_off).is_empty())
            .find_map(|m| {
                self.find_member(m.type_id, name)
                    .map(|(inner, off)| (inner, m.bit_offset + off))
            })
    }

    /// Byte offset of `path` (dotted, e.g. `__sk_common.skc_net`) inside struct `strukt`.
    pub fn member_offset(&self, strukt: &str, path: &str) -> Result<u32, BtfError> {
        let root = self
            .types
            .iter()
            .position(|t| t.kind == KIND_STRUCT && self.name(t.name_off) == strukt)
            .ok_or_else(|| BtfError::NoStruct(strukt.to_string()))?;
        let no_member = || BtfError::NoMember {
            strukt: strukt.to_string(),
            path: path.to_string(),
        };
        let mut id = root as u32;
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
        let offsets = KernelOffsets {
            sock_net: get("sock", "__sk_common.skc_net.net"),
            net_inum: get("net", "ns.inum"),
            sock_cgroup: get("sock", "sk_cgrp_data.cgroup"),
            cgroup_kn: get("cgroup", "kn"),
            kernfs_node_id: get("kernfs_node", "id"),
            sock_err: get("sock", "sk_err"),
            task_nsproxy: get("task_struct", "nsproxy"),
            nsproxy_net_ns: get("nsproxy", "net_ns"),
            sock_addr_kern_sk: get("bpf_sock_addr_kern", "sk"),
            _pad: 0,
        };
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
        if !std::path::Path::new(crate::kernel::host::VMLINUX_BTF).exists() {
            panic!(
                "{} is missing: the agent requires a kernel with BTF",
                crate::kernel::host::VMLINUX_BTF
            );
        }
        let btf = Btf::from_kernel().unwrap();
        let (offsets, missing) = btf.kernel_offsets();
        assert!(missing.is_empty(), "{missing:?}");
        // `struct sock` starts with `struct sock_common`, whose network namespace pointer is early on.
        assert!(offsets.sock_net < 64, "{offsets:?}");
    }
}
