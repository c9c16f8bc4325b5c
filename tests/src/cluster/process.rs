//! The cluster's daemons: started detached (own process group, output to a log file, pid file), found
//! again by pid file or, after a crash, by their command line naming the state directory.

use anyhow::{Context, Result, bail};
use std::fs;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::layout::State;

/// Starts `cmd` as the daemon `name`: detached from our process group (so a test binary's exit or a
/// Ctrl-C in the terminal does not stop it), stdout and stderr appended to its log, pid recorded.
pub fn spawn(state: &State, name: &str, cmd: &mut Command) -> Result<u32> {
    let log_path = state.log(name);
    fs::create_dir_all(log_path.parent().unwrap())?;
    let log = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .with_context(|| format!("opening {}", log_path.display()))?;
    let child = cmd
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0)
        .spawn()
        .with_context(|| format!("starting {name}: {cmd:?}"))?;
    let pid = child.id();
    // The child is reaped by init once this process exits; until then a dead daemon is a zombie,
    // which `alive` treats as dead.
    std::mem::forget(child);
    let pid_file = state.pid_file(name);
    fs::create_dir_all(pid_file.parent().unwrap())?;
    fs::write(&pid_file, pid.to_string())?;
    Ok(pid)
}

/// The recorded pid of daemon `name`, if it is still running.
pub fn running_pid(state: &State, name: &str) -> Option<u32> {
    let pid: u32 = fs::read_to_string(state.pid_file(name))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    alive(pid).then_some(pid)
}

/// True when `pid` exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state is the first field after the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|s| s != "Z" && s != "X"),
        Err(_) => false,
    }
}

/// Every process whose command line mentions `needle` (our daemons all name the state directory in
/// their arguments), except this process.
pub fn pids_mentioning(needle: &str) -> Vec<u32> {
    pids_where(|pid| {
        fs::read(format!("/proc/{pid}/cmdline"))
            .is_ok_and(|c| String::from_utf8_lossy(&c).contains(needle))
    })
}

/// Every process (but this one) in the network namespace bound at `netns` (an `ip netns` file).
pub fn pids_in_netns(netns: &Path) -> Vec<u32> {
    use std::os::unix::fs::MetadataExt;
    let Ok(want) = fs::metadata(netns).map(|m| (m.dev(), m.ino())) else {
        return Vec::new();
    };
    pids_where(|pid| {
        fs::metadata(format!("/proc/{pid}/ns/net")).is_ok_and(|m| (m.dev(), m.ino()) == want)
    })
}

/// Every process but this one for which `keep` holds.
fn pids_where(keep: impl Fn(u32) -> bool) -> Vec<u32> {
    let me = std::process::id();
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me && keep(pid))
        .collect()
}

/// Sends SIGTERM to `pids`, waits up to `grace` for them to go, then SIGKILLs the rest.
pub fn terminate(pids: &[u32], grace: Duration) {
    for &pid in pids {
        signal(pid, libc::SIGTERM);
    }
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline && pids.iter().any(|&p| alive(p)) {
        std::thread::sleep(Duration::from_millis(100));
    }
    for &pid in pids.iter().filter(|&&p| alive(p)) {
        signal(pid, libc::SIGKILL);
    }
}

/// Sends `sig` to `pid` (ignoring a process that is already gone).
pub fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) has no memory-safety preconditions.
    unsafe {
        libc::kill(pid as i32, sig);
    }
}

/// The last `lines` lines of a log file ("(no log)" when it does not exist).
pub fn tail(path: &Path, lines: usize) -> String {
    match fs::read_to_string(path) {
        Ok(text) => {
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(_) => "(no log)".to_string(),
    }
}

/// Polls `check` every `every` until it returns `Ok(true)` or `timeout` passes. While waiting, it fails
/// early when daemon `component` died, with its log; the timeout error carries the log too.
pub fn wait_for(
    state: &State,
    component: &str,
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> Result<bool>,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let mut last_err = None;
    loop {
        match check() {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => last_err = Some(e),
        }
        if running_pid(state, component).is_none() {
            bail!(
                "{component} exited while waiting for {what}.\n--- {} (last 40 lines) ---\n{}",
                state.log(component).display(),
                tail(&state.log(component), 40)
            );
        }
        if Instant::now() > deadline {
            bail!(
                "timed out after {timeout:?} waiting for {what}{}.\n--- {} (last 40 lines) ---\n{}",
                last_err
                    .map(|e| format!(" (last error: {e:#})"))
                    .unwrap_or_default(),
                state.log(component).display(),
                tail(&state.log(component), 40)
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Runs `cmd` and returns its stdout; fails with the command line and stderr when it exits non-zero.
pub fn output(cmd: &mut Command) -> Result<String> {
    let shown = format!("{cmd:?}");
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("could not start {shown}"))?;
    if !out.status.success() {
        bail!(
            "{shown} failed with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `cmd` with `input` on stdin; fails like [`output`].
pub fn output_with_input(cmd: &mut Command, input: &[u8]) -> Result<String> {
    use std::io::Write;
    let shown = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("could not start {shown}"))?;
    child.stdin.take().unwrap().write_all(input)?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "{shown} failed with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
