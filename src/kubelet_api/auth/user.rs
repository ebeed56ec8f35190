//! Who made a request.

use std::collections::BTreeMap;

/// An authenticated identity (a client certificate's subject, or a TokenReview's user).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct UserInfo {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

/// Every authenticated identity is in this group (the kubelet adds it to certificate users).
pub const AUTHENTICATED: &str = "system:authenticated";

impl UserInfo {
    /// The identity of a verified client certificate: CN is the user, each O a group.
    pub fn from_certificate(common_name: &str, organizations: &[String]) -> Self {
        let mut groups: Vec<String> = organizations.to_vec();
        if !groups.iter().any(|g| g == AUTHENTICATED) {
            groups.push(AUTHENTICATED.into());
        }
        Self {
            name: common_name.to_string(),
            groups,
            ..Default::default()
        }
    }
}
