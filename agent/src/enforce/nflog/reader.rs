//! The `NETLINK_NETFILTER` socket: group bind, copy mode, async receive.

use super::*;

/// What to do about a refused configuration step.
pub(crate) fn config_hint(error: &io::Error) -> &'static str {
    match error.raw_os_error() {
        // The kernel refuses a group another socket has bound with EPERM too.
        Some(libc::EPERM) | Some(libc::EACCES) => {
            "the agent needs CAP_NET_ADMIN in the network namespace of the enforcement table, and no \
             other process (ulogd, a second agent?) may read this group: stop it or configure another \
             NFLOG group"
        }
        Some(libc::EBUSY) => "this group is already bound: configure another NFLOG group",
        Some(libc::EINVAL)
        | Some(libc::ENOENT)
        | Some(libc::EOPNOTSUPP)
        | Some(libc::EPROTONOSUPPORT) => {
            "the kernel needs nfnetlink_log (`modprobe nfnetlink_log`, CONFIG_NETFILTER_NETLINK_LOG)"
        }
        Some(libc::ETIMEDOUT) => "the kernel did not answer; is nfnetlink_log loaded?",
        _ => "check that nfnetlink_log is available and the agent has CAP_NET_ADMIN",
    }
}

/// A socket bound to one NFLOG group in the network namespace of the thread that opened it.
pub struct NflogReader {
    fd: AsyncFd<OwnedFd>,
    group: u16,
    buf: Vec<u8>,
    pending: VecDeque<Denied>,
    counters: Arc<NflogCounters>,
}

impl std::fmt::Debug for NflogReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NflogReader")
            .field("fd", &self.fd.get_ref().as_raw_fd())
            .field("group", &self.group)
            .finish_non_exhaustive()
    }
}

impl NflogReader {
    /// Binds `group` with packet copy mode (`copy_range` bytes of each packet). Must be called
    /// inside a tokio runtime; the socket stays in the calling thread's network namespace.
    /// Dropping the reader unbinds the group (the kernel may take a moment to free it).
    pub fn open(group: u16, copy_range: u16) -> Result<Self, NflogError> {
        // Registration below panics outside a runtime; an error says more, and before the bind.
        tokio::runtime::Handle::try_current()
            .map_err(|error| NflogError::Reactor(io::Error::other(error)))?;
        let fd = open_socket(SOCKET_QUEUE_BYTES)?;
        let raw = fd.as_raw_fd();
        let mut buf = vec![0u8; RECEIVE_BUFFER_BYTES];
        let mut seq = 0u32;
        let mut configure =
            |step: &'static str, family: u8, res_id: u16, attrs: &[(u16, &[u8])]| {
                seq += 1;
                let message = config_message(seq, family, res_id, attrs);
                request(raw, seq, &message, &mut buf).map_err(|source| NflogError::Config {
                    group,
                    step,
                    hint: config_hint(&source),
                    source,
                })
            };
        // Kernels since 3.17 ignore the per-family commands; older ones need nfnetlink_log bound as
        // the family's logger. Their failure is not fatal: the group bind below tells what is wrong.
        for family in [libc::AF_INET as u8, libc::AF_INET6 as u8] {
            for (step, command) in [
                ("unbinding the address family", NFULNL_CFG_CMD_PF_UNBIND),
                ("binding the address family", NFULNL_CFG_CMD_PF_BIND),
            ] {
                if let Err(error) = configure(step, family, 0, &[(NFULA_CFG_CMD, &[command])]) {
                    tracing::debug!(%error, "NFLOG per-family command refused (ignored)");
                }
            }
        }
        let mut mode = [0u8; 6];
        mode[..4].copy_from_slice(&u32::from(copy_range).to_be_bytes());
        mode[4] = NFULNL_COPY_PACKET;
        // One message: the group starts logging with the right mode, never with the defaults.
        configure(
            "bind, copy mode, batch size and flush timeout",
            libc::AF_UNSPEC as u8,
            group,
            &[
                (NFULA_CFG_CMD, &[NFULNL_CFG_CMD_BIND]),
                (NFULA_CFG_MODE, &mode),
                (NFULA_CFG_NLBUFSIZ, &KERNEL_BATCH_BYTES.to_be_bytes()),
                (NFULA_CFG_TIMEOUT, &KERNEL_FLUSH_CENTISECONDS.to_be_bytes()),
            ],
        )?;
        set_nonblocking(raw).map_err(|source| NflogError::Socket {
            step: "O_NONBLOCK",
            source,
        })?;
        // SAFETY: the OwnedFd, owned by the AsyncFd from here on, keeps its descriptor open and
        // unchanged until the AsyncFd is dropped.
        let fd = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }
            .map_err(|error| NflogError::Reactor(error.into()))?;
        Ok(Self {
            fd,
            group,
            buf,
            pending: VecDeque::new(),
            counters: Arc::default(),
        })
    }

    pub fn group(&self) -> u16 {
        self.group
    }

    pub fn counters(&self) -> Arc<NflogCounters> {
        Arc::clone(&self.counters)
    }

    /// The next denied packet (not deduplicated). Kernel drops (ENOBUFS) and unreadable messages
    /// are counted and skipped; an error is returned only when the socket itself fails.
    pub async fn next(&mut self) -> Result<Denied, NflogError> {
        loop {
            if let Some(denied) = self.pending.pop_front() {
                return Ok(denied);
            }
            let mut guard = self
                .fd
                .readable()
                .await
                .map_err(|source| NflogError::Receive {
                    group: self.group,
                    source,
                })?;
            let buf = &mut self.buf;
            let received = guard.try_io(|fd| {
                // MSG_TRUNC: the datagram's real length, so a cut datagram is noticed.
                // SAFETY: the pointer and length describe `buf`, which outlives the call.
                let n = unsafe {
                    libc::recv(
                        fd.as_raw_fd(),
                        buf.as_mut_ptr().cast(),
                        buf.len(),
                        libc::MSG_TRUNC,
                    )
                };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(n as usize)
                }
            });
            match received {
                Err(_would_block) => continue,
                Ok(Ok(n)) => self.absorb(n),
                Ok(Err(error)) if error.raw_os_error() == Some(libc::ENOBUFS) => {
                    let before = self.counters.kernel_dropped.fetch_add(1, Ordering::Relaxed);
                    if before == 0 {
                        tracing::warn!(
                            group = self.group,
                            "the kernel dropped NFLOG messages: the agent reads denials slower than \
                             they happen (counted in the kernel-dropped counter; later drops are \
                             logged at debug level)"
                        );
                    } else {
                        tracing::debug!(group = self.group, "the kernel dropped NFLOG messages");
                    }
                }
                Ok(Err(error)) if error.kind() == io::ErrorKind::Interrupted => {}
                Ok(Err(source)) => {
                    return Err(NflogError::Receive {
                        group: self.group,
                        source,
                    });
                }
            }
        }
    }

    fn absorb(&mut self, n: usize) {
        let c = &self.counters;
        if n > self.buf.len() {
            NflogCounters::add(&c.truncated, 1);
        }
        let parsed = parse_datagram(&self.buf[..n.min(self.buf.len())]);
        NflogCounters::add(&c.logged, parsed.denied.len() as u64);
        NflogCounters::add(&c.other_prefix, parsed.other_prefix);
        NflogCounters::add(&c.malformed, parsed.malformed);
        if let Some(error) = parsed.first_error {
            tracing::debug!(group = self.group, %error, "unreadable NFLOG message skipped");
        }
        self.pending.extend(parsed.denied);
    }
}

/// A `NETLINK_NETFILTER` socket, bound, with a kernel-side queue of `queue_bytes` and a bounded wait
/// for acknowledgements (receives time out after it too).
pub(crate) fn open_socket(queue_bytes: libc::c_int) -> Result<OwnedFd, NflogError> {
    fn socket_error(step: &'static str) -> impl FnOnce(io::Error) -> NflogError {
        move |source| NflogError::Socket { step, source }
    }
    // SAFETY: plain socket(2) call; the result is checked before use.
    let raw = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_NETFILTER,
        )
    };
    if raw < 0 {
        return Err(socket_error("socket")(io::Error::last_os_error()));
    }
    // SAFETY: `raw` is a fresh descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: an all-zero sockaddr_nl is valid; nl_pid 0 lets the kernel pick our port id.
    let mut address: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    address.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    // SAFETY: the pointer and length describe `address`.
    let rc = unsafe {
        libc::bind(
            raw,
            (&raw const address).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(socket_error("bind")(io::Error::last_os_error()));
    }
    // A deep queue: SO_RCVBUFFORCE passes rmem_max with CAP_NET_ADMIN, SO_RCVBUF is the fallback.
    if setsockopt_int(raw, libc::SO_RCVBUFFORCE, queue_bytes).is_err() {
        let _ = setsockopt_int(raw, libc::SO_RCVBUF, queue_bytes);
    }
    // Setup waits for acknowledgements on the still blocking socket; this bounds the wait.
    let timeout = libc::timeval {
        tv_sec: ACK_TIMEOUT.as_secs() as libc::time_t,
        tv_usec: 0,
    };
    // SAFETY: the pointer and length describe `timeout`.
    let rc = unsafe {
        libc::setsockopt(
            raw,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&raw const timeout).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(socket_error("SO_RCVTIMEO")(io::Error::last_os_error()));
    }
    Ok(fd)
}

fn setsockopt_int(fd: RawFd, option: libc::c_int, value: libc::c_int) -> io::Result<()> {
    // SAFETY: the pointer and length describe `value`.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            option,
            (&raw const value).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we own.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// An NFULNL_MSG_CONFIG request asking for an acknowledgement.
pub(super) fn config_message(seq: u32, family: u8, res_id: u16, attrs: &[(u16, &[u8])]) -> Vec<u8> {
    nfnl_message(
        (NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_CONFIG,
        NLM_F_REQUEST | NLM_F_ACK,
        seq,
        family,
        res_id,
        attrs,
    )
}

/// An nfnetlink message: type `kind` (subsystem << 8 | message), `flags`, and `attrs` after the
/// nfgenmsg of `family` and `res_id` (a group or queue number).
pub(crate) fn nfnl_message(
    kind: u16,
    flags: u16,
    seq: u32,
    family: u8,
    res_id: u16,
    attrs: &[(u16, &[u8])],
) -> Vec<u8> {
    let mut message = vec![0u8; NLMSG_HDRLEN];
    message.extend_from_slice(&[family, NFNETLINK_V0]);
    message.extend_from_slice(&res_id.to_be_bytes());
    for (kind, data) in attrs {
        let length = (NLA_HDRLEN + data.len()) as u16;
        message.extend_from_slice(&length.to_ne_bytes());
        message.extend_from_slice(&kind.to_ne_bytes());
        message.extend_from_slice(data);
        message.resize(align4(message.len()), 0);
    }
    let total = message.len() as u32;
    message[0..4].copy_from_slice(&total.to_ne_bytes());
    message[4..6].copy_from_slice(&kind.to_ne_bytes());
    message[6..8].copy_from_slice(&flags.to_ne_bytes());
    message[8..12].copy_from_slice(&seq.to_ne_bytes());
    message
}

/// Sends `message` to the kernel and waits for the acknowledgement of `seq` (blocking socket).
pub(crate) fn request(fd: RawFd, seq: u32, message: &[u8], buf: &mut [u8]) -> io::Result<()> {
    // SAFETY: the pointer and length describe `message`. An unconnected netlink socket sends to
    // the kernel.
    let sent = unsafe { libc::send(fd, message.as_ptr().cast(), message.len(), 0) };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    let deadline = Instant::now() + ACK_TIMEOUT;
    loop {
        if Instant::now() >= deadline {
            return Err(io::Error::from_raw_os_error(libc::ETIMEDOUT));
        }
        // SAFETY: the pointer and length describe `buf`.
        let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            let error = io::Error::last_os_error();
            match error.raw_os_error() {
                Some(libc::EINTR) | Some(libc::ENOBUFS) => continue,
                Some(libc::EAGAIN) => return Err(io::Error::from_raw_os_error(libc::ETIMEDOUT)),
                _ => return Err(error),
            }
        }
        let received = &buf[..(n as usize).min(buf.len())];
        for message in NetlinkMessages::new(received).flatten() {
            if message.kind != NLMSG_ERROR || message.seq != seq {
                continue;
            }
            let Some(code) = message.body.get(..4) else {
                return Err(io::Error::from_raw_os_error(libc::EPROTO));
            };
            let code = i32::from_ne_bytes([code[0], code[1], code[2], code[3]]);
            return match code {
                0 => Ok(()),
                _ => Err(io::Error::from_raw_os_error(code.saturating_neg())),
            };
        }
    }
}
