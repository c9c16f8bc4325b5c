//! Agents reconnect often (restarts, rollouts, controller failover, a thousand nodes at once): one
//! TokenReview per connect would put the API server on the ingest's hot path. A successful
//! authentication is remembered for a short while ([`TTL`]) by a keyed hash of the token, so a token
//! is reviewed at most once per window; failures are never remembered (a fixed token must work at once).
//! At most [`MAX_CONCURRENT_REVIEWS`] reviews run at once; a stream waits up to [`REVIEW_WAIT`] for
//! its turn, then is told to retry, so a thousand agents reconnecting together queue instead of
//! sending a thousand TokenReviews at once.

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
/// TokenReviews in flight at most.
pub const MAX_CONCURRENT_REVIEWS: usize = 16;
/// How long a stream waits for a review slot before it is told to retry.
pub const REVIEW_WAIT: Duration = Duration::from_secs(10);

/// An [`Authenticate`] that remembers what `inner` accepted.
pub struct CachedAuthenticator<A> {
    inner: A,
    ttl: Duration,
    /// Keyed (random per process) hash of the token → identity and expiry.
    entries: Mutex<HashMap<u64, (AgentIdentity, Instant)>>,
    hasher: std::hash::RandomState,
    /// Slots for reviews in flight.
    reviews: tokio::sync::Semaphore,
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
            reviews: tokio::sync::Semaphore::new(MAX_CONCURRENT_REVIEWS),
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
        let _slot = tokio::time::timeout(REVIEW_WAIT, self.reviews.acquire())
            .await
            .map_err(|_| {
                Status::unavailable(
                    "too many agents are being authenticated right now; retry shortly",
                )
            })?
            // Never closed.
            .map_err(|_| Status::internal("review slots closed"))?;
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

    /// Accepts every token after a while, recording the most reviews in flight at once.
    struct Slow {
        now: AtomicUsize,
        most: AtomicUsize,
    }

    #[tonic::async_trait]
    impl Authenticate for Slow {
        async fn authenticate(&self, token: &str) -> Result<AgentIdentity, Status> {
            let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
            self.most.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(20)).await;
            self.now.fetch_sub(1, Ordering::SeqCst);
            Ok(AgentIdentity {
                node: "n1".into(),
                pod: format!("ns/{token}"),
            })
        }
    }

    #[tokio::test]
    async fn reviews_in_flight_are_bounded() {
        let cache = std::sync::Arc::new(CachedAuthenticator::new(
            Slow {
                now: AtomicUsize::new(0),
                most: AtomicUsize::new(0),
            },
            TTL,
        ));
        let connects: Vec<_> = (0..MAX_CONCURRENT_REVIEWS * 3)
            .map(|i| {
                let cache = cache.clone();
                tokio::spawn(async move { cache.authenticate(&format!("good-{i}")).await })
            })
            .collect();
        for c in connects {
            assert!(c.await.unwrap().is_ok());
        }
        let most = cache.inner.most.load(Ordering::SeqCst);
        assert!(
            (2..=MAX_CONCURRENT_REVIEWS).contains(&most),
            "{most} reviews at once"
        );
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
