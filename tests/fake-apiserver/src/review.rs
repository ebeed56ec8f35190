//! The access-review endpoints a client asks before it acts (`vk-cocoon`'s RBAC preflight):
//! `SelfSubjectAccessReview` and `SelfSubjectReview`. The fake has no authentication or
//! authorization — every caller is an administrator — so every review is allowed and every
//! caller is told it is `fake-apiserver:admin` (group `system:masters`). Nothing is stored, as on
//! a real apiserver.

use crate::error::ApiError;
use axum::http::Method;
use serde_json::{Value, json};

pub(crate) const ACCESS_REVIEWS: &str = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews";
pub(crate) const SELF_REVIEWS: &str = "/apis/authentication.k8s.io/v1/selfsubjectreviews";

/// The answer to a review request (`201 Created` with the review and its status), or `None`
/// when `path` is not a review endpoint.
pub(crate) fn answer(method: &Method, path: &str, body: &[u8]) -> Option<Result<Value, ApiError>> {
    let path = path.trim_end_matches('/');
    if path != ACCESS_REVIEWS && path != SELF_REVIEWS {
        return None;
    }
    if method != Method::POST {
        return Some(Err(ApiError::method_not_allowed(format!(
            "{method} is not supported on {path}: reviews are only created"
        ))));
    }
    let mut review: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => {
            return Some(Err(ApiError::bad_request(format!(
                "the request body is not valid JSON: {e}"
            ))));
        }
    };
    if path == ACCESS_REVIEWS {
        review["apiVersion"] = json!("authorization.k8s.io/v1");
        review["kind"] = json!("SelfSubjectAccessReview");
        review["status"] = json!({"allowed": true, "reason": "the fake apiserver authorizes every request"});
    } else {
        review["apiVersion"] = json!("authentication.k8s.io/v1");
        review["kind"] = json!("SelfSubjectReview");
        review["status"] = json!({"userInfo": {
            "username": "fake-apiserver:admin",
            "groups": ["system:masters", "system:authenticated"],
        }});
    }
    review["metadata"]["creationTimestamp"] = Value::Null;
    Some(Ok(review))
}
