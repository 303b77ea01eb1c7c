//! Namespaces: each tenant namespace has a host namespace `<key>-<ns>`, labelled with the
//! tenant so cleanup can select everything of a tenant.

use super::{Ctx, host_meta};
use k8s_openapi::api::core::v1::Namespace;

/// The host namespace for a tenant namespace.
pub fn to_host(ns: &Namespace, ctx: &Ctx) -> Namespace {
    let mut meta = host_meta(ns, ctx);
    meta.name = Some(crate::naming::host_namespace(
        &ctx.key,
        &kube::ResourceExt::name_any(ns),
    ));
    Namespace {
        metadata: meta,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::naming::{ANN_NAME, LABEL_TENANT};
    use crate::resources::fixtures::ctx;

    #[test]
    fn a_tenant_namespace_maps_to_a_prefixed_labelled_host_namespace() {
        let ns: Namespace = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "apps", "uid": "u1", "labels": {"team": "a"}, "finalizers": ["x"]},
        }))
        .unwrap();
        let host = to_host(&ns, &ctx());
        assert_eq!(host.metadata.name.as_deref(), Some("demo-apps"));
        let labels = host.metadata.labels.unwrap();
        assert_eq!(labels[LABEL_TENANT], "demo");
        assert_eq!(labels["team"], "a");
        assert_eq!(host.metadata.annotations.unwrap()[ANN_NAME], "apps");
        assert!(host.metadata.finalizers.is_none());
    }
}
