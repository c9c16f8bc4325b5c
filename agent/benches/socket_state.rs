//! Per-socket state from `connect()` to the connection's outcome, three ways (issue 45.1; the
//! programs and why: `agent-ebpf/src/socket_state.rs`): the live TCP program's LRU hash keyed by the
//! socket's address from a raw tracepoint (`state_lru`), the same from a BTF-enabled tracepoint
//! (`state_btf_lru`), and socket-local storage from the BTF-enabled tracepoint (`state_sk_storage`).
//! Each in turn is attached alone while this process makes loopback TCP connections (closed with
//! RST, as the agent bench's storm), with the kernel's BPF statistics on; the figure is the time in
//! the program per connection, the median of [`ROUNDS`] interleaved rounds. Root. `cargo xtask bench
//! socket_state` runs it and reads the figures back from the file `BENCH_FIGURES` names (plain `cargo
//! bench --bench socket_state` writes `target/bench/socket_state.json` itself).
//!
//! The state-change hook fires about 8 times per connection here (both ends, loopback); 2 of those
//! runs store and find the value, the others leave at once. What it does not count: the kernel's
//! freeing of socket-local storage when the socket goes, outside the program's run time.
//!
//! Then the floor of one run on each kind of hook the agent uses, with the statistics on: empty
//! programs on the raw and the BTF-enabled tracepoint and a cgroup skb egress program at the cgroup
//! root (as the DNS programs), each alone during the same connections; the figure is ns per run.

use aya::maps::Array;
use aya::programs::{
    BtfTracePoint, CgroupAttachMode, CgroupSkb, CgroupSkbAttachType, RawTracePoint,
};
use aya::{Btf, EbpfLoader};
use std::os::fd::AsRawFd;

static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(
    env!("OUT_DIR"),
    "/network-enforcer-agent-ebpf-socket-state"
));

/// Connections per round and program.
const CONNECTIONS: usize = 40_000;
/// Rounds, each running the three programs in turn.
const ROUNDS: usize = 3;
const PROGRAMS: [&str; 3] = ["state_lru", "state_btf_lru", "state_sk_storage"];
/// The empty programs, the floor of a run per kind of hook.
const EMPTY: [&str; 3] = ["empty_raw_tp", "empty_tp_btf", "empty_skb"];

/// `CONNECTIONS` loopback connections from this process, each closed with RST.
fn connections() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback listener");
    let address = listener.local_addr().expect("its address");
    for _ in 0..CONNECTIONS {
        let client = std::net::TcpStream::connect(address).expect("connect");
        let _accepted = listener.accept().expect("accept");
        let linger = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        // SAFETY: a valid socket and a `linger` of the size given.
        unsafe {
            libc::setsockopt(
                client.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                std::ptr::from_ref(&linger).cast(),
                std::mem::size_of::<libc::linger>() as u32,
            )
        };
    }
}

/// Loads the object, attaches `program` alone, makes the connections: ns in it per connection, and
/// what it stored, found, and found for this process.
fn measure(program: &str) -> (f64, [u64; 3]) {
    let mut ebpf = EbpfLoader::new()
        .load(OBJECT)
        .expect("loading the object (its BTF-defined map too)");
    let mut pid: Array<_, u32> =
        Array::try_from(ebpf.map_mut("STATE_PID").expect("STATE_PID")).expect("an array");
    pid.set(0, std::process::id(), 0).expect("setting the pid");
    attach(&mut ebpf, program);
    connections();
    let info = ebpf
        .program(program)
        .expect("the program")
        .info()
        .expect("its info");
    let seen: Array<_, u64> =
        Array::try_from(ebpf.map("STATE_SEEN").expect("STATE_SEEN")).expect("an array");
    let seen = [0, 1, 2].map(|i| seen.get(&i, 0).expect("a counter"));
    (info.run_time().as_nanos() as f64 / CONNECTIONS as f64, seen)
}

/// Loads the object, attaches the empty `program` alone, makes the connections: ns per run.
fn floor(program: &str) -> f64 {
    let mut ebpf = EbpfLoader::new()
        .load(OBJECT)
        .expect("loading the object (its BTF-defined map too)");
    attach(&mut ebpf, program);
    connections();
    let info = ebpf
        .program(program)
        .expect("the program")
        .info()
        .expect("its info");
    assert!(info.run_count() > 0, "{program} never ran");
    info.run_time().as_nanos() as f64 / info.run_count() as f64
}

fn attach(ebpf: &mut aya::Ebpf, program: &str) {
    if program == "empty_skb" {
        let skb: &mut CgroupSkb = ebpf
            .program_mut(program)
            .expect("the program")
            .try_into()
            .expect("a cgroup skb program");
        skb.load().expect("the verifier takes it");
        let root = network_enforcer_agent::kernel::host::cgroup2_root().expect("a cgroup v2 mount");
        let root = std::fs::File::open(root).expect("the cgroup v2 root");
        skb.attach(&root, CgroupSkbAttachType::Egress, CgroupAttachMode::Single)
            .expect("attach");
    } else if program == "state_lru" || program == "empty_raw_tp" {
        let raw: &mut RawTracePoint = ebpf
            .program_mut(program)
            .expect("the program")
            .try_into()
            .expect("a raw tracepoint");
        raw.load().expect("the verifier takes it");
        raw.attach("inet_sock_set_state").expect("attach");
    } else {
        let btf = Btf::from_sys_fs().expect("the kernel's BTF");
        let typed: &mut BtfTracePoint = ebpf
            .program_mut(program)
            .expect("the program")
            .try_into()
            .expect("a BTF tracepoint");
        typed
            .load("inet_sock_set_state", &btf)
            .expect("the verifier takes it");
        typed.attach().expect("attach");
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "this bench loads eBPF programs: run it as root"
    );
    // On while the descriptor is open: off again however the bench ends.
    let stats =
        aya::sys::enable_stats(aya::sys::Stats::RunTime).expect("turning BPF statistics on");
    let mut per_program: Vec<Vec<f64>> = vec![Vec::new(); PROGRAMS.len()];
    for round in 1..=ROUNDS {
        for (i, program) in PROGRAMS.iter().enumerate() {
            let (ns, seen) = measure(program);
            println!(
                "round {round} {program}: {ns:.0} ns per connection (stored {}, found {}, ours {})",
                seen[0], seen[1], seen[2]
            );
            // Every connection of this process stored and found its value, whichever the way.
            assert!(
                seen[2] >= CONNECTIONS as u64,
                "{program} found the value for {} of {CONNECTIONS} connections",
                seen[2]
            );
            per_program[i].push(ns);
        }
    }
    let mut per_floor: Vec<Vec<f64>> = vec![Vec::new(); EMPTY.len()];
    for round in 1..=ROUNDS {
        for (i, program) in EMPTY.iter().enumerate() {
            let ns = floor(program);
            println!("round {round} {program}: {ns:.1} ns per run");
            per_floor[i].push(ns);
        }
    }
    drop(stats);
    let [lru, btf_lru, sk_storage] = [0, 1, 2].map(|i| median(per_program[i].clone()).round());
    let [raw_tp, tp_btf, skb] =
        [0, 1, 2].map(|i| (median(per_floor[i].clone()) * 10.0).round() / 10.0);
    let path = std::env::var_os("BENCH_FIGURES")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../target/bench/socket_state.json")
        });
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).expect("create the figures' directory");
    }
    let figures = serde_json::json!({
        "lru_ns_per_conn": lru,
        "btf_lru_ns_per_conn": btf_lru,
        "sk_storage_ns_per_conn": sk_storage,
        "empty_raw_tp_ns_per_run": raw_tp,
        "empty_tp_btf_ns_per_run": tp_btf,
        "empty_cgroup_skb_ns_per_run": skb,
    });
    std::fs::write(&path, figures.to_string()).expect("writing the figures");
}
