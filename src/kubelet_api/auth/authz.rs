//! Authorization: a SubjectAccessReview per (identity, attributes), cached like the kubelet's
//! webhook authorizer (allow 5 min, deny 30 s).

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use kube::api::{Api, PostParams};

use super::attributes::Attributes;
use super::cache::TtlCache;
use super::user::UserInfo;

/// One check: may `user` `verb` `resource/name/subresource`?
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AccessCheck {
    pub user: UserInfo,
    pub verb: &'static str,
    pub resource: &'static str,
    pub name: String,
    pub subresource: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccessVerdict {
    Allowed,
    /// Not allowed, with the authorizer's reason ("" when it gave none).
    Denied(String),
}

#[async_trait]
pub trait AccessReviewer: Send + Sync {
    /// `Err` = the review itself failed: nothing is cached.
    async fn review(&self, check: &AccessCheck) -> Result<AccessVerdict, String>;
}

/// SubjectAccessReview through the apiserver (`authorization.k8s.io/v1`).
pub struct KubeAccessReviewer {
    api: Api<SubjectAccessReview>,
}

impl KubeAccessReviewer {
    pub fn new(client: kube::Client) -> Self {
        Self { api: Api::all(client) }
    }
}

#[async_trait]
impl AccessReviewer for KubeAccessReviewer {
    async fn review(&self, check: &AccessCheck) -> Result<AccessVerdict, String> {
        let sar = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(check.user.name.clone()),
                uid: Some(check.user.uid.clone()).filter(|u| !u.is_empty()),
                groups: Some(check.user.groups.clone()),
                extra: Some(check.user.extra.clone()).filter(|e| !e.is_empty()),
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(check.verb.into()),
                    group: Some(String::new()),
                    version: Some("v1".into()),
                    resource: Some(check.resource.into()),
                    name: Some(check.name.clone()),
                    subresource: Some(check.subresource.into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let answer = self
            .api
            .create(&PostParams::default(), &sar)
            .await
            .map_err(|e| format!("SubjectAccessReview failed: {e}"))?;
        let status = answer.status.unwrap_or_default();
        Ok(if status.allowed {
            AccessVerdict::Allowed
        } else {
            AccessVerdict::Denied(status.reason.unwrap_or_default())
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuthzTtl {
    pub allowed: Duration,
    pub denied: Duration,
}

impl Default for AuthzTtl {
    fn default() -> Self {
        Self {
            allowed: Duration::from_secs(300),
            denied: Duration::from_secs(30),
        }
    }
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthzError {
    /// 403: the message names the user, verb, resource and subresources, then the reason.
    #[error("{0}")]
    Forbidden(String),
    /// 500: the review could not be made.
    #[error("{0}")]
    Failed(String),
}

pub struct Authorizer {
    reviewer: Arc<dyn AccessReviewer>,
    ttl: AuthzTtl,
    cache: TtlCache<AccessCheck, AccessVerdict>,
}

impl Authorizer {
    pub fn new(reviewer: Arc<dyn AccessReviewer>, ttl: AuthzTtl) -> Self {
        Self {
            reviewer,
            ttl,
            cache: TtlCache::new(10_000),
        }
    }

    async fn check(&self, check: AccessCheck) -> Result<AccessVerdict, String> {
        if let Some(v) = self.cache.get(&check, Instant::now()) {
            return Ok(v);
        }
        let v = self.reviewer.review(&check).await?;
        let ttl = match v {
            AccessVerdict::Allowed => self.ttl.allowed,
            AccessVerdict::Denied(_) => self.ttl.denied,
        };
        self.cache.insert(check, v.clone(), ttl, Instant::now());
        Ok(v)
    }

    /// Allowed when any of the attributes' subresources is (tried in order).
    pub async fn authorize(&self, user: &UserInfo, attrs: &Attributes) -> Result<(), AuthzError> {
        let mut reasons = Vec::new();
        for sub in &attrs.subresources {
            let verdict = self
                .check(AccessCheck {
                    user: user.clone(),
                    verb: attrs.verb,
                    resource: attrs.resource,
                    name: attrs.name.clone(),
                    subresource: sub,
                })
                .await
                .map_err(|e| {
                    AuthzError::Failed(format!(
                        "Authorization error (user={}, verb={}, resource={}, subresource={sub}): {e}",
                        user.name, attrs.verb, attrs.resource
                    ))
                })?;
            match verdict {
                AccessVerdict::Allowed => return Ok(()),
                AccessVerdict::Denied(reason) if !reason.is_empty() => reasons.push(reason),
                AccessVerdict::Denied(_) => {}
            }
        }
        let mut msg = format!(
            "Forbidden (user={}, verb={}, resource={}, subresource(s)=[{}])",
            user.name,
            attrs.verb,
            attrs.resource,
            attrs.subresources.join(" ")
        );
        if !reasons.is_empty() {
            msg.push_str(": ");
            msg.push_str(&reasons.join("; "));
        }
        Err(AuthzError::Forbidden(msg))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Allows `proxy` to "admin" only; records every review.
    #[derive(Default)]
    struct Rbac {
        asked: Mutex<Vec<(String, &'static str)>>,
    }

    #[async_trait]
    impl AccessReviewer for Rbac {
        async fn review(&self, c: &AccessCheck) -> Result<AccessVerdict, String> {
            self.asked.lock().unwrap().push((c.user.name.clone(), c.subresource));
            if c.user.name == "broken" {
                return Err("connection refused".into());
            }
            Ok(if c.user.name == "admin" && c.subresource == "proxy" {
                AccessVerdict::Allowed
            } else {
                AccessVerdict::Denied(format!("no {} for {}", c.subresource, c.user.name))
            })
        }
    }

    fn user(name: &str) -> UserInfo {
        UserInfo {
            name: name.into(),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn the_fallback_subresource_admits_and_answers_are_cached() {
        let rbac = Arc::new(Rbac::default());
        let a = Authorizer::new(rbac.clone(), AuthzTtl::default());
        let pods = super::super::attributes::for_request(&axum::http::Method::GET, "/pods", "n");
        a.authorize(&user("admin"), &pods).await.unwrap();
        a.authorize(&user("admin"), &pods).await.unwrap();
        assert_eq!(
            *rbac.asked.lock().unwrap(),
            vec![("admin".to_string(), "pods"), ("admin".to_string(), "proxy")],
            "pods first, then proxy; the second request is answered from the cache"
        );
        let stats = super::super::attributes::for_request(&axum::http::Method::GET, "/stats/summary", "n");
        let err = a.authorize(&user("viewer"), &stats).await.unwrap_err();
        assert_eq!(
            err,
            AuthzError::Forbidden(
                "Forbidden (user=viewer, verb=get, resource=nodes, subresource(s)=[stats]): no stats for viewer".into()
            )
        );
        let err = a.authorize(&user("broken"), &stats).await.unwrap_err();
        assert!(matches!(err, AuthzError::Failed(m) if m.contains("connection refused")));
        let _ = a.authorize(&user("broken"), &stats).await;
        let asked = rbac.asked.lock().unwrap().len();
        assert_eq!(asked, 5, "a failed review is not cached");
    }
}
