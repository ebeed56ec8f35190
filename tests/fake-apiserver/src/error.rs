//! API errors rendered as the `meta/v1 Status` bodies the real apiserver sends.

use serde_json::{Value, json};

/// A failed API request, carrying what the real apiserver would answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status code (404, 409, 410, 422, ...).
    pub code: u16,
    /// The `reason` field (`NotFound`, `Conflict`, `AlreadyExists`, `Expired`, ...).
    pub reason: &'static str,
    /// Human-readable message, worded like the apiserver's.
    pub message: String,
    /// `details.name`, when the error is about one object.
    pub name: Option<String>,
    /// `details.kind` (the resource plural, as the apiserver reports it).
    pub kind: Option<String>,
    /// `details.group`.
    pub group: Option<String>,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: String) -> Self {
        Self {
            code,
            reason,
            message,
            name: None,
            kind: None,
            group: None,
        }
    }

    fn about(mut self, group: &str, plural: &str, name: &str) -> Self {
        self.name = Some(name.to_string());
        self.kind = Some(plural.to_string());
        if !group.is_empty() {
            self.group = Some(group.to_string());
        }
        self
    }

    /// `pods "x" not found`.
    pub fn not_found(group: &str, plural: &str, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", qualified(group, plural)),
        )
        .about(group, plural, name)
    }

    /// The path names no resource this server serves.
    pub fn no_such_resource() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource".into(),
        )
    }

    /// `pods "x" already exists`.
    pub fn already_exists(group: &str, plural: &str, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", qualified(group, plural)),
        )
        .about(group, plural, name)
    }

    /// The optimistic-lock conflict of an update with a stale `metadata.resourceVersion`.
    pub fn stale_resource_version(group: &str, plural: &str, name: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
                qualified(group, plural)
            ),
        )
        .about(group, plural, name)
    }

    /// A failed `uid` / `resourceVersion` precondition of a delete (409, worded as the apiserver
    /// does: `the UID in the precondition (a) does not match the UID in record (b). …`).
    pub fn precondition_failed(group: &str, plural: &str, kind: &str, name: &str, detail: String) -> Self {
        Self::new(
            409,
            "Conflict",
            format!("Operation cannot be fulfilled on {kind} \"{name}\": {detail}"),
        )
        .about(group, plural, name)
    }

    /// A write whose body names another `metadata.uid` (the uid-as-precondition idiom): the
    /// apiserver rejects the immutable field with 422 Invalid, not 409.
    pub fn immutable_uid(group: &str, plural: &str, kind: &str, name: &str, uid: &str) -> Self {
        Self::invalid(
            group,
            plural,
            name,
            format!("{kind} \"{name}\" is invalid: metadata.uid: Invalid value: \"{uid}\": field is immutable"),
        )
    }

    /// 410 Gone for a watch from a resourceVersion older than the retained history.
    pub fn expired(requested: u64, oldest: u64) -> Self {
        Self::new(
            410,
            "Expired",
            format!("too old resource version: {requested} ({oldest})"),
        )
    }

    /// 400 Bad Request.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message.into())
    }

    /// 422 Unprocessable Entity.
    pub fn invalid(group: &str, plural: &str, name: &str, message: impl Into<String>) -> Self {
        Self::new(422, "Invalid", message.into()).about(group, plural, name)
    }

    /// 405 Method Not Allowed.
    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message.into())
    }

    /// 415 Unsupported Media Type.
    pub fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json (got {content_type:?})"
            ),
        )
    }

    /// An injected fault with an arbitrary code.
    pub fn injected(code: u16) -> Self {
        let reason = match code {
            400 => "BadRequest",
            401 => "Unauthorized",
            403 => "Forbidden",
            404 => "NotFound",
            409 => "Conflict",
            410 => "Expired",
            422 => "Invalid",
            429 => "TooManyRequests",
            503 => "ServiceUnavailable",
            504 => "Timeout",
            _ => "InternalError",
        };
        Self::new(code, reason, format!("injected fault (HTTP {code})"))
    }

    /// The `meta/v1 Status` body.
    pub fn to_status(&self) -> Value {
        let mut details = serde_json::Map::new();
        if let Some(name) = &self.name {
            details.insert("name".into(), json!(name));
        }
        if let Some(group) = &self.group {
            details.insert("group".into(), json!(group));
        }
        if let Some(kind) = &self.kind {
            details.insert("kind".into(), json!(kind));
        }
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if !details.is_empty() {
            status["details"] = Value::Object(details);
        }
        status
    }
}

fn qualified(group: &str, plural: &str) -> String {
    if group.is_empty() {
        plural.to_string()
    } else {
        format!("{plural}.{group}")
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}
