//! PersistentVolumes the tenant created itself (static provisioning), copied to the host.
//!
//! A tenant volume `v` is the host volume `<key>-<v>` ([`naming::host_cluster_name`]: volumes
//! are cluster-scoped, so the key keeps tenants apart; long names are hash-shortened). Its
//! source, capacity, modes, class and reclaim policy are copied. A `claimRef` names a tenant
//! claim: on the host it names the host claim (host namespace, same name), without the tenant
//! claim's UID, so the host binder pre-binds the pair and fills in the host claim's UID and
//! resource version, which later applies keep. Tenant claims that name such a volume get the host volume's name
//! (`pvcs::to_host`).
//!
//! A tenant volume goes down only once it has a `claimRef` (the tenant's binder bound it, or the
//! tenant pre-bound it): on the host, an unclaimed volume is free for any claim the host binder
//! matches it with, another tenant's among them, and the tenant's binder, not the host's, decides
//! which of its claims a tenant volume serves. For the same reason a claim, once on the host,
//! is never taken away from a host volume by the syncer.
//!
//! Volumes the syncer mirrors up from the host (`pvcs::MIRROR_LABEL`) are the host's own and
//! never go down. Up: the host's `Bound`, `Released` and `Failed` phases are copied to the
//! tenant volume; `Pending`/`Available` are left to the tenant's binder, which owns them there.
//!
//! The host takes the volume source as the tenant wrote it: which sources a tenant may use
//! (hostPath!) is the host's admission policy to decide, not the syncer's.

use crate::kinds::pvcs::translate::MIRROR_LABEL;
use crate::tenant::Ctx;
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::ResourceExt;
use kube::api::ObjectMeta;
use vcp_core::naming::{self, TenantRef};

/// Annotation the tenant's binder sets on volumes it bound; the host binder keeps its own.
const BOUND_BY_CONTROLLER: &str = "pv.kubernetes.io/bound-by-controller";

/// Whether a tenant volume goes down (it is not a mirror of a host volume).
pub fn synced(pv: &PersistentVolume) -> bool {
    pv.labels().get(MIRROR_LABEL).map(String::as_str) != Some("true")
}

/// The host volume for tenant volume `pv`; `current` is the host volume as it is now (its
/// claim UID, set by the host binder, is kept).
pub fn to_host(
    pv: &PersistentVolume,
    ctx: &Ctx,
    current: Option<&PersistentVolume>,
) -> PersistentVolume {
    let r = TenantRef {
        namespace: None,
        name: pv.name_any(),
        uid: pv.uid(),
    };
    let (marker_labels, marker_annotations) = naming::markers(&ctx.key, &r);
    let mut labels = naming::map_to_host(pv.labels());
    labels.extend(marker_labels);
    let mut annotations = naming::map_to_host(pv.annotations());
    annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
    annotations.remove(BOUND_BY_CONTROLLER);
    annotations.extend(marker_annotations);
    let mut spec = pv.spec.clone().unwrap_or_default();
    if let Some(c) = &mut spec.claim_ref {
        c.namespace = c
            .namespace
            .as_ref()
            .map(|ns| naming::host_namespace(&ctx.key, ns));
        // What the host binder filled in for this claim stays: `claimRef` is one atomic field,
        // so leaving these out would take them away on every apply and fight the binder.
        let held = current
            .and_then(|h| h.spec.as_ref()?.claim_ref.as_ref())
            .filter(|h| h.namespace == c.namespace && h.name == c.name);
        c.uid = held.and_then(|h| h.uid.clone());
        c.resource_version = held.and_then(|h| h.resource_version.clone());
    } else {
        // A host volume without a claim could be bound by any host claim, another tenant's
        // included: it goes down only once claimed (`kinds::volumes`), and if the tenant
        // unclaims it later, the host volume keeps the claim it had, so it stays reserved.
        spec.claim_ref = current.and_then(|h| h.spec.as_ref()?.claim_ref.clone());
    }
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some(naming::host_cluster_name(&ctx.key, &pv.name_any())),
            labels: Some(labels),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    }
}

/// The phase the tenant volume should show, if the host's says more than the tenant binder.
pub fn phase_to_tenant(host: &PersistentVolume, tenant: &PersistentVolume) -> Option<String> {
    let phase = |v: &PersistentVolume| v.status.as_ref()?.phase.clone();
    let h = phase(host)?;
    (matches!(h.as_str(), "Bound" | "Released" | "Failed") && phase(tenant) != Some(h.clone()))
        .then_some(h)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tenant::fixtures::ctx;
    use vcp_core::naming::{ANN_NAME, LABEL_TENANT};

    fn pv(name: &str) -> PersistentVolume {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "uid": "v1",
                "annotations": {BOUND_BY_CONTROLLER: "yes"}},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                "storageClassName": "manual", "hostPath": {"path": "/srv/data"},
                "claimRef": {"kind": "PersistentVolumeClaim", "namespace": "apps", "name": "data",
                    "uid": "tenant-claim", "resourceVersion": "7"}},
            "status": {"phase": "Bound"},
        }))
        .unwrap()
    }

    #[test]
    fn a_tenant_volume_is_prefixed_marked_and_prebound_to_the_host_claim() {
        let host = to_host(&pv("fast"), &ctx(), None);
        assert_eq!(host.metadata.name.as_deref(), Some("demo-fast"));
        assert_eq!(host.metadata.labels.as_ref().unwrap()[LABEL_TENANT], "demo");
        let ann = host.metadata.annotations.as_ref().unwrap();
        assert_eq!(ann[ANN_NAME], "fast");
        assert!(!ann.contains_key(BOUND_BY_CONTROLLER));
        let spec = host.spec.as_ref().unwrap();
        assert_eq!(spec.storage_class_name.as_deref(), Some("manual"));
        let c = spec.claim_ref.as_ref().unwrap();
        assert_eq!(
            (c.namespace.as_deref(), c.name.as_deref()),
            (Some("demo-apps"), Some("data"))
        );
        assert!(c.uid.is_none() && c.resource_version.is_none());
        assert!(host.status.is_none());
    }

    #[test]
    fn the_host_binders_claim_uid_survives_updates() {
        let mut bound = to_host(&pv("fast"), &ctx(), None);
        let held = bound.spec.as_mut().unwrap().claim_ref.as_mut().unwrap();
        held.uid = Some("host-claim".into());
        held.resource_version = Some("42".into());
        let again = to_host(&pv("fast"), &ctx(), Some(&bound));
        let c = again.spec.unwrap().claim_ref.unwrap();
        assert_eq!(c.uid.as_deref(), Some("host-claim"));
        assert_eq!(c.resource_version.as_deref(), Some("42"));
        let mut other = pv("fast");
        other
            .spec
            .as_mut()
            .unwrap()
            .claim_ref
            .as_mut()
            .unwrap()
            .name = Some("other".into());
        let rebound = to_host(&other, &ctx(), Some(&bound));
        assert!(rebound.spec.unwrap().claim_ref.unwrap().uid.is_none());
    }

    #[test]
    fn an_unclaimed_tenant_volume_keeps_the_host_volume_reserved_for_its_last_claim() {
        let bound = to_host(&pv("fast"), &ctx(), None);
        let mut unclaimed = pv("fast");
        unclaimed.spec.as_mut().unwrap().claim_ref = None;
        let again = to_host(&unclaimed, &ctx(), Some(&bound));
        let c = again.spec.unwrap().claim_ref.unwrap();
        assert_eq!(
            (c.namespace.as_deref(), c.name.as_deref()),
            (Some("demo-apps"), Some("data"))
        );
        assert!(
            to_host(&unclaimed, &ctx(), None)
                .spec
                .unwrap()
                .claim_ref
                .is_none()
        );
    }

    #[test]
    fn long_volume_names_are_shortened_and_mirrors_stay_in_the_tenant() {
        let long = "v".repeat(253);
        let host = to_host(&pv(&long), &ctx(), None);
        assert_eq!(host.metadata.name.unwrap().len(), naming::MAX_SUBDOMAIN);
        let mut mirror = pv("pvc-1");
        mirror.metadata.labels = Some([(MIRROR_LABEL.to_owned(), "true".to_owned())].into());
        assert!(!synced(&mirror) && synced(&pv("fast")));
    }

    #[test]
    fn only_phases_the_tenant_binder_cannot_know_flow_up() {
        let mut host = to_host(&pv("fast"), &ctx(), None);
        let mut tenant = pv("fast");
        tenant.status = None;
        assert_eq!(phase_to_tenant(&host, &tenant), None, "no host status yet");
        for (h, up) in [
            ("Available", None),
            ("Bound", Some("Bound")),
            ("Failed", Some("Failed")),
        ] {
            host.status = Some(k8s_openapi::api::core::v1::PersistentVolumeStatus {
                phase: Some(h.into()),
                ..Default::default()
            });
            assert_eq!(phase_to_tenant(&host, &tenant).as_deref(), up, "{h}");
        }
        tenant.status = host.status.clone();
        assert_eq!(phase_to_tenant(&host, &tenant), None);
    }
}
