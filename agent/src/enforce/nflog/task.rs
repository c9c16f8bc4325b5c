//! The reader and dedupe as a task feeding a channel.

use super::*;

/// Settings of [`spawn`].
#[derive(Debug, Clone)]
pub struct NflogOptions {
    pub copy_range: u16,
    /// Denials queued for the consumer; more are dropped (and counted) rather than blocking the
    /// socket, whose own queue would overflow.
    pub channel_capacity: usize,
    pub dedupe_capacity: usize,
    pub dedupe_window: Duration,
}

impl Default for NflogOptions {
    fn default() -> Self {
        Self {
            copy_range: DEFAULT_COPY_RANGE,
            channel_capacity: 1024,
            dedupe_capacity: DEFAULT_DEDUPE_CAPACITY,
            dedupe_window: DEFAULT_DEDUPE_WINDOW,
        }
    }
}

/// A running reader task.
#[derive(Debug)]
pub struct Nflog {
    /// Deduplicated denials. The task ends (and the group is unbound) when this is dropped.
    pub denied: mpsc::Receiver<Denied>,
    pub counters: Arc<NflogCounters>,
    /// Ends with the socket error that stopped the reader, or `Ok` once `denied` is dropped.
    pub task: tokio::task::JoinHandle<Result<(), NflogError>>,
}

/// Binds `group` (see [`NflogReader::open`]; the socket lives in the calling thread's network
/// namespace) and spawns a task sending each denied attempt once on [`Nflog::denied`].
pub fn spawn(group: u16, options: &NflogOptions) -> Result<Nflog, NflogError> {
    let mut reader = NflogReader::open(group, options.copy_range)?;
    let counters = reader.counters();
    let (sender, denied) = mpsc::channel(options.channel_capacity.max(1));
    let mut dedupe = Dedupe::new(options.dedupe_capacity, options.dedupe_window);
    let task_counters = Arc::clone(&counters);
    let task = tokio::spawn(async move {
        loop {
            let next = tokio::select! {
                next = reader.next() => next?,
                () = sender.closed() => return Ok(()),
            };
            let admitted = dedupe.admit(&next, Instant::now());
            task_counters
                .deduplicated
                .store(dedupe.suppressed(), Ordering::Relaxed);
            task_counters
                .dedupe_evicted
                .store(dedupe.evicted(), Ordering::Relaxed);
            if !admitted {
                continue;
            }
            match sender.try_send(next) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(_)) => {
                    NflogCounters::add(&task_counters.channel_full, 1);
                }
                Err(mpsc::error::TrySendError::Closed(_)) => return Ok(()),
            }
        }
    });
    Ok(Nflog {
        denied,
        counters,
        task,
    })
}
