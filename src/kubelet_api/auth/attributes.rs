//! The kubelet's mapping of a request to authorization attributes (pure): resource `nodes`,
//! name = this node, verb from the HTTP method, and the subresources tried in order. With the
//! kubelet's fine-grained authorization (on by default since Kubernetes 1.33), `/pods` and
//! `/healthz` first try their own subresource, then `proxy`; `/stats` → `stats`, `/metrics` →
//! `metrics`, `/logs` → `log`; everything else — `/containerLogs`, `/exec`, `/attach`,
//! `/portForward`, `/run` — is `proxy`.
//!
//! One deliberate difference from the kubelet's table: `/exec`, `/attach`, `/portForward` and
//! `/run` are always `create`, whatever the method. A WebSocket upgrade is a GET, so the plain
//! table lets a token with only `get nodes/proxy` — what monitoring is handed — run commands
//! in every guest (kubernetes/kubernetes#136550; the apiserver closed the same hole for
//! `pods/exec` with `AuthorizePodWebsocketUpgradeCreatePermission`). The apiserver itself holds
//! `create` (system:kubelet-api-admin), so kubectl is unaffected.

use axum::http::Method;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attributes {
    pub verb: &'static str,
    pub resource: &'static str,
    pub name: String,
    /// Tried in order; the first allowed one admits the request.
    pub subresources: Vec<&'static str>,
}

/// The API verb of an HTTP method (the kubelet's table; HEAD reads like GET).
pub fn verb(method: &Method) -> &'static str {
    match *method {
        Method::GET | Method::HEAD => "get",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "",
    }
}

/// The endpoints that run something in a guest or open a connection into it.
const STARTS_SOMETHING: [&str; 4] = ["/exec", "/attach", "/portForward", "/run"];

/// Whether `path` is `prefix` or below it (`/stats` matches `/stats` and `/stats/summary`,
/// not `/statsfoo`).
fn is_subpath(path: &str, prefix: &str) -> bool {
    let prefix = prefix.trim_end_matches('/');
    path == prefix || (path.starts_with(prefix) && path.as_bytes().get(prefix.len()) == Some(&b'/'))
}

pub fn for_request(method: &Method, path: &str, node_name: &str) -> Attributes {
    let subresources = if is_subpath(path, "/pods") {
        vec!["pods", "proxy"]
    } else if is_subpath(path, "/healthz") {
        vec!["healthz", "proxy"]
    } else if is_subpath(path, "/configz") {
        vec!["configz", "proxy"]
    } else if is_subpath(path, "/stats") {
        vec!["stats"]
    } else if is_subpath(path, "/metrics") {
        vec!["metrics"]
    } else if is_subpath(path, "/logs") {
        vec!["log"]
    } else if is_subpath(path, "/checkpoint") {
        vec!["checkpoint"]
    } else {
        vec!["proxy"]
    };
    let verb = if STARTS_SOMETHING.iter().any(|p| is_subpath(path, p)) {
        "create"
    } else {
        verb(method)
    };
    Attributes {
        verb,
        resource: "nodes",
        name: node_name.to_string(),
        subresources,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kubelets_table() {
        let cases: &[(&str, &str, &str, &[&str])] = &[
            ("GET", "/stats/summary", "get", &["stats"]),
            ("GET", "/stats", "get", &["stats"]),
            ("GET", "/metrics/resource", "get", &["metrics"]),
            ("GET", "/metrics", "get", &["metrics"]),
            ("GET", "/containerLogs/ns/pod/c", "get", &["proxy"]),
            ("GET", "/logs/messages", "get", &["log"]),
            ("GET", "/pods", "get", &["pods", "proxy"]),
            ("GET", "/healthz", "get", &["healthz", "proxy"]),
            ("POST", "/exec/ns/pod/c", "create", &["proxy"]),
            ("GET", "/exec/ns/pod/c", "create", &["proxy"]),
            ("GET", "/attach/ns/pod/c", "create", &["proxy"]),
            ("GET", "/portForward/ns/pod", "create", &["proxy"]),
            ("POST", "/portForward/ns/pod", "create", &["proxy"]),
            ("GET", "/run/ns/pod/c", "create", &["proxy"]),
            ("GET", "/execfoo", "get", &["proxy"]),
            ("GET", "/statsfoo", "get", &["proxy"]),
            ("GET", "/", "get", &["proxy"]),
            ("PUT", "/x", "update", &["proxy"]),
            ("PATCH", "/x", "patch", &["proxy"]),
            ("DELETE", "/x", "delete", &["proxy"]),
            ("HEAD", "/healthz", "get", &["healthz", "proxy"]),
        ];
        for (method, path, verb, subs) in cases {
            let a = for_request(&method.parse().unwrap(), path, "node-a");
            assert_eq!(a.verb, *verb, "{method} {path}");
            assert_eq!(a.subresources, *subs, "{method} {path}");
            assert_eq!((a.resource, a.name.as_str()), ("nodes", "node-a"));
        }
    }
}
