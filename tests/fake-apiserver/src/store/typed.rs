//! Typed helpers for tests: reads as k8s-openapi types and seeds from them.

use super::*;

impl Store {
    /// The object as a typed value, if present.
    pub fn get_as<K: kube::Resource<DynamicType = ()> + DeserializeOwned>(
        &self,
        ns: Option<&str>,
        name: &str,
    ) -> Option<K> {
        let rt = ResourceType::of::<K>().expect("resource type served by the fake apiserver");
        self.get(rt, ns, name)
            .ok()
            .map(|v| serde_json::from_value(v).expect("stored object deserialises"))
    }

    /// Every stored object of a type.
    pub fn list_as<K: kube::Resource<DynamicType = ()> + DeserializeOwned>(&self) -> Vec<K> {
        let rt = ResourceType::of::<K>().expect("resource type served by the fake apiserver");
        self.list(rt, &Filter::default())
            .0
            .into_iter()
            .map(|v| serde_json::from_value(v).expect("stored object deserialises"))
            .collect()
    }

    /// Creates an object directly (with create semantics and a watch event); returns the stored object.
    pub fn seed<K: kube::Resource<DynamicType = ()> + serde::Serialize + DeserializeOwned>(
        &self,
        obj: &K,
    ) -> Result<K, ApiError> {
        let rt = ResourceType::of::<K>().expect("resource type served by the fake apiserver");
        let v = serde_json::to_value(obj).expect("object serialises");
        let ns = meta_str(&v, "namespace").map(str::to_string);
        let stored = self.create(rt, ns.as_deref().or(Some("default")), v)?;
        Ok(serde_json::from_value(stored).expect("stored object deserialises"))
    }
}
