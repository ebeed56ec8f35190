//! Authentication and authorization of every kubelet API request, as the kubelet does it
//! (webhook mode): identity from a verified client certificate or a TokenReview, permission
//! from a SubjectAccessReview on `nodes/<subresource>`. Anonymous requests get 401, refused
//! ones 403 with the reason. The [`guard`] middleware wraps the whole router, so every route
//! — today's and the streaming ones to come — is behind it.

pub mod attributes;
pub mod authn;
pub mod authz;
pub mod cache;
pub mod user;

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

pub use authn::{Authenticator, AuthnError, AuthnTtl, KubeTokenReviewer, TokenReviewer, TokenVerdict};
pub use authz::{AccessCheck, AccessReviewer, AccessVerdict, Authorizer, AuthzError, AuthzTtl, KubeAccessReviewer};
pub use user::UserInfo;

/// The identity a verified client certificate carries (put on each request by the server).
#[derive(Debug, Clone)]
pub struct PeerCertificate(pub UserInfo);

/// Authentication plus authorization for one node.
pub struct Auth {
    pub node_name: String,
    pub authenticator: Authenticator,
    pub authorizer: Authorizer,
}

impl Auth {
    pub fn new(
        node_name: &str,
        tokens: Arc<dyn TokenReviewer>,
        access: Arc<dyn AccessReviewer>,
        authn_ttl: AuthnTtl,
        authz_ttl: AuthzTtl,
    ) -> Self {
        Self {
            node_name: node_name.to_string(),
            authenticator: Authenticator::new(tokens, authn_ttl),
            authorizer: Authorizer::new(access, authz_ttl),
        }
    }

    /// The cluster's reviewers.
    pub fn kube(node_name: &str, client: kube::Client) -> Self {
        Self::new(
            node_name,
            Arc::new(KubeTokenReviewer::new(client.clone())),
            Arc::new(KubeAccessReviewer::new(client)),
            AuthnTtl::default(),
            AuthzTtl::default(),
        )
    }
}

fn text(status: StatusCode, body: String) -> Response {
    (status, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], body).into_response()
}

/// The middleware: authenticates, authorizes, and hands the [`UserInfo`] to the route.
pub async fn guard(State(auth): State<Arc<Auth>>, mut req: Request, next: Next) -> Response {
    let cert = req.extensions().get::<PeerCertificate>().map(|p| p.0.clone());
    let authorization = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let user = match auth
        .authenticator
        .authenticate(cert.as_ref(), authorization.as_deref())
        .await
    {
        Ok(user) => user,
        Err(AuthnError::RateLimited) => {
            // A flood of unknown tokens: one debug line each, not a warning each.
            tracing::debug!(path = %req.uri().path(), "kubelet API: token review rate-limited");
            let mut r = text(
                StatusCode::TOO_MANY_REQUESTS,
                "Too many requests with bearer tokens this node has not seen; try again in a second\n".into(),
            );
            r.headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
            return r;
        }
        Err(error) => {
            if let AuthnError::ReviewFailed(_) = error {
                tracing::warn!(%error, "kubelet API: token review failed");
            } else {
                tracing::debug!(%error, path = %req.uri().path(), "kubelet API: unauthenticated request");
            }
            return text(StatusCode::UNAUTHORIZED, "Unauthorized\n".into());
        }
    };
    let attrs = attributes::for_request(req.method(), req.uri().path(), &auth.node_name);
    match auth.authorizer.authorize(&user, &attrs).await {
        Ok(()) => {}
        Err(AuthzError::Forbidden(msg)) => {
            tracing::debug!(user = %user.name, path = %req.uri().path(), "kubelet API: {msg}");
            return text(StatusCode::FORBIDDEN, format!("{msg}\n"));
        }
        Err(AuthzError::Failed(msg)) => {
            tracing::warn!(user = %user.name, "kubelet API: {msg}");
            return text(StatusCode::INTERNAL_SERVER_ERROR, format!("{msg}\n"));
        }
    }
    req.extensions_mut().insert(user);
    next.run(req).await
}
