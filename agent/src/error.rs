//! The agent library's errors. Each variant says what failed and, where there is one, what to do about it.

use std::path::PathBuf;

/// Everything that can go wrong while loading the kernel programs or reading their events.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The process may not load eBPF programs.
    #[error(
        "loading the eBPF programs needs root or the capabilities CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN \
         (running as uid {uid} without them)"
    )]
    NotPrivileged {
        /// The effective uid of this process.
        uid: u32,
    },

    /// The kernel has no BTF, so kernel struct offsets cannot be computed.
    #[error(
        "the kernel exposes no BTF at {0}: network-enforcer needs a kernel built with CONFIG_DEBUG_INFO_BTF=y \
         (Linux 5.8 or later)"
    )]
    NoBtf(PathBuf),

    /// A pseudo file system (bpffs) is missing and could not be mounted.
    #[error(
        "mounting {fstype} at {path} failed: {source}; mount it on the node (`mount -t {fstype} {fstype} \
         {path}`, which systemd does at boot) or run the agent with CAP_SYS_ADMIN"
    )]
    Mount {
        /// The file system type, e.g. `bpf`.
        fstype: &'static str,
        /// Where it should have been mounted.
        path: PathBuf,
        /// What mount(2) said.
        source: std::io::Error,
    },

    /// A kernel interface file could not be read.
    #[error("reading {path} failed: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },

    /// The kernel's BTF could not be parsed.
    #[error("reading the kernel's BTF: {0}")]
    Btf(#[from] crate::kernel::btf::BtfError),

    /// The cgroup v2 hierarchy is not mounted, so the UDP hooks have nowhere to attach.
    #[error(
        "no cgroup2 file system is mounted (see /proc/self/mountinfo): the UDP hooks need cgroup v2"
    )]
    NoCgroup2,

    /// The kernel rejected the programs or their maps.
    #[error("loading the eBPF programs failed: {0}")]
    Load(#[from] aya::EbpfError),

    /// A program could not be loaded into the verifier or attached.
    #[error("program `{program}`: {source}")]
    Program {
        /// The program's name.
        program: &'static str,
        /// aya's error (with the verifier log when the verifier rejected it).
        source: aya::programs::ProgramError,
    },

    /// A map could not be opened or read.
    #[error("map `{map}`: {source}")]
    Map {
        /// The map's name.
        map: &'static str,
        /// aya's error.
        source: aya::maps::MapError,
    },

    /// The embedded object lacks a map or program the agent expects: the build is inconsistent.
    #[error("the embedded eBPF object has no {kind} named `{name}`")]
    Missing {
        /// `map` or `program`.
        kind: &'static str,
        /// The name looked for.
        name: &'static str,
    },

    /// The debug API's unix socket could not be set up or reached.
    #[error("debug socket {path}: {source}")]
    DebugSocket {
        /// The socket path.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },

    /// The scan of /proc and the cgroup tree for pods' namespaces and cgroups failed.
    #[error(
        "scanning /proc and the cgroup tree for pods failed: {0} (the agent needs the host's /proc and \
         cgroup v2 tree: hostPID and the chart's mounts)"
    )]
    Scan(#[source] std::io::Error),

    /// Waiting on the ring buffer's file descriptor failed.
    #[error("polling the events ring buffer failed: {0}")]
    Poll(#[source] std::io::Error),
}

/// The library's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An error with its causes, `a: b: c`, each cause once (a cause whose text the error already
/// repeats is left out). Transport errors say little on their own, and the kernel verifier's log is
/// a cause of the load error.
pub fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let more = cause.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = cause.source();
    }
    text
}
