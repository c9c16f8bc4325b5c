//! One report per denied attempt rather than per retransmission.

use super::*;

/// Reports each denied attempt once: a refused TCP SYN is retransmitted (after 1 s, 3 s, 7 s...)
/// and a UDP sender may retry, all with the same addresses and ports, while a new connection
/// attempt has a new source port. A denial is suppressed while an identical one was reported less
/// than `window` ago; at most `capacity` are remembered, the oldest evicted first (and counted).
#[derive(Debug)]
pub struct Dedupe {
    capacity: usize,
    window: Duration,
    reported: HashMap<Denied, Instant>,
    /// Report order, which is also expiry order.
    order: VecDeque<(Denied, Instant)>,
    suppressed: u64,
    evicted: u64,
}

impl Dedupe {
    pub fn new(capacity: usize, window: Duration) -> Self {
        let capacity = capacity.max(1);
        Self {
            capacity,
            window,
            reported: HashMap::with_capacity(capacity.min(DEFAULT_DEDUPE_CAPACITY)),
            order: VecDeque::new(),
            suppressed: 0,
            evicted: 0,
        }
    }

    /// Whether `denied`, seen at `now`, is to be reported (the first of its kind in the window).
    pub fn admit(&mut self, denied: &Denied, now: Instant) -> bool {
        while let Some(&(oldest, at)) = self.order.front() {
            if now.saturating_duration_since(at) < self.window {
                break;
            }
            self.order.pop_front();
            self.reported.remove(&oldest);
        }
        if self.reported.contains_key(denied) {
            self.suppressed += 1;
            return false;
        }
        if self.reported.len() >= self.capacity
            && let Some((oldest, _)) = self.order.pop_front()
        {
            self.reported.remove(&oldest);
            self.evicted += 1;
        }
        self.reported.insert(*denied, now);
        self.order.push_back((*denied, now));
        true
    }

    /// Repeats not reported so far.
    pub fn suppressed(&self) -> u64 {
        self.suppressed
    }

    /// Denials forgotten before their window ended because `capacity` was reached (their repeats
    /// are reported again).
    pub fn evicted(&self) -> u64 {
        self.evicted
    }

    /// Denials currently remembered.
    pub fn len(&self) -> usize {
        self.reported.len()
    }

    pub fn is_empty(&self) -> bool {
        self.reported.is_empty()
    }
}
