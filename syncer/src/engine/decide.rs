//! What to do with one key, given both sides (pure).

use std::collections::BTreeMap;
use vcp_core::naming::{self, TenantKey};

/// The host side of a key as the engine sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostSide {
    /// No host object with that name.
    Absent,
    /// A host object of this tenant, made from the tenant object with this UID.
    Ours { tenant_uid: Option<String> },
    /// A host object that does not carry this tenant's markers: never touched.
    Foreign,
}

impl HostSide {
    /// Classifies a host object by its markers.
    pub fn of(
        key: &TenantKey,
        labels: &BTreeMap<String, String>,
        annotations: &BTreeMap<String, String>,
    ) -> HostSide {
        // Generated objects (token Secrets) belong to the syncer, never to a tenant object.
        if naming::owned_by(key, labels) && !annotations.contains_key(naming::ANN_GENERATED) {
            HostSide::Ours {
                tenant_uid: annotations.get(naming::ANN_UID).cloned(),
            }
        } else {
            HostSide::Foreign
        }
    }
}

/// The engine's decision for one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Create,
    /// Apply the desired fields (idempotent; a no-op if nothing drifted).
    Update,
    /// The tenant object was recreated under the same name: replace the host object.
    Replace,
    /// The host object is ours and the tenant object is gone.
    Delete,
    /// A host object of someone else holds the name: report, touch nothing.
    Conflict,
    Nothing,
}

/// Decides per key, as in the style guide: both sides -> update; tenant only -> create; host only
/// and ours -> delete; host only and not ours -> leave alone.
pub fn decide(tenant_uid: Option<&str>, tenant_exists: bool, host: &HostSide) -> Decision {
    match (tenant_exists, host) {
        (true, HostSide::Absent) => Decision::Create,
        (true, HostSide::Foreign) => Decision::Conflict,
        (true, HostSide::Ours { tenant_uid: h }) => match (tenant_uid, h.as_deref()) {
            (Some(t), Some(h)) if t != h => Decision::Replace,
            _ => Decision::Update,
        },
        (false, HostSide::Ours { .. }) => Decision::Delete,
        (false, _) => Decision::Nothing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ours(uid: &str) -> HostSide {
        HostSide::Ours {
            tenant_uid: Some(uid.into()),
        }
    }

    #[test]
    fn every_combination_of_sides_has_one_decision() {
        assert_eq!(
            decide(Some("u1"), true, &HostSide::Absent),
            Decision::Create
        );
        assert_eq!(decide(Some("u1"), true, &ours("u1")), Decision::Update);
        assert_eq!(decide(Some("u2"), true, &ours("u1")), Decision::Replace);
        assert_eq!(
            decide(Some("u1"), true, &HostSide::Foreign),
            Decision::Conflict
        );
        assert_eq!(decide(None, false, &ours("u1")), Decision::Delete);
        assert_eq!(decide(None, false, &HostSide::Foreign), Decision::Nothing);
        assert_eq!(decide(None, false, &HostSide::Absent), Decision::Nothing);
    }

    #[test]
    fn host_objects_are_ours_only_with_our_label() {
        let key = TenantKey::new("demo").unwrap();
        let ann = BTreeMap::from([(naming::ANN_UID.to_owned(), "u1".to_owned())]);
        let ours = BTreeMap::from([(naming::LABEL_TENANT.to_owned(), "demo".to_owned())]);
        let other = BTreeMap::from([(naming::LABEL_TENANT.to_owned(), "other".to_owned())]);
        assert_eq!(
            HostSide::of(&key, &ours, &ann),
            HostSide::Ours {
                tenant_uid: Some("u1".into())
            }
        );
        assert_eq!(HostSide::of(&key, &other, &ann), HostSide::Foreign);
        assert_eq!(
            HostSide::of(&key, &BTreeMap::new(), &ann),
            HostSide::Foreign
        );
        let generated = BTreeMap::from([(naming::ANN_GENERATED.to_owned(), "pod/u1".to_owned())]);
        assert_eq!(
            HostSide::of(&key, &ours, &generated),
            HostSide::Foreign,
            "a tenant secret must not adopt a token secret"
        );
    }
}
