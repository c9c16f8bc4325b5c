//! Capped exponential backoff with jitter, for every reconnect loop (the agent's uplink and flow
//! sources, the controller's Goldmane source), so that clients cut off together do not come back
//! together.

use std::time::Duration;

/// Capped exponential backoff between reconnects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// The wait before the first retry (before jitter).
    pub initial: Duration,
    /// The longest wait (before jitter).
    pub max: Duration,
}

impl Default for Backoff {
    /// 500 ms doubling up to 30 s.
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(500),
            max: Duration::from_secs(30),
        }
    }
}

impl Backoff {
    /// The wait before retry number `attempt` (0 for the first): `initial * 2^attempt` capped at `max`,
    /// then scaled into `[1/2, 1)` of that by `jitter` in `[0, 1)` ("equal jitter"), so that agents cut
    /// off together do not come back together, and a retry never comes sooner than half the nominal wait.
    pub fn delay(&self, attempt: u32, jitter: f64) -> Duration {
        let nominal = self
            .initial
            .checked_mul(1u32.checked_shl(attempt).unwrap_or(u32::MAX))
            .unwrap_or(self.max)
            .min(self.max);
        nominal.mul_f64(0.5 + jitter.clamp(0.0, 1.0) / 2.0)
    }
}

/// A number in `[0, 1)`, different at every call. `RandomState` is seeded randomly per thread and
/// re-keyed at every construction, which is plenty for spreading reconnects without a random crate.
pub fn jitter() -> f64 {
    use std::hash::BuildHasher;
    let bits = std::collections::hash_map::RandomState::new().hash_one(std::time::Instant::now());
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap_with_jitter_in_the_upper_half() {
        let backoff = Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(2),
        };
        let top = |attempt| backoff.delay(attempt, 1.0);
        assert_eq!(top(0), Duration::from_millis(100));
        assert_eq!(top(1), Duration::from_millis(200));
        assert_eq!(top(4), Duration::from_millis(1600));
        assert_eq!(top(5), Duration::from_secs(2), "capped");
        assert_eq!(top(64), Duration::from_secs(2), "no overflow");
        assert_eq!(top(u32::MAX), Duration::from_secs(2));
        assert_eq!(backoff.delay(1, 0.0), Duration::from_millis(100));
        assert_eq!(backoff.delay(1, 0.5), Duration::from_millis(150));
    }

    #[test]
    fn jitter_stays_in_range_and_varies() {
        let samples: Vec<f64> = (0..64).map(|_| jitter()).collect();
        assert!(samples.iter().all(|j| (0.0..1.0).contains(j)));
        let distinct = samples
            .iter()
            .map(|j| j.to_bits())
            .collect::<std::collections::BTreeSet<_>>();
        assert!(distinct.len() > 32, "{distinct:?}");
    }
}
