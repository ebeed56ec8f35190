//! The auth server of a docker-registry with `auth: token` (the distribution token protocol): on
//! `GET /token?service=…&scope=repository:<name>:<actions>` it checks the Basic credentials, grants the
//! intersection of the asked actions and the user's rights, and answers a JWT (ES256) whose `x5c`
//! header carries the certificate of its signing key — the certificate the registry trusts as its
//! `rootcertbundle`. It plays the real role of an auth server: the registry verifies every token.
//! Served on loopback from a thread of its own; stopped on drop.

use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

pub const SERVICE: &str = "vk-test-registry";
pub const ISSUER: &str = "vk-test-token-issuer";

/// A user of the token server and the actions it may be granted on every repository.
#[derive(Clone)]
pub struct User {
    pub name: &'static str,
    pub password: &'static str,
    pub actions: &'static [&'static str],
}

struct Issuer {
    key: EcdsaKeyPair,
    cert_der: Vec<u8>,
    users: Vec<User>,
    /// Every grant: (user or "anonymous", scope asked, actions granted).
    log: Mutex<Vec<(String, String, Vec<String>)>>,
}

pub struct TokenServer {
    pub port: u16,
    pub cert_path: PathBuf,
    issuer: Arc<Issuer>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TokenServer {
    /// Starts on a free loopback port; the certificate goes to `dir/token-root.pem`.
    pub fn start(dir: &Path, users: Vec<User>) -> TokenServer {
        let key_pair = rcgen::KeyPair::generate().expect("P-256 key");
        let params = rcgen::CertificateParams::new(vec![ISSUER.to_string()]).expect("certificate params");
        let cert = params.self_signed(&key_pair).expect("self-signed certificate");
        let cert_path = dir.join("token-root.pem");
        std::fs::write(&cert_path, cert.pem()).unwrap();
        let key = EcdsaKeyPair::from_pkcs8(
            &ECDSA_P256_SHA256_FIXED_SIGNING,
            &key_pair.serialize_der(),
            &ring::rand::SystemRandom::new(),
        )
        .expect("signing key");
        let issuer = Arc::new(Issuer {
            key,
            cert_der: cert.der().to_vec(),
            users,
            log: Mutex::new(Vec::new()),
        });
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let state = issuer.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let app = axum::Router::new()
                    .route("/token", axum::routing::get(token))
                    .with_state(state);
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                axum::serve(listener, app)
                    .with_graceful_shutdown(async {
                        let _ = stopped.await;
                    })
                    .await
                    .unwrap();
            });
        });
        TokenServer {
            port,
            cert_path,
            issuer,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    pub fn realm(&self) -> String {
        format!("http://127.0.0.1:{}/token", self.port)
    }

    /// Every grant so far: (user, scope asked, actions granted).
    pub fn grants(&self) -> Vec<(String, String, Vec<String>)> {
        self.issuer.log.lock().unwrap().clone()
    }
}

impl Drop for TokenServer {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn b64url(b: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
}

/// The Basic credentials of a request, if any.
fn basic(headers: &HeaderMap) -> Option<(String, String)> {
    let v = headers.get("authorization")?.to_str().ok()?.strip_prefix("Basic ")?;
    let raw = base64::engine::general_purpose::STANDARD.decode(v).ok()?;
    let (u, p) = std::str::from_utf8(&raw).ok()?.split_once(':')?;
    Some((u.to_string(), p.to_string()))
}

async fn token(State(issuer): State<Arc<Issuer>>, headers: HeaderMap, RawQuery(query): RawQuery) -> Response {
    let url = reqwest::Url::parse(&format!("http://x/?{}", query.unwrap_or_default())).unwrap();
    let mut service = String::new();
    let mut scopes = Vec::new();
    for (k, v) in url.query_pairs() {
        match k.as_ref() {
            "service" => service = v.into_owned(),
            "scope" => scopes.extend(v.split_whitespace().map(str::to_string)),
            _ => {}
        }
    }
    if service != SERVICE {
        return (StatusCode::BAD_REQUEST, format!("unknown service {service:?}")).into_response();
    }
    // Anonymous callers get a token without rights (the registry then refuses what they ask).
    let user = match basic(&headers) {
        None => None,
        Some((u, p)) => match issuer.users.iter().find(|x| x.name == u && x.password == p) {
            Some(user) => Some(user.clone()),
            None => return (StatusCode::UNAUTHORIZED, "bad credentials").into_response(),
        },
    };
    let mut access = Vec::new();
    for scope in &scopes {
        let mut parts = scope.splitn(3, ':');
        let (Some(kind), Some(name), Some(actions)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let granted: Vec<String> = actions
            .split(',')
            .filter(|a| user.as_ref().is_some_and(|u| u.actions.contains(a)))
            .map(str::to_string)
            .collect();
        issuer.log.lock().unwrap().push((
            user.as_ref().map_or("anonymous", |u| u.name).to_string(),
            scope.clone(),
            granted.clone(),
        ));
        access.push(serde_json::json!({"type": kind, "name": name, "actions": granted}));
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let header = serde_json::json!({
        "typ": "JWT",
        "alg": "ES256",
        "x5c": [base64::engine::general_purpose::STANDARD.encode(&issuer.cert_der)],
    });
    let claims = serde_json::json!({
        "iss": ISSUER,
        "sub": user.as_ref().map_or("", |u| u.name),
        "aud": SERVICE,
        "exp": now + 300,
        "nbf": now - 10,
        "iat": now,
        "jti": format!("{now}-{}", scopes.len()),
        "access": access,
    });
    let signing_input = format!(
        "{}.{}",
        b64url(header.to_string().as_bytes()),
        b64url(claims.to_string().as_bytes())
    );
    let sig = issuer
        .key
        .sign(&ring::rand::SystemRandom::new(), signing_input.as_bytes())
        .expect("ES256 signature");
    let jwt = format!("{signing_input}.{}", b64url(sig.as_ref()));
    let body = BTreeMap::from([
        ("token", serde_json::Value::from(jwt.clone())),
        ("access_token", jwt.into()),
        ("expires_in", 300.into()),
    ]);
    axum::Json(body).into_response()
}
