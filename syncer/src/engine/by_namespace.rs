//! The names of a cached kind's objects, by namespace, kept beside the cache.
//!
//! A kind's tenant watch -> [`ByNamespace::observe`] (an observer of the shared cache, so it is
//! current before any reconcile hears of the object) -> [`ByNamespace::names`], which a
//! question about one namespace ("the policies of `ns`", "the pods of `ns`") reads instead of
//! scanning every object of the tenant. The objects themselves stay in the cache: this holds
//! names only.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

/// Namespace -> names of the objects the watch holds there.
#[derive(Debug, Default)]
pub struct ByNamespace {
    inner: Mutex<HashMap<String, BTreeSet<String>>>,
}

impl ByNamespace {
    /// Records object `ns`/`name` as present or gone. Idempotent: a relist tells every object
    /// again.
    pub fn observe(&self, ns: &str, name: &str, present: bool) {
        let mut m = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if present {
            m.entry(ns.to_owned()).or_default().insert(name.to_owned());
        } else if let Some(names) = m.get_mut(ns) {
            names.remove(name);
            if names.is_empty() {
                m.remove(ns);
            }
        }
    }

    /// The names held in `ns`, sorted.
    pub fn names(&self, ns: &str) -> Vec<String> {
        let m = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        m.get(ns)
            .map(|n| n.iter().cloned().collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// After any sequence of objects appearing and going (repeats included), each
        /// namespace's names are those a scan of the objects present would find.
        #[test]
        fn names_are_what_a_scan_would_find(
            ops in prop::collection::vec((0u8..3, 0u8..5, any::<bool>()), 0..80)
        ) {
            let index = ByNamespace::default();
            let mut present = BTreeSet::new();
            for (ns, name, here) in ops {
                let (ns, name) = (format!("n{ns}"), format!("o{name}"));
                index.observe(&ns, &name, here);
                if here { present.insert((ns, name)); } else { present.remove(&(ns, name)); }
            }
            for ns in ["n0", "n1", "n2", "n3"] {
                let scan: Vec<String> = present
                    .iter()
                    .filter(|(n, _)| n == ns)
                    .map(|(_, o)| o.clone())
                    .collect();
                prop_assert_eq!(index.names(ns), scan);
            }
            prop_assert_eq!(
                index.inner.lock().unwrap().len(),
                present.iter().map(|(n, _)| n).collect::<BTreeSet<_>>().len(),
                "no empty namespace is kept"
            );
        }
    }
}
