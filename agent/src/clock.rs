//! The clocks the agent reads: the kernel's CLOCK_MONOTONIC (the clock of the eBPF programs' event
//! timestamps, `bpf_ktime_get_ns`) and wall-clock time derived from it for what leaves the node.

use std::time::{Duration, SystemTime};

/// The kernel's CLOCK_MONOTONIC now: the clock event timestamps (`bpf_ktime_get_ns`) use.
pub fn monotonic_now() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the valid timespec; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Converts kernel CLOCK_MONOTONIC times to wall-clock time, using the offset between the two clocks
/// measured when it is created (good to the millisecond while the clock is not stepped).
#[derive(Clone, Copy, Debug)]
pub struct WallClock {
    boot: SystemTime,
}

impl WallClock {
    /// Measures the offset now.
    pub fn now() -> Self {
        Self {
            boot: SystemTime::now() - monotonic_now(),
        }
    }

    /// The wall-clock time of a kernel timestamp.
    pub fn at(&self, monotonic: Duration) -> SystemTime {
        self.boot + monotonic
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wall_clock_maps_kernel_time_to_now() {
        let clock = WallClock::now();
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes into the valid timespec.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        let kernel_now = Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32);
        let wall = clock.at(kernel_now);
        let skew = match wall.duration_since(SystemTime::now()) {
            Ok(ahead) => ahead,
            Err(behind) => behind.duration(),
        };
        assert!(skew < Duration::from_secs(1), "{skew:?}");
    }
}
