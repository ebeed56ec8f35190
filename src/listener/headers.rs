//! Request headers whose value is a comma-separated list, shared by the daemon's HTTP servers.

use axum::http::HeaderMap;

/// The entries of every `name` header of the request, in order: each value split at its
/// commas, trimmed, empty entries dropped (a header that is not text is skipped).
pub fn header_list(headers: &HeaderMap, name: &str) -> Vec<String> {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect()
}
