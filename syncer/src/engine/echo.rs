//! Echoes: the watch events that the syncer's own writes bring back.
//!
//! Data flow: a write that returns the object it made (a host create or apply, a tenant pod's
//! status patch) records the object's UID and the resource version the answer carries
//! ([`Echoes::expect`]); the down controller's trigger streams drop the one event whose
//! object has exactly that version ([`Echoes::is_echo`]); a deleted object's entry goes with
//! it ([`Echoes::forget`], from the caches' observers).
//!
//! Why: a pod's life made about seven down passes, and three were the echoes of the syncer's
//! own writes (its host pod's creation, its status copied up). Such a pass sees exactly what
//! the pass that wrote it left, so it decides nothing new. The cache still takes the event:
//! only the trigger is dropped.
//!
//! Why it loses nothing: every change has its own resource version and so its own event.
//! Anything that happened to the object before the write has an earlier version, and anything
//! after a later one; both still trigger. Only the version the syncer made itself is skipped,
//! once. A version is opaque here: it is compared for equality, never ordered.

use kube::Resource;
use std::collections::HashMap;
use std::sync::Mutex;

/// The versions of the syncer's own last writes, by object UID (one entry per object: a
/// later write replaces the entry, and the earlier write's event then triggers as before).
#[derive(Default)]
pub struct Echoes {
    expected: Mutex<HashMap<String, String>>,
}

impl Echoes {
    /// Records that the syncer's write made version `rv` of the object with UID `uid`.
    pub fn expect(&self, uid: &str, rv: &str) {
        if uid.is_empty() || rv.is_empty() {
            return;
        }
        self.lock().insert(uid.to_owned(), rv.to_owned());
    }

    /// [`Echoes::expect`] for the object a write answered with.
    pub fn expect_obj<K: Resource>(&self, obj: &K) {
        let meta = obj.meta();
        if let (Some(uid), Some(rv)) = (&meta.uid, &meta.resource_version) {
            self.expect(uid, rv);
        }
    }

    /// Whether `obj` is the echo of the syncer's own last write to it; consumed when it is.
    pub fn is_echo<K: Resource>(&self, obj: &K) -> bool {
        let meta = obj.meta();
        let (Some(uid), Some(rv)) = (&meta.uid, &meta.resource_version) else {
            return false;
        };
        let mut expected = self.lock();
        if expected.get(uid) == Some(rv) {
            expected.remove(uid);
            return true;
        }
        false
    }

    /// Drops what is expected of a deleted object.
    pub fn forget(&self, uid: &str) {
        self.lock().remove(uid);
    }

    /// How many writes still wait for their echo.
    pub fn pending(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        self.expected.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The resource version in a write's answer, read without decoding the object (its other
/// fields are skipped, not built).
pub fn answer_version(text: &str) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Meta {
        #[serde(rename = "resourceVersion")]
        resource_version: Option<String>,
    }
    #[derive(serde::Deserialize)]
    struct Answer {
        metadata: Meta,
    }
    serde_json::from_str::<Answer>(text)
        .ok()?
        .metadata
        .resource_version
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;

    fn pod(uid: &str, rv: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "uid": uid, "resourceVersion": rv},
        }))
        .unwrap()
    }

    #[test]
    fn only_the_version_the_syncer_wrote_is_an_echo_and_only_once() {
        let e = Echoes::default();
        e.expect("u1", "10");
        // Someone else's change before the write: still a trigger, and the entry stays.
        assert!(!e.is_echo(&pod("u1", "9")));
        assert!(e.is_echo(&pod("u1", "10")));
        // The same version again (a relist) triggers: the echo was consumed.
        assert!(!e.is_echo(&pod("u1", "10")));
        assert!(!e.is_echo(&pod("u1", "11")));
        assert_eq!(e.pending(), 0);
    }

    #[test]
    fn objects_are_told_apart_by_uid_and_a_later_write_replaces_the_earlier() {
        let e = Echoes::default();
        e.expect("a", "5");
        e.expect("b", "5");
        e.expect("a", "7");
        assert!(
            !e.is_echo(&pod("a", "5")),
            "a's first write is no longer expected"
        );
        assert!(e.is_echo(&pod("b", "5")));
        assert!(e.is_echo(&pod("a", "7")));
        // Without a UID or a version nothing is expected or matched.
        e.expect("", "1");
        e.expect("c", "");
        assert_eq!(e.pending(), 0);
        assert!(!e.is_echo(&Pod::default()));
    }

    #[test]
    fn a_deleted_object_leaves_nothing_behind() {
        let e = Echoes::default();
        e.expect("a", "5");
        e.forget("a");
        assert_eq!(e.pending(), 0);
        assert!(!e.is_echo(&pod("a", "5")));
    }

    #[test]
    fn the_version_is_read_from_an_answer_without_its_object() {
        let text = r#"{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p","uid":"u","resourceVersion":"42","labels":{"a":"b"}},"spec":{"containers":[{"name":"c","image":"i"}]},"status":{"phase":"Running"}}"#;
        assert_eq!(answer_version(text).as_deref(), Some("42"));
        assert_eq!(answer_version(r#"{"metadata":{}}"#), None);
        assert_eq!(answer_version("not json"), None);
    }
}
