//! Every request the registry client makes goes out here, authorized the way the registry asks (the
//! distribution token protocol). Each request goes out with the token cached for its scope, if any,
//! else with the docker-config credentials (Basic or an identity token: the registry's own host gets
//! them as they are); a 401 names the scheme, realm, service and scope in `WWW-Authenticate`; a Bearer
//! challenge is answered at its realm with those credentials and the request is sent once more with
//! the token; a Basic challenge gets the credentials directly. Tokens are cached per scope until
//! shortly before they expire (an hour at most).
//!
//! The realm is the registry's to name, so it is where the registry could send the node's
//! credentials: they go to a realm on the registry's own host (any port: the same machine), over
//! HTTPS — or over plain HTTP when the registry itself is spoken to over plain HTTP, where the
//! credentials already travel in clear to that host. Another host gets them only when the operator
//! lists it in `OCI_REGISTRY_TOKEN_REALMS`, and only over HTTPS. Any other realm is not asked at all,
//! with or without credentials (a realm is also a URL the registry makes the node fetch). A token
//! answer is read to [`MAX_TOKEN_ANSWER`] at most, within the answer deadline.

use super::answer::{self, AnswerError};
use super::errors::Cause;
use oci_client::secrets::RegistryAuth;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How a request failed before the registry gave an answer the caller can interpret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HttpError {
    /// Connection, TLS, timeout, a token server that could not be reached (and the error, when
    /// one says why).
    Transport(String, Option<Cause>),
    /// The token server refused the credentials (or answered something that is not a token).
    Denied(String, Option<Cause>),
    /// The registry named a token realm the credentials may not go to; it was not asked.
    UntrustedRealm { realm: String, reason: RealmRefusal },
}

impl std::fmt::Display for HttpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HttpError::Transport(s, _) | HttpError::Denied(s, _) => f.write_str(s),
            HttpError::UntrustedRealm { realm, reason } => write!(f, "the token realm {realm} {reason}"),
        }
    }
}

/// Where the registry's token realm may be (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RealmPolicy {
    /// The registry's host (no port, no brackets), lower-cased.
    pub registry_host: String,
    /// The registry is spoken to over plain HTTP.
    pub plain_http: bool,
    /// `OCI_REGISTRY_TOKEN_REALMS`: `host` or `host:port` entries, lower-cased.
    pub trusted: Vec<String>,
}

/// Why a token realm gets no credentials; reads after "the token realm X, which".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum RealmRefusal {
    #[error("is not an http(s) URL (scheme {0:?})")]
    NotHttp(String),
    #[error("is plain HTTP while the registry is spoken to over HTTPS")]
    PlainToTheRegistry,
    #[error("is plain HTTP (another host, {host}, gets the credentials only over HTTPS)")]
    PlainToAnotherHost { host: String },
    #[error("is on another host ({host}) than the registry ({registry})")]
    AnotherHost { host: String, registry: String },
}

impl RealmPolicy {
    /// `Err(reason)` when `realm` may not be asked for a token.
    pub(crate) fn check(&self, realm: &reqwest::Url) -> Result<(), RealmRefusal> {
        let https = match realm.scheme() {
            "https" => true,
            "http" => false,
            other => return Err(RealmRefusal::NotHttp(other.to_string())),
        };
        let host = realm
            .host_str()
            .unwrap_or_default()
            .trim_matches(['[', ']'])
            .to_ascii_lowercase();
        if host == self.registry_host {
            return if https || self.plain_http {
                Ok(())
            } else {
                Err(RealmRefusal::PlainToTheRegistry)
            };
        }
        let with_port = realm.port().map(|p| format!("{host}:{p}"));
        let listed = self
            .trusted
            .iter()
            .any(|t| t.trim_matches(['[', ']']) == host || Some(t) == with_port.as_ref());
        match (listed, https) {
            (true, true) => Ok(()),
            (true, false) => Err(RealmRefusal::PlainToAnotherHost { host }),
            (false, _) => Err(RealmRefusal::AnotherHost {
                host,
                registry: self.registry_host.clone(),
            }),
        }
    }
}

struct CachedToken {
    token: String,
    expires: Instant,
}

/// A token answer of the distribution token protocol (`token`, or the OAuth2 `access_token`).
#[derive(serde::Deserialize)]
struct TokenResponse {
    #[serde(default)]
    token: String,
    #[serde(default)]
    access_token: String,
    #[serde(default)]
    expires_in: Option<u64>,
}

/// The distribution spec's default when a token answer carries no `expires_in`.
const DEFAULT_TOKEN_SECS: u64 = 60;
/// The longest a token is kept, whatever its answer says (a longer one is simply fetched again).
const MAX_TOKEN_SECS: u64 = 3600;
/// The biggest token answer read (a JWT with its certificate chain is a few KiB).
pub(crate) const MAX_TOKEN_ANSWER: usize = 1 << 20;
/// Tokens are dropped this long before they expire, so a request never leaves with a dying one.
const EXPIRY_MARGIN: Duration = Duration::from_secs(10);

pub(crate) struct AuthedHttp {
    http: reqwest::Client,
    auth: RegistryAuth,
    realms: RealmPolicy,
    /// The most a token exchange may take, answer included.
    answer_deadline: Duration,
    tokens: Mutex<HashMap<String, CachedToken>>,
}

impl AuthedHttp {
    pub(crate) fn new(
        http: reqwest::Client,
        auth: RegistryAuth,
        realms: RealmPolicy,
        answer_deadline: Duration,
    ) -> Self {
        AuthedHttp {
            http,
            auth,
            realms,
            answer_deadline,
            tokens: Mutex::new(HashMap::new()),
        }
    }

    /// The bearer token cached for `scope` (e.g. `repository:cocoon/vm:pull,push`), if still fresh.
    pub(crate) fn cached_token(&self, scope: &str) -> Option<String> {
        let tokens = self.tokens.lock().expect("token cache lock");
        tokens
            .get(scope)
            .filter(|t| t.expires > Instant::now())
            .map(|t| t.token.clone())
    }

    pub(crate) fn client(&self) -> &reqwest::Client {
        &self.http
    }

    /// Applies the token cached for `scope`, else the docker-config credentials (a registry with Basic
    /// auth takes them as they are; one with token auth answers 401 and a challenge, see [`Self::send`]).
    pub(crate) fn authorize(&self, scope: &str, req: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match (self.cached_token(scope), &self.auth) {
            (Some(t), _) => req.bearer_auth(t),
            (None, RegistryAuth::Bearer(t)) => req.bearer_auth(t),
            (None, RegistryAuth::Basic(u, p)) => req.basic_auth(u, Some(p)),
            (None, RegistryAuth::Anonymous) => req,
        }
    }

    /// Sends the request `build` makes (it is built again for the second attempt, so it must not carry a
    /// streamed body), answering one authentication challenge. The caller interprets the final status.
    pub(crate) async fn send(
        &self,
        scope: &str,
        build: impl Fn(&reqwest::Client) -> reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, HttpError> {
        let first = self
            .authorize(scope, build(&self.http))
            .send()
            .await
            .map_err(|e| HttpError::Transport(e.to_string(), Some(Cause::new(e))))?;
        if first.status() != reqwest::StatusCode::UNAUTHORIZED {
            return Ok(first);
        }
        let Some(challenge) = first
            .headers()
            .get(reqwest::header::WWW_AUTHENTICATE)
            .and_then(|v| v.to_str().ok())
            .and_then(Challenge::parse)
        else {
            return Ok(first);
        };
        let retry = match challenge {
            Challenge::Basic => match &self.auth {
                RegistryAuth::Basic(user, pass) => build(&self.http).basic_auth(user, Some(pass)),
                _ => return Ok(first),
            },
            Challenge::Bearer {
                realm,
                service,
                scope: asked,
            } => {
                let asked = asked.unwrap_or_else(|| scope.to_string());
                let token = self.fetch_token(&realm, service.as_deref(), &asked, scope).await?;
                build(&self.http).bearer_auth(token)
            }
        };
        retry
            .send()
            .await
            .map_err(|e| HttpError::Transport(e.to_string(), Some(Cause::new(e))))
    }

    /// `GET <realm>?service=…&scope=…` with the docker-config credentials, when the realm may have them
    /// (see [`RealmPolicy`]); caches the token under `key`, the scope of the request that was
    /// challenged (the one the next such request looks up).
    async fn fetch_token(
        &self,
        realm: &str,
        service: Option<&str>,
        scope: &str,
        key: &str,
    ) -> Result<String, HttpError> {
        let mut url = reqwest::Url::parse(realm).map_err(|e| {
            HttpError::Denied(
                format!("the registry's token realm {realm:?} is not a URL: {e}"),
                Some(Cause::new(e)),
            )
        })?;
        self.realms.check(&url).map_err(|reason| {
            tracing::warn!(realm, %reason, "refusing the registry's token realm");
            HttpError::UntrustedRealm {
                realm: realm.to_string(),
                reason,
            }
        })?;
        {
            let mut q = url.query_pairs_mut();
            if let Some(s) = service {
                q.append_pair("service", s);
            }
            // A challenge may name several scopes, space-separated: one `scope` parameter each.
            for s in scope.split_whitespace() {
                q.append_pair("scope", s);
            }
        }
        let mut req = self.http.get(url);
        match &self.auth {
            RegistryAuth::Basic(user, pass) => req = req.basic_auth(user, Some(pass)),
            RegistryAuth::Bearer(t) => req = req.bearer_auth(t),
            RegistryAuth::Anonymous => {}
        }
        let exchange = async {
            let resp = req
                .send()
                .await
                .map_err(|e| HttpError::Transport(format!("token request to {realm}: {e}"), Some(Cause::new(e))))?;
            let status = resp.status();
            if !status.is_success() {
                let text = answer::error_text(resp, self.answer_deadline).await;
                return Err(HttpError::Denied(
                    format!("the token server {realm} answered {status} for scope {scope:?}: {text}"),
                    None,
                ));
            }
            answer::read_whole(resp, MAX_TOKEN_ANSWER).await.map_err(|e| match e {
                AnswerError::TooLarge { .. } => HttpError::Denied(format!("the token server {realm}: {e}"), None),
                AnswerError::Transport(ref cause) => {
                    HttpError::Transport(format!("token answer from {realm}: {e}"), Some(cause.clone()))
                }
            })
        };
        let body = tokio::time::timeout(self.answer_deadline, exchange)
            .await
            .map_err(|_| {
                HttpError::Transport(
                    format!(
                        "the token server {realm} did not answer within {}",
                        answer::secs_text(self.answer_deadline)
                    ),
                    None,
                )
            })??;
        let t: TokenResponse = serde_json::from_slice(&body).map_err(|e| {
            HttpError::Denied(
                format!("the token server {realm} answered no token: {e}"),
                Some(Cause::new(e)),
            )
        })?;
        let token = if t.token.is_empty() { t.access_token } else { t.token };
        if token.is_empty() {
            return Err(HttpError::Denied(
                format!("the token server {realm} answered an empty token"),
                None,
            ));
        }
        let now = Instant::now();
        let mut tokens = self.tokens.lock().expect("token cache lock");
        // Expired tokens go when a new one comes: the cache holds no more than the scopes in use.
        tokens.retain(|_, t| t.expires > now);
        tokens.insert(
            key.to_string(),
            CachedToken {
                token: token.clone(),
                expires: now + token_lifetime(t.expires_in),
            },
        );
        Ok(token)
    }
}

/// How long a token is kept: its `expires_in` (the spec's default without one), capped at
/// [`MAX_TOKEN_SECS`], less the margin that keeps a dying token off the wire.
fn token_lifetime(expires_in: Option<u64>) -> Duration {
    let secs = expires_in.unwrap_or(DEFAULT_TOKEN_SECS).min(MAX_TOKEN_SECS);
    Duration::from_secs(secs).saturating_sub(EXPIRY_MARGIN)
}

/// The part of a `WWW-Authenticate` header we answer.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Challenge {
    Basic,
    Bearer {
        realm: String,
        service: Option<String>,
        scope: Option<String>,
    },
}

impl Challenge {
    /// The first Bearer (with a realm) or Basic challenge of the header, parsed by `http-auth`.
    fn parse(header: &str) -> Option<Challenge> {
        let challenges = http_auth::parse_challenges(header).ok()?;
        let mut basic = false;
        for c in challenges {
            if c.scheme.eq_ignore_ascii_case("bearer") {
                let param = |k: &str| {
                    c.params
                        .iter()
                        .find(|(n, _)| n.eq_ignore_ascii_case(k))
                        .map(|(_, v)| v.to_unescaped())
                };
                if let Some(realm) = param("realm") {
                    return Some(Challenge::Bearer {
                        realm,
                        service: param("service"),
                        scope: param("scope"),
                    });
                }
            } else if c.scheme.eq_ignore_ascii_case("basic") {
                basic = true;
            }
        }
        basic.then_some(Challenge::Basic)
    }
}

/// The token scope of an action on a repository (`repository:<path>:<actions>`).
pub(crate) fn repository_scope(repository: &str, actions: &str) -> String {
    format!("repository:{repository}:{actions}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenges_are_parsed_as_registries_send_them() {
        assert_eq!(
            Challenge::parse(
                r#"Bearer realm="https://auth.example.com/token",service="registry.example.com",scope="repository:cocoon/vm:delete",error="insufficient_scope""#
            ),
            Some(Challenge::Bearer {
                realm: "https://auth.example.com/token".into(),
                service: Some("registry.example.com".into()),
                scope: Some("repository:cocoon/vm:delete".into()),
            })
        );
        assert_eq!(
            Challenge::parse(r#"Basic realm="Registry Realm""#),
            Some(Challenge::Basic)
        );
        assert_eq!(
            Challenge::parse(r#"Bearer realm="http://127.0.0.1:1/token""#),
            Some(Challenge::Bearer {
                realm: "http://127.0.0.1:1/token".into(),
                service: None,
                scope: None
            })
        );
        assert_eq!(Challenge::parse("Negotiate"), None);
        assert_eq!(Challenge::parse(""), None);
    }

    fn policy(host: &str, plain_http: bool, trusted: &[&str]) -> RealmPolicy {
        RealmPolicy {
            registry_host: host.into(),
            plain_http,
            trusted: trusted.iter().map(|t| t.to_string()).collect(),
        }
    }

    fn check(p: &RealmPolicy, realm: &str) -> Result<(), RealmRefusal> {
        p.check(&reqwest::Url::parse(realm).unwrap())
    }

    #[test]
    fn credentials_go_only_to_the_registry_host_over_https_unless_it_is_plain_http_itself() {
        let https = policy("reg.example.com", false, &[]);
        assert_eq!(check(&https, "https://reg.example.com/token"), Ok(()));
        assert_eq!(check(&https, "https://REG.example.com:8443/token"), Ok(()));
        assert!(
            check(&https, "http://reg.example.com/token")
                .unwrap_err()
                .to_string()
                .contains("plain HTTP")
        );
        assert!(
            check(&https, "https://evil.example.net/token")
                .unwrap_err()
                .to_string()
                .contains("another host")
        );
        assert!(
            check(&https, "https://reg.example.com.evil.net/t")
                .unwrap_err()
                .to_string()
                .contains("another host")
        );
        assert!(check(&https, "ftp://reg.example.com/t").is_err());
        // A plain-HTTP registry (loopback, private network, or http:// chosen by the operator): its
        // own host may have them over plain HTTP too — they already go there in clear.
        let plain = policy("127.0.0.1", true, &[]);
        assert_eq!(check(&plain, "http://127.0.0.1:5001/token"), Ok(()));
        assert!(
            check(&plain, "http://127.0.0.2:5001/token")
                .unwrap_err()
                .to_string()
                .contains("another host")
        );
        assert!(check(&plain, "http://localhost:5001/token").is_err());
        let v6 = policy("::1", true, &[]);
        assert_eq!(check(&v6, "http://[::1]:5001/token"), Ok(()));
        // Hosts the operator lists: over HTTPS only, by host or host:port.
        let listed = policy(
            "registry-1.docker.io",
            false,
            &["auth.docker.io", "gitlab.example.com:8443"],
        );
        assert_eq!(check(&listed, "https://auth.docker.io/token"), Ok(()));
        assert!(
            check(&listed, "http://auth.docker.io/token")
                .unwrap_err()
                .to_string()
                .contains("plain HTTP")
        );
        assert_eq!(check(&listed, "https://gitlab.example.com:8443/jwt/auth"), Ok(()));
        assert!(check(&listed, "https://gitlab.example.com/jwt/auth").is_err());
    }

    #[test]
    fn token_lifetimes_are_capped_and_never_overflow() {
        assert_eq!(
            token_lifetime(Some(u64::MAX)),
            Duration::from_secs(MAX_TOKEN_SECS) - EXPIRY_MARGIN
        );
        assert_eq!(token_lifetime(Some(300)), Duration::from_secs(290));
        assert_eq!(token_lifetime(None), Duration::from_secs(50));
        assert_eq!(token_lifetime(Some(3)), Duration::ZERO);
        // The cache entry's deadline is computable from any of them.
        let _ = Instant::now() + token_lifetime(Some(u64::MAX));
    }

    #[test]
    fn scopes() {
        assert_eq!(repository_scope("cocoon/vm", "delete"), "repository:cocoon/vm:delete");
    }
}
