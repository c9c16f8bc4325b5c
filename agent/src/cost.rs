//! What the agent process costs its node, read from the kernel: its CPU time and resident memory
//! (on `/metrics`, and sent to the controller with each batch, which reports an agent over its budget:
//! docs/behaviour.md §3.12).

/// This process's resident memory in bytes, from `/proc/self/statm` (pages × page size).
pub fn resident_memory_bytes() -> Option<i64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: i64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf reads a constant of the system; no memory is passed.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    (page > 0).then(|| pages.saturating_mul(page))
}

/// The CPU time (user and system) this process and its finished child processes (the `nft` runs
/// of enforcement) have used since it started, in ms.
pub fn cpu_time_ms() -> Option<u64> {
    let used = |who| {
        // SAFETY: getrusage writes one rusage into the zeroed value passed; nothing else is touched.
        let usage = unsafe {
            let mut usage: libc::rusage = std::mem::zeroed();
            (libc::getrusage(who, &mut usage) == 0).then_some(usage)
        }?;
        let ms = |t: libc::timeval| {
            u64::try_from(t.tv_sec).unwrap_or(0) * 1000
                + u64::try_from(t.tv_usec).unwrap_or(0) / 1000
        };
        Some(ms(usage.ru_utime) + ms(usage.ru_stime))
    };
    Some(used(libc::RUSAGE_SELF)? + used(libc::RUSAGE_CHILDREN).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_process_has_memory_and_cpu_time_that_grows_with_work() {
        assert!(resident_memory_bytes().is_some_and(|b| b > 0));
        let before = cpu_time_ms().expect("getrusage answers");
        // Busy for a while: at least 50 ms of CPU.
        let start = std::time::Instant::now();
        let mut x = 0u64;
        while start.elapsed() < std::time::Duration::from_millis(120) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let after = cpu_time_ms().expect("getrusage answers");
        assert!(after >= before + 50, "{before} → {after} ms");
    }
}
