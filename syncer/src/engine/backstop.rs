//! The quota backstop on the host: a ResourceQuota with the tenant's totals and a LimitRange
//! with the plan's container defaults in every host namespace of the tenant, built from the
//! plan alone (pure); [`super::quota::apply_backstop`] writes them.

use crate::tenant::Ctx;
use k8s_openapi::api::core::v1::{
    LimitRange, LimitRangeItem, LimitRangeSpec, ResourceQuota, ResourceQuotaSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::ObjectMeta;
use std::collections::BTreeMap;
use vcp_core::naming;

/// Name of the host ResourceQuota in every host namespace of a tenant.
pub const QUOTA_NAME: &str = "vcp-quota";
/// Name of the host LimitRange in every host namespace of a tenant.
pub const LIMITS_NAME: &str = "vcp-limits";

/// The host ResourceQuota and LimitRange of host namespace `host_ns`. The syncer enforces the
/// tenant-wide quota itself (`policy::quota`); these hold if it were bypassed: no single host
/// namespace can exceed the tenant's totals, and a container created there without resources
/// still gets the plan's defaults (so the quota on requests and limits can count it). Labelled
/// with the tenant (cleanup selects them) and marked generated, so no tenant object adopts them.
pub fn backstop(host_ns: &str, ctx: &Ctx) -> (ResourceQuota, LimitRange) {
    let meta = |name: &str| ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some(host_ns.to_owned()),
        labels: Some(BTreeMap::from([(
            naming::LABEL_TENANT.to_owned(),
            ctx.key.to_string(),
        )])),
        annotations: Some(BTreeMap::from([(
            naming::ANN_GENERATED.to_owned(),
            format!("namespace/{host_ns}"),
        )])),
        ..Default::default()
    };
    let q = &ctx.policy.quota;
    let mut hard = BTreeMap::new();
    let mut put = |k: &str, v: Option<String>| {
        if let Some(v) = v {
            hard.insert(k.to_owned(), Quantity(v));
        }
    };
    let text = |q: &Option<vcp_policy::quota::Quantity>| q.as_ref().map(|q| q.0.clone());
    put("pods", q.pods.map(|n| n.to_string()));
    put("requests.cpu", text(&q.requests_cpu));
    put("requests.memory", text(&q.requests_memory));
    put("limits.cpu", text(&q.limits_cpu));
    put("limits.memory", text(&q.limits_memory));
    put("services", q.services.map(|n| n.to_string()));
    put(
        "persistentvolumeclaims",
        q.persistent_volume_claims.map(|n| n.to_string()),
    );
    put("requests.storage", text(&q.requests_storage));
    let quota = ResourceQuota {
        metadata: meta(QUOTA_NAME),
        spec: Some(ResourceQuotaSpec {
            hard: Some(hard),
            ..Default::default()
        }),
        ..Default::default()
    };
    let pair = |r: &vcp_policy::quota::Resources| {
        BTreeMap::from([
            ("cpu".to_owned(), Quantity(r.cpu.0.clone())),
            ("memory".to_owned(), Quantity(r.memory.0.clone())),
        ])
    };
    let limits = LimitRange {
        metadata: meta(LIMITS_NAME),
        spec: Some(LimitRangeSpec {
            limits: vec![LimitRangeItem {
                type_: "Container".into(),
                default_request: q.limits.default_request.as_ref().map(pair),
                // No default limit in a plan that has none: such containers run unlimited.
                default: q.limits.default_limit.as_ref().map(pair),
                ..Default::default()
            }],
        }),
    };
    (quota, limits)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tenant::fixtures::ctx;
    use vcp_core::naming::LABEL_TENANT;

    #[test]
    fn every_host_namespace_gets_the_tenant_totals_and_the_container_defaults() {
        let mut ctx = ctx();
        ctx.policy = std::sync::Arc::new(
            vcp_policy::TenantPolicy::from_yaml("quota: {pods: 3, requests_cpu: '1'}").unwrap(),
        );
        let (q, l) = backstop("demo-apps", &ctx);
        assert_eq!(q.metadata.name.as_deref(), Some(QUOTA_NAME));
        assert_eq!(q.metadata.namespace.as_deref(), Some("demo-apps"));
        assert_eq!(q.metadata.labels.as_ref().unwrap()[LABEL_TENANT], "demo");
        assert!(
            q.metadata
                .annotations
                .as_ref()
                .unwrap()
                .contains_key(naming::ANN_GENERATED)
        );
        let hard = q.spec.unwrap().hard.unwrap();
        assert_eq!(hard.len(), 2, "unlisted resources are unlimited: {hard:?}");
        assert_eq!(hard["pods"].0, "3");
        assert_eq!(hard["requests.cpu"].0, "1");
        let item = &l.spec.unwrap().limits[0];
        assert_eq!(item.type_, "Container");
        assert_eq!(item.default_request.as_ref().unwrap()["cpu"].0, "100m");
        assert_eq!(item.default.as_ref().unwrap()["memory"].0, "512Mi");
        let (q, _) = backstop("demo-apps", &crate::tenant::fixtures::ctx());
        assert_eq!(
            q.spec.unwrap().hard.unwrap().len(),
            8,
            "the default quota is finite"
        );
    }
}
