//! Echoes: the watch events that the syncer's own writes bring back.
//!
//! Data flow: a write that returns the object it made (a host pod's create, a tenant pod's
//! status patch) announces itself before it is sent ([`Echoes::begin`], by side, namespace and
//! name: a create has no UID yet) and, once answered, records the resource version the answer
//! carries ([`Echoes::expect`]); the down controller's trigger streams drop the one event
//! whose object has exactly that version ([`Echoes::is_echo`]). An event for an object whose
//! write is still unanswered waits for the answer, briefly: the watch often delivers the echo
//! before the writer has read its answer. A deleted object's entry goes with it
//! ([`Echoes::forget`], from the caches' observers).
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
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

/// Which apiserver an object lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    Tenant,
    Host,
}

type Key = (Side, String, String);

/// How long an event waits for the answer of a write to its object: far longer than an answer
/// takes to be read, short enough that a write hanging on a dead connection holds up nothing.
const ANSWER_WAIT: Duration = Duration::from_secs(2);

#[derive(Default)]
struct State {
    /// The version the syncer's last answered write made, by object (one entry per object: a
    /// later write replaces it, and the earlier write's event then triggers as before).
    expected: HashMap<Key, String>,
    /// Writes sent and not answered yet, with how many (two passes never write one object at
    /// once, but a pass's status write and a create may share nothing but the key's form).
    in_flight: HashMap<Key, usize>,
}

/// The versions of the syncer's own writes.
#[derive(Default)]
pub struct Echoes {
    state: Mutex<State>,
    answered: Arc<Notify>,
}

/// A write in flight, from [`Echoes::begin`]: dropping it (answered or failed) lets events
/// waiting for it go on.
pub struct Write<'a> {
    echoes: &'a Echoes,
    key: Key,
}

impl Drop for Write<'_> {
    fn drop(&mut self) {
        let mut s = self.echoes.lock();
        if let Some(n) = s.in_flight.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                s.in_flight.remove(&self.key);
            }
        }
        drop(s);
        self.echoes.answered.notify_waiters();
    }
}

impl Write<'_> {
    /// Records that this write made version `rv` of its object.
    pub fn made(&self, rv: &str) {
        if !rv.is_empty() {
            self.echoes
                .lock()
                .expected
                .insert(self.key.clone(), rv.to_owned());
        }
    }

    /// [`Write::made`] with the object the write answered with.
    pub fn made_obj<K: Resource>(&self, obj: &K) {
        if let Some(rv) = &obj.meta().resource_version {
            self.made(rv);
        }
    }
}

fn key_of<K: Resource>(side: Side, obj: &K) -> Option<Key> {
    let meta = obj.meta();
    Some((
        side,
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone()?,
    ))
}

impl Echoes {
    /// Announces a write to object `namespace/name` on `side`, before it is sent.
    pub fn begin(&self, side: Side, namespace: &str, name: &str) -> Write<'_> {
        let key = (side, namespace.to_owned(), name.to_owned());
        *self.lock().in_flight.entry(key.clone()).or_default() += 1;
        Write { echoes: self, key }
    }

    /// Whether `obj` is the echo of the syncer's own last write to it; consumed when it is.
    /// Waits (at most [`ANSWER_WAIT`]) while a write to it is unanswered.
    pub async fn is_echo<K: Resource>(&self, side: Side, obj: &K) -> bool {
        let (Some(key), Some(rv)) = (key_of(side, obj), obj.meta().resource_version.as_ref())
        else {
            return false;
        };
        let deadline = tokio::time::Instant::now() + ANSWER_WAIT;
        loop {
            let answered = self.answered.notified();
            tokio::pin!(answered);
            // Registered before the look, so an answer in between is not missed.
            answered.as_mut().enable();
            {
                let mut s = self.lock();
                if s.expected.get(&key) == Some(rv) {
                    s.expected.remove(&key);
                    return true;
                }
                if !s.in_flight.contains_key(&key) {
                    return false;
                }
            }
            if tokio::time::timeout_at(deadline, answered).await.is_err() {
                return false;
            }
        }
    }

    /// Drops what is expected of a deleted object.
    pub fn forget<K: Resource>(&self, side: Side, obj: &K) {
        if let Some(key) = key_of(side, obj) {
            self.lock().expected.remove(&key);
        }
    }

    /// How many answered writes still wait for their echo.
    pub fn pending(&self) -> usize {
        self.lock().expected.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
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

    fn pod(name: &str, rv: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "ns", "resourceVersion": rv},
        }))
        .unwrap()
    }

    #[tokio::test]
    async fn only_the_version_the_syncer_wrote_is_an_echo_and_only_once() {
        let e = Echoes::default();
        e.begin(Side::Host, "ns", "p").made("10");
        // Someone else's change before the write: still a trigger, and the entry stays.
        assert!(!e.is_echo(Side::Host, &pod("p", "9")).await);
        // The same object on the other side is another object.
        assert!(!e.is_echo(Side::Tenant, &pod("p", "10")).await);
        assert!(e.is_echo(Side::Host, &pod("p", "10")).await);
        // The same version again (a relist) triggers: the echo was consumed.
        assert!(!e.is_echo(Side::Host, &pod("p", "10")).await);
        assert!(!e.is_echo(Side::Host, &pod("p", "11")).await);
        assert_eq!(e.pending(), 0);
    }

    #[tokio::test]
    async fn a_later_write_replaces_the_earlier_and_a_deleted_object_leaves_nothing() {
        let e = Echoes::default();
        e.begin(Side::Tenant, "ns", "a").made("5");
        e.begin(Side::Tenant, "ns", "b").made("5");
        e.begin(Side::Tenant, "ns", "a").made("7");
        assert!(!e.is_echo(Side::Tenant, &pod("a", "5")).await);
        assert!(e.is_echo(Side::Tenant, &pod("b", "5")).await);
        e.forget(Side::Tenant, &pod("a", "7"));
        assert_eq!(e.pending(), 0);
        assert!(!e.is_echo(Side::Tenant, &pod("a", "7")).await);
        // A write answered without a version expects nothing.
        e.begin(Side::Tenant, "ns", "c").made("");
        assert_eq!(e.pending(), 0);
        assert!(!e.is_echo(Side::Tenant, &Pod::default()).await);
    }

    #[tokio::test]
    async fn an_echo_that_comes_before_the_answer_waits_for_it() {
        let e = Arc::new(Echoes::default());
        let write = e.begin(Side::Host, "ns", "p");
        let e2 = e.clone();
        let event = tokio::spawn(async move { e2.is_echo(Side::Host, &pod("p", "3")).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !event.is_finished(),
            "the event waits while the write is unanswered"
        );
        write.made("3");
        drop(write);
        assert!(event.await.unwrap());
        // A failed write (no version) lets the waiting event trigger.
        let write = e.begin(Side::Host, "ns", "q");
        let e2 = e.clone();
        let event = tokio::spawn(async move { e2.is_echo(Side::Host, &pod("q", "4")).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(write);
        assert!(!event.await.unwrap());
    }

    #[tokio::test]
    async fn a_write_that_never_answers_holds_an_event_up_only_briefly() {
        let e = Echoes::default();
        let _write = e.begin(Side::Host, "ns", "p");
        let started = std::time::Instant::now();
        assert!(!e.is_echo(Side::Host, &pod("p", "3")).await);
        let waited = started.elapsed();
        assert!(
            waited >= ANSWER_WAIT && waited < ANSWER_WAIT * 3,
            "{waited:?}"
        );
    }

    #[test]
    fn the_version_is_read_from_an_answer_without_its_object() {
        let text = r#"{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p","uid":"u","resourceVersion":"42","labels":{"a":"b"}},"spec":{"containers":[{"name":"c","image":"i"}]},"status":{"phase":"Running"}}"#;
        assert_eq!(answer_version(text).as_deref(), Some("42"));
        assert_eq!(answer_version(r#"{"metadata":{}}"#), None);
        assert_eq!(answer_version("not json"), None);
    }
}
