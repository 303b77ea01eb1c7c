//! Which tenant ConfigMaps and Secrets the tenant's pods reference, kept beside the pod cache.
//!
//! Tenant pod watch -> [`PodRefs::observe`] (an observer of the pod cache, so it is current
//! before any reconcile hears of the pod) -> [`PodRefs::referenced`], which the ConfigMap and
//! Secret controllers ask on every pass. Asked of the pod cache instead, the question cost a
//! scan of every tenant pod (and a set of references built for each), once per ConfigMap or
//! Secret reconcile: pods times objects on a resync. Here it is one hash lookup, and a pod
//! change costs its own references only.

use std::collections::{BTreeSet, HashMap};

/// What one pod references: (configmaps, secrets).
pub type Refs = (BTreeSet<String>, BTreeSet<String>);

/// The references of every tenant pod the watch holds, and how many pods reference each
/// ConfigMap and Secret.
#[derive(Debug, Default)]
pub struct PodRefs {
    /// (namespace, pod name) -> what it references.
    by_pod: HashMap<(String, String), Refs>,
    /// (namespace, is a Secret, name) -> how many pods reference it (never 0: removed).
    counts: HashMap<(String, bool, String), usize>,
}

impl PodRefs {
    /// Records pod `ns`/`name` as present with `refs`, or as gone (`None`). Idempotent: a
    /// relist tells every pod again.
    pub fn observe(&mut self, ns: &str, name: &str, refs: Option<Refs>) {
        let key = (ns.to_owned(), name.to_owned());
        if let Some((cms, secrets)) = self.by_pod.remove(&key) {
            self.count(ns, &cms, &secrets, false);
        }
        if let Some((cms, secrets)) = refs {
            self.count(ns, &cms, &secrets, true);
            if !(cms.is_empty() && secrets.is_empty()) {
                self.by_pod.insert(key, (cms, secrets));
            }
        }
    }

    fn count(&mut self, ns: &str, cms: &BTreeSet<String>, secrets: &BTreeSet<String>, add: bool) {
        let all = cms
            .iter()
            .map(|n| (false, n))
            .chain(secrets.iter().map(|n| (true, n)));
        for (secret, n) in all {
            let k = (ns.to_owned(), secret, n.clone());
            if add {
                *self.counts.entry(k).or_default() += 1;
            } else if let Some(c) = self.counts.get_mut(&k) {
                *c -= 1;
                if *c == 0 {
                    self.counts.remove(&k);
                }
            }
        }
    }

    /// Whether a pod in `ns` references ConfigMap (`secret == false`) or Secret `name`.
    pub fn referenced(&self, ns: &str, name: &str, secret: bool) -> bool {
        // Borrowed lookup without building the owned key each time would need a custom
        // Borrow impl; the key is three short strings.
        self.counts
            .contains_key(&(ns.to_owned(), secret, name.to_owned()))
    }

    /// Pods with at least one reference (for tests and metrics).
    pub fn pods(&self) -> usize {
        self.by_pod.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn refs(cms: &[u8], secrets: &[u8]) -> Refs {
        (
            cms.iter().map(|c| format!("c{c}")).collect(),
            secrets.iter().map(|s| format!("s{s}")).collect(),
        )
    }

    proptest! {
        /// After any sequence of pods appearing, changing and going (repeats included, as a
        /// relist tells them), the index answers as a scan of the pods present would.
        #[test]
        fn the_index_answers_as_a_scan_of_the_pods_would(
            ops in prop::collection::vec(
                (0u8..2, 0u8..6, prop::option::of((
                    prop::collection::vec(0u8..4, 0..3),
                    prop::collection::vec(0u8..4, 0..3),
                ))),
                0..60,
            )
        ) {
            let mut index = PodRefs::default();
            let mut pods: HashMap<(String, String), Refs> = HashMap::new();
            for (ns, pod, r) in ops {
                let (ns, pod) = (format!("n{ns}"), format!("p{pod}"));
                let r = r.map(|(c, s)| refs(&c, &s));
                index.observe(&ns, &pod, r.clone());
                match r {
                    Some(r) => { pods.insert((ns, pod), r); }
                    None => { pods.remove(&(ns, pod)); }
                }
            }
            for ns in ["n0", "n1"] {
                for i in 0..4 {
                    for secret in [false, true] {
                        let name = if secret { format!("s{i}") } else { format!("c{i}") };
                        let scan = pods.iter().any(|((n, _), (c, s))| {
                            n == ns && if secret { s.contains(&name) } else { c.contains(&name) }
                        });
                        prop_assert_eq!(index.referenced(ns, &name, secret), scan, "{} {}", ns, name);
                    }
                }
            }
            prop_assert_eq!(
                index.pods(),
                pods.values().filter(|(c, s)| !(c.is_empty() && s.is_empty())).count()
            );
        }
    }

    #[test]
    fn a_configmap_and_a_secret_of_one_name_are_apart() {
        let mut index = PodRefs::default();
        index.observe("a", "p", Some(refs(&[1], &[])));
        assert!(index.referenced("a", "c1", false));
        assert!(!index.referenced("a", "c1", true));
        assert!(!index.referenced("b", "c1", false));
        index.observe("a", "p", None);
        assert!(!index.referenced("a", "c1", false));
        assert_eq!(index.pods(), 0);
    }
}
