//! Agents reconnect often (restarts, rollouts, controller failover, a thousand nodes at once): one
//! TokenReview per connect would put the API server on the ingest's hot path. A successful
//! authentication is remembered for a short while ([`TTL`]) by a keyed hash of the token, so a token
//! is reviewed at most once per window; failures are never remembered (a fixed token must work at once).

use super::{AgentIdentity, Authenticate};
use std::collections::HashMap;
use std::hash::BuildHasher as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tonic::Status;

/// How long a reviewed token is trusted without asking again: short, since the pod it is bound to may
/// be deleted meanwhile.
pub const TTL: Duration = Duration::from_secs(30);
/// Tokens remembered at most; expired ones are dropped first, then everything.
pub const CAPACITY: usize = 10_000;

/// An [`Authenticate`] that remembers what `inner` accepted.
pub struct CachedAuthenticator<A> {
    inner: A,
    ttl: Duration,
    /// Keyed (random per process) hash of the token → identity and expiry.
    entries: Mutex<HashMap<u64, (AgentIdentity, Instant)>>,
    hasher: std::hash::RandomState,
    /// Authentications answered from memory.
    pub hits: AtomicU64,
}

impl<A: Authenticate> CachedAuthenticator<A> {
    pub fn new(inner: A, ttl: Duration) -> Self {
        Self {
            inner,
            ttl,
            entries: Mutex::new(HashMap::new()),
            hasher: std::hash::RandomState::new(),
            hits: AtomicU64::new(0),
        }
    }
}

#[tonic::async_trait]
impl<A: Authenticate> Authenticate for CachedAuthenticator<A> {
    async fn authenticate(&self, token: &str) -> Result<AgentIdentity, Status> {
        let key = self.hasher.hash_one(token);
        let now = Instant::now();
        if let Some((identity, expires)) = self.entries.lock().expect("auth cache lock").get(&key)
            && *expires > now
        {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(identity.clone());
        }
        let identity = self.inner.authenticate(token).await?;
        let mut entries = self.entries.lock().expect("auth cache lock");
        if entries.len() >= CAPACITY {
            entries.retain(|_, (_, expires)| *expires > now);
            if entries.len() >= CAPACITY {
                entries.clear();
            }
        }
        entries.insert(key, (identity.clone(), now + self.ttl));
        Ok(identity)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Accepts `good-*` tokens as node `n1`, counting every review.
    struct Counting(AtomicUsize);

    #[tonic::async_trait]
    impl Authenticate for Counting {
        async fn authenticate(&self, token: &str) -> Result<AgentIdentity, Status> {
            self.0.fetch_add(1, Ordering::SeqCst);
            if token.starts_with("good") {
                Ok(AgentIdentity {
                    node: "n1".into(),
                    pod: format!("ns/{token}"),
                })
            } else {
                Err(Status::unauthenticated("no"))
            }
        }
    }

    #[tokio::test]
    async fn a_token_is_reviewed_once_per_window_and_a_refusal_is_never_remembered() {
        let cache = CachedAuthenticator::new(Counting(AtomicUsize::new(0)), TTL);
        let reviews = || cache.inner.0.load(Ordering::SeqCst);
        // (token, accepted, reviews so far)
        let steps = [
            ("good-a", true, 1),
            ("good-a", true, 1),
            ("good-b", true, 2),
            ("good-a", true, 2),
            ("bad", false, 3),
            ("bad", false, 4),
        ];
        for (token, accepted, expected) in steps {
            let result = cache.authenticate(token).await;
            assert_eq!(result.is_ok(), accepted, "{token}");
            if let Ok(identity) = result {
                assert_eq!(
                    identity.pod,
                    format!("ns/{token}"),
                    "never another token's identity"
                );
            }
            assert_eq!(reviews(), expected, "{token}");
        }
        assert_eq!(cache.hits.load(Ordering::Relaxed), 2);
        // An expired entry is reviewed again.
        let expiring = CachedAuthenticator::new(Counting(AtomicUsize::new(0)), Duration::ZERO);
        expiring.authenticate("good-a").await.unwrap();
        expiring.authenticate("good-a").await.unwrap();
        assert_eq!(expiring.inner.0.load(Ordering::SeqCst), 2);
    }
}
