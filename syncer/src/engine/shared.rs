//! One watch and one cache per kind and side, shared by every controller that needs them.
//!
//! A kind's down and gc controllers both read the tenant and the host side. Each used to watch
//! and cache both for itself: four watches and four copies of every object. A [`Shared`] runs
//! one watcher, slims each object ([`slim`]), stores it, and only then hands it to every
//! subscriber. So the invariant the engine relies on still holds for every controller: the
//! object that triggers a reconcile is already in the cache the reconcile reads.
//!
//! kube-runtime's own shared streams (`reflect_shared`) are not used because their
//! subscribers see applied objects only, never deletions, and deletions trigger work here: a
//! deleted tenant object triggers gc, a host pod deleted out of band triggers the down
//! controller (which then replaces or removes the tenant pod).
//!
//! Readiness (the first list is in) is published by [`Cache`], not by the store's own
//! `wait_until_ready`: that one wakes only the last task that polled it (a oneshot receiver
//! behind a mutex), so with one cache read by many tasks the others slept until something
//! unrelated woke them (the volume-mirror loop for minutes, Events up until their first
//! timeout), and `now_or_never` on it replaced a waiting controller's waker with a no-op. The
//! store's own readiness is left to the one controller that reads it as its primary cache.

use super::fanin::slim;
use futures::channel::mpsc;
use futures::{Stream, StreamExt};
use kube::Resource;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde::de::DeserializeOwned;
use std::fmt::Debug;
use std::sync::Arc;
use tokio::sync::watch;

/// A shared cache and whether it holds its first complete list. Reads go to the store
/// (`Deref`); readiness has any number of waiters.
pub struct Cache<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    store: Store<K>,
    ready: watch::Receiver<bool>,
}

impl<K> Clone for Cache<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    fn clone(&self) -> Self {
        Cache {
            store: self.store.clone(),
            ready: self.ready.clone(),
        }
    }
}

impl<K> std::ops::Deref for Cache<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    type Target = Store<K>;

    fn deref(&self) -> &Store<K> {
        &self.store
    }
}

impl<K> Cache<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    /// The store itself (for code that takes one).
    pub fn store(&self) -> Store<K> {
        self.store.clone()
    }

    /// Whether the cache holds its first complete list. Never waits: see
    /// [`super::cache_ready`] for why reconciles must not.
    pub fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }

    /// Waits until the cache holds its first complete list.
    pub async fn ready(&self) {
        let mut ready = self.ready.clone();
        // An error means the watch is gone for good, and with it the process.
        let _ = ready.wait_for(|r| *r).await;
    }

    /// A cache over a store that already holds its list (tests build stores by hand).
    #[cfg(test)]
    pub fn listed(store: Store<K>) -> Cache<K> {
        Cache {
            store,
            ready: watch::channel(true).1,
        }
    }
}

/// A store that has listed `objects` (for tests of code that reads caches).
#[cfg(test)]
pub fn listed_store<K>(objects: &[serde_json::Value]) -> Store<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + 'static,
{
    let (reader, mut writer) = reflector::store();
    writer.apply_watcher_event(&watcher::Event::Init);
    for o in objects {
        let obj = serde_json::from_value(o.clone()).unwrap();
        writer.apply_watcher_event(&watcher::Event::InitApply(obj));
    }
    writer.apply_watcher_event(&watcher::Event::InitDone);
    reader
}

/// One watch of one kind on one side, its cache, and the streams of its subscribers.
pub struct Shared<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    reader: Store<K>,
    writer: reflector::store::Writer<K>,
    ready: watch::Sender<bool>,
    subscribers: Vec<mpsc::UnboundedSender<Arc<K>>>,
    observers: Vec<Observer<K>>,
}

/// Told of every object a watch touches, present (listed, applied) or gone, once the cache
/// reflects it and before any subscriber hears of it: state kept beside the cache (the quota
/// ledger) is never older than a reconcile's trigger. Runs on the watch's task, so it must be
/// quick.
pub type Observer<K> = Box<dyn FnMut(&K, bool) + Send>;

impl<K> Default for Shared<K>
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
{
    fn default() -> Self {
        Shared::new()
    }
}

impl<K> Shared<K>
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
{
    pub fn new() -> Shared<K> {
        let (reader, writer) = reflector::store();
        Shared {
            reader,
            writer,
            ready: watch::channel(false).0,
            subscribers: Vec::new(),
            observers: Vec::new(),
        }
    }

    /// Adds an observer (see [`Observer`]).
    pub fn observe(&mut self, observer: Observer<K>) {
        self.observers.push(observer);
    }

    /// The store, for the one controller that reads it as its primary cache (it waits for the
    /// store's own readiness; nothing else may, see the module docs).
    pub fn store(&self) -> Store<K> {
        self.reader.clone()
    }

    /// The cache, for everyone else.
    pub fn cache(&self) -> Cache<K> {
        Cache {
            store: self.reader.clone(),
            ready: self.ready.subscribe(),
        }
    }

    /// A stream of every object the watch touches (listed, applied or deleted), each
    /// yielded once the cache reflects it (see [`Shared::feed`]).
    ///
    /// Unbounded: a controller whose workers are all busy still drains its triggers into its
    /// own de-duplicating queue, but a bounded channel would let one slow subscriber stall
    /// the watch, and with it the cache every other controller reads. What waits here is one
    /// reference per event, not a copy of the object.
    pub fn subscribe(&mut self) -> mpsc::UnboundedReceiver<Arc<K>> {
        let (tx, rx) = mpsc::unbounded();
        self.subscribers.push(tx);
        rx
    }

    /// Watches `api` with `config` until the future is dropped, filling the cache and feeding
    /// the subscribers.
    pub async fn run(self, api: Api<K>, config: watcher::Config) {
        self.feed(watcher(api, config).default_backoff()).await
    }

    /// Watches `K` in each of the tenant's host namespaces (see [`super::fanin`]) until the
    /// future is dropped, filling the cache and feeding the subscribers.
    pub async fn run_in_namespaces(
        self,
        client: kube::Client,
        config: watcher::Config,
        namespaces: watch::Receiver<super::fanin::NamespaceSet>,
    ) where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope> + Send + Sync,
    {
        let store = self.reader.clone();
        let cached = move |ns: &str| -> Vec<K> {
            store
                .state()
                .iter()
                .filter(|o| o.meta().namespace.as_deref() == Some(ns))
                .map(|o| o.as_ref().clone())
                .collect()
        };
        self.feed(super::fanin::stream(client, config, namespaces, cached))
            .await
    }

    /// Applies watch events to the cache and hands every object they touch to the
    /// subscribers, each after the cache reflects it:
    /// - applied and deleted objects at once;
    /// - a (re)list's objects when it completes, since the cache takes a list whole at its
    ///   end; with them the objects the list no longer has (deleted while the watch was
    ///   down), which would otherwise wait for the next resync.
    async fn feed(self, events: impl Stream<Item = watcher::Result<watcher::Event<K>>>) {
        let Shared {
            reader,
            writer,
            ready,
            mut subscribers,
            mut observers,
        } = self;
        let kind = K::kind(&()).to_string();
        let mut before_list: Vec<Arc<K>> = Vec::new();
        let mut send = move |obj: Arc<K>, present: bool| {
            for o in &mut observers {
                o(&obj, present);
            }
            subscribers.retain(|s| s.unbounded_send(obj.clone()).is_ok())
        };
        events
            .modify(slim)
            .reflect(writer)
            .for_each(|event| {
                match event {
                    Ok(watcher::Event::Apply(obj)) => send(Arc::new(obj), true),
                    Ok(watcher::Event::Delete(obj)) => send(Arc::new(obj), false),
                    // The cache keeps its old contents until the list is complete.
                    Ok(watcher::Event::Init) => before_list = reader.state(),
                    Ok(watcher::Event::InitApply(_)) => {}
                    Ok(watcher::Event::InitDone) => {
                        ready.send_replace(true);
                        for obj in reader.state() {
                            send(obj, true);
                        }
                        for obj in before_list.drain(..) {
                            if reader.get(&ObjectRef::from_obj(obj.as_ref())).is_none() {
                                send(obj, false);
                            }
                        }
                    }
                    // The watcher retries with backoff; its cache stays as it was meanwhile.
                    Err(err) => {
                        tracing::warn!(kind = %kind, error = %err, "watch failed; retrying")
                    }
                }
                futures::future::ready(())
            })
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use kube::ResourceExt;

    fn pod(name: &str, app: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "a", "labels": {"app": app},
                "managedFields": [{"manager": "kubectl", "operation": "Apply", "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:metadata": {"f:labels": {"f:app": {}}}}}]},
            "spec": {"containers": [{"name": "c", "image": "i"}]},
            "status": {"phase": "Running"},
        }))
        .unwrap()
    }

    #[test]
    fn cached_objects_lose_managed_fields_only() {
        let mut p = pod("web", "x");
        let mut want = p.clone();
        want.metadata.managed_fields = None;
        slim(&mut p);
        assert_eq!(p, want);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_task_waiting_for_a_shared_cache_wakes_when_its_list_is_in() {
        let shared = Shared::<Pod>::new();
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let cache = shared.cache();
                tokio::spawn(async move { cache.ready().await })
            })
            .collect();
        let cache = shared.cache();
        assert!(!cache.is_ready());
        let (events, rx) = mpsc::unbounded();
        tokio::spawn(shared.feed(rx));
        // Let every waiter register before the list completes.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        events.unbounded_send(Ok(watcher::Event::Init)).unwrap();
        events.unbounded_send(Ok(watcher::Event::InitDone)).unwrap();
        for w in waiters {
            tokio::time::timeout(std::time::Duration::from_secs(5), w)
                .await
                .expect("a waiter slept through the list")
                .unwrap();
        }
        assert!(cache.is_ready());
    }

    #[tokio::test]
    async fn observers_hear_of_every_touched_object_before_any_subscriber() {
        let mut shared = Shared::<Pod>::new();
        let store = shared.store();
        let heard: Arc<std::sync::Mutex<Vec<(String, bool, bool)>>> = Default::default();
        let h = heard.clone();
        let s2 = store.clone();
        shared.observe(Box::new(move |p: &Pod, present| {
            // What the cache says at that moment: the object is (or is no longer) in it.
            let cached = s2.get(&ObjectRef::from_obj(p)).is_some();
            h.lock().unwrap().push((p.name_any(), present, cached));
        }));
        let mut down = shared.subscribe();
        let (events, rx) = mpsc::unbounded();
        tokio::spawn(shared.feed(rx));
        let send = |e: watcher::Event<Pod>| events.unbounded_send(Ok(e)).unwrap();
        send(watcher::Event::Init);
        send(watcher::Event::InitApply(pod("web", "v1")));
        send(watcher::Event::InitDone);
        let _ = down.next().await.unwrap();
        assert_eq!(*heard.lock().unwrap(), [("web".to_owned(), true, true)]);
        send(watcher::Event::Apply(pod("db", "v1")));
        send(watcher::Event::Delete(pod("web", "v1")));
        let _ = down.next().await.unwrap();
        let _ = down.next().await.unwrap();
        // A relist that no longer has "db": it is heard of as gone.
        send(watcher::Event::Init);
        send(watcher::Event::InitDone);
        let _ = down.next().await.unwrap();
        assert_eq!(
            *heard.lock().unwrap(),
            [
                ("web".to_owned(), true, true),
                ("db".to_owned(), true, true),
                ("web".to_owned(), false, false),
                ("db".to_owned(), false, false),
            ]
        );
    }

    #[tokio::test]
    async fn every_subscriber_sees_each_touched_object_once_the_cache_reflects_it() {
        let mut shared = Shared::<Pod>::new();
        let store = shared.store();
        let mut down = shared.subscribe();
        let mut gc = shared.subscribe();
        let (events, rx) = mpsc::unbounded();
        tokio::spawn(shared.feed(rx));
        let key = |name: &str| ObjectRef::<Pod>::new(name).within("a");
        let send = |e: watcher::Event<Pod>| events.unbounded_send(Ok(e)).unwrap();

        // The first list: its objects come once the cache holds all of them, slimmed.
        send(watcher::Event::Init);
        send(watcher::Event::InitApply(pod("web", "v1")));
        send(watcher::Event::InitApply(pod("db", "v1")));
        send(watcher::Event::InitDone);
        let mut listed: Vec<String> = Vec::new();
        for _ in 0..2 {
            let p = down.next().await.unwrap();
            assert!(p.managed_fields().is_empty());
            assert!(store.get(&key(&p.name_any())).is_some());
            listed.push(p.name_any());
        }
        listed.sort();
        assert_eq!(listed, ["db", "web"]);

        // An update: handed on after the cache has it.
        send(watcher::Event::Apply(pod("web", "v2")));
        let p = down.next().await.unwrap();
        assert_eq!(p.labels()["app"], "v2");
        assert_eq!(store.get(&key("web")).unwrap().labels()["app"], "v2");

        // A deletion reaches subscribers too (kube-runtime's shared streams drop them).
        send(watcher::Event::Delete(pod("web", "v2")));
        let p = down.next().await.unwrap();
        assert_eq!(p.name_any(), "web");
        assert!(store.get(&key("web")).is_none());

        // A relist after the watch was down: "db" was deleted meanwhile, "api" created.
        send(watcher::Event::Init);
        send(watcher::Event::InitApply(pod("api", "v1")));
        send(watcher::Event::InitDone);
        let mut relisted = Vec::new();
        for _ in 0..2 {
            let p = down.next().await.unwrap();
            relisted.push((p.name_any(), store.get(&key(&p.name_any())).is_some()));
        }
        relisted.sort();
        assert_eq!(
            relisted,
            [("api".to_owned(), true), ("db".to_owned(), false)],
            "the new object is cached, the vanished one is handed on as gone"
        );

        // The other subscriber saw the same sequence.
        let mut seen = Vec::new();
        for _ in 0..6 {
            seen.push(gc.next().await.unwrap().name_any());
        }
        assert_eq!(seen.len(), 6);
        assert_eq!(seen[2..4], ["web", "web"]);
    }
}
