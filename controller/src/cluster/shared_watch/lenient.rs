//! An object as the API server sent it, decoded or not. A typed watch fails its whole list on one
//! object that does not decode (a value a newer release wrote before a rollback, an object written
//! where no schema checks it): every reader of the kind would go blind for one bad object. The
//! shared watches read [`Lenient`] objects instead, pass the decoded ones on and report the others
//! (a warning naming the object and why, the `watch_objects_undecodable_total{kind}` counter).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::Deserialize;
use serde::de::{DeserializeOwned, Deserializer, Error as _};
use std::borrow::Cow;
use std::sync::Arc;

/// An object of kind `K`: decoded, or only its metadata and why the rest did not decode.
#[derive(Clone, Debug)]
pub enum Lenient<K> {
    Decoded(K),
    Undecodable {
        metadata: Box<ObjectMeta>,
        error: Arc<str>,
    },
}

impl<K: Resource> Resource for Lenient<K> {
    type DynamicType = K::DynamicType;
    type Scope = K::Scope;

    fn kind(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::kind(dt)
    }

    fn group(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::group(dt)
    }

    fn version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::version(dt)
    }

    fn api_version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::api_version(dt)
    }

    fn plural(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        match self {
            Lenient::Decoded(object) => object.meta(),
            Lenient::Undecodable { metadata, .. } => metadata,
        }
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        match self {
            Lenient::Decoded(object) => object.meta_mut(),
            Lenient::Undecodable { metadata, .. } => metadata,
        }
    }
}

impl<'de, K: DeserializeOwned> Deserialize<'de> for Lenient<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = serde_json::Value::deserialize(deserializer)?;
        match K::deserialize(&value) {
            Ok(object) => Ok(Lenient::Decoded(object)),
            Err(error) => {
                // Without its metadata it could not even be named: the list fails, as before.
                let metadata = ObjectMeta::deserialize(value.get("metadata").unwrap_or_default())
                    .map_err(D::Error::custom)?;
                Ok(Lenient::Undecodable {
                    metadata: Box::new(metadata),
                    error: error.to_string().into(),
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use network_enforcer_api::WorkloadNetworkPolicy;

    fn policy(mode: &str) -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "networkenforcer.kubewarden.io/v1alpha1",
            "kind": "WorkloadNetworkPolicy",
            "metadata": {"name": "p", "namespace": "n", "resourceVersion": "7"},
            "spec": {"backend": "kubernetes", "direction": "Ingress", "mode": mode,
                     "targetRef": {"kind": "Deployment", "name": "w"},
                     "kubernetes": {"podSelector": {}, "policyTypes": ["Ingress"]}}
        })
    }

    #[test]
    fn an_object_decodes_or_keeps_its_name_and_why_not() {
        let good: Lenient<WorkloadNetworkPolicy> =
            serde_json::from_value(policy("monitor")).unwrap();
        assert!(matches!(good, Lenient::Decoded(_)));
        assert_eq!(good.meta().resource_version.as_deref(), Some("7"));
        // A mode a newer release might write.
        let bad: Lenient<WorkloadNetworkPolicy> =
            serde_json::from_value(policy("enforce-later")).unwrap();
        let Lenient::Undecodable { metadata, error } = &bad else {
            panic!("decoded: {bad:?}");
        };
        assert_eq!(
            (metadata.namespace.as_deref(), metadata.name.as_deref()),
            (Some("n"), Some("p"))
        );
        assert!(error.contains("enforce-later"), "{error}");
        // Without metadata it is not an object at all.
        assert!(
            serde_json::from_value::<Lenient<WorkloadNetworkPolicy>>(
                serde_json::json!({"spec": 1})
            )
            .is_err()
        );
    }
}
