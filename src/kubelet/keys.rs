//! The two keys every per-pod table uses: the pod's `namespace/name` and its incarnation (uid).
//! Both are cheap to clone (a shared `str`) and borrow as `&str`, so a table keyed by them is
//! looked up with the plain text a caller has. Neither derefs to `str`: a key is not text to
//! slice or search, so the text is taken explicitly (`as_str`), where a signature still asks
//! for a `&str`.

use std::borrow::Borrow;
use std::fmt;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

macro_rules! shared_str_key {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
        pub struct $name(Arc<str>);

        impl $name {
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                Self(Arc::from(s))
            }
        }

        impl From<String> for $name {
            fn from(s: String) -> Self {
                Self(Arc::from(s))
            }
        }

        impl From<&String> for $name {
            fn from(s: &String) -> Self {
                Self(Arc::from(s.as_str()))
            }
        }

        impl From<&$name> for $name {
            fn from(k: &$name) -> Self {
                k.clone()
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                &*self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                &*self.0 == *other
            }
        }

        impl PartialEq<String> for $name {
            fn eq(&self, other: &String) -> bool {
                &*self.0 == other.as_str()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&*self.0, f)
            }
        }
    };
}

shared_str_key!(
    /// `namespace/name` of a pod: the key of every per-pod record.
    PodKey
);

shared_str_key!(
    /// One incarnation of a pod (`metadata.uid`; "" when the object carries none).
    Uid
);

impl PodKey {
    /// The key of a pod object.
    pub fn of(pod: &Pod) -> Self {
        Self::from(format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any()))
    }

    /// `(namespace, name)`.
    pub fn split(&self) -> (&str, &str) {
        self.0.split_once('/').unwrap_or(("", &self.0))
    }
}

impl Uid {
    /// The incarnation of a pod object.
    pub fn of(pod: &Pod) -> Self {
        Self::from(pod.metadata.uid.as_deref().unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn keys_borrow_as_text_and_split() {
        let mut pod = Pod::default();
        pod.metadata.namespace = Some("ns".into());
        pod.metadata.name = Some("p".into());
        pod.metadata.uid = Some("u1".into());
        let key = PodKey::of(&pod);
        assert_eq!(key, "ns/p");
        assert_eq!(key.split(), ("ns", "p"));
        assert_eq!(Uid::of(&pod), "u1");
        let map = HashMap::from([(key.clone(), 1)]);
        assert_eq!(map.get("ns/p"), Some(&1), "a map keyed by PodKey is read with &str");
        assert_eq!(Uid::of(&Pod::default()), "");
    }
}
