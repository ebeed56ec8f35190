//! Authentication: a client certificate verified against `VK_CLIENT_CA_FILE` during the TLS
//! handshake (the apiserver presents its kubelet-client certificate), else a bearer token
//! checked with a TokenReview; nothing else gets in (401).

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::{Api, PostParams};
use sha2::{Digest, Sha256};

use super::cache::TtlCache;
use super::user::UserInfo;

/// The answer of a token review.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenVerdict {
    Authenticated(UserInfo),
    /// Not a valid token (the reviewer's reason, logged, never shown to the client).
    Rejected(String),
}

/// Asks the cluster whether a bearer token is valid.
#[async_trait]
pub trait TokenReviewer: Send + Sync {
    /// `Err` = the review itself failed (apiserver unreachable): nothing is cached.
    async fn review(&self, token: &str) -> Result<TokenVerdict, String>;
}

/// TokenReview through the apiserver (`authentication.k8s.io/v1`).
pub struct KubeTokenReviewer {
    api: Api<TokenReview>,
}

impl KubeTokenReviewer {
    pub fn new(client: kube::Client) -> Self {
        Self { api: Api::all(client) }
    }
}

#[async_trait]
impl TokenReviewer for KubeTokenReviewer {
    async fn review(&self, token: &str) -> Result<TokenVerdict, String> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_string(),
                audiences: None,
            },
            ..Default::default()
        };
        let answer = self
            .api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| format!("TokenReview failed: {e}"))?;
        let status = answer.status.unwrap_or_default();
        if status.authenticated != Some(true) {
            return Ok(TokenVerdict::Rejected(
                status.error.unwrap_or_else(|| "token not authenticated".into()),
            ));
        }
        let user = status.user.unwrap_or_default();
        Ok(TokenVerdict::Authenticated(UserInfo {
            name: user.username.unwrap_or_default(),
            uid: user.uid.unwrap_or_default(),
            groups: user.groups.unwrap_or_default(),
            extra: user.extra.unwrap_or_default(),
        }))
    }
}

/// Why a request was not authenticated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthnError {
    #[error("no client certificate and no bearer token")]
    Anonymous,
    #[error("malformed Authorization header")]
    MalformedHeader,
    #[error("bearer token rejected: {0}")]
    Rejected(String),
    #[error("{0}")]
    ReviewFailed(String),
    /// Too many tokens this side does not know are being reviewed: not asked this time.
    #[error("too many unknown bearer tokens to review; try again shortly")]
    RateLimited,
}

/// How long token reviews are remembered (the kubelet's webhook defaults: 2 min, failures 10 s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuthnTtl {
    pub authenticated: Duration,
    pub rejected: Duration,
}

impl Default for AuthnTtl {
    fn default() -> Self {
        Self {
            authenticated: Duration::from_secs(120),
            rejected: Duration::from_secs(10),
        }
    }
}

/// TokenReviews of tokens not in the cache, per second (sustained) and at once (burst). Each
/// costs the apiserver a review, and anyone who can reach the port can send random tokens:
/// past this, a request with an unknown token is answered 429 without one. Known tokens (an
/// answer cached, allow or deny) are not limited. The kubelet has no such limit; real clients
/// present few distinct tokens (each answer is cached for minutes).
pub const UNKNOWN_TOKEN_REVIEWS_PER_SECOND: u32 = 20;
pub const UNKNOWN_TOKEN_REVIEW_BURST: u32 = 100;

pub struct Authenticator {
    reviewer: Arc<dyn TokenReviewer>,
    ttl: AuthnTtl,
    /// Keyed by the token's SHA-256 (the token itself is not kept).
    cache: TtlCache<[u8; 32], TokenVerdict>,
    /// The token bucket of reviews of unknown tokens.
    reviews: DefaultDirectRateLimiter,
}

/// The token of an `Authorization: Bearer …` header value.
pub fn bearer_token(header: &str) -> Option<&str> {
    let (scheme, token) = header.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

impl Authenticator {
    pub fn new(reviewer: Arc<dyn TokenReviewer>, ttl: AuthnTtl) -> Self {
        let per_second = NonZeroU32::new(UNKNOWN_TOKEN_REVIEWS_PER_SECOND).unwrap_or(NonZeroU32::MIN);
        let burst = NonZeroU32::new(UNKNOWN_TOKEN_REVIEW_BURST).unwrap_or(NonZeroU32::MIN);
        Self {
            reviewer,
            ttl,
            cache: TtlCache::new(10_000),
            reviews: RateLimiter::direct(Quota::per_second(per_second).allow_burst(burst)),
        }
    }

    /// The request's identity: the verified certificate's, else the bearer token's.
    pub async fn authenticate(
        &self,
        certificate: Option<&UserInfo>,
        authorization: Option<&str>,
    ) -> Result<UserInfo, AuthnError> {
        if let Some(user) = certificate {
            return Ok(user.clone());
        }
        let Some(header) = authorization else {
            return Err(AuthnError::Anonymous);
        };
        let token = bearer_token(header).ok_or(AuthnError::MalformedHeader)?;
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let verdict = match self.cache.get(&key, Instant::now()) {
            Some(v) => v,
            None => {
                if self.reviews.check().is_err() {
                    return Err(AuthnError::RateLimited);
                }
                let v = self.reviewer.review(token).await.map_err(AuthnError::ReviewFailed)?;
                let ttl = match v {
                    TokenVerdict::Authenticated(_) => self.ttl.authenticated,
                    TokenVerdict::Rejected(_) => self.ttl.rejected,
                };
                self.cache.insert(key, v.clone(), ttl, Instant::now());
                v
            }
        };
        match verdict {
            TokenVerdict::Authenticated(user) => Ok(user),
            TokenVerdict::Rejected(why) => Err(AuthnError::Rejected(why)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct Counting {
        calls: AtomicUsize,
    }

    #[async_trait]
    impl TokenReviewer for Counting {
        async fn review(&self, token: &str) -> Result<TokenVerdict, String> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            match token {
                "good" => Ok(TokenVerdict::Authenticated(UserInfo {
                    name: "alice".into(),
                    ..Default::default()
                })),
                "down" => Err("TokenReview failed: connection refused".into()),
                _ => Ok(TokenVerdict::Rejected("invalid bearer token".into())),
            }
        }
    }

    #[test]
    fn bearer_headers() {
        assert_eq!(bearer_token("Bearer abc"), Some("abc"));
        assert_eq!(bearer_token("bearer  abc "), Some("abc"));
        assert_eq!(bearer_token("Basic abc"), None);
        assert_eq!(bearer_token("Bearer "), None);
        assert_eq!(bearer_token("Bearer"), None);
    }

    #[tokio::test]
    async fn certificates_win_tokens_are_reviewed_once_and_failures_are_not_cached() {
        let reviewer = Arc::new(Counting {
            calls: AtomicUsize::new(0),
        });
        let a = Authenticator::new(reviewer.clone(), AuthnTtl::default());
        let cert = UserInfo::from_certificate("kube-apiserver-kubelet-client", &["system:masters".into()]);
        assert_eq!(a.authenticate(Some(&cert), Some("Bearer bad")).await.unwrap(), cert);
        assert_eq!(a.authenticate(None, None).await, Err(AuthnError::Anonymous));
        assert_eq!(
            a.authenticate(None, Some("Basic x")).await,
            Err(AuthnError::MalformedHeader)
        );
        for _ in 0..3 {
            assert_eq!(a.authenticate(None, Some("Bearer good")).await.unwrap().name, "alice");
            assert!(matches!(
                a.authenticate(None, Some("Bearer bad")).await,
                Err(AuthnError::Rejected(_))
            ));
        }
        assert_eq!(reviewer.calls.load(Ordering::SeqCst), 2, "one review per token");
        for _ in 0..2 {
            assert!(matches!(
                a.authenticate(None, Some("Bearer down")).await,
                Err(AuthnError::ReviewFailed(_))
            ));
        }
        assert_eq!(
            reviewer.calls.load(Ordering::SeqCst),
            4,
            "a failed review is asked again"
        );
        assert!(cert.groups.contains(&"system:authenticated".to_string()));
    }

    /// Every unknown bearer token costs a TokenReview on the apiserver: a client spraying
    /// random tokens is limited to a small burst of reviews, the rest answered without one.
    #[tokio::test]
    async fn reviews_of_unknown_tokens_are_rate_limited() {
        let reviewer = Arc::new(Counting {
            calls: AtomicUsize::new(0),
        });
        let a = Authenticator::new(reviewer.clone(), AuthnTtl::default());
        let mut refused = 0;
        for i in 0..2_000 {
            if a.authenticate(None, Some(&format!("Bearer random-{i}"))).await.is_err() {
                refused += 1;
            }
        }
        assert_eq!(refused, 2_000);
        let calls = reviewer.calls.load(Ordering::SeqCst);
        assert!(calls <= 200, "{calls} TokenReviews for 2000 random tokens");
        assert_eq!(
            a.authenticate(None, Some("Bearer random-1999")).await,
            Err(AuthnError::RateLimited),
            "past the burst, an unknown token is not reviewed"
        );
        // A token reviewed before the flood is answered from the cache, limit or not.
        assert!(matches!(
            a.authenticate(None, Some("Bearer random-0")).await,
            Err(AuthnError::Rejected(_))
        ));
    }
}
