//! Waiting for something to become true: the one polling loop of the tests, in a blocking and an
//! async form. Both return the value `check` found, or fail after `timeout` naming what was awaited,
//! the last error `check` returned and `describe()` (what the world looked like), so that a failure
//! can be read without rerunning.

use anyhow::{Result, bail};
use std::future::Future;
use std::time::{Duration, Instant};

/// Polls `check` every `every` (blocking the thread) until it returns `Some`.
pub fn poll<T>(
    what: &str,
    timeout: Duration,
    every: Duration,
    mut check: impl FnMut() -> Result<Option<T>>,
    describe: impl Fn() -> String,
) -> Result<T> {
    let deadline = Instant::now() + timeout;
    let mut last_err = None;
    loop {
        match check() {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last_err = Some(e),
        }
        if Instant::now() > deadline {
            return timed_out(what, timeout, last_err, describe());
        }
        std::thread::sleep(every);
    }
}

/// Polls `check` every `every` (sleeping on the async runtime) until it returns `Some`.
pub async fn eventually<T, Fut>(
    what: &str,
    timeout: Duration,
    every: Duration,
    mut check: impl FnMut() -> Fut,
    describe: impl Fn() -> String,
) -> Result<T>
where
    Fut: Future<Output = Result<Option<T>>>,
{
    let deadline = Instant::now() + timeout;
    let mut last_err = None;
    loop {
        match check().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last_err = Some(e),
        }
        if Instant::now() > deadline {
            return timed_out(what, timeout, last_err, describe());
        }
        tokio::time::sleep(every).await;
    }
}

/// [`eventually`] for a plain condition.
pub async fn until(
    what: &str,
    timeout: Duration,
    every: Duration,
    done: impl Fn() -> bool,
    describe: impl Fn() -> String,
) -> Result<()> {
    eventually(
        what,
        timeout,
        every,
        || std::future::ready(Ok(done().then_some(()))),
        describe,
    )
    .await
}

/// Listens on `addr` again, once the sockets of the server that listened there before (stopped or
/// killed) let it: their connections linger in TIME_WAIT, which `SO_REUSEADDR` passes, and a killed
/// process's listening socket may take a moment to close.
pub async fn listen_again(addr: std::net::SocketAddr) -> Result<tokio::net::TcpListener> {
    let mut listener = None;
    eventually(
        &format!("{addr} to be free to listen on"),
        Duration::from_secs(10),
        Duration::from_millis(50),
        || {
            let bound = (|| {
                let socket = tokio::net::TcpSocket::new_v4()?;
                socket.set_reuseaddr(true)?;
                socket.bind(addr)?;
                socket.listen(64)
            })();
            std::future::ready(match bound {
                Ok(l) => {
                    listener = Some(l);
                    Ok(Some(()))
                }
                Err(e) => Err(anyhow::Error::new(e).context(format!("binding {addr}"))),
            })
        },
        String::new,
    )
    .await?;
    Ok(listener.expect("set once bound"))
}

fn timed_out<T>(
    what: &str,
    timeout: Duration,
    last_err: Option<anyhow::Error>,
    described: String,
) -> Result<T> {
    bail!(
        "timed out after {timeout:?} waiting for {what}{}\n{described}",
        last_err
            .map(|e| format!(" (last error: {e:#})"))
            .unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poll_returns_the_value_and_a_timeout_names_the_wait_and_the_last_error() {
        let mut calls = 0;
        let found = poll(
            "three calls",
            Duration::from_secs(5),
            Duration::ZERO,
            || {
                calls += 1;
                Ok((calls == 3).then_some(calls))
            },
            String::new,
        );
        assert_eq!(found.unwrap(), 3);
        let err = poll::<()>(
            "nothing",
            Duration::ZERO,
            Duration::ZERO,
            || bail!("refused"),
            || "the state".into(),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("waiting for nothing (last error: refused)"),
            "{err}"
        );
        assert!(err.ends_with("the state"), "{err}");
    }

    #[tokio::test]
    async fn listen_again_waits_for_the_old_listener_to_close() {
        let old = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = old.local_addr().unwrap();
        let start = Instant::now();
        let closer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            drop(old);
        });
        let listener = listen_again(addr).await.unwrap();
        assert_eq!(listener.local_addr().unwrap(), addr);
        assert!(
            start.elapsed() >= Duration::from_millis(200),
            "bound only once the old listener closed"
        );
        closer.join().unwrap();
    }

    #[tokio::test]
    async fn until_waits_for_the_condition() {
        let start = Instant::now();
        until(
            "50 ms",
            Duration::from_secs(5),
            Duration::from_millis(5),
            || start.elapsed() >= Duration::from_millis(50),
            String::new,
        )
        .await
        .unwrap();
        let err = until(
            "never",
            Duration::ZERO,
            Duration::ZERO,
            || false,
            || "x".into(),
        )
        .await
        .unwrap_err();
        assert!(err.to_string().contains("waiting for never"), "{err}");
    }
}
