//! Which tenant-created PersistentVolumes and claims may reach the host (pure).
//!
//! A PersistentVolume's source is what a host node mounts: `hostPath` and `local` are a node's
//! own files, and any other source (an NFS server, a cloud disk, a CSI volume handle) names
//! storage the host reaches with its own credentials. So a tenant volume goes down only if its
//! source is one the plan lists, and only with a StorageClass the plan allows; claims likewise.

use super::{Refusal, TenantPolicy};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaimSpec};

/// Every PersistentVolume source the API has, by field name.
pub const PV_SOURCES: [&str; 22] = [
    "awsElasticBlockStore",
    "azureDisk",
    "azureFile",
    "cephfs",
    "cinder",
    "csi",
    "fc",
    "flexVolume",
    "flocker",
    "gcePersistentDisk",
    "glusterfs",
    "hostPath",
    "iscsi",
    "local",
    "nfs",
    "photonPersistentDisk",
    "portworxVolume",
    "quobyte",
    "rbd",
    "scaleIO",
    "storageos",
    "vsphereVolume",
];

/// Sources that are a node's own files.
pub const HOST_SCOPED: [&str; 2] = ["hostPath", "local"];

/// The sources a volume names (normally one), by field name.
pub fn sources(pv: &PersistentVolume) -> Vec<String> {
    let spec = serde_json::to_value(pv.spec.clone().unwrap_or_default()).unwrap_or_default();
    PV_SOURCES
        .iter()
        .filter(|s| spec.get(**s).is_some_and(|v| !v.is_null()))
        .map(|s| (*s).to_owned())
        .collect()
}

/// Why a tenant volume may not reach the host (empty: it may).
pub fn check_volume(pv: &PersistentVolume, policy: &TenantPolicy) -> Vec<Refusal> {
    let mut out: Vec<Refusal> = sources(pv)
        .into_iter()
        .filter(|s| !policy.volumes.persistent_volume_sources.contains(s))
        .map(|s| {
            let why = if HOST_SCOPED.contains(&s.as_str()) {
                "mounts a host node's own files"
            } else {
                "is not a source the tenant's plan allows"
            };
            Refusal::new(
                format!("spec.{s}"),
                "plan: persistent volume sources",
                format!("volume source {s} {why}"),
            )
        })
        .collect();
    let class = pv
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.as_deref());
    out.extend(check_class(class, policy, "spec.storageClassName"));
    out
}

/// Why a claim (or an ephemeral volume's claim template) may not reach the host.
pub fn check_claim(
    spec: &PersistentVolumeClaimSpec,
    policy: &TenantPolicy,
    field: &str,
) -> Vec<Refusal> {
    check_class(
        spec.storage_class_name.as_deref(),
        policy,
        &format!("{field}.storageClassName"),
    )
}

fn check_class(class: Option<&str>, policy: &TenantPolicy, field: &str) -> Vec<Refusal> {
    let Some(allowed) = &policy.volumes.storage_classes else {
        return Vec::new();
    };
    match class {
        // No class: the host default (or, for a volume, none), which the plan cannot rule out.
        None | Some("") => Vec::new(),
        Some(c) if allowed.iter().any(|a| a == c) => Vec::new(),
        Some(c) => vec![Refusal::new(
            field,
            "plan: storage classes",
            format!(
                "StorageClass {c} is not one the tenant's plan allows ({})",
                allowed.join(", ")
            ),
        )],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pv(spec: serde_json::Value) -> PersistentVolume {
        serde_json::from_value(serde_json::json!({"metadata": {"name": "v"}, "spec": spec}))
            .unwrap()
    }

    #[test]
    fn host_scoped_and_unlisted_sources_are_refused() {
        let policy =
            TenantPolicy::from_yaml("volumes: {persistent_volume_sources: [nfs]}").unwrap();
        let host_path =
            pv(serde_json::json!({"hostPath": {"path": "/"}, "capacity": {"storage": "1Gi"}}));
        let r = check_volume(&host_path, &policy);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].field, "spec.hostPath");
        assert!(r[0].message.contains("host node"));
        let local = pv(serde_json::json!({"local": {"path": "/mnt"}}));
        assert_eq!(check_volume(&local, &policy)[0].field, "spec.local");
        let csi = pv(serde_json::json!({"csi": {"driver": "d", "volumeHandle": "h"}}));
        assert_eq!(
            check_volume(&csi, &policy)[0].rule,
            "plan: persistent volume sources"
        );
        let nfs = pv(serde_json::json!({"nfs": {"server": "s", "path": "/x"}}));
        assert!(check_volume(&nfs, &policy).is_empty());
        assert!(
            !check_volume(&nfs, &TenantPolicy::default()).is_empty(),
            "by default no tenant volume reaches the host"
        );
    }

    #[test]
    fn storage_classes_are_checked_only_when_the_plan_lists_them() {
        let any = TenantPolicy::from_yaml("volumes: {persistent_volume_sources: [nfs]}").unwrap();
        let listed = TenantPolicy::from_yaml(
            "volumes: {persistent_volume_sources: [nfs], storage_classes: [standard]}",
        )
        .unwrap();
        let fast = pv(
            serde_json::json!({"nfs": {"server": "s", "path": "/x"}, "storageClassName": "fast"}),
        );
        assert!(check_volume(&fast, &any).is_empty());
        assert_eq!(
            check_volume(&fast, &listed)[0].field,
            "spec.storageClassName"
        );
        let claim: PersistentVolumeClaimSpec =
            serde_json::from_value(serde_json::json!({"storageClassName": "fast"})).unwrap();
        assert_eq!(
            check_claim(&claim, &listed, "spec")[0].rule,
            "plan: storage classes"
        );
        let default_class = PersistentVolumeClaimSpec::default();
        assert!(check_claim(&default_class, &listed, "spec").is_empty());
    }

    #[test]
    fn every_listed_source_is_a_field_of_the_api() {
        // A misspelt name would be ignored by the typed spec and pass every volume unchecked.
        for s in PV_SOURCES {
            match serde_json::from_value::<PersistentVolume>(serde_json::json!({"spec": {s: {}}})) {
                Ok(v) => assert_eq!(sources(&v), [s], "{s}"),
                // Its own required fields are missing: so the field itself was recognised.
                Err(e) => assert!(e.to_string().contains("missing field"), "{s}: {e}"),
            }
        }
    }
}
