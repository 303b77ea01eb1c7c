//! The metrics.k8s.io API as a tenant sees it, made from the host's (pure).
//!
//! Data flow: [`parse`] reads a request path into a [`Route`]; the caller fetches the host's
//! `PodMetrics` of the tenant's host namespaces and pairs each with the tenant pod it belongs
//! to; [`tenant_pod`] then gives the tenant's object (tenant name, namespace and labels, the
//! host's figures, only the tenant pod's containers), and [`node`] sums the tenant's pods on
//! one virtual node (never the host node's own figure, which would show the other tenants'
//! load). [`Selector`] filters by the tenant's labels, as `kubectl top -l` asks.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

pub const GROUP: &str = "metrics.k8s.io";
pub const VERSION: &str = "v1beta1";
pub const GROUP_VERSION: &str = "metrics.k8s.io/v1beta1";

/// One container's usage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContainerMetrics {
    pub name: String,
    #[serde(default)]
    pub usage: BTreeMap<String, Quantity>,
}

/// A pod's usage, as metrics-server serves it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PodMetrics {
    #[serde(default)]
    pub metadata: ObjectMeta,
    pub timestamp: String,
    pub window: String,
    #[serde(default)]
    pub containers: Vec<ContainerMetrics>,
}

/// A node's usage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeMetrics {
    pub metadata: ObjectMeta,
    pub timestamp: String,
    pub window: String,
    pub usage: BTreeMap<String, Quantity>,
}

/// A host list of pod metrics.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct PodMetricsList {
    #[serde(default)]
    pub items: Vec<PodMetrics>,
}

/// What a request asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// `/apis/metrics.k8s.io/v1beta1`: the resource list the aggregator discovers.
    Resources,
    /// `/apis/metrics.k8s.io`.
    Group,
    /// Pod metrics: all namespaces, one namespace, or one pod.
    Pods {
        namespace: Option<String>,
        name: Option<String>,
    },
    /// Node metrics: all virtual nodes or one.
    Nodes { name: Option<String> },
}

/// Reads a request path; `None` for anything this API does not serve.
pub fn parse(path: &str) -> Option<Route> {
    let rest = path.trim_end_matches('/');
    if rest == "/apis/metrics.k8s.io" {
        return Some(Route::Group);
    }
    let rest = rest.strip_prefix("/apis/metrics.k8s.io/v1beta1")?;
    let parts: Vec<&str> = rest.split('/').filter(|s| !s.is_empty()).collect();
    let name = |s: &str| (!s.is_empty()).then(|| s.to_owned());
    Some(match parts.as_slice() {
        [] => Route::Resources,
        ["pods"] => Route::Pods {
            namespace: None,
            name: None,
        },
        ["pods", n] => Route::Pods {
            namespace: None,
            name: name(n),
        },
        ["namespaces", ns, "pods"] => Route::Pods {
            namespace: name(ns),
            name: None,
        },
        ["namespaces", ns, "pods", n] => Route::Pods {
            namespace: name(ns),
            name: name(n),
        },
        ["nodes"] => Route::Nodes { name: None },
        ["nodes", n] => Route::Nodes { name: name(n) },
        _ => return None,
    })
}

/// The tenant's view of `host`, the metrics of the host copy of `tenant`: the tenant pod's
/// name, namespace and labels, the host's timestamp, window and figures, and only containers
/// the tenant pod declares.
pub fn tenant_pod(tenant: &Pod, host: &PodMetrics) -> PodMetrics {
    let declared: BTreeSet<&str> = tenant
        .spec
        .iter()
        .flat_map(|s| s.containers.iter().map(|c| c.name.as_str()))
        .collect();
    PodMetrics {
        metadata: ObjectMeta {
            name: Some(tenant.name_any()),
            namespace: tenant.namespace(),
            labels: Some(tenant.labels().clone()),
            creation_timestamp: host.metadata.creation_timestamp.clone(),
            ..Default::default()
        },
        timestamp: host.timestamp.clone(),
        window: host.window.clone(),
        containers: host
            .containers
            .iter()
            .filter(|c| declared.contains(c.name.as_str()))
            .cloned()
            .collect(),
    }
}

/// A virtual node's usage: the sum of the tenant's `pods` on it. Without pods, zero at `now`.
pub fn node(
    name: &str,
    labels: &BTreeMap<String, String>,
    pods: &[&PodMetrics],
    now: &str,
) -> NodeMetrics {
    let mut cpu: i128 = 0;
    let mut memory: i128 = 0;
    for c in pods.iter().flat_map(|p| &p.containers) {
        let amount = |k: &str| {
            c.usage
                .get(k)
                .and_then(|q| vcp_policy::quota::parse_quantity(&q.0).ok())
                .unwrap_or(0)
        };
        cpu = cpu.saturating_add(amount("cpu"));
        memory = memory.saturating_add(amount("memory"));
    }
    let latest = pods.iter().max_by(|a, b| a.timestamp.cmp(&b.timestamp));
    NodeMetrics {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(labels.clone()),
            ..Default::default()
        },
        timestamp: latest.map_or_else(|| now.to_owned(), |p| p.timestamp.clone()),
        window: latest.map_or_else(|| "0s".to_owned(), |p| p.window.clone()),
        usage: BTreeMap::from([
            ("cpu".to_owned(), cpu_quantity(cpu)),
            ("memory".to_owned(), memory_quantity(memory)),
        ]),
    }
}

/// CPU in nano-units (as `parse_quantity` gives it) as metrics-server writes it: nanocores.
fn cpu_quantity(nanos: i128) -> Quantity {
    Quantity(format!("{nanos}n"))
}

/// Memory in nano-units as whole bytes, in Ki when exact (metrics-server's form).
fn memory_quantity(nanos: i128) -> Quantity {
    let bytes = nanos.div_euclid(1_000_000_000);
    if bytes % 1024 == 0 {
        Quantity(format!("{}Ki", bytes / 1024))
    } else {
        Quantity(bytes.to_string())
    }
}

/// A list response of `kind` (`PodMetricsList`, `NodeMetricsList`).
pub fn list<T: Serialize>(kind: &str, items: &[T]) -> serde_json::Value {
    serde_json::json!({
        "kind": kind,
        "apiVersion": GROUP_VERSION,
        "metadata": {},
        "items": items,
    })
}

/// One object with its kind (`PodMetrics`, `NodeMetrics`).
pub fn object<T: Serialize>(kind: &str, item: &T) -> serde_json::Value {
    let mut v = serde_json::to_value(item).unwrap_or_default();
    if let Some(o) = v.as_object_mut() {
        o.insert("kind".into(), kind.into());
        o.insert("apiVersion".into(), GROUP_VERSION.into());
    }
    v
}

/// What `/apis/metrics.k8s.io/v1beta1` answers: the aggregator's discovery and availability
/// check read it.
pub fn resources() -> serde_json::Value {
    let verbs = ["get", "list"];
    serde_json::json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": GROUP_VERSION,
        "resources": [
            {"name": "nodes", "singularName": "", "namespaced": false, "kind": "NodeMetrics", "verbs": verbs},
            {"name": "pods", "singularName": "", "namespaced": true, "kind": "PodMetrics", "verbs": verbs},
        ],
    })
}

/// What `/apis/metrics.k8s.io` answers.
pub fn group() -> serde_json::Value {
    let v = serde_json::json!({"groupVersion": GROUP_VERSION, "version": VERSION});
    serde_json::json!({
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": GROUP,
        "versions": [v],
        "preferredVersion": v,
    })
}

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, BTreeSet<String>),
    NotIn(String, BTreeSet<String>),
    Exists(String),
    NotExists(String),
}

/// A label selector in its string form (`a=b,c!=d,e in (f,g),h,!i`), as `kubectl -l` sends it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector(Vec<Requirement>);

impl Selector {
    /// Parses a selector; an empty string selects everything.
    pub fn parse(s: &str) -> Result<Selector, String> {
        let bad = |why: &str| format!("invalid label selector {s:?}: {why}");
        let mut reqs = Vec::new();
        let mut rest = s.trim();
        while !rest.is_empty() {
            // A requirement ends at the first comma outside parentheses.
            let mut depth = 0;
            let end = rest
                .char_indices()
                .find(|&(_, c)| {
                    match c {
                        '(' => depth += 1,
                        ')' => depth -= 1,
                        _ => {}
                    }
                    c == ',' && depth == 0
                })
                .map_or(rest.len(), |(i, _)| i);
            let term = rest[..end].trim();
            let comma = rest[end..].strip_prefix(',');
            rest = comma.unwrap_or("").trim_start();
            if term.is_empty() || (comma.is_some() && rest.is_empty()) {
                return Err(bad("empty requirement"));
            }
            reqs.push(Self::requirement(term).map_err(|w| bad(&w))?);
        }
        Ok(Selector(reqs))
    }

    fn requirement(term: &str) -> Result<Requirement, String> {
        let key = |k: &str| -> Result<String, String> {
            let k = k.trim();
            let ok = !k.is_empty()
                && k.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
            ok.then(|| k.to_owned())
                .ok_or_else(|| format!("bad key {k:?}"))
        };
        let value = |v: &str| -> Result<String, String> {
            let v = v.trim();
            let ok = v
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
            ok.then(|| v.to_owned())
                .ok_or_else(|| format!("bad value {v:?}"))
        };
        let set = |s: &str| -> Result<BTreeSet<String>, String> {
            let inner = s
                .trim()
                .strip_prefix('(')
                .and_then(|s| s.strip_suffix(')'))
                .ok_or_else(|| format!("expected a (list) in {s:?}"))?;
            inner.split(',').map(value).collect()
        };
        if let Some(k) = term.strip_prefix('!') {
            return Ok(Requirement::NotExists(key(k)?));
        }
        if let Some((k, v)) = term.split_once("!=") {
            return Ok(Requirement::NotEquals(key(k)?, value(v)?));
        }
        if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
            return Ok(Requirement::Equals(key(k)?, value(v)?));
        }
        let words: Vec<&str> = term.splitn(2, char::is_whitespace).collect();
        match words.as_slice() {
            [k] => Ok(Requirement::Exists(key(k)?)),
            [k, rest] => {
                let rest = rest.trim_start();
                if let Some(s) = rest.strip_prefix("notin") {
                    Ok(Requirement::NotIn(key(k)?, set(s)?))
                } else if let Some(s) = rest.strip_prefix("in") {
                    Ok(Requirement::In(key(k)?, set(s)?))
                } else {
                    Err(format!("unknown operator in {term:?}"))
                }
            }
            _ => Err(format!("cannot read {term:?}")),
        }
    }

    /// Whether `labels` satisfy every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|r| match r {
            Requirement::Equals(k, v) => labels.get(k) == Some(v),
            Requirement::NotEquals(k, v) => labels.get(k) != Some(v),
            Requirement::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::NotExists(k) => !labels.contains_key(k),
        })
    }
}

/// The pod name a field selector asks for: only `metadata.name=<n>` (and `==`) are served,
/// as metrics-server serves them.
pub fn field_name(s: &str) -> Result<Option<String>, String> {
    let s = s.trim();
    if s.is_empty() {
        return Ok(None);
    }
    let value = s
        .strip_prefix("metadata.name==")
        .or_else(|| s.strip_prefix("metadata.name="));
    match value {
        Some(v) if !v.contains(',') => Ok(Some(v.to_owned())),
        _ => Err(format!(
            "field selector {s:?} is not supported: only metadata.name=<name>"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn usage(cpu: &str, mem: &str) -> BTreeMap<String, Quantity> {
        BTreeMap::from([
            ("cpu".to_owned(), Quantity(cpu.into())),
            ("memory".to_owned(), Quantity(mem.into())),
        ])
    }

    fn host_metrics(name: &str, ts: &str, containers: &[(&str, &str, &str)]) -> PodMetrics {
        PodMetrics {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("vcp-x-default".into()),
                labels: Some(BTreeMap::from([("vcp.dev/tenant".into(), "x".into())])),
                ..Default::default()
            },
            timestamp: ts.into(),
            window: "10.2s".into(),
            containers: containers
                .iter()
                .map(|(n, c, m)| ContainerMetrics {
                    name: (*n).into(),
                    usage: usage(c, m),
                })
                .collect(),
        }
    }

    fn tenant_pod_named(name: &str, containers: &[&str]) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "default", "labels": {"app": "web"}},
            "spec": {"containers": containers.iter().map(|c| serde_json::json!({"name": c})).collect::<Vec<_>>()},
        }))
        .unwrap()
    }

    #[test]
    fn paths_are_read_into_routes_and_others_refused() {
        let pods = |ns: Option<&str>, n: Option<&str>| {
            Some(Route::Pods {
                namespace: ns.map(Into::into),
                name: n.map(Into::into),
            })
        };
        assert_eq!(
            parse("/apis/metrics.k8s.io/v1beta1"),
            Some(Route::Resources)
        );
        assert_eq!(
            parse("/apis/metrics.k8s.io/v1beta1/"),
            Some(Route::Resources)
        );
        assert_eq!(parse("/apis/metrics.k8s.io"), Some(Route::Group));
        assert_eq!(parse("/apis/metrics.k8s.io/v1beta1/pods"), pods(None, None));
        assert_eq!(
            parse("/apis/metrics.k8s.io/v1beta1/namespaces/default/pods"),
            pods(Some("default"), None)
        );
        assert_eq!(
            parse("/apis/metrics.k8s.io/v1beta1/namespaces/default/pods/web"),
            pods(Some("default"), Some("web"))
        );
        assert_eq!(
            parse("/apis/metrics.k8s.io/v1beta1/nodes/n1"),
            Some(Route::Nodes {
                name: Some("n1".into())
            })
        );
        for other in [
            "/apis",
            "/api/v1/pods",
            "/apis/metrics.k8s.io/v1",
            "/apis/metrics.k8s.io/v1beta1/namespaces/default/pods/web/log",
            "/apis/metrics.k8s.io/v1beta1/services",
            "/containerLogs/default/web/app",
        ] {
            assert_eq!(parse(other), None, "{other}");
        }
    }

    #[test]
    fn a_pod_gets_the_tenant_name_labels_and_only_its_own_containers() {
        let host = host_metrics(
            "web",
            "2026-11-25T12:00:00Z",
            &[("app", "250m", "64Mi"), ("injected", "5m", "1Mi")],
        );
        let t = tenant_pod(&tenant_pod_named("web", &["app"]), &host);
        assert_eq!(t.metadata.name.as_deref(), Some("web"));
        assert_eq!(t.metadata.namespace.as_deref(), Some("default"));
        assert_eq!(
            t.metadata.labels,
            Some(BTreeMap::from([("app".into(), "web".into())])),
            "the tenant's labels, never the host's markers"
        );
        assert_eq!(t.containers.len(), 1);
        assert_eq!(t.containers[0].usage, usage("250m", "64Mi"));
        assert_eq!(
            (t.timestamp.as_str(), t.window.as_str()),
            ("2026-11-25T12:00:00Z", "10.2s")
        );
    }

    #[test]
    fn a_node_sums_the_tenants_pods_on_it_and_is_zero_without_any() {
        let a = host_metrics(
            "a",
            "2026-11-25T12:00:01Z",
            &[("app", "250m", "64Mi"), ("side", "1m", "1Mi")],
        );
        let b = host_metrics(
            "b",
            "2026-11-25T12:00:05Z",
            &[("app", "1500000n", "1024Ki")],
        );
        let n = node("kwok-node-1", &BTreeMap::new(), &[&a, &b], "now");
        assert_eq!(n.usage["cpu"], Quantity("252500000n".into()));
        assert_eq!(n.usage["memory"], Quantity("67584Ki".into()));
        assert_eq!(n.timestamp, "2026-11-25T12:00:05Z", "the latest sample");
        let empty = node("kwok-node-2", &BTreeMap::new(), &[], "2026-11-25T12:01:00Z");
        assert_eq!(empty.usage["cpu"], Quantity("0n".into()));
        assert_eq!(empty.usage["memory"], Quantity("0Ki".into()));
        assert_eq!(empty.timestamp, "2026-11-25T12:01:00Z");
    }

    #[test]
    fn selectors_read_every_form_kubectl_sends() {
        let labels = BTreeMap::from([
            ("app".to_owned(), "web".to_owned()),
            ("tier".to_owned(), "front".to_owned()),
            ("app.kubernetes.io/name".to_owned(), "shop".to_owned()),
        ]);
        for (sel, want) in [
            ("", true),
            ("app=web", true),
            ("app==web", true),
            ("app=db", false),
            ("app!=db", true),
            ("app!=web", false),
            ("tier in (front, back)", true),
            ("tier in (back)", false),
            ("tier notin (back)", true),
            ("tier notin (front,back)", false),
            ("missing notin (x)", true),
            ("app", true),
            ("missing", false),
            ("!missing", true),
            ("!app", false),
            ("app=web,tier in (front),app.kubernetes.io/name=shop", true),
            ("app=web,tier=back", false),
        ] {
            let s = Selector::parse(sel).unwrap_or_else(|e| panic!("{sel}: {e}"));
            assert_eq!(s.matches(&labels), want, "{sel}");
        }
        for bad in [
            "app=web,",
            "=web",
            "tier in front",
            "tier within (a)",
            "app=we b",
            ",",
        ] {
            assert!(Selector::parse(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn only_name_field_selectors_are_served() {
        assert_eq!(field_name(""), Ok(None));
        assert_eq!(field_name("metadata.name=web"), Ok(Some("web".into())));
        assert_eq!(field_name("metadata.name==web"), Ok(Some("web".into())));
        assert!(field_name("spec.nodeName=n1").is_err());
        assert!(field_name("metadata.name=a,metadata.namespace=b").is_err());
    }

    #[test]
    fn discovery_names_both_resources() {
        let r = resources();
        let names: Vec<_> = r["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| {
                (
                    x["name"].as_str().unwrap(),
                    x["namespaced"].as_bool().unwrap(),
                )
            })
            .collect();
        assert_eq!(names, [("nodes", false), ("pods", true)]);
        assert_eq!(group()["preferredVersion"]["groupVersion"], GROUP_VERSION);
    }

    proptest! {
        #[test]
        fn node_sums_are_exact_in_the_units_written(
            cpus in proptest::collection::vec(0u64..4_000_000_000, 0..8),
            mems in proptest::collection::vec(0u64..(1 << 36), 0..8),
        ) {
            let pods: Vec<PodMetrics> = cpus
                .iter()
                .zip(mems.iter().chain(std::iter::repeat(&0)))
                .enumerate()
                .map(|(i, (c, m))| {
                    let name = format!("p{i}");
                    let c = format!("{c}n");
                    let m = m.to_string();
                    host_metrics(&name, "t", &[("app", &c, &m)])
                })
                .collect();
            let refs: Vec<&PodMetrics> = pods.iter().collect();
            let n = node("n", &BTreeMap::new(), &refs, "t");
            let parse = |q: &Quantity| vcp_policy::quota::parse_quantity(&q.0).unwrap();
            let want_cpu: i128 = cpus.iter().map(|c| i128::from(*c)).sum();
            let want_mem: i128 = mems.iter().take(cpus.len()).map(|m| i128::from(*m)).sum();
            prop_assert_eq!(parse(&n.usage["cpu"]), want_cpu);
            prop_assert_eq!(parse(&n.usage["memory"]) / 1_000_000_000, want_mem);
        }

        #[test]
        fn equality_selectors_match_exactly_their_labels(
            k in "[a-z]{1,8}", v in "[a-z0-9]{1,8}", other in "[a-z0-9]{1,8}",
        ) {
            let s = Selector::parse(&format!("{k}={v}")).unwrap();
            prop_assert!(s.matches(&BTreeMap::from([(k.clone(), v.clone())])));
            prop_assert_eq!(s.matches(&BTreeMap::from([(k.clone(), other.clone())])), v == other);
            prop_assert!(!s.matches(&BTreeMap::new()));
        }
    }
}
