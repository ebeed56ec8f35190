//! Requests oci-client does not make (the manifest DELETE; the streamed blob upload of a push), authorized
//! the way the registry asks. oci-client runs the distribution token flow for its own requests, but only
//! for the `pull` and `pull,push` scopes, and it has no DELETE: a registry with token auth answers a
//! DELETE with 401 and a challenge for the `delete` action, which a static Basic or Bearer header can
//! never satisfy (GHCR, Harbor, Hub, distribution with `auth: token`).
//!
//! So each request here goes out with the token cached for its scope, if any; a 401 names the scheme,
//! realm, service and scope in `WWW-Authenticate`; a Bearer challenge is answered at its realm with the
//! docker-config credentials (Basic) and the request is sent once more with the token; a Basic challenge
//! gets the credentials directly. Tokens are cached per scope until shortly before they expire.

use oci_client::secrets::RegistryAuth;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How a request failed before the registry gave an answer the caller can interpret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HttpError {
    /// Connection, TLS, timeout, a token server that could not be reached.
    Transport(String),
    /// The token server refused the credentials (or answered something that is not a token).
    Denied(String),
}

impl std::fmt::Display for HttpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HttpError::Transport(s) | HttpError::Denied(s) => f.write_str(s),
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
/// Tokens are dropped this long before they expire, so a request never leaves with a dying one.
const EXPIRY_MARGIN: Duration = Duration::from_secs(10);

pub(crate) struct AuthedHttp {
    http: reqwest::Client,
    auth: RegistryAuth,
    tokens: Mutex<HashMap<String, CachedToken>>,
}

impl AuthedHttp {
    pub(crate) fn new(http: reqwest::Client, auth: RegistryAuth) -> Self {
        AuthedHttp {
            http,
            auth,
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
            .map_err(|e| HttpError::Transport(e.to_string()))?;
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
                let token = self.fetch_token(&realm, service.as_deref(), &asked).await?;
                build(&self.http).bearer_auth(token)
            }
        };
        retry.send().await.map_err(|e| HttpError::Transport(e.to_string()))
    }

    /// `GET <realm>?service=…&scope=…` with the docker-config credentials; caches the token under `scope`.
    async fn fetch_token(&self, realm: &str, service: Option<&str>, scope: &str) -> Result<String, HttpError> {
        let mut url = reqwest::Url::parse(realm)
            .map_err(|e| HttpError::Denied(format!("the registry's token realm {realm:?} is not a URL: {e}")))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(HttpError::Denied(format!(
                "the registry's token realm {realm:?} is not http(s)"
            )));
        }
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
        let mut req = self.http.get(url).timeout(Duration::from_secs(30));
        match &self.auth {
            RegistryAuth::Basic(user, pass) => req = req.basic_auth(user, Some(pass)),
            RegistryAuth::Bearer(t) => req = req.bearer_auth(t),
            RegistryAuth::Anonymous => {}
        }
        let resp = req
            .send()
            .await
            .map_err(|e| HttpError::Transport(format!("token request to {realm}: {e}")))?;
        let status = resp.status();
        let body = resp
            .bytes()
            .await
            .map_err(|e| HttpError::Transport(format!("token answer from {realm}: {e}")))?;
        if !status.is_success() {
            return Err(HttpError::Denied(format!(
                "the token server {realm} answered {status} for scope {scope:?}: {}",
                String::from_utf8_lossy(&body).trim()
            )));
        }
        let t: TokenResponse = serde_json::from_slice(&body)
            .map_err(|e| HttpError::Denied(format!("the token server {realm} answered no token: {e}")))?;
        let token = if t.token.is_empty() { t.access_token } else { t.token };
        if token.is_empty() {
            return Err(HttpError::Denied(format!(
                "the token server {realm} answered an empty token"
            )));
        }
        let lifetime = Duration::from_secs(t.expires_in.unwrap_or(DEFAULT_TOKEN_SECS));
        let expires = Instant::now() + lifetime.saturating_sub(EXPIRY_MARGIN);
        self.tokens.lock().expect("token cache lock").insert(
            scope.to_string(),
            CachedToken {
                token: token.clone(),
                expires,
            },
        );
        Ok(token)
    }
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

    #[test]
    fn scopes() {
        assert_eq!(repository_scope("cocoon/vm", "delete"), "repository:cocoon/vm:delete");
    }
}
