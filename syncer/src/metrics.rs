//! Prometheus metrics of the syncer, served as text on `/metrics` (see docs/syncer.md).
//!
//! - `vcp_syncer_sync_duration_seconds{kind, direction}`: how long one sync of one object
//!   took, `down` (a tenant object reconciled onto the host, or a host object collected) or
//!   `up` (host state written back to the tenant: pod status and binding, events).
//! - `vcp_syncer_reconciles_in_flight{kind}`: reconciles running now; at the worker limit it
//!   means the queue is backing up.
//! - `vcp_syncer_sync_errors_total{kind, error}`: failed syncs by error variant.
//! - `vcp_syncer_api_requests_total{side, verb, resource}`: requests the syncer sent to the
//!   tenant or host apiserver, counted by a layer in each client's HTTP stack ([`ApiRequests`]);
//!   divided by the pods synced, it says what one pod costs the two control planes.
//! - `vcp_syncer_tenant_quota{resource}` and `vcp_syncer_tenant_usage{resource}`: the plan's
//!   tenant-wide quota and what the admitted objects hold, per quota field (`pods`,
//!   `requests_cpu`, ...; CPU in cores, memory and storage in bytes; see `policy::quota`). An
//!   unlimited resource has no quota series.
//! - `vcp_syncer_egress_refused_total{reason}`: CONNECTs of the tenant apiserver the egress
//!   proxy refused ([`crate::egress`]), by reason (`address`, `port`, `name`, `malformed`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::future::Future;
use std::time::Instant;

/// Which way a sync went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Down,
    Up,
}

impl Direction {
    fn as_str(self) -> &'static str {
        match self {
            Direction::Down => "down",
            Direction::Up => "up",
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SyncLabels {
    kind: String,
    direction: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    side: &'static str,
    verb: &'static str,
    resource: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResourceLabels {
    resource: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

type Amounts = Family<ResourceLabels, Gauge<f64, std::sync::atomic::AtomicU64>>;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    kind: String,
    error: String,
}

type Histograms = Family<SyncLabels, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    // 1 ms to ~33 s: a cached no-op to a slow apiserver under load.
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

/// The syncer's metrics and their registry.
pub struct Metrics {
    registry: Registry,
    duration: Histograms,
    in_flight: Family<KindLabels, Gauge>,
    errors: Family<ErrorLabels, Counter>,
    requests: Family<RequestLabels, Counter>,
    quota: Amounts,
    usage: Amounts,
    egress_refused: Family<ReasonLabels, Counter>,
}

/// A quota amount in base units: CPU in cores (counted in millicores), the rest as is.
fn base_units(resource: &str, v: u64) -> f64 {
    // Precision: f64 is exact to 2^53, far above any quota.
    #[allow(clippy::cast_precision_loss)] // see above
    let v = v as f64;
    if resource.ends_with("_cpu") {
        v / 1000.0
    } else {
        v
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

/// Decrements the in-flight gauge even when a reconcile is cancelled mid-way.
struct InFlight(Gauge);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        let duration = Histograms::new_with_constructor(latency_histogram);
        let in_flight = Family::<KindLabels, Gauge>::default();
        let errors = Family::<ErrorLabels, Counter>::default();
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "vcp_syncer_sync_duration_seconds",
            "Duration of one object's sync, by kind and direction (down: onto the host, up: back to the tenant)",
            duration.clone(),
        );
        registry.register(
            "vcp_syncer_reconciles_in_flight",
            "Reconciles running now, by kind",
            in_flight.clone(),
        );
        registry.register(
            "vcp_syncer_sync_errors",
            "Failed syncs, by kind and error variant",
            errors.clone(),
        );
        registry.register(
            "vcp_syncer_api_requests",
            "Requests sent to the tenant or host apiserver, by side, verb and resource",
            requests.clone(),
        );
        let quota = Amounts::default();
        let usage = Amounts::default();
        registry.register(
            "vcp_syncer_tenant_quota",
            "The plan's tenant-wide quota, by resource (CPU in cores, memory and storage in bytes)",
            quota.clone(),
        );
        registry.register(
            "vcp_syncer_tenant_usage",
            "What the tenant's admitted objects hold, by quota resource (CPU in cores, memory and storage in bytes)",
            usage.clone(),
        );
        let egress_refused = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "vcp_syncer_egress_refused",
            "CONNECTs of the tenant apiserver refused by the egress proxy, by reason",
            egress_refused.clone(),
        );
        Metrics {
            registry,
            egress_refused,
            duration,
            in_flight,
            errors,
            requests,
            quota,
            usage,
        }
    }

    /// Counts one CONNECT the egress proxy refused (`reason`: see `egress::allow::Refusal`).
    pub fn egress_refused(&self, reason: &'static str) {
        self.egress_refused
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// The request counter of one side's client (`"tenant"` or `"host"`).
    pub fn api_requests(&self, side: &'static str) -> ApiRequests {
        ApiRequests {
            side,
            family: self.requests.clone(),
        }
    }

    /// Runs one sync of a `kind` object, timing it; `reconcile` also counts it as in flight.
    pub async fn timed<T>(
        &self,
        kind: &str,
        direction: Direction,
        reconcile: bool,
        sync: impl Future<Output = T>,
    ) -> T {
        let _in_flight = reconcile.then(|| {
            let g = self
                .in_flight
                .get_or_create(&KindLabels { kind: kind.into() })
                .clone();
            g.inc();
            InFlight(g)
        });
        let start = Instant::now();
        let out = sync.await;
        self.duration
            .get_or_create(&SyncLabels {
                kind: kind.into(),
                direction: direction.as_str().into(),
            })
            .observe(start.elapsed().as_secs_f64());
        out
    }

    /// Counts a failed sync.
    pub fn error(&self, kind: &str, err: &crate::Error) {
        self.errors
            .get_or_create(&ErrorLabels {
                kind: kind.into(),
                error: err.variant().into(),
            })
            .inc();
    }

    /// Exports the plan's quota (unlimited resources have no series).
    pub fn tenant_quota(&self, hard: &vcp_policy::quota::Hard) {
        for r in vcp_policy::quota::RESOURCES {
            if let Some(v) = hard.get(r) {
                self.quota
                    .get_or_create(&ResourceLabels { resource: r })
                    .set(base_units(r, v));
            }
        }
    }

    /// Exports what the tenant's admitted objects hold.
    pub fn tenant_usage(&self, used: &vcp_policy::quota::Usage) {
        for r in vcp_policy::quota::RESOURCES {
            if let Some(v) = used.get(r) {
                self.usage
                    .get_or_create(&ResourceLabels { resource: r })
                    .set(base_units(r, v));
            }
        }
    }

    /// The metrics in the Prometheus text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// Counts the requests one client sends (see [`ApiRequests::layer`]).
#[derive(Clone)]
pub struct ApiRequests {
    side: &'static str,
    family: Family<RequestLabels, Counter>,
}

impl ApiRequests {
    /// Counts one request.
    pub fn count(&self, method: &http::Method, uri: &http::Uri) {
        let (verb, resource) = classify(method, uri.path(), uri.query().unwrap_or_default());
        self.family
            .get_or_create(&RequestLabels {
                side: self.side,
                verb,
                resource,
            })
            .inc();
    }

    /// A layer for a kube client's HTTP stack that counts every request it sends.
    pub fn layer<B>(
        self,
    ) -> tower::util::MapRequestLayer<impl Fn(http::Request<B>) -> http::Request<B> + Clone> {
        tower::util::MapRequestLayer::new(move |req: http::Request<B>| {
            self.count(req.method(), req.uri());
            req
        })
    }
}

/// The Kubernetes verb and resource (with its subresource, `pods/status`) of a request path:
/// `/api/v1/namespaces/a/pods/web/status` is a `patch` of `pods/status` when sent as PATCH.
pub fn classify(method: &http::Method, path: &str, query: &str) -> (&'static str, String) {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    // Skip /api/<version> or /apis/<group>/<version>.
    let rest = match segs.first() {
        Some(&"api") => segs.get(2..),
        Some(&"apis") => segs.get(3..),
        _ => None,
    }
    .unwrap_or_default();
    // Namespaced: namespaces/<ns>/<resource>[/<name>[/<sub>]]; otherwise (namespaces
    // themselves, nodes, volumes) <resource>[/<name>[/<sub>]].
    let rest = match rest {
        // A namespace's own subresources.
        ["namespaces", _, "status" | "finalize"] => rest,
        ["namespaces", _, _, ..] => &rest[2..],
        _ => rest,
    };
    let (resource, named) = match rest {
        [] => ("other".to_owned(), false),
        [r] => ((*r).to_owned(), false),
        [r, _] => ((*r).to_owned(), true),
        [r, _, sub, ..] => (format!("{r}/{sub}"), true),
    };
    let watch = query
        .split('&')
        .any(|kv| kv == "watch=true" || kv == "watch=1");
    let verb = match *method {
        http::Method::GET if named => "get",
        http::Method::GET if watch => "watch",
        http::Method::GET => "list",
        http::Method::POST => "create",
        http::Method::PUT => "update",
        http::Method::PATCH => "patch",
        http::Method::DELETE if named => "delete",
        http::Method::DELETE => "deletecollection",
        _ => "other",
    };
    (verb, resource)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_classified_by_verb_and_resource() {
        use http::Method;
        let cases = [
            (
                Method::GET,
                "/api/v1/pods",
                "watch=true&resourceVersion=1",
                "watch",
                "pods",
            ),
            (Method::GET, "/api/v1/pods", "limit=500", "list", "pods"),
            (
                Method::POST,
                "/api/v1/namespaces/a/pods",
                "",
                "create",
                "pods",
            ),
            (
                Method::GET,
                "/api/v1/namespaces/a/pods/web",
                "",
                "get",
                "pods",
            ),
            (
                Method::PATCH,
                "/api/v1/namespaces/a/pods/web/status",
                "",
                "patch",
                "pods/status",
            ),
            (
                Method::POST,
                "/api/v1/namespaces/a/pods/web/binding",
                "",
                "create",
                "pods/binding",
            ),
            (
                Method::DELETE,
                "/api/v1/namespaces/a/pods/web",
                "",
                "delete",
                "pods",
            ),
            (Method::GET, "/api/v1/namespaces/a", "", "get", "namespaces"),
            (Method::GET, "/api/v1/namespaces", "", "list", "namespaces"),
            (
                Method::PUT,
                "/api/v1/namespaces/a/finalize",
                "",
                "update",
                "namespaces/finalize",
            ),
            (
                Method::POST,
                "/api/v1/namespaces",
                "",
                "create",
                "namespaces",
            ),
            (Method::GET, "/api/v1/nodes/n1", "", "get", "nodes"),
            (
                Method::PATCH,
                "/api/v1/nodes/n1/status",
                "",
                "patch",
                "nodes/status",
            ),
            (
                Method::GET,
                "/apis/discovery.k8s.io/v1/namespaces/a/endpointslices",
                "watch=1",
                "watch",
                "endpointslices",
            ),
            (
                Method::POST,
                "/api/v1/namespaces/a/serviceaccounts/default/token",
                "",
                "create",
                "serviceaccounts/token",
            ),
        ];
        for (method, path, query, verb, resource) in cases {
            assert_eq!(
                classify(&method, path, query),
                (verb, resource.to_owned()),
                "{method} {path}?{query}"
            );
        }
    }

    #[test]
    fn the_tenant_quota_and_usage_are_exported_in_base_units() {
        let m = Metrics::new();
        let q = vcp_policy::TenantPolicy::from_yaml("quota: {pods: 3, requests_cpu: 1500m}")
            .unwrap()
            .quota;
        m.tenant_quota(&q.hard());
        m.tenant_usage(&vcp_policy::quota::Usage {
            pods: 2,
            requests_cpu: 250,
            ..Default::default()
        });
        let text = m.encode();
        for line in [
            r#"vcp_syncer_tenant_quota{resource="pods"} 3"#,
            r#"vcp_syncer_tenant_quota{resource="requests_cpu"} 1.5"#,
            r#"vcp_syncer_tenant_usage{resource="pods"} 2"#,
            r#"vcp_syncer_tenant_usage{resource="requests_cpu"} 0.25"#,
            r#"vcp_syncer_tenant_usage{resource="namespaces"} 0"#,
        ] {
            assert!(text.contains(line), "{line} missing in:\n{text}");
        }
        assert!(
            !text.contains(r#"vcp_syncer_tenant_quota{resource="services"}"#),
            "unlimited: no series"
        );
    }

    #[test]
    fn api_requests_are_counted_per_side() {
        let m = Metrics::new();
        let host = m.api_requests("host");
        let uri: http::Uri = "https://h/api/v1/namespaces/a/pods".parse().unwrap();
        host.count(&http::Method::POST, &uri);
        host.count(&http::Method::POST, &uri);
        let text = m.encode();
        let line = r#"vcp_syncer_api_requests_total{side="host",verb="create",resource="pods"} 2"#;
        assert!(text.contains(line), "{line} missing in:\n{text}");
    }

    #[test]
    fn syncs_errors_and_in_flight_reconciles_are_exported() {
        let m = Metrics::new();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(m.timed("Pod", Direction::Down, true, async {}));
        rt.block_on(m.timed("Pod", Direction::Up, false, async {}));
        m.error("Pod", &crate::Error::NotReady("x".into()));
        let text = m.encode();
        for line in [
            r#"vcp_syncer_sync_duration_seconds_count{kind="Pod",direction="down"} 1"#,
            r#"vcp_syncer_sync_duration_seconds_count{kind="Pod",direction="up"} 1"#,
            r#"vcp_syncer_reconciles_in_flight{kind="Pod"} 0"#,
            r#"vcp_syncer_sync_errors_total{kind="Pod",error="not_ready"} 1"#,
        ] {
            assert!(text.contains(line), "{line} missing in:\n{text}");
        }
    }
}
