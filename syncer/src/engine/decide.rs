//! What to do with one key, given both sides (pure).
//!
//! The host side is the cached host object of the key's name, classified by its markers
//! ([`HostSide::of`]); the [`Decision`] carries that object wherever it acts on it (update,
//! replace, delete), so a reconcile never looks it up again nor assumes it is there.

use kube::{Resource, ResourceExt};
use std::collections::BTreeMap;
use std::ops::Deref;
use vcp_core::naming::{self, TenantKey};

/// The host side of a key as the engine sees it: `H` is the host object (an `Arc` from a
/// cache, or a reference).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostSide<H> {
    /// No host object with that name.
    Absent,
    /// A host object of this tenant, made from the tenant object with this UID.
    Ours { host: H, tenant_uid: Option<String> },
    /// A host object that does not carry this tenant's markers: never touched.
    Foreign(H),
}

impl<H> HostSide<H>
where
    H: Deref<Target: Resource + Sized>,
{
    /// Classifies the host object of a key, if there is one, by its markers.
    pub fn of(key: &TenantKey, host: Option<H>) -> HostSide<H> {
        let Some(host) = host else {
            return HostSide::Absent;
        };
        match tenant_uid(key, host.labels(), host.annotations()) {
            Some(tenant_uid) => HostSide::Ours { host, tenant_uid },
            None => HostSide::Foreign(host),
        }
    }
}

/// For a host object of this tenant (its labels and annotations), `Some` with the UID of the
/// tenant object it was made from; `None` if it is not this tenant's.
fn tenant_uid(
    key: &TenantKey,
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
) -> Option<Option<String>> {
    // Generated objects (token Secrets) belong to the syncer, never to a tenant object.
    (naming::owned_by(key, labels) && !annotations.contains_key(naming::ANN_GENERATED))
        .then(|| annotations.get(naming::ANN_UID).cloned())
}

/// The engine's decision for one key, with the host object it was decided on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision<H> {
    Create,
    /// Apply the desired fields to this host object (idempotent; a no-op if nothing drifted).
    Update(H),
    /// The tenant object was recreated under the same name: replace this host object.
    Replace(H),
    /// This host object is ours and the tenant object is gone.
    Delete(H),
    /// A host object of someone else holds the name: report, touch nothing.
    Conflict(H),
    Nothing,
}

/// Decides per key, as in the style guide: both sides -> update; tenant only -> create; host only
/// and ours -> delete; host only and not ours -> leave alone.
pub fn decide<H>(tenant_uid: Option<&str>, tenant_exists: bool, host: HostSide<H>) -> Decision<H> {
    match (tenant_exists, host) {
        (true, HostSide::Absent) => Decision::Create,
        (true, HostSide::Foreign(h)) => Decision::Conflict(h),
        (
            true,
            HostSide::Ours {
                host,
                tenant_uid: h,
            },
        ) => match (tenant_uid, h.as_deref()) {
            (Some(t), Some(h)) if t != h => Decision::Replace(host),
            _ => Decision::Update(host),
        },
        (false, HostSide::Ours { host, .. }) => Decision::Delete(host),
        (false, _) => Decision::Nothing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;

    fn ours(uid: &str) -> HostSide<&'static str> {
        HostSide::Ours {
            host: "h",
            tenant_uid: Some(uid.into()),
        }
    }

    #[test]
    fn every_combination_of_sides_has_one_decision() {
        assert_eq!(
            decide(Some("u1"), true, HostSide::<&str>::Absent),
            Decision::Create
        );
        assert_eq!(decide(Some("u1"), true, ours("u1")), Decision::Update("h"));
        assert_eq!(decide(Some("u2"), true, ours("u1")), Decision::Replace("h"));
        assert_eq!(
            decide(Some("u1"), true, HostSide::Foreign("h")),
            Decision::Conflict("h")
        );
        assert_eq!(decide(None, false, ours("u1")), Decision::Delete("h"));
        assert_eq!(
            decide(None, false, HostSide::Foreign("h")),
            Decision::Nothing
        );
        assert_eq!(
            decide(None, false, HostSide::<&str>::Absent),
            Decision::Nothing
        );
    }

    #[test]
    fn host_objects_are_ours_only_with_our_label() {
        let key = TenantKey::new("demo").unwrap();
        let obj = |labels: &BTreeMap<String, String>, ann: &BTreeMap<String, String>| ConfigMap {
            metadata: kube::api::ObjectMeta {
                labels: Some(labels.clone()),
                annotations: Some(ann.clone()),
                ..Default::default()
            },
            ..Default::default()
        };
        let ann = BTreeMap::from([(naming::ANN_UID.to_owned(), "u1".to_owned())]);
        let ours = BTreeMap::from([(naming::LABEL_TENANT.to_owned(), "demo".to_owned())]);
        let other = BTreeMap::from([(naming::LABEL_TENANT.to_owned(), "other".to_owned())]);
        let (mine, theirs, unmarked) = (
            obj(&ours, &ann),
            obj(&other, &ann),
            obj(&BTreeMap::new(), &ann),
        );
        assert_eq!(
            HostSide::of(&key, Some(&mine)),
            HostSide::Ours {
                host: &mine,
                tenant_uid: Some("u1".into())
            }
        );
        assert_eq!(
            HostSide::of(&key, Some(&theirs)),
            HostSide::Foreign(&theirs)
        );
        assert_eq!(
            HostSide::of(&key, Some(&unmarked)),
            HostSide::Foreign(&unmarked)
        );
        assert_eq!(HostSide::<&ConfigMap>::of(&key, None), HostSide::Absent);
        let generated = BTreeMap::from([(naming::ANN_GENERATED.to_owned(), "pod/u1".to_owned())]);
        let token = obj(&ours, &generated);
        assert_eq!(
            HostSide::of(&key, Some(&token)),
            HostSide::Foreign(&token),
            "a tenant secret must not adopt a token secret"
        );
    }
}
