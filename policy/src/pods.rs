//! Whether a tenant pod may reach the host, and the fields that must be seen from the
//! tenant's side (pure).
//!
//! [`admit`] gathers every refusal: the plan's Pod Security level
//! ([`super::pod_security`]), its runtime class (by name, or by the handler of the tenant's
//! class: [`placement::runtime_class`]), and the StorageClasses of ephemeral volume claims. A
//! refused pod never reaches the host. (Projected credentials go down translated, never as the
//! host's: `clusterTrustBundle` sources are filled from the tenant's own bundles, and
//! `podCertificate` sources name a signer of vcp's own that only the tenant's signers answer,
//! through the syncer.)
//!
//! [`downward_to_tenant_view`] rewrites downward-API references whose host value differs from
//! the tenant's: the pod's namespace and UID (the host's are `<key>-<ns>` and another UID)
//! and its service account (the host pod has none) read the markers the syncer puts on the
//! host pod instead; labels and annotations by key are read under their host keys.

use super::{Refusal, TenantPolicy, placement, pod_security, volumes};
use k8s_openapi::api::core::v1::{ObjectFieldSelector, Pod, PodSpec};
use vcp_core::naming;

/// Annotation on host pods: the tenant pod's service account (downward API reads it there).
pub const ANN_SERVICE_ACCOUNT: &str = "vcp.dev/tenant-service-account";

/// Every reason `pod` may not reach the host under `policy` (empty: admitted).
/// `runtime_handler`: the handler of the pod's RuntimeClass in the tenant, if it names one
/// (see [`placement::runtime_class`]).
pub fn admit(pod: &Pod, policy: &TenantPolicy, runtime_handler: Option<&str>) -> Vec<Refusal> {
    let mut out = pod_security::check(pod, policy.pod_security);
    let Some(spec) = &pod.spec else { return out };
    out.extend(placement::runtime_class(spec, runtime_handler, &policy.scheduling).err());
    for (i, v) in spec.volumes.iter().flatten().enumerate() {
        let template = v
            .ephemeral
            .as_ref()
            .and_then(|e| e.volume_claim_template.as_ref());
        if let Some(t) = template {
            let field = format!("spec.volumes[{i}].ephemeral.volumeClaimTemplate.spec");
            out.extend(volumes::check_claim(&t.spec, policy, &field));
        }
    }
    out
}

/// The host field a downward-API `fieldPath` must read so the workload sees its tenant value.
fn field_path_to_host(path: &str) -> Option<String> {
    let annotation = |k: &str| format!("metadata.annotations['{k}']");
    match path {
        "metadata.namespace" => Some(annotation(naming::ANN_NAMESPACE)),
        "metadata.uid" => Some(annotation(naming::ANN_UID)),
        "spec.serviceAccountName" => Some(annotation(ANN_SERVICE_ACCOUNT)),
        _ => {
            for kind in ["labels", "annotations"] {
                let prefix = format!("metadata.{kind}['");
                if let Some(k) = path
                    .strip_prefix(&prefix)
                    .and_then(|r| r.strip_suffix("']"))
                {
                    let host = naming::key_to_host(k);
                    return (host != k).then(|| format!("metadata.{kind}['{host}']"));
                }
            }
            None
        }
    }
}

fn rewrite(sel: &mut ObjectFieldSelector) {
    if let Some(p) = field_path_to_host(&sel.field_path) {
        sel.field_path = p;
    }
}

/// Points downward-API references (env and volumes) at host fields holding the tenant's values.
pub fn downward_to_tenant_view(spec: &mut PodSpec) {
    let containers = spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten());
    for c in containers {
        for e in c.env.iter_mut().flatten() {
            if let Some(f) = e.value_from.as_mut().and_then(|v| v.field_ref.as_mut()) {
                rewrite(f);
            }
        }
    }
    for c in spec.ephemeral_containers.iter_mut().flatten() {
        for e in c.env.iter_mut().flatten() {
            if let Some(f) = e.value_from.as_mut().and_then(|v| v.field_ref.as_mut()) {
                rewrite(f);
            }
        }
    }
    for v in spec.volumes.iter_mut().flatten() {
        let plain = v
            .downward_api
            .iter_mut()
            .flat_map(|d| d.items.iter_mut().flatten());
        let projected = v
            .projected
            .iter_mut()
            .flat_map(|p| p.sources.iter_mut().flatten())
            .flat_map(|s| {
                s.downward_api
                    .iter_mut()
                    .flat_map(|d| d.items.iter_mut().flatten())
            });
        for item in plain.chain(projected) {
            if let Some(f) = &mut item.field_ref {
                rewrite(f);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(
            serde_json::json!({"metadata": {"name": "p", "namespace": "apps"}, "spec": spec}),
        )
        .unwrap()
    }

    #[test]
    fn projected_credentials_are_not_refused_they_go_down_translated() {
        let p = pod(serde_json::json!({
            "containers": [{"name": "c", "image": "i"}],
            "volumes": [{"name": "creds", "projected": {"sources": [
                {"configMap": {"name": "x"}},
                {"podCertificate": {"signerName": "example.com/s", "keyType": "ED25519", "credentialBundlePath": "b"}},
                {"clusterTrustBundle": {"signerName": "example.com/s", "path": "t"}},
            ]}}],
        }));
        assert!(admit(&p, &TenantPolicy::default(), None).is_empty());
    }

    #[test]
    fn runtime_classes_and_ephemeral_claim_classes_follow_the_plan() {
        let policy = TenantPolicy::from_yaml("volumes: {storage_classes: [standard]}").unwrap();
        let p = pod(serde_json::json!({
            "containers": [{"name": "c", "image": "i"}],
            "runtimeClassName": "kata",
            "volumes": [{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {
                "storageClassName": "fast", "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}}}}}}],
        }));
        let rules: Vec<String> = admit(&p, &policy, Some("kata"))
            .into_iter()
            .map(|r| r.rule)
            .collect();
        assert_eq!(rules, ["plan: runtime classes", "plan: storage classes"]);
    }

    #[test]
    fn downward_api_reads_the_tenant_values() {
        let mut s: PodSpec = serde_json::from_value(serde_json::json!({
            "containers": [{"name": "c", "image": "i", "env": [
                {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                {"name": "UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
                {"name": "SA", "valueFrom": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}},
                {"name": "NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "OWN", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['vcp.dev/team']"}}},
                {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
            ]}],
            "volumes": [
                {"name": "info", "downwardAPI": {"items": [{"path": "ns", "fieldRef": {"fieldPath": "metadata.namespace"}}]}},
                {"name": "proj", "projected": {"sources": [{"downwardAPI": {"items": [{"path": "uid", "fieldRef": {"fieldPath": "metadata.uid"}}]}}]}},
            ],
        }))
        .unwrap();
        downward_to_tenant_view(&mut s);
        let paths: Vec<String> = s.containers[0]
            .env
            .clone()
            .unwrap()
            .into_iter()
            .map(|e| e.value_from.unwrap().field_ref.unwrap().field_path)
            .collect();
        assert_eq!(
            paths,
            [
                "metadata.annotations['vcp.dev/tenant-namespace']",
                "metadata.annotations['vcp.dev/tenant-uid']",
                "metadata.annotations['vcp.dev/tenant-service-account']",
                "metadata.name",
                "metadata.labels['t.vcp.dev/team']",
                "metadata.labels['app']",
            ]
        );
        let vols = s.volumes.unwrap();
        assert_eq!(
            vols[0]
                .downward_api
                .as_ref()
                .unwrap()
                .items
                .as_ref()
                .unwrap()[0]
                .field_ref
                .as_ref()
                .unwrap()
                .field_path,
            "metadata.annotations['vcp.dev/tenant-namespace']"
        );
        let proj = &vols[1]
            .projected
            .as_ref()
            .unwrap()
            .sources
            .as_ref()
            .unwrap()[0];
        assert_eq!(
            proj.downward_api.as_ref().unwrap().items.as_ref().unwrap()[0]
                .field_ref
                .as_ref()
                .unwrap()
                .field_path,
            "metadata.annotations['vcp.dev/tenant-uid']"
        );
    }
}
