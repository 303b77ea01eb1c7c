//! Host watches one namespace at a time, merged into the stream one cluster-wide watch would
//! give.
//!
//! A syncer's host credentials reach only its own tenant's host namespaces (a RoleBinding in
//! each, see [`crate::kinds::namespaces::access`]), so it cannot list or watch a kind across the cluster. For each
//! host kind it runs one watch per host namespace of the tenant, started and stopped as the
//! set of those namespaces changes (published by the namespace controllers, see
//! [`super::Engine::host_namespace_set`]), and [`Merge`] turns their events into one stream for
//! [`super::shared::Shared`]:
//! - the first complete picture (every namespace known at the start listed once) becomes one
//!   `Init`..`InitDone`, so the cache turns ready when a cluster-wide list would have;
//! - a later relist of one namespace (its watch reconnected) becomes `Apply` for what it holds
//!   and `Delete` for what the cache holds there and the relist no longer has;
//! - a namespace that goes takes its cached objects with it (a `Delete` each).
//!
//! A namespace whose first list fails (its RoleBinding not in force yet, say) counts as listed
//! empty for readiness, so one broken namespace never holds up the whole syncer; its watch
//! retries with backoff, and its objects arrive as `Apply` once a list succeeds.
//!
//! [`Merge`] is pure (it reads the cache only through the closure it is given); [`stream`]
//! runs the watches. The merged stream is pulled by the cache's feed, which applies each event
//! before it pulls the next, so the cache [`Merge`] reads is never behind what it emitted.

use futures::{Stream, StreamExt};
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::fmt::Debug;
use std::sync::Arc;
use tokio::sync::{mpsc, watch};
use tokio::task::{AbortHandle, JoinSet};

/// Drops what the syncer never reads from an object before it is cached: managed fields
/// (a list of every writer's field set, often the larger part of an object's metadata).
pub fn slim<K: Resource>(obj: &mut K) {
    obj.meta_mut().managed_fields = None;
}

/// The tenant's host namespaces; `None` until the namespace watch has listed them once.
pub type NamespaceSet = Option<BTreeSet<String>>;

/// Merges per-namespace watch events into one cluster-wide-looking stream (see the module
/// docs). `cached(ns)` answers what the cache holds in `ns`.
#[derive(Debug)]
pub struct Merge<K> {
    /// The namespaces watched now.
    namespaces: BTreeSet<String>,
    /// The namespace set has arrived once.
    known: bool,
    /// The first complete picture has been emitted.
    started: bool,
    /// Before that: namespaces whose first list is awaited.
    pending: BTreeSet<String>,
    /// Before that: what each namespace holds, by name.
    initial: BTreeMap<String, BTreeMap<String, K>>,
    /// After that: relists under way, per namespace.
    relisting: HashMap<String, Vec<K>>,
}

impl<K> Default for Merge<K> {
    fn default() -> Self {
        Merge {
            namespaces: BTreeSet::new(),
            known: false,
            started: false,
            pending: BTreeSet::new(),
            initial: BTreeMap::new(),
            relisting: HashMap::new(),
        }
    }
}

/// What a change of the namespace set asks of the watches.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Watches {
    pub start: Vec<String>,
    pub stop: Vec<String>,
}

impl<K: Resource + Clone> Merge<K> {
    /// The namespace set changed: which watches to start and stop, and the events that
    /// follow (the objects of namespaces gone; the first picture, if that was all it awaited).
    pub fn namespaces(
        &mut self,
        set: &BTreeSet<String>,
        cached: impl Fn(&str) -> Vec<K>,
        out: &mut VecDeque<watcher::Event<K>>,
    ) -> Watches {
        let start: Vec<String> = set.difference(&self.namespaces).cloned().collect();
        let stop: Vec<String> = self.namespaces.difference(set).cloned().collect();
        for ns in &stop {
            self.pending.remove(ns);
            self.initial.remove(ns);
            self.relisting.remove(ns);
            if self.started {
                out.extend(cached(ns).into_iter().map(watcher::Event::Delete));
            }
        }
        if !self.started {
            self.pending.extend(start.iter().cloned());
        }
        self.namespaces = set.clone();
        self.known = true;
        self.maybe_start(out);
        Watches { start, stop }
    }

    /// An event of the watch of `ns`.
    pub fn event(
        &mut self,
        ns: &str,
        event: watcher::Event<K>,
        cached: impl Fn(&str) -> Vec<K>,
        out: &mut VecDeque<watcher::Event<K>>,
    ) {
        if !self.namespaces.contains(ns) {
            return; // a watch stopped after it sent this
        }
        if !self.started {
            let objects = self.initial.entry(ns.to_owned()).or_default();
            match event {
                watcher::Event::Init => objects.clear(),
                watcher::Event::InitApply(o) | watcher::Event::Apply(o) => {
                    objects.insert(o.name_any(), o);
                }
                watcher::Event::Delete(o) => {
                    objects.remove(&o.name_any());
                }
                watcher::Event::InitDone => {
                    self.pending.remove(ns);
                    self.maybe_start(out);
                }
            }
            return;
        }
        match event {
            watcher::Event::Init => {
                self.relisting.insert(ns.to_owned(), Vec::new());
            }
            watcher::Event::InitApply(o) => match self.relisting.get_mut(ns) {
                Some(objects) => objects.push(o),
                None => out.push_back(watcher::Event::Apply(o)),
            },
            watcher::Event::InitDone => {
                let listed = self.relisting.remove(ns).unwrap_or_default();
                let names: BTreeSet<String> = listed.iter().map(|o| o.name_any()).collect();
                out.extend(
                    cached(ns)
                        .into_iter()
                        .filter(|o| !names.contains(&o.name_any()))
                        .map(watcher::Event::Delete),
                );
                out.extend(listed.into_iter().map(watcher::Event::Apply));
            }
            e @ (watcher::Event::Apply(_) | watcher::Event::Delete(_)) => out.push_back(e),
        }
    }

    /// The watch of `ns` failed. Before the first picture, a namespace whose list fails counts
    /// as listed (with what it had so far), so it cannot hold the cache back.
    pub fn failed(&mut self, ns: &str, out: &mut VecDeque<watcher::Event<K>>) {
        if !self.started && self.pending.remove(ns) {
            self.maybe_start(out);
        }
    }

    fn maybe_start(&mut self, out: &mut VecDeque<watcher::Event<K>>) {
        if self.started || !self.known || !self.pending.is_empty() {
            return;
        }
        self.started = true;
        out.push_back(watcher::Event::Init);
        for objects in std::mem::take(&mut self.initial).into_values() {
            out.extend(objects.into_values().map(watcher::Event::InitApply));
        }
        out.push_back(watcher::Event::InitDone);
    }
}

/// What a namespace's watch task reports: its namespace, its generation (a namespace that goes
/// and comes back gets a new watch; the old one's late events are dropped) and the event.
type Report<K> = (String, u64, watcher::Result<watcher::Event<K>>);

struct Runner<K: Resource + Clone> {
    client: Client,
    config: watcher::Config,
    namespaces: watch::Receiver<NamespaceSet>,
    tx: mpsc::Sender<Report<K>>,
    rx: mpsc::Receiver<Report<K>>,
    tasks: JoinSet<()>,
    watching: HashMap<String, (u64, AbortHandle)>,
    generation: u64,
    merge: Merge<K>,
    out: VecDeque<watcher::Event<K>>,
    cached: Cached<K>,
}

/// A kind a host watch per namespace can carry.
pub trait Namespaced:
    Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
    + Clone
    + Debug
    + DeserializeOwned
    + Send
    + 'static
{
}

impl<K> Namespaced for K where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + Debug
        + DeserializeOwned
        + Send
        + 'static
{
}

/// What the cache holds in a namespace.
type Cached<K> = Box<dyn Fn(&str) -> Vec<K> + Send>;

/// The merged stream of `K` in every namespace of `namespaces`, each watched with `config`.
/// `cached(ns)` must answer from the cache this stream feeds.
pub fn stream<K>(
    client: Client,
    config: watcher::Config,
    namespaces: watch::Receiver<NamespaceSet>,
    cached: impl Fn(&str) -> Vec<K> + Send + 'static,
) -> impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send
where
    K: Namespaced + Sync,
{
    let (tx, rx) = mpsc::channel(256);
    let runner = Runner {
        client,
        config,
        namespaces,
        tx,
        rx,
        tasks: JoinSet::new(),
        watching: HashMap::new(),
        generation: 0,
        merge: Merge::default(),
        out: VecDeque::new(),
        cached: Box::new(cached),
    };
    futures::stream::unfold(runner, |mut r| async move {
        loop {
            if let Some(e) = r.out.pop_front() {
                return Some((Ok(e), r));
            }
            r.step().await?;
        }
    })
}

impl<K> Runner<K>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + Debug
        + DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    /// Waits for the next namespace change or watch event and merges it; `None` once the
    /// namespace set is gone (the syncer is stopping).
    async fn step(&mut self) -> Option<()> {
        // The set as it is when the stream starts counts, not only later changes.
        if !self.merge.known && self.namespaces.borrow().is_some() {
            self.namespaces_changed();
            return Some(());
        }
        tokio::select! {
            changed = self.namespaces.changed() => {
                changed.ok()?;
                self.namespaces_changed();
            }
            Some((ns, generation, event)) = self.rx.recv() => {
                if self.watching.get(&ns).is_some_and(|(g, _)| *g == generation) {
                    match event {
                        Ok(e) => self.merge.event(&ns, e, &self.cached, &mut self.out),
                        Err(err) => {
                            tracing::warn!(kind = %K::kind(&()), ns = %ns, error = %err, "host watch failed; retrying");
                            self.merge.failed(&ns, &mut self.out);
                        }
                    }
                }
            }
        }
        Some(())
    }

    fn namespaces_changed(&mut self) {
        let Some(set) = self.namespaces.borrow_and_update().clone() else {
            return;
        };
        let w = self.merge.namespaces(&set, &self.cached, &mut self.out);
        for ns in w.stop {
            if let Some((_, task)) = self.watching.remove(&ns) {
                task.abort();
            }
        }
        for ns in w.start {
            self.start(ns);
        }
        // Reap finished (aborted) tasks so the set does not grow with namespace churn.
        while self.tasks.try_join_next().is_some() {}
    }

    fn start(&mut self, ns: String) {
        self.generation += 1;
        let generation = self.generation;
        let api: Api<K> = Api::namespaced(self.client.clone(), &ns);
        let events = watcher(api, self.config.clone())
            .default_backoff()
            .modify(slim);
        let tx = self.tx.clone();
        let name = ns.clone();
        let task = self.tasks.spawn(async move {
            let mut events = std::pin::pin!(events);
            while let Some(e) = events.next().await {
                if tx.send((name.clone(), generation, e)).await.is_err() {
                    return; // the merged stream is gone
                }
            }
        });
        self.watching.insert(ns, (generation, task));
    }
}

/// Keeps one watch of `K` (selected by `cfg`) running per host namespace of the tenant,
/// following the set the namespace controllers publish, and sends every object it lists or
/// sees change to `tx`; for loops that act on each host object as it comes (Events up, pod
/// certificate requests) and keep no cache of their own. The watch tasks live in a
/// `JoinSet`, so they end with this future.
pub async fn each_namespace<K: Namespaced>(
    e: Arc<super::Engine>,
    cfg: watcher::Config,
    tx: mpsc::Sender<K>,
) {
    let mut tasks = JoinSet::new();
    let mut watching: HashMap<String, AbortHandle> = HashMap::new();
    let mut set = e.host_namespace_set.subscribe();
    loop {
        let namespaces: BTreeSet<String> =
            set.borrow_and_update().iter().flatten().cloned().collect();
        watching.retain(|ns, task| {
            let keep = namespaces.contains(ns);
            if !keep {
                tracing::debug!(ns = %ns, kind = K::kind(&()).as_ref(), "host namespace gone; stopped watching");
                task.abort();
            }
            keep
        });
        for ns in namespaces {
            if let std::collections::hash_map::Entry::Vacant(slot) = watching.entry(ns) {
                let ns = slot.key().clone();
                tracing::debug!(ns = %ns, kind = K::kind(&()).as_ref(), "watching host namespace");
                let api = Api::<K>::namespaced(e.host.clone(), &ns);
                slot.insert(tasks.spawn(forward(api, ns, cfg.clone(), tx.clone())));
            }
        }
        // Reap finished (aborted) tasks so the set does not grow with namespace churn.
        while tasks.try_join_next().is_some() {}
        if set.changed().await.is_err() {
            return; // the engine is gone
        }
    }
}

/// Sends every object of one host namespace (listed, then watched) to `tx`.
async fn forward<K>(api: Api<K>, ns: String, cfg: watcher::Config, tx: mpsc::Sender<K>)
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + 'static,
{
    let mut objects = watcher(api, cfg)
        .default_backoff()
        .applied_objects()
        .boxed();
    while let Some(r) = objects.next().await {
        match r {
            Ok(o) => {
                if tx.send(o).await.is_err() {
                    return; // the receiver is gone: the syncer is stopping
                }
            }
            Err(err) => tracing::warn!(ns = %ns, error = %err, "host watch failed; retrying"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::reflector::{self, Store};
    use proptest::prelude::*;

    fn cm(ns: &str, name: &str, v: &str) -> ConfigMap {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": ns}, "data": {"v": v}
        }))
        .unwrap()
    }

    /// A merge feeding a real reflector store, as `Shared` does.
    struct Fed {
        merge: Merge<ConfigMap>,
        store: Store<ConfigMap>,
        writer: reflector::store::Writer<ConfigMap>,
        seen: Vec<String>,
    }

    impl Fed {
        fn new() -> Fed {
            let (store, writer) = reflector::store();
            Fed {
                merge: Merge::default(),
                store,
                writer,
                seen: Vec::new(),
            }
        }

        fn drain(&mut self, out: VecDeque<watcher::Event<ConfigMap>>) {
            for e in out {
                self.seen.push(match &e {
                    watcher::Event::Init => "Init".into(),
                    watcher::Event::InitDone => "InitDone".into(),
                    watcher::Event::InitApply(o) => format!("InitApply {}", key(o)),
                    watcher::Event::Apply(o) => format!("Apply {}", key(o)),
                    watcher::Event::Delete(o) => format!("Delete {}", key(o)),
                });
                self.writer.apply_watcher_event(&e);
            }
        }

        fn namespaces(&mut self, set: &[&str]) -> Watches {
            let set = set.iter().map(|s| s.to_string()).collect();
            let store = self.store.clone();
            let mut out = VecDeque::new();
            let w = self.merge.namespaces(&set, in_store(store), &mut out);
            self.drain(out);
            w
        }

        fn event(&mut self, ns: &str, e: watcher::Event<ConfigMap>) {
            let store = self.store.clone();
            let mut out = VecDeque::new();
            self.merge.event(ns, e, in_store(store), &mut out);
            self.drain(out);
        }

        fn failed(&mut self, ns: &str) {
            let mut out = VecDeque::new();
            self.merge.failed(ns, &mut out);
            self.drain(out);
        }

        fn cached(&self) -> Vec<String> {
            let mut v: Vec<String> = self
                .store
                .state()
                .iter()
                .map(|o| format!("{}={}", key(o.as_ref()), o.data.as_ref().unwrap()["v"]))
                .collect();
            v.sort();
            v
        }

        fn take(&mut self) -> Vec<String> {
            std::mem::take(&mut self.seen)
        }
    }

    fn key(o: &ConfigMap) -> String {
        format!("{}/{}", o.namespace().unwrap(), o.name_any())
    }

    fn in_store(store: Store<ConfigMap>) -> impl Fn(&str) -> Vec<ConfigMap> {
        move |ns: &str| {
            store
                .state()
                .iter()
                .filter(|o| o.namespace().as_deref() == Some(ns))
                .map(|o| o.as_ref().clone())
                .collect()
        }
    }

    fn list(fed: &mut Fed, ns: &str, objects: &[ConfigMap]) {
        fed.event(ns, watcher::Event::Init);
        for o in objects {
            fed.event(ns, watcher::Event::InitApply(o.clone()));
        }
        fed.event(ns, watcher::Event::InitDone);
    }

    #[test]
    fn the_first_picture_waits_for_every_namespace_known_at_the_start() {
        let mut fed = Fed::new();
        let w = fed.namespaces(&["t-a", "t-b"]);
        assert_eq!(w.start, ["t-a", "t-b"]);
        list(&mut fed, "t-a", &[cm("t-a", "x", "1")]);
        // An update in a listed namespace before the picture is complete is part of it.
        fed.event("t-a", watcher::Event::Apply(cm("t-a", "x", "2")));
        assert!(fed.take().is_empty(), "nothing until t-b is listed");
        list(&mut fed, "t-b", &[cm("t-b", "y", "1")]);
        assert_eq!(
            fed.take(),
            ["Init", "InitApply t-a/x", "InitApply t-b/y", "InitDone"]
        );
        assert_eq!(fed.cached(), ["t-a/x=2", "t-b/y=1"]);
    }

    #[test]
    fn no_namespace_at_all_is_a_complete_empty_picture() {
        let mut fed = Fed::new();
        fed.event("t-a", watcher::Event::Init);
        assert!(
            fed.take().is_empty(),
            "events before the namespace set count for nothing"
        );
        fed.namespaces(&[]);
        assert_eq!(fed.take(), ["Init", "InitDone"]);
    }

    #[test]
    fn a_namespace_whose_first_list_fails_does_not_hold_the_picture_back() {
        let mut fed = Fed::new();
        fed.namespaces(&["t-a", "t-b"]);
        list(&mut fed, "t-a", &[cm("t-a", "x", "1")]);
        fed.failed("t-b");
        assert_eq!(fed.take(), ["Init", "InitApply t-a/x", "InitDone"]);
        // Its list succeeds later: its objects arrive as they would from a relist.
        list(&mut fed, "t-b", &[cm("t-b", "y", "1")]);
        assert_eq!(fed.take(), ["Apply t-b/y"]);
        assert_eq!(fed.cached(), ["t-a/x=1", "t-b/y=1"]);
    }

    #[test]
    fn a_relist_of_one_namespace_touches_only_that_namespace() {
        let mut fed = Fed::new();
        fed.namespaces(&["t-a", "t-b"]);
        list(
            &mut fed,
            "t-a",
            &[cm("t-a", "x", "1"), cm("t-a", "gone", "1")],
        );
        list(&mut fed, "t-b", &[cm("t-b", "x", "1")]);
        fed.take();
        // t-a's watch reconnects: "gone" was deleted meanwhile, "x" changed, "new" appeared.
        list(
            &mut fed,
            "t-a",
            &[cm("t-a", "x", "2"), cm("t-a", "new", "1")],
        );
        assert_eq!(
            fed.take(),
            ["Delete t-a/gone", "Apply t-a/x", "Apply t-a/new"]
        );
        assert_eq!(fed.cached(), ["t-a/new=1", "t-a/x=2", "t-b/x=1"]);
    }

    #[test]
    fn namespaces_come_and_go_with_their_objects() {
        let mut fed = Fed::new();
        fed.namespaces(&["t-a"]);
        list(&mut fed, "t-a", &[cm("t-a", "x", "1")]);
        fed.take();
        let w = fed.namespaces(&["t-a", "t-b"]);
        assert_eq!(
            w,
            Watches {
                start: vec!["t-b".into()],
                stop: vec![]
            }
        );
        list(&mut fed, "t-b", &[cm("t-b", "y", "1")]);
        fed.event("t-b", watcher::Event::Apply(cm("t-b", "z", "1")));
        assert_eq!(fed.take(), ["Apply t-b/y", "Apply t-b/z"]);
        let w = fed.namespaces(&["t-b"]);
        assert_eq!(
            w,
            Watches {
                start: vec![],
                stop: vec!["t-a".into()]
            }
        );
        assert_eq!(fed.take(), ["Delete t-a/x"]);
        // A late event of the stopped watch changes nothing.
        fed.event("t-a", watcher::Event::Apply(cm("t-a", "late", "1")));
        assert!(fed.take().is_empty());
        assert_eq!(fed.cached(), ["t-b/y=1", "t-b/z=1"]);
    }

    #[test]
    fn a_namespace_that_goes_before_its_first_list_is_not_awaited() {
        let mut fed = Fed::new();
        fed.namespaces(&["t-a", "t-b"]);
        list(&mut fed, "t-a", &[]);
        fed.event("t-b", watcher::Event::InitApply(cm("t-b", "y", "1")));
        fed.namespaces(&["t-a"]);
        assert_eq!(fed.take(), ["Init", "InitDone"]);
        assert!(fed.cached().is_empty());
    }

    /// One namespace's watch as the watcher reports it: lists (complete or cut off by an
    /// error) and single changes, over a handful of names.
    #[derive(Debug, Clone)]
    enum Step {
        List(u8, Vec<(u8, u8)>),
        Apply(u8, u8, u8),
        Delete(u8, u8),
        Fail(u8),
        Namespaces(Vec<u8>),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (0..3u8, prop::collection::vec((0..4u8, 0..9u8), 0..4))
                .prop_map(|(n, o)| Step::List(n, o)),
            (0..3u8, 0..4u8, 0..9u8).prop_map(|(n, o, v)| Step::Apply(n, o, v)),
            (0..3u8, 0..4u8).prop_map(|(n, o)| Step::Delete(n, o)),
            (0..3u8).prop_map(Step::Fail),
            prop::collection::vec(0..3u8, 0..3).prop_map(Step::Namespaces),
        ]
    }

    proptest! {
        /// Once the first picture is out, the cache equals what the namespaces' watches say
        /// they hold, restricted to the namespaces watched: exactly what one cluster-wide
        /// watch over those namespaces would have cached.
        #[test]
        fn the_cache_is_what_the_watched_namespaces_hold(steps in prop::collection::vec(step(), 0..40)) {
            let ns = |n: u8| format!("t-{n}");
            let mut fed = Fed::new();
            // What each namespace's apiserver holds, as its watch last reported it.
            let mut truth: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
            let mut watched: BTreeSet<String> = BTreeSet::new();
            // Namespaces whose watch has completed a list since it started.
            let mut listed: BTreeSet<String> = BTreeSet::new();
            for s in steps {
                match s {
                    Step::Namespaces(set) => {
                        let set: BTreeSet<String> = set.into_iter().map(ns).collect();
                        let v: Vec<&str> = set.iter().map(String::as_str).collect();
                        fed.namespaces(&v);
                        for gone in watched.difference(&set) {
                            truth.remove(gone);
                            listed.remove(gone);
                        }
                        watched = set;
                    }
                    Step::List(n, objects) => {
                        let n = ns(n);
                        let objects: BTreeMap<String, String> = objects.into_iter().map(|(o, v)| (format!("o{o}"), v.to_string())).collect();
                        let cms: Vec<ConfigMap> = objects.iter().map(|(o, v)| cm(&n, o, v)).collect();
                        list(&mut fed, &n, &cms);
                        if watched.contains(&n) {
                            truth.insert(n.clone(), objects);
                            listed.insert(n);
                        }
                    }
                    Step::Apply(n, o, v) => {
                        let n = ns(n);
                        // A watch reports changes only after its list.
                        if listed.contains(&n) {
                            fed.event(&n, watcher::Event::Apply(cm(&n, &format!("o{o}"), &v.to_string())));
                            truth.entry(n).or_default().insert(format!("o{o}"), v.to_string());
                        }
                    }
                    Step::Delete(n, o) => {
                        let n = ns(n);
                        if listed.contains(&n) {
                            fed.event(&n, watcher::Event::Delete(cm(&n, &format!("o{o}"), "0")));
                            truth.entry(n).or_default().remove(&format!("o{o}"));
                        }
                    }
                    Step::Fail(n) => fed.failed(&ns(n)),
                }
            }
            if !fed.merge.started {
                prop_assert!(fed.cached().is_empty(), "a cache before its first picture is empty");
                return Ok(());
            }
            let mut want: Vec<String> = truth
                .iter()
                .filter(|(n, _)| listed.contains(*n))
                .flat_map(|(n, objects)| objects.iter().map(move |(o, v)| format!("{n}/{o}={v}")))
                .collect();
            want.sort();
            prop_assert_eq!(fed.cached(), want);
        }
    }
}
