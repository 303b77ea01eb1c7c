//! Host objects the syncer generates for one tenant pod: its token Secret ([`super::tokens`])
//! and its trust-bundle ConfigMap ([`super::bundles`]).
//!
//! Both live under a name derived from the tenant pod's UID in the pod's host namespace, and
//! both follow one contract, kept here so the two cannot drift apart:
//! - **Marked.** The tenant label and `vcp.dev/generated-for: pod/<uid>`; no tenant object of
//!   the same kind can adopt a generated one, since tenant objects never carry that marker.
//! - **Owned.** Once the host pod exists it owns the object, so the host's garbage collector
//!   removes the object with the pod (before that, the object waits for the pod).
//! - **Never taken.** An object found under the generated name without both markers belongs
//!   to someone else: the syncer leaves it alone and tells the tenant (`HostConflict`).
//!
//! [`standing`] and [`meta`] are pure; [`refuse_foreign`] is the one write (a tenant Event).

use crate::engine::Engine;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::ResourceExt;
use std::collections::BTreeMap;
use vcp_core::host_pod::HostPod;
use vcp_core::naming::{self, TenantKey};

/// Where the object found under a generated name stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// Nothing there yet.
    Absent,
    /// Ours; `owned` says whether the host pod (when there is one) already owns it.
    Ours { owned: bool },
    /// Someone else's: never overwritten.
    Foreign,
}

/// The host pod as an owner, once it has a UID.
fn owner(host_pod: Option<&HostPod>) -> Option<OwnerReference> {
    let p = host_pod?;
    Some(OwnerReference {
        api_version: "v1".into(),
        kind: "Pod".into(),
        name: p.name_any(),
        uid: p.metadata.uid.clone()?,
        ..Default::default()
    })
}

/// Where `current` (the object under the generated name, if any) stands for tenant `key`,
/// given the host pod that should own it.
pub fn standing(
    key: &TenantKey,
    current: Option<&ObjectMeta>,
    host_pod: Option<&HostPod>,
) -> Standing {
    let Some(cur) = current else {
        return Standing::Absent;
    };
    let empty = BTreeMap::new();
    let labels = cur.labels.as_ref().unwrap_or(&empty);
    let marked = cur
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(naming::ANN_GENERATED));
    if !naming::owned_by(key, labels) || !marked {
        return Standing::Foreign;
    }
    let owned = owner(host_pod).is_none_or(|o| {
        cur.owner_references
            .iter()
            .flatten()
            .any(|c| c.uid == o.uid)
    });
    Standing::Ours { owned }
}

/// The metadata of the object generated under `name` in `host_ns` for tenant pod `pod_uid`:
/// the markers, `annotations` besides them, and the host pod as owner once it exists.
pub fn meta(
    key: &TenantKey,
    host_ns: &str,
    name: &str,
    pod_uid: &str,
    host_pod: Option<&HostPod>,
    annotations: impl IntoIterator<Item = (String, String)>,
) -> ObjectMeta {
    let mut ann = BTreeMap::from([(naming::ANN_GENERATED.to_owned(), format!("pod/{pod_uid}"))]);
    ann.extend(annotations);
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some(host_ns.to_owned()),
        labels: Some(BTreeMap::from([(
            naming::LABEL_TENANT.to_owned(),
            key.to_string(),
        )])),
        annotations: Some(ann),
        owner_references: owner(host_pod).map(|o| vec![o]),
        ..Default::default()
    }
}

/// Tells the tenant that the host `kind` object its pod `t` needs under `host_ns/name` is
/// someone else's (the pod then waits for its volume, visibly).
pub async fn refuse_foreign(e: &Engine, t: &Pod, kind: &str, host_ns: &str, name: &str) {
    e.report(
        t,
        "HostConflict",
        format!("host {kind} {host_ns}/{name} exists and is not managed by vcp"),
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> TenantKey {
        TenantKey::new(s).unwrap()
    }

    fn host_pod(uid: &str) -> HostPod {
        HostPod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                uid: Some(uid.into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn what_the_syncer_generates_it_recognises_and_nothing_else() {
        let k = key("demo");
        let pod = host_pod("u-host");
        let ours = meta(
            &k,
            "ns",
            "n",
            "u-tenant",
            Some(&pod),
            [("x".into(), "y".into())],
        );
        assert_eq!(
            ours.annotations.as_ref().unwrap()[naming::ANN_GENERATED],
            "pod/u-tenant"
        );
        assert_eq!(ours.annotations.as_ref().unwrap()["x"], "y");
        assert_eq!(
            standing(&k, Some(&ours), Some(&pod)),
            Standing::Ours { owned: true }
        );
        assert_eq!(standing(&k, None, Some(&pod)), Standing::Absent);

        // Written before the host pod existed: ours, waiting for its owner.
        let early = meta(&k, "ns", "n", "u-tenant", None, []);
        assert!(early.owner_references.is_none());
        assert_eq!(
            standing(&k, Some(&early), None),
            Standing::Ours { owned: true }
        );
        assert_eq!(
            standing(&k, Some(&early), Some(&pod)),
            Standing::Ours { owned: false }
        );
        // Owned by an earlier host pod of the same name.
        assert_eq!(
            standing(&k, Some(&ours), Some(&host_pod("u-other"))),
            Standing::Ours { owned: false }
        );

        // Another tenant's, or the tenant's label without the marker (a synced object of the
        // same name), or nobody's: never taken.
        assert_eq!(
            standing(&key("other"), Some(&ours), Some(&pod)),
            Standing::Foreign
        );
        let mut unmarked = ours.clone();
        unmarked.annotations = None;
        assert_eq!(standing(&k, Some(&unmarked), Some(&pod)), Standing::Foreign);
        let mut unlabelled = ours.clone();
        unlabelled.labels = None;
        assert_eq!(
            standing(&k, Some(&unlabelled), Some(&pod)),
            Standing::Foreign
        );
    }
}
