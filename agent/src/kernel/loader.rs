//! Loading the kernel programs: checks the host, patches the load-time configuration into the object,
//! attaches the programs, and hands out the event reader and the counters.

use crate::error::{Error, Result};
use crate::kernel::btf::Btf;
use crate::kernel::dns_messages::DnsReader;
use crate::kernel::events::EventReader;
use crate::kernel::host;
use aya::maps::{Array, HashMap, Map, MapData, PerCpuArray, PerCpuValues, RingBuf};
use aya::programs::{
    BtfTracePoint, CgroupAttachMode, CgroupSkb, CgroupSkbAttachType, CgroupSockAddr, ProgramError,
    RawTracePoint,
};
use aya::{Ebpf, EbpfLoader};
use network_enforcer_agent_common::{
    CONFIG_GLOBAL, CONNECTING_KEY_BYTES, CONNECTING_MAP, CONNECTING_VALUE_BYTES, COUNTERS_MAP,
    Config, Counter, DNS_ANSWER_PROGRAM, DNS_EVENTS_MAP, DNS_QUERY_PROGRAM, EDGE_KEY_BYTES,
    EDGE_VALUE_BYTES, EDGES_MAP, EVENTS_MAP, KernelOffsets, SWITCHES_MAP, Switch,
    TCP_STATE_BTF_PROGRAM, TCP_STATE_PROGRAM, UDP_PEER_KEY_BYTES, UDP_PEER_VALUE_BYTES,
    UDP_PEERS_MAP, UDP_PROGRAMS,
};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
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
    /// Capacity of each of the programs' LRU maps ([`FlowMap`]); `None` keeps the compiled-in
    /// 65,536. A full map evicts its oldest entry: raise it when `status` shows a map full.
    pub flow_map_entries: Option<u32>,
    /// Name the process of each outbound TCP connection from the start ([`Switch::ConnectionPids`];
    /// [`DataPlane::switches`] turns it on and off later). Off by default: the agent turns it on
    /// only while a debug client asks for processes.
    pub connection_pids: bool,
    /// Which hook sees TCP state changes ([`TcpHook`]).
    pub tcp_hook: TcpHook,
}

/// The hook of the TCP program. Both see the same state changes and report the same events; they
/// differ in how they read the socket.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum TcpHook {
    /// The BTF-enabled tracepoint (`tp_btf`): the socket is read with plain loads, about 40 % less
    /// kernel time per connection (docs/design.md, "Capture"). Falls back to `Raw`, with a warning,
    /// where the kernel refuses it.
    #[default]
    Typed,
    /// The raw tracepoint: a helper call per field read. Any kernel the agent supports.
    Raw,
}

impl TcpHook {
    /// The program's name in the object (and in the agent's cost metrics).
    pub fn program(self) -> &'static str {
        match self {
            Self::Typed => TCP_STATE_BTF_PROGRAM,
            Self::Raw => TCP_STATE_PROGRAM,
        }
    }
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            ring_buffer_bytes: None,
            dedupe_window: Duration::from_secs(5),
            cgroup: None,
            dns: true,
            flow_map_entries: None,
            connection_pids: false,
            tcp_hook: TcpHook::default(),
        }
    }
}

/// The program `name` of the object, as its kind `P`; a missing one or one of another kind is a build
/// error.
fn program_mut<'a, P>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut P>
where
    &'a mut P: TryFrom<&'a mut aya::programs::Program, Error = ProgramError>,
{
    ebpf.program_mut(name)
        .ok_or(Error::Missing {
            kind: "program",
            name,
        })?
        .try_into()
        .map_err(|source| Error::Program {
            program: name,
            source,
        })
}

/// Loads and attaches the TCP program on `hook`: `Typed` falls back to `Raw` (with a warning naming
/// why) when the kernel refuses the BTF-enabled tracepoint, so capture never depends on it. A typed
/// program that loaded but did not attach is unloaded, so its name never shows in the metrics.
fn attach_tcp(ebpf: &mut Ebpf, hook: TcpHook) -> Result<TcpHook> {
    if hook == TcpHook::Typed {
        // A missing program or one of another type is a build error, not the kernel's refusal.
        let program: &mut BtfTracePoint = program_mut(ebpf, TCP_STATE_BTF_PROGRAM)?;
        let refused = match aya::Btf::from_sys_fs() {
            Err(e) => Some(ProgramError::Btf(e)),
            Ok(btf) => match program.load("inet_sock_set_state", &btf) {
                Err(e) => Some(e),
                Ok(()) => match program.attach() {
                    Ok(_) => return Ok(TcpHook::Typed),
                    Err(e) => {
                        if let Err(err) = program.unload() {
                            tracing::warn!(%err, "unloading the unattached BTF-enabled TCP program");
                        }
                        Some(e)
                    }
                },
            },
        };
        if let Some(err) = refused {
            // The verifier's log can be megabytes: the reason at warn, the log at debug.
            match &err {
                ProgramError::LoadError {
                    io_error,
                    verifier_log,
                } => {
                    tracing::warn!(
                        %io_error,
                        "the kernel refused the BTF-enabled TCP tracepoint: using the raw \
                         tracepoint (same events, about 40 % more kernel time per connection; \
                         the verifier's log is at debug)"
                    );
                    tracing::debug!(%verifier_log, "the verifier's log of the BTF-enabled TCP program");
                }
                other => tracing::warn!(
                    err = %other,
                    "the BTF-enabled TCP tracepoint is not available: using the raw tracepoint \
                     (same events, about 40 % more kernel time per connection)"
                ),
            }
        }
    }
    let program: &mut RawTracePoint = program_mut(ebpf, TCP_STATE_PROGRAM)?;
    program
        .load()
        .and_then(|()| program.attach("inet_sock_set_state").map(drop))
        .map_err(|source| Error::Program {
            program: TCP_STATE_PROGRAM,
            source,
        })?;
    Ok(TcpHook::Raw)
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
    /// The hook the TCP program runs on (the asked one, or `Raw` after a fallback).
    tcp_hook: TcpHook,
    /// The events ring buffer's size as the kernel made it (its map is handed to the reader).
    ring_buffer_bytes: u32,
    dedupe_window: Duration,
    maps: Arc<KernelMaps>,
    switches: Arc<Switches>,
}

/// The programs' switches ([`Switch`]), turned while they run.
pub struct Switches(Mutex<Array<MapData, u32>>);

impl Switches {
    /// Turns `switch` on or off.
    pub fn set(&self, switch: Switch, on: bool) -> Result<()> {
        // A panic elsewhere while holding the lock left the map handle as it was.
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.set(switch as u32, u32::from(on), 0)
            .map_err(|source| Error::Map {
                map: SWITCHES_MAP,
                source,
            })
    }
}

/// The counters and the LRU maps, taken out of the loaded object: the counters are written too
/// (the ring buffer's peak is set back to 0 after each reading), and the maps are walked on a
/// blocking thread while the agent's loop goes on. (Opening second handles by the maps' ids
/// would need CAP_SYS_ADMIN.)
pub struct KernelMaps {
    counters: Mutex<PerCpuArray<MapData, u64>>,
    flow_maps: Vec<(FlowMap, Map)>,
}

/// The programs' LRU hash maps (`ebpf_map_*{map}` on `/metrics`).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, prometheus_client::encoding::EncodeLabelValue,
)]
#[allow(non_camel_case_types)]
pub enum FlowMap {
    /// TCP sockets inside `connect()`, for the process that connects.
    connecting,
    /// Edges reported within the dedupe window.
    edges,
    /// UDP sockets' peers, so that replies join the request's edge.
    udp_peers,
}

impl FlowMap {
    pub const ALL: [FlowMap; 3] = [FlowMap::connecting, FlowMap::edges, FlowMap::udp_peers];

    fn map_name(self) -> &'static str {
        match self {
            FlowMap::connecting => CONNECTING_MAP,
            FlowMap::edges => EDGES_MAP,
            FlowMap::udp_peers => UDP_PEERS_MAP,
        }
    }
}

/// How full one of the [`FlowMap`]s is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapFill {
    pub map: FlowMap,
    /// Entries now (counted by walking the map's keys).
    pub entries: u64,
    pub capacity: u32,
    /// Entries the programs put in and took out since they were loaded.
    pub inserted: u64,
    pub removed: u64,
}

impl MapFill {
    /// Entries the kernel evicted to make room since the programs were loaded: what went in and
    /// neither came out nor is still there. An estimate: the counters and the walk are not one
    /// instant, and a key written twice counts twice.
    pub fn evicted(&self) -> u64 {
        self.inserted
            .saturating_sub(self.removed)
            .saturating_sub(self.entries)
    }

    /// Entries over capacity.
    pub fn ratio(&self) -> f64 {
        self.entries as f64 / f64::from(self.capacity.max(1))
    }

    /// What this sample says, against the one `elapsed` before it, that costs the agent what it
    /// sees (`None`: nothing). An LRU map evicts before it is full (each CPU keeps free entries
    /// aside), and most evictions are of entries that no longer matter, so only these count:
    /// - `connecting` evicted: connections still inside `connect()` lost their process;
    /// - `edges` evicted at a rate that turns the map over within `dedupe_window`: edges are
    ///   reported again before their window ends (more events, never fewer edges);
    /// - `udp_peers` never: the programs cannot tell when a UDP socket closes, so dead sockets'
    ///   entries fill it and are evicted; full is its normal state.
    pub fn pressure(
        &self,
        previous: &MapFill,
        elapsed: Duration,
        dedupe_window: Duration,
    ) -> Option<String> {
        let evicted = self.evicted().saturating_sub(previous.evicted());
        if evicted == 0 {
            return None;
        }
        match self.map {
            FlowMap::connecting => Some(format!(
                "{evicted} connections in progress lost their process: more sockets were inside \
                 connect() at once than the map holds ({})",
                self.capacity
            )),
            FlowMap::edges => {
                let inserted = self.inserted.saturating_sub(previous.inserted) as f64;
                let seconds = elapsed.as_secs_f64();
                if inserted == 0.0 || seconds <= 0.0 {
                    return None;
                }
                let turnover = f64::from(self.capacity) * seconds / inserted;
                (turnover < dedupe_window.as_secs_f64()).then(|| {
                    format!(
                        "new edges turn the map over in {turnover:.1} s, within the dedupe window \
                         ({} s): edges are reported again early",
                        dedupe_window.as_secs_f64()
                    )
                })
            }
            FlowMap::udp_peers => None,
        }
    }
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
    /// Entries the programs put into and took out of their LRU maps ([`MapFill`]).
    pub edges_inserted: u64,
    pub connecting_inserted: u64,
    pub connecting_removed: u64,
    pub udp_peers_inserted: u64,
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
        if let Some(entries) = options.flow_map_entries {
            for map in FlowMap::ALL {
                loader.map_max_entries(map.map_name(), entries);
            }
        }
        let mut ebpf = loader.load(EBPF_OBJECT)?;
        // The kernel rounds the size up to whole pages (a power of two of them).
        let ring_buffer_bytes = match ebpf.map(EVENTS_MAP) {
            Some(Map::RingBuf(data)) => data
                .info()
                .map_err(|source| Error::Map {
                    map: EVENTS_MAP,
                    source,
                })?
                .max_entries(),
            _ => {
                return Err(Error::Missing {
                    kind: "ring buffer",
                    name: EVENTS_MAP,
                });
            }
        };
        let flow_maps = FlowMap::ALL
            .into_iter()
            .map(|map| {
                let name = map.map_name();
                match ebpf.take_map(name) {
                    Some(taken @ Map::LruHashMap(_)) => Ok((map, taken)),
                    _ => Err(Error::Missing {
                        kind: "LRU hash map",
                        name,
                    }),
                }
            })
            .collect::<Result<Vec<_>>>()?;
        let counters = ebpf.take_map(COUNTERS_MAP).ok_or(Error::Missing {
            kind: "map",
            name: COUNTERS_MAP,
        })?;
        let counters =
            Mutex::new(
                PerCpuArray::try_from(counters).map_err(|source| Error::Map {
                    map: COUNTERS_MAP,
                    source,
                })?,
            );

        let switches = ebpf.take_map(SWITCHES_MAP).ok_or(Error::Missing {
            kind: "map",
            name: SWITCHES_MAP,
        })?;
        let switches = Switches(Mutex::new(Array::try_from(switches).map_err(|source| {
            Error::Map {
                map: SWITCHES_MAP,
                source,
            }
        })?));
        // Before the programs attach: the first connections are named (or not) as asked.
        switches.set(Switch::ConnectionPids, options.connection_pids)?;

        let tcp_hook = attach_tcp(&mut ebpf, options.tcp_hook)?;

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
            let program: &mut CgroupSockAddr = program_mut(&mut ebpf, name)?;
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
                let program: &mut CgroupSkb = program_mut(&mut ebpf, name)?;
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
            tcp = tcp_hook.program(),
            "eBPF programs attached: the TCP state tracepoint, UDP sock_addr hooks, DNS cgroup \
             skb hooks (when dns)"
        );
        Ok(Self {
            ebpf,
            tcp_hook,
            ring_buffer_bytes,
            dedupe_window: options.dedupe_window,
            maps: Arc::new(KernelMaps {
                counters,
                flow_maps,
            }),
            switches: Arc::new(switches),
        })
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
            programs,
            ..self.maps.counters()?
        })
    }

    /// The hook the TCP program runs on.
    pub fn tcp_hook(&self) -> TcpHook {
        self.tcp_hook
    }

    /// The events ring buffer's size in bytes.
    pub fn ring_buffer_bytes(&self) -> u32 {
        self.ring_buffer_bytes
    }

    /// The kernel's dedupe window (an edge's entry in the `edges` map matters for that long).
    pub fn dedupe_window(&self) -> Duration {
        self.dedupe_window
    }

    /// The counters and the LRU maps, for a thread of their own.
    pub fn maps(&self) -> Arc<KernelMaps> {
        Arc::clone(&self.maps)
    }

    /// The programs' switches, for whoever turns them while the programs run.
    pub fn switches(&self) -> Arc<Switches> {
        Arc::clone(&self.switches)
    }

    /// See [`KernelMaps::take_ring_buffer_peak`].
    pub fn take_ring_buffer_peak(&self) -> Result<u64> {
        self.maps.take_ring_buffer_peak()
    }
}

impl KernelMaps {
    /// The kernel-side counters summed over the CPUs (no program statistics).
    pub fn counters(&self) -> Result<KernelCounters> {
        let array = self.counters.lock().unwrap_or_else(|e| e.into_inner());
        let sum = |counter: Counter| -> Result<u64> {
            let values = array
                .get(&(counter as u32), 0)
                .map_err(|source| Error::Map {
                    map: COUNTERS_MAP,
                    source,
                })?;
            Ok(values.iter().sum())
        };
        Ok(KernelCounters {
            ring_buffer_full: sum(Counter::RingBufferFull)?,
            dedupe_hits: sum(Counter::DedupeHit)?,
            unknown_family: sum(Counter::UnknownFamily)?,
            dns_ring_buffer_full: sum(Counter::DnsRingBufferFull)?,
            dns_truncated: sum(Counter::DnsTruncated)?,
            edges_inserted: sum(Counter::EdgesInserted)?,
            connecting_inserted: sum(Counter::ConnectingInserted)?,
            connecting_removed: sum(Counter::ConnectingRemoved)?,
            udp_peers_inserted: sum(Counter::UdpPeersInserted)?,
            programs: BTreeMap::new(),
        })
    }

    /// The most unread bytes the events ring buffer held (the event being written included) since
    /// the last call (or the load): how close the node came to losing events. Sets it back to 0.
    pub fn take_ring_buffer_peak(&self) -> Result<u64> {
        let slot = Counter::RingBufferPeakBytes as u32;
        let mut counters = self.counters.lock().unwrap_or_else(|e| e.into_inner());
        let map_error = |source| Error::Map {
            map: COUNTERS_MAP,
            source,
        };
        let peak = counters
            .get(&slot, 0)
            .map_err(map_error)?
            .iter()
            .copied()
            .max()
            .unwrap_or(0);
        // A program raising its CPU's peak between the read and this write loses that raise: the
        // next reading starts lower, never higher, than the truth.
        let zeros = aya::util::nr_cpus()
            .map_err(|(_, source)| Error::Map {
                map: COUNTERS_MAP,
                source: aya::maps::MapError::IoError(source),
            })
            .and_then(|cpus| {
                PerCpuValues::try_from(vec![0u64; cpus]).map_err(|e| Error::Map {
                    map: COUNTERS_MAP,
                    source: aya::maps::MapError::IoError(e),
                })
            })?;
        counters.set(slot, zeros, 0).map_err(map_error)?;
        Ok(peak)
    }

    /// How full each of the programs' LRU maps is. Walks every key, a system call per entry (about
    /// 170 ms for two full maps of 65,536 on a 2-core machine): call it rarely, off the agent's loop.
    /// What went in is read before the walk and what came out after it, so that entries moving
    /// during the walk can only make the eviction estimate low, never high.
    pub fn fill(&self) -> Result<Vec<MapFill>> {
        let before = self.counters()?;
        let mut walked = Vec::with_capacity(self.flow_maps.len());
        for (map, data) in &self.flow_maps {
            let name = map.map_name();
            let map_error = |source| Error::Map { map: name, source };
            let capacity = match data {
                Map::LruHashMap(data) => data.info().map_err(map_error)?.max_entries(),
                _ => {
                    return Err(Error::Missing {
                        kind: "LRU hash map",
                        name,
                    });
                }
            };
            let entries = match map {
                FlowMap::connecting => {
                    count_keys::<CONNECTING_KEY_BYTES, CONNECTING_VALUE_BYTES>(data, capacity)
                }
                FlowMap::edges => count_keys::<EDGE_KEY_BYTES, EDGE_VALUE_BYTES>(data, capacity),
                FlowMap::udp_peers => {
                    count_keys::<UDP_PEER_KEY_BYTES, UDP_PEER_VALUE_BYTES>(data, capacity)
                }
            }
            .map_err(map_error)?;
            walked.push((*map, entries, capacity));
        }
        let after = self.counters()?;
        Ok(walked
            .into_iter()
            .map(|(map, entries, capacity)| {
                let (inserted, removed) = match map {
                    FlowMap::connecting => (before.connecting_inserted, after.connecting_removed),
                    FlowMap::edges => (before.edges_inserted, 0),
                    FlowMap::udp_peers => (before.udp_peers_inserted, 0),
                };
                MapFill {
                    map,
                    entries,
                    capacity,
                    inserted,
                    removed,
                }
            })
            .collect())
    }
}

/// Entries of a hash map whose keys are `K` bytes and values `V` bytes, at most `capacity`. When
/// the key the walk stands on is evicted or deleted, the kernel goes on from the first key and the
/// walk counts some twice: the cap keeps the count within what the map can hold.
fn count_keys<const K: usize, const V: usize>(
    map: &Map,
    capacity: u32,
) -> std::result::Result<u64, aya::maps::MapError> {
    let map: HashMap<&MapData, [u8; K], [u8; V]> = HashMap::try_from(map)?;
    let mut entries = 0;
    for key in map.keys().take(capacity as usize) {
        key?;
        entries += 1;
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fill(map: FlowMap, entries: u64, inserted: u64, removed: u64) -> MapFill {
        MapFill {
            map,
            entries,
            capacity: 1_000,
            inserted,
            removed,
        }
    }

    #[test]
    fn evictions_are_what_went_in_and_neither_came_out_nor_stayed() {
        assert_eq!(fill(FlowMap::connecting, 10, 100, 60).evicted(), 30);
        assert_eq!(
            fill(FlowMap::edges, 1_000, 800, 0).evicted(),
            0,
            "never below 0"
        );
        assert_eq!(fill(FlowMap::edges, 250, 1_000, 0).ratio(), 0.25);
    }

    #[test]
    fn only_evictions_that_cost_what_the_agent_sees_are_pressure() {
        let minute = Duration::from_secs(60);
        let window = Duration::from_secs(5);
        let cases = [
            // (map, before (entries, inserted, removed), now, pressure?)
            (
                "connecting evicts",
                FlowMap::connecting,
                (10, 100, 90),
                (1_000, 2_000, 900),
                true,
            ),
            (
                "connecting within",
                FlowMap::connecting,
                (10, 100, 90),
                (20, 300, 280),
                false,
            ),
            // 60,000 new edges a minute turn 1,000 entries over each second.
            (
                "edges churn within the window",
                FlowMap::edges,
                (1_000, 10_000, 0),
                (1_000, 70_000, 0),
                true,
            ),
            // 2,000 a minute: once every 30 s, past the window.
            (
                "edges evict old entries",
                FlowMap::edges,
                (1_000, 10_000, 0),
                (1_000, 12_000, 0),
                false,
            ),
            (
                "edges without evictions",
                FlowMap::edges,
                (100, 100, 0),
                (900, 900, 0),
                false,
            ),
            (
                "udp peers full",
                FlowMap::udp_peers,
                (1_000, 10_000, 0),
                (1_000, 90_000, 0),
                false,
            ),
        ];
        for (name, map, (e0, i0, r0), (e1, i1, r1), expected) in cases {
            let pressure = fill(map, e1, i1, r1).pressure(&fill(map, e0, i0, r0), minute, window);
            assert_eq!(pressure.is_some(), expected, "{name}: {pressure:?}");
        }
    }
}
