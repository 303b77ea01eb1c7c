//! ConfigMaps: copied into the host namespace under the same name.

use crate::tenant::Ctx;
use k8s_openapi::api::core::v1::ConfigMap;
use vcp_core::naming::host_meta;

/// The host copy of a tenant ConfigMap.
pub fn to_host(cm: &ConfigMap, ctx: &Ctx) -> ConfigMap {
    ConfigMap {
        metadata: host_meta(&cm.metadata, &ctx.key),
        data: cm.data.clone(),
        binary_data: cm.binary_data.clone(),
        immutable: cm.immutable,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tenant::fixtures::ctx;

    #[test]
    fn data_is_copied_and_owner_references_are_not() {
        let cm: ConfigMap = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "settings", "namespace": "apps", "ownerReferences": [
                {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u"}]},
            "data": {"mode": "fast"},
        }))
        .unwrap();
        let host = to_host(&cm, &ctx());
        assert_eq!(host.metadata.namespace.as_deref(), Some("demo-apps"));
        assert_eq!(host.data.unwrap()["mode"], "fast");
        assert!(host.metadata.owner_references.is_none());
    }
}
