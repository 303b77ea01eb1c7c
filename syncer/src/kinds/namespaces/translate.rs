//! Namespaces: each tenant namespace has a host namespace `<key>-<ns>`, labelled with the
//! tenant so cleanup can select everything of a tenant, and with the plan's Pod Security
//! level, which the host's admission enforces on every pod there. Each also gets the quota
//! backstop ([`crate::engine::backstop`]): a ResourceQuota with the tenant's totals and a
//! LimitRange with the plan's container defaults.

use crate::tenant::Ctx;
use k8s_openapi::api::core::v1::Namespace;
use vcp_core::naming::host_meta;
use vcp_policy::Level;

/// Pod Security admission labels every host namespace carries: the plan's level, enforced
/// by the host on every pod (the tenant's own `pod-security.kubernetes.io` labels are stored
/// under `t.` like every host-reserved key, see [`vcp_core::naming`]).
pub fn pod_security_labels(level: Level) -> [(String, String); 4] {
    let l = level.as_str().to_owned();
    [
        ("pod-security.kubernetes.io/enforce".into(), l.clone()),
        (
            "pod-security.kubernetes.io/enforce-version".into(),
            "latest".into(),
        ),
        ("pod-security.kubernetes.io/warn".into(), l),
        (
            "pod-security.kubernetes.io/warn-version".into(),
            "latest".into(),
        ),
    ]
}

/// The host namespace for a tenant namespace.
pub fn to_host(ns: &Namespace, ctx: &Ctx) -> Namespace {
    let mut meta = host_meta(&ns.metadata, &ctx.key);
    meta.name = Some(vcp_core::naming::host_namespace(
        &ctx.key,
        &kube::ResourceExt::name_any(ns),
    ));
    meta.labels
        .get_or_insert_with(Default::default)
        .extend(pod_security_labels(ctx.policy.pod_security));
    Namespace {
        metadata: meta,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tenant::fixtures::ctx;
    use vcp_core::naming::{ANN_NAME, LABEL_TENANT};

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

    #[test]
    fn the_host_namespace_enforces_the_plan_level_and_ignores_the_tenants_labels() {
        let ns: Namespace = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "apps", "labels": {
                "pod-security.kubernetes.io/enforce": "privileged",
                "kubernetes.io/metadata.name": "apps",
            }},
        }))
        .unwrap();
        let mut ctx = ctx();
        ctx.policy = std::sync::Arc::new(
            vcp_policy::TenantPolicy::from_yaml("pod_security: restricted").unwrap(),
        );
        let labels = to_host(&ns, &ctx).metadata.labels.unwrap();
        assert_eq!(labels["pod-security.kubernetes.io/enforce"], "restricted");
        assert_eq!(
            labels["pod-security.kubernetes.io/enforce-version"],
            "latest"
        );
        assert_eq!(labels["t.pod-security.kubernetes.io/enforce"], "privileged");
        assert_eq!(labels["t.kubernetes.io/metadata.name"], "apps");
        assert!(
            !labels.contains_key("kubernetes.io/metadata.name"),
            "the host sets its own"
        );
    }
}
