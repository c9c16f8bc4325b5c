//! Loading the kernel programs: checks the host, patches the load-time configuration into the object,
//! attaches the programs, and hands out the event reader and the counters.

use crate::error::{Error, Result};
use crate::kernel::btf::Btf;
use crate::kernel::dns_messages::DnsReader;
use crate::kernel::events::EventReader;
use crate::kernel::host;
use aya::maps::{MapData, PerCpuArray, RingBuf};
use aya::programs::{
    CgroupAttachMode, CgroupSkb, CgroupSkbAttachType, CgroupSockAddr, RawTracePoint,
};
use aya::{Ebpf, EbpfLoader};
use network_enforcer_agent_common::{
    CONFIG_GLOBAL, COUNTERS_MAP, Config, Counter, DNS_ANSWER_PROGRAM, DNS_EVENTS_MAP,
    DNS_QUERY_PROGRAM, EVENTS_MAP, KernelOffsets, TCP_STATE_PROGRAM, UDP_PROGRAMS,
};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

/// The kernel programs, compiled by `build.rs` from the `agent-ebpf` crate.
static EBPF_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/network-enforcer-agent-ebpf"));

/// Choices made at load time.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Size of the events ring buffer in bytes: a power of two and a multiple of the page size. `None`
    /// keeps the compiled-in default (4 MiB). Tests use a tiny one to exercise the lost-event counter.
    pub ring_buffer_bytes: Option<u32>,
    /// An edge already reported within this window is not reported again by the kernel.
    pub dedupe_window: Duration,
    /// The cgroup v2 directory the UDP hooks attach to; `None`: the hierarchy's root.
    pub cgroup: Option<std::path::PathBuf>,
    /// Copy the pods' DNS messages (for the names of outside peers); off: no DNS program is attached.
    pub dns: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            ring_buffer_bytes: None,
            dedupe_window: Duration::from_secs(5),
            cgroup: None,
            dns: true,
        }
    }
}

/// Kernel struct offsets from the running kernel's BTF. A member this kernel lacks is logged and left
/// unknown (the programs then report 0 for the netns, cgroup or error that depends on it).
fn kernel_offsets() -> Result<KernelOffsets> {
    let btf = Btf::from_kernel()?;
    let (offsets, missing) = btf.kernel_offsets();
    for err in &missing {
        tracing::warn!(%err, "kernel struct member not found; attribution will be partial");
    }
    tracing::debug!(?offsets, "kernel struct offsets from BTF");
    Ok(offsets)
}

/// The loaded and attached kernel programs. Dropping it detaches and unloads them.
pub struct DataPlane {
    ebpf: Ebpf,
}

/// The kernel-side counters, summed over all CPUs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelCounters {
    /// Events dropped because the ring buffer was full.
    pub ring_buffer_full: u64,
    /// Events not sent because the same edge was reported within the dedupe window.
    pub dedupe_hits: u64,
    /// TCP state changes of an unknown address family (should stay 0).
    pub unknown_family: u64,
    /// DNS messages not copied because the DNS ring buffer was full.
    pub dns_ring_buffer_full: u64,
    /// DNS messages longer than the kernel copies (user space cannot read them).
    pub dns_truncated: u64,
    /// Per program, by its name (`inet_sock_set_state`, `udp_sendmsg4`, ...): its runs and the time the
    /// kernel spent in it. Both stay 0 unless the kernel keeps BPF statistics (`sysctl
    /// kernel.bpf_stats_enabled=1`): they are what the agent costs inside the kernel
    /// (docs/operations.md, "Kernel cost"). A program this kernel refused is absent.
    pub programs: BTreeMap<String, ProgramCost>,
}

/// What one of the agent's programs cost the kernel so far (see [`KernelCounters::programs`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProgramCost {
    pub runs: u64,
    pub run_ns: u64,
}

impl DataPlane {
    /// Checks the host (privileges, BTF, bpffs), loads the programs with this kernel's layout
    /// and attaches them. Events flow into the ring buffer from here on; take the reader with
    /// [`DataPlane::events`].
    pub fn load(options: &LoadOptions) -> Result<Self> {
        host::check_privileges()?;
        host::require_btf()?;
        host::ensure_mounted("bpf", Path::new(host::BPFFS_PATH))?;

        let kernel = kernel_offsets()?;
        // Without these the TCP program could not tell a TCP socket or read its addresses.
        if kernel.sock_protocol == KernelOffsets::UNKNOWN
            || kernel.sock_head == KernelOffsets::UNKNOWN
        {
            return Err(Error::Btf(crate::kernel::btf::BtfError::Layout(
                "struct sock lacks sk_protocol or the usual start of struct sock_common: TCP \
                 connections cannot be read on this kernel"
                    .into(),
            )));
        }
        let config = Config {
            kernel,
            dedupe_window_ns: u64::try_from(options.dedupe_window.as_nanos()).unwrap_or(u64::MAX),
        };
        tracing::debug!(?config, "loading eBPF programs");

        let mut loader = EbpfLoader::new();
        loader.override_global(CONFIG_GLOBAL, &config, true);
        if let Some(bytes) = options.ring_buffer_bytes {
            loader.map_max_entries(EVENTS_MAP, bytes);
        }
        let mut ebpf = loader.load(EBPF_OBJECT)?;

        let program: &mut RawTracePoint = ebpf
            .program_mut(TCP_STATE_PROGRAM)
            .ok_or(Error::Missing {
                kind: "program",
                name: TCP_STATE_PROGRAM,
            })?
            .try_into()
            .map_err(|source| Error::Program {
                program: TCP_STATE_PROGRAM,
                source,
            })?;
        program
            .load()
            .and_then(|()| program.attach("inet_sock_set_state").map(drop))
            .map_err(|source| Error::Program {
                program: TCP_STATE_PROGRAM,
                source,
            })?;

        // The UDP hooks go on the node's cgroup (the cgroup v2 root on a real node, see
        // `host::NodeCgroups`): every pod of the node is below it.
        // aya attaches with a bpf_link (kernel >= 5.7, and we need >= 5.8), which the kernel always adds in
        // multi mode, leaving other programs attached there (Cilium's, another agent's) in place; the
        // link API rejects any explicit flag, hence `Single` (= no flags).
        let cgroup_root = match &options.cgroup {
            Some(dir) => dir.clone(),
            None => host::cgroup2_root()?,
        };
        let cgroup = std::fs::File::open(&cgroup_root).map_err(|source| Error::Read {
            path: cgroup_root.clone(),
            source,
        })?;
        for name in UDP_PROGRAMS {
            let program: &mut CgroupSockAddr = ebpf
                .program_mut(name)
                .ok_or(Error::Missing {
                    kind: "program",
                    name,
                })?
                .try_into()
                .map_err(|source| Error::Program {
                    program: name,
                    source,
                })?;
            program
                .load()
                .and_then(|()| program.attach(&cgroup, CgroupAttachMode::Single).map(drop))
                .map_err(|source| Error::Program {
                    program: name,
                    source,
                })?;
        }
        if options.dns {
            for (name, direction) in [
                (DNS_QUERY_PROGRAM, CgroupSkbAttachType::Egress),
                (DNS_ANSWER_PROGRAM, CgroupSkbAttachType::Ingress),
            ] {
                let program: &mut CgroupSkb = ebpf
                    .program_mut(name)
                    .ok_or(Error::Missing {
                        kind: "program",
                        name,
                    })?
                    .try_into()
                    .map_err(|source| Error::Program {
                        program: name,
                        source,
                    })?;
                program
                    .load()
                    .and_then(|()| {
                        program
                            .attach(&cgroup, direction, CgroupAttachMode::Single)
                            .map(drop)
                    })
                    .map_err(|source| Error::Program {
                        program: name,
                        source,
                    })?;
            }
        }
        tracing::info!(
            cgroup_root = %cgroup_root.display(),
            dns = options.dns,
            "eBPF programs attached: raw tracepoint inet_sock_set_state, UDP sock_addr hooks, \
             DNS cgroup skb hooks (when dns)"
        );
        Ok(Self { ebpf })
    }

    /// Takes the reader of the events ring buffer (once; later calls fail with [`Error::Missing`]).
    pub fn events(&mut self) -> Result<EventReader> {
        let map = self.ebpf.take_map(EVENTS_MAP).ok_or(Error::Missing {
            kind: "map",
            name: EVENTS_MAP,
        })?;
        let ring = RingBuf::try_from(map).map_err(|source| Error::Map {
            map: EVENTS_MAP,
            source,
        })?;
        EventReader::new(ring)
    }

    /// Takes the reader of the DNS ring buffer (once); `None` when DNS capture is off.
    pub fn dns_messages(&mut self) -> Result<Option<DnsReader>> {
        let attached = self
            .ebpf
            .program(DNS_ANSWER_PROGRAM)
            .is_some_and(|p| p.fd().is_ok());
        if !attached {
            return Ok(None);
        }
        let map = self.ebpf.take_map(DNS_EVENTS_MAP).ok_or(Error::Missing {
            kind: "map",
            name: DNS_EVENTS_MAP,
        })?;
        let ring = RingBuf::try_from(map).map_err(|source| Error::Map {
            map: DNS_EVENTS_MAP,
            source,
        })?;
        DnsReader::new(ring).map(Some)
    }

    /// Reads the kernel-side counters.
    pub fn counters(&self) -> Result<KernelCounters> {
        let map = self.ebpf.map(COUNTERS_MAP).ok_or(Error::Missing {
            kind: "map",
            name: COUNTERS_MAP,
        })?;
        let array: PerCpuArray<&MapData, u64> =
            PerCpuArray::try_from(map).map_err(|source| Error::Map {
                map: COUNTERS_MAP,
                source,
            })?;
        let sum = |counter: Counter| -> Result<u64> {
            let values = array
                .get(&(counter as u32), 0)
                .map_err(|source| Error::Map {
                    map: COUNTERS_MAP,
                    source,
                })?;
            Ok(values.iter().sum())
        };
        // A program that is not loaded (a hook this kernel refused) has no statistics: skip it.
        let programs = self
            .ebpf
            .programs()
            .filter_map(|(name, program)| {
                let info = program.info().ok()?;
                let cost = ProgramCost {
                    runs: info.run_count(),
                    run_ns: u64::try_from(info.run_time().as_nanos()).unwrap_or(u64::MAX),
                };
                Some((name.to_string(), cost))
            })
            .collect();
        Ok(KernelCounters {
            ring_buffer_full: sum(Counter::RingBufferFull)?,
            dedupe_hits: sum(Counter::DedupeHit)?,
            unknown_family: sum(Counter::UnknownFamily)?,
            dns_ring_buffer_full: sum(Counter::DnsRingBufferFull)?,
            dns_truncated: sum(Counter::DnsTruncated)?,
            programs,
        })
    }
}
