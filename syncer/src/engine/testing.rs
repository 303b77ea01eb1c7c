//! Test support: an engine whose clients reach no apiserver, and the spans a reconciler opens
//! (so tests can check what a reconcile's logs are tagged with without a cluster).

use super::{Engine, Side, Synced};
use crate::engine::shared::Shared;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt as _};
use vcp_core::naming::TenantKey;

/// An engine for tenant `demo` whose clients point at a closed port: every request fails
/// at once, so a reconciler runs up to its first call and returns an error.
pub fn offline_engine() -> Arc<Engine> {
    let config = kube::Config::new("http://127.0.0.1:9".parse().expect("a URL"));
    let client = kube::Client::try_from(config).expect("a client");
    Arc::new(Engine::new(
        client.clone(),
        client,
        TenantKey::new("demo").expect("a key"),
        Default::default(),
        Default::default(),
    ))
}

/// Empty, unlisted caches of `K` on both sides of `engine`, and the kind's own state as new.
pub fn side<K: Synced>(engine: &Arc<Engine>) -> Arc<Side<K>>
where
    K::Own: Default,
{
    Arc::new(Side {
        engine: engine.clone(),
        own: Default::default(),
        tenant: Shared::<K>::new().cache(),
        host: Shared::<K::Host>::new().cache(),
    })
}

/// An object of kind `K` from JSON.
pub fn obj<K: serde::de::DeserializeOwned>(v: serde_json::Value) -> Arc<K> {
    Arc::new(serde_json::from_value(v).expect("an object"))
}

/// A span as it was opened: its name and fields (Display and Debug values as text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opened {
    pub name: &'static str,
    pub fields: BTreeMap<String, String>,
}

/// The spans opened while `f` runs (for at most half a second: a span opens on the first
/// poll, and a reconciler that waits for a cache would wait forever; what it returns is
/// dropped).
pub async fn spans_of<F: Future>(f: F) -> Vec<Opened> {
    let opened = Arc::new(Mutex::new(Vec::new()));
    let subscriber = tracing_subscriber::registry().with(Record(opened.clone()));
    {
        let _default = tracing::subscriber::set_default(subscriber);
        let _ = tokio::time::timeout(Duration::from_millis(500), f).await;
    }
    opened.lock().expect("not poisoned").clone()
}

/// The first span named `name`, with the fields the test looks at.
pub fn span<'a>(spans: &'a [Opened], name: &str) -> Option<&'a BTreeMap<String, String>> {
    spans.iter().find(|s| s.name == name).map(|s| &s.fields)
}

/// Fields as a test writes them.
pub fn fields(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

struct Record(Arc<Mutex<Vec<Opened>>>);

impl<S: tracing::Subscriber> Layer<S> for Record {
    fn on_new_span(&self, attrs: &Attributes<'_>, _id: &Id, _cx: Context<'_, S>) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        self.0.lock().expect("not poisoned").push(Opened {
            name: attrs.metadata().name(),
            fields: fields.0,
        });
    }
}

#[derive(Default)]
struct Fields(BTreeMap<String, String>);

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}
