//! Which tenant Services get host NodePorts, kept beside the tenant Service cache so a
//! reconcile looks its verdict up instead of recounting.
//!
//! The plan admits NodePort and LoadBalancer Services in creation order
//! (`vcp_policy::services::admitted`), so one Service's verdict depends on every earlier one.
//! Worked out per reconcile over the whole cache, that cost grew with the tenant's Services:
//! a tenant with many Services paid for all of them on every NodePort Service's pass. Here the
//! tenant watch tells [`NodePorts::observe`] of every Service; only those that take NodePorts
//! are kept, and a change among them (or of the plan) marks the verdicts stale. The next
//! lookup works them out once over those Services; every lookup until the next change is a
//! map read. Pure: no client, tested against `admitted` itself.

use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use std::collections::BTreeMap;
use std::sync::Arc;
use vcp_policy::services;
use vcp_policy::{Refusal, Services};

type Key = (String, String);

/// The tenant's NodePort and LoadBalancer Services, and their verdicts once worked out.
#[derive(Debug, Default)]
pub struct NodePorts {
    services: BTreeMap<Key, Arc<Service>>,
    /// Verdicts of every Service in `services` under the plan they were worked out for;
    /// `None` when stale.
    verdicts: Option<(Services, BTreeMap<Key, Vec<Refusal>>)>,
}

fn key(s: &Service) -> Key {
    (s.namespace().unwrap_or_default(), s.name_any())
}

impl NodePorts {
    /// A tenant Service was listed, changed or deleted (`present == false`).
    pub fn observe(&mut self, s: &Service, present: bool) {
        let k = key(s);
        let was = self.services.contains_key(&k);
        if present && services::takes_node_ports(s) {
            self.services.insert(k, Arc::new(s.clone()));
            self.verdicts = None;
        } else if was {
            self.services.remove(&k);
            self.verdicts = None;
        }
    }

    /// What the plan `p` refuses of Service `t` (nothing: it gets its NodePorts). A Service
    /// the watch has not shown yet is judged on its own, as if it came last.
    pub fn refusals(&mut self, t: &Service, p: &Services) -> Vec<Refusal> {
        if !services::takes_node_ports(t) {
            return Vec::new();
        }
        let stale = self.verdicts.as_ref().is_none_or(|(plan, _)| plan != p);
        if stale {
            let (verdicts, _) = services::admitted(self.services.values().map(|s| s.as_ref()), p);
            self.verdicts = Some((p.clone(), verdicts));
        }
        let (_, verdicts) = self.verdicts.as_ref().expect("worked out above");
        verdicts
            .get(&key(t))
            .cloned()
            .unwrap_or_else(|| services::check(t, p))
    }

    /// How many Services are kept (those that take NodePorts).
    pub fn len(&self) -> usize {
        self.services.len()
    }

    pub fn is_empty(&self) -> bool {
        self.services.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn svc(ns: &str, name: &str, ty: &str, at: i64, ports: usize) -> Service {
        let ports: Vec<_> = (0..ports)
            .map(|i| serde_json::json!({"port": 80 + i, "nodePort": 30000 + i}))
            .collect();
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": name, "namespace": ns,
                "creationTimestamp": format!("2026-01-01T00:{:02}:{:02}Z", at / 60, at % 60),
            },
            "spec": {"type": ty, "ports": ports},
        }))
        .unwrap()
    }

    fn plan(services: u32, lbs: u32, ports: u32) -> Services {
        Services {
            node_port_services: services,
            load_balancers: lbs,
            node_ports: ports,
            ..Services::default()
        }
    }

    proptest! {
        /// After any sequence of watch events, every lookup says what `admitted` says over
        /// the Services then present.
        #[test]
        fn lookups_agree_with_admission_over_the_whole_cache(
            events in proptest::collection::vec(
                (0..3usize, 0..6usize, 0..3usize, 0..120i64, 0..3usize, proptest::bool::weighted(0.8)),
                1..40,
            ),
            limits in (0..4u32, 0..3u32, 0..6u32),
        ) {
            let p = plan(limits.0, limits.1, limits.2);
            let mut index = NodePorts::default();
            let mut cache: BTreeMap<Key, Service> = BTreeMap::new();
            for (ns, name, ty, at, ports, present) in events {
                let ty = ["ClusterIP", "NodePort", "LoadBalancer"][ty];
                let s = svc(&format!("ns{ns}"), &format!("s{name}"), ty, at, ports);
                index.observe(&s, present);
                if present {
                    cache.insert(key(&s), s);
                } else {
                    cache.remove(&key(&s));
                }
                let (want, _) = services::admitted(cache.values(), &p);
                for s in cache.values() {
                    let expected = want.get(&key(s)).cloned().unwrap_or_default();
                    prop_assert_eq!(index.refusals(s, &p), expected, "{:?}", key(s));
                }
            }
            prop_assert_eq!(
                index.len(),
                cache.values().filter(|s| services::takes_node_ports(s)).count()
            );
        }
    }

    #[test]
    fn a_changed_plan_is_worked_out_again() {
        let mut index = NodePorts::default();
        let s = svc("a", "web", "NodePort", 1, 1);
        index.observe(&s, true);
        assert!(index.refusals(&s, &plan(1, 0, 5)).is_empty());
        assert!(!index.refusals(&s, &plan(0, 0, 5)).is_empty());
    }

    #[test]
    fn a_service_that_stops_taking_node_ports_leaves_the_index() {
        let mut index = NodePorts::default();
        index.observe(&svc("a", "web", "NodePort", 1, 1), true);
        assert_eq!(index.len(), 1);
        index.observe(&svc("a", "web", "ClusterIP", 1, 1), true);
        assert!(index.is_empty());
    }
}
