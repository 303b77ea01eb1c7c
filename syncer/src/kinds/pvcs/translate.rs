//! PersistentVolumeClaims down, and the volumes that bind them mirrored up.
//!
//! Down: the claim keeps its name in the host namespace; `volumeName` and `dataSource` refer to
//! tenant objects and are dropped, a `selector` is confined to the tenant's own volumes
//! ([`claim_spec_to_host`]), so the host binds the claim to a host volume (dynamically,
//! through the host StorageClass of the same name, or the host default). A `volumeName` that
//! names a volume the tenant created itself becomes that volume's host name instead.
//!
//! Up: once the host claim is Bound to host volume `X`, the tenant gets a PersistentVolume `X`
//! ([`mirror_volume`]) pre-bound (`claimRef`) to the tenant claim; the tenant's own PV
//! controller then binds the pair, so `kubectl get pvc` shows Bound and the volume. The mirror
//! has reclaim policy Retain (there is nothing to reclaim in the tenant: the host owns the
//! data) and a synthetic source; the syncer deletes it once its claim is gone.

use crate::tenant::Ctx;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::ResourceExt;
use vcp_core::naming::host_meta;

/// Label on tenant volumes that mirror a host volume.
pub const MIRROR_LABEL: &str = "vcp.dev/mirrored-volume";

/// The host claim for a tenant claim. `host_volume` is the host name of the tenant volume the
/// claim names, if the tenant created that volume itself (`kinds::volumes`); otherwise the
/// claim binds on the host on its own.
pub fn to_host(
    pvc: &PersistentVolumeClaim,
    ctx: &Ctx,
    host_volume: Option<String>,
) -> PersistentVolumeClaim {
    let mut spec = pvc.spec.clone().unwrap_or_default();
    claim_spec_to_host(&mut spec, &ctx.key, host_volume);
    let mut metadata = host_meta(&pvc.metadata, &ctx.key);
    // The tenant's volume binder records its state in `pv.kubernetes.io/` annotations
    // (`bind-completed`, `bound-by-controller`). Copied, they tell the host's binder that a
    // claim created after the tenant bound it is bound already, and the host claim is `Lost`.
    if let Some(a) = &mut metadata.annotations {
        a.retain(|k, _| !k.starts_with(BINDER_PREFIX));
    }
    PersistentVolumeClaim {
        metadata,
        spec: Some(spec),
        status: None,
    }
}

/// Prefix of the volume binder's own annotations on claims and volumes.
pub const BINDER_PREFIX: &str = "pv.kubernetes.io/";

/// A claim spec (of a claim, or of an ephemeral volume's claim template) as the host gets it:
/// `volumeName` is `host_volume` (or unset), data sources that name tenant objects are dropped,
/// and a volume selector can match only this tenant's volumes (keys rewritten as on the host,
/// AND the tenant label), never another tenant's or the host's.
pub fn claim_spec_to_host(
    spec: &mut k8s_openapi::api::core::v1::PersistentVolumeClaimSpec,
    key: &vcp_core::naming::TenantKey,
    host_volume: Option<String>,
) {
    spec.volume_name = host_volume;
    spec.data_source = None;
    spec.data_source_ref = None;
    spec.selector = spec
        .selector
        .as_ref()
        .map(|s| vcp_policy::placement::namespace_selector_to_host(s, key));
}

/// The host volume a host claim is bound to.
pub fn bound_volume(host: &PersistentVolumeClaim) -> Option<&str> {
    let bound = host.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
    bound
        .then(|| host.spec.as_ref()?.volume_name.as_deref())
        .flatten()
}

/// The tenant mirror of host volume `host_pv`, pre-bound to `tenant_claim`.
pub fn mirror_volume(
    host_pv: &PersistentVolume,
    tenant_claim: &PersistentVolumeClaim,
) -> PersistentVolume {
    let name = host_pv.name_any();
    let hs = host_pv.spec.clone().unwrap_or_default();
    let pv = serde_json::json!({
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name, "labels": {MIRROR_LABEL: "true"}},
        "spec": {
            "capacity": hs.capacity,
            "accessModes": hs.access_modes,
            "volumeMode": hs.volume_mode,
            // The tenant PV controller binds only equal classes; an unset class is "".
            "storageClassName": tenant_claim.spec.as_ref().and_then(|s| s.storage_class_name.clone()).unwrap_or_default(),
            "persistentVolumeReclaimPolicy": "Retain",
            // Nothing mounts this in the tenant (there is no kubelet); a source is required.
            "hostPath": {"path": format!("/vcp/volumes/{name}")},
            "claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": tenant_claim.namespace(),
                "name": tenant_claim.name_any(),
                "uid": tenant_claim.uid(),
            },
        },
    });
    serde_json::from_value(pv).expect("a well-formed PersistentVolume")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tenant_binders_annotations_stay_in_the_tenant() {
        let pvc: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "data", "namespace": "apps", "annotations": {
                "pv.kubernetes.io/bind-completed": "yes",
                "pv.kubernetes.io/bound-by-controller": "yes",
                "team": "a",
            }},
            "spec": {"volumeName": "local-a"},
        }))
        .unwrap();
        let a = to_host(&pvc, &crate::tenant::fixtures::ctx(), None)
            .metadata
            .annotations
            .unwrap();
        assert!(!a.keys().any(|k| k.starts_with(BINDER_PREFIX)), "{a:?}");
        assert_eq!(a["team"], "a");
    }
    use crate::tenant::fixtures::ctx;

    fn claim() -> PersistentVolumeClaim {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "data", "namespace": "apps", "uid": "c1"},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "standard",
                "resources": {"requests": {"storage": "1Gi"}}, "volumeName": "tenant-pv",
                "dataSource": {"kind": "VolumeSnapshot", "name": "snap", "apiGroup": "snapshot.storage.k8s.io"}},
        }))
        .unwrap()
    }

    #[test]
    fn the_host_claim_binds_on_its_own() {
        let host = to_host(&claim(), &ctx(), None);
        assert_eq!(host.metadata.namespace.as_deref(), Some("demo-apps"));
        let spec = host.spec.unwrap();
        assert!(spec.volume_name.is_none() && spec.data_source.is_none());
        assert_eq!(spec.storage_class_name.as_deref(), Some("standard"));
        let named = to_host(&claim(), &ctx(), Some("demo-tenant-pv".into()));
        assert_eq!(
            named.spec.unwrap().volume_name.as_deref(),
            Some("demo-tenant-pv")
        );
    }

    #[test]
    fn a_bound_host_volume_is_mirrored_prebound_to_the_tenant_claim() {
        let mut host_claim = to_host(&claim(), &ctx(), None);
        assert_eq!(bound_volume(&host_claim), None);
        host_claim.spec.as_mut().unwrap().volume_name = Some("pvc-h1".into());
        host_claim.status = serde_json::from_value(serde_json::json!({"phase": "Bound"})).unwrap();
        assert_eq!(bound_volume(&host_claim), Some("pvc-h1"));
        let host_pv: PersistentVolume = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "pvc-h1"},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "standard",
                "hostPath": {"path": "/srv/secret-host-layout/pvc-h1"}, "persistentVolumeReclaimPolicy": "Delete"},
        }))
        .unwrap();
        let mirror = mirror_volume(&host_pv, &claim());
        let spec = mirror.spec.unwrap();
        let claim_ref = spec.claim_ref.unwrap();
        assert_eq!(
            (claim_ref.namespace.as_deref(), claim_ref.uid.as_deref()),
            (Some("apps"), Some("c1"))
        );
        assert_eq!(
            spec.persistent_volume_reclaim_policy.as_deref(),
            Some("Retain")
        );
        assert!(
            !spec.host_path.unwrap().path.contains("secret-host-layout"),
            "host paths stay on the host"
        );
        assert_eq!(mirror.metadata.labels.unwrap()[MIRROR_LABEL], "true");
    }
}
