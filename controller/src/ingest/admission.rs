//! Admission of agent streams: how many at once, one per agent pod, and for how long.
//!
//! Every stream costs a TokenReview, a task and HTTP/2 windows, so the number of streams is capped
//! *before* the token is reviewed: a flood of connections cannot turn into a flood of TokenReviews.
//! An agent pod holds one stream; when it opens another (it reconnected while the old connection
//! was still half-open), the older one is closed. A stream lives no longer than the token it was
//! opened with (capped by a maximum age), and is closed when its agent pod is deleted: a stolen or
//! revoked token stops working at the latest when it expires, not when the connection happens to drop.
//! Agents reconnect on their own and resend what was not acknowledged, so closing a stream loses nothing.

use base64::Engine as _;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};
use tonic::Status;

/// Limits on the streams the ingest serves.
#[derive(Clone, Debug)]
pub struct StreamLimits {
    /// Streams open or being authenticated at once (`--max-agent-streams`).
    pub max_streams: usize,
    /// The longest a stream lives, even when its token is valid for longer.
    pub max_age: Duration,
    /// How often a stream checks that its agent pod still exists.
    pub recheck_every: Duration,
}

impl Default for StreamLimits {
    fn default() -> Self {
        Self {
            // One per node, with room for reconnects overlapping their old stream.
            max_streams: 5_000,
            max_age: Duration::from_secs(3_600),
            recheck_every: Duration::from_secs(10),
        }
    }
}

/// See the module docs.
pub struct Admission {
    limits: StreamLimits,
    slots: Arc<Semaphore>,
    /// The current stream of each agent pod (`namespace/name`), and how to close it.
    by_pod: Mutex<HashMap<String, (u64, oneshot::Sender<Closed>)>>,
    next_id: AtomicU64,
}

/// Why a stream is told to close.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Closed {
    /// The same agent pod opened a newer stream.
    Replaced,
    /// Its token expired, or the stream reached its maximum age.
    Expired,
    /// Its agent pod was deleted.
    PodDeleted,
}

impl Closed {
    /// The `reason` label of `agent_streams_closed_total`.
    pub fn label(self) -> &'static str {
        match self {
            Closed::Replaced => "replaced",
            Closed::Expired => "expired",
            Closed::PodDeleted => "pod_deleted",
        }
    }

    /// What the agent is told.
    pub fn status(self) -> Status {
        Status::unavailable(match self {
            Closed::Replaced => "a newer stream from this agent pod replaced this one",
            Closed::Expired => {
                "the stream's token expired or the stream reached its maximum age; reconnect with a fresh token"
            }
            Closed::PodDeleted => "the agent pod this stream belongs to was deleted",
        })
    }
}

/// A stream's registration as its pod's stream; unregisters when dropped.
pub struct Registered {
    admission: Arc<Admission>,
    pod: String,
    id: u64,
    /// Resolves when a newer stream of the same pod replaces this one.
    pub replaced: oneshot::Receiver<Closed>,
    /// Whether registering closed an older stream of the pod.
    pub replaced_older: bool,
}

impl Drop for Registered {
    fn drop(&mut self) {
        let mut by_pod = self.admission.by_pod.lock().expect("streams lock");
        if by_pod.get(&self.pod).is_some_and(|(id, _)| *id == self.id) {
            by_pod.remove(&self.pod);
        }
    }
}

impl Admission {
    pub fn new(limits: StreamLimits) -> Arc<Self> {
        Arc::new(Self {
            slots: Arc::new(Semaphore::new(limits.max_streams)),
            limits,
            by_pod: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
        })
    }

    pub fn limits(&self) -> &StreamLimits {
        &self.limits
    }

    /// A slot for one stream, taken before its token is reviewed and held while it is open.
    pub fn slot(&self) -> Result<OwnedSemaphorePermit, Status> {
        self.slots.clone().try_acquire_owned().map_err(|_| {
            Status::resource_exhausted(format!(
                "this controller serves at most {} agent streams at once (--max-agent-streams); retry later",
                self.limits.max_streams
            ))
        })
    }

    /// Registers a stream as the one of agent pod `pod`; an older stream of the pod is told to close.
    pub fn register(self: &Arc<Self>, pod: &str) -> Registered {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let older = self
            .by_pod
            .lock()
            .expect("streams lock")
            .insert(pod.to_string(), (id, tx));
        let replaced_older = match older {
            // Its receiver is gone when that stream has ended already.
            Some((_, close)) => close.send(Closed::Replaced).is_ok(),
            None => false,
        };
        Registered {
            admission: self.clone(),
            pod: pod.to_string(),
            id,
            replaced: rx,
            replaced_older,
        }
    }

    /// How long a stream opened now with `token` may live: until the token's `exp`, at most
    /// [`StreamLimits::max_age`].
    pub fn lifetime(&self, token: &str, now_unix_s: i64) -> Duration {
        lifetime(token, now_unix_s, self.limits.max_age)
    }
}

/// See [`Admission::lifetime`]. A token without a readable `exp` gets the maximum age: it was accepted
/// by a TokenReview, which is what decides its validity; `exp` only bounds the stream.
pub fn lifetime(token: &str, now_unix_s: i64, max_age: Duration) -> Duration {
    match token_expiry(token) {
        Some(exp) => Duration::from_secs(exp.saturating_sub(now_unix_s).max(0) as u64).min(max_age),
        None => max_age,
    }
}

/// The `exp` claim (seconds since the epoch) of a JSON Web Token, read without checking its signature
/// (the TokenReview did); `None` when the token is no JWT or has no numeric `exp`.
fn token_expiry(token: &str) -> Option<i64> {
    let payload = token.split('.').nth(1)?;
    // Bound the work a hostile token can cause; service account tokens are ~1 KiB.
    if payload.len() > 16 * 1024 {
        return None;
    }
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    claims.get("exp")?.as_i64()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jwt(claims: &str) -> String {
        let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        format!("{}.{}.signature", b64(r#"{"alg":"RS256"}"#), b64(claims))
    }

    #[test]
    fn a_stream_lives_until_its_token_expires_at_most_the_maximum_age() {
        let max = Duration::from_secs(3_600);
        let now = 1_700_000_000;
        // (token, lifetime)
        let cases = [
            (
                jwt(&format!(r#"{{"exp":{}}}"#, now + 600)),
                Duration::from_secs(600),
            ),
            (jwt(&format!(r#"{{"exp":{}}}"#, now + 86_400)), max),
            (jwt(&format!(r#"{{"exp":{}}}"#, now - 5)), Duration::ZERO),
            (jwt(r#"{"exp":"soon"}"#), max),
            (jwt(r#"{"sub":"x"}"#), max),
            (jwt(&format!(r#"{{"exp":{}}}"#, i64::MIN)), Duration::ZERO),
            ("not-a-jwt".to_string(), max),
            ("a.%%%.c".to_string(), max),
            (format!("a.{}.c", "A".repeat(100_000)), max),
        ];
        for (token, expected) in cases {
            assert_eq!(lifetime(&token, now, max), expected, "{:.60}", token);
        }
    }

    #[test]
    fn streams_are_capped_before_authentication() {
        let admission = Admission::new(StreamLimits {
            max_streams: 2,
            ..StreamLimits::default()
        });
        let a = admission.slot().unwrap();
        let _b = admission.slot().unwrap();
        let refused = admission.slot().unwrap_err();
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        assert!(
            refused.message().contains("--max-agent-streams"),
            "{refused}"
        );
        drop(a);
        assert!(admission.slot().is_ok(), "a closed stream frees its slot");
    }

    #[tokio::test]
    async fn one_stream_per_agent_pod_the_newest_wins() {
        let admission = Admission::new(StreamLimits::default());
        let mut first = admission.register("ne/agent-a");
        assert!(!first.replaced_older);
        let _other = admission.register("ne/agent-b");
        let second = admission.register("ne/agent-a");
        assert!(second.replaced_older, "the older stream is told");
        assert_eq!((&mut first.replaced).await, Ok(Closed::Replaced));
        // The replaced stream ending must not unregister its successor...
        drop(first);
        let third = admission.register("ne/agent-a");
        assert!(
            third.replaced_older,
            "the second stream was still registered"
        );
        // ...and a stream that ended is not told again.
        drop(second);
        drop(third);
        let fourth = admission.register("ne/agent-a");
        assert!(!fourth.replaced_older);
        drop(fourth);
        assert_eq!(admission.by_pod.lock().unwrap().len(), 1, "only agent-b");
    }
}
