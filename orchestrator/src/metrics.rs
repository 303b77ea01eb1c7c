//! Prometheus metrics of a `vcp serve` replica, on the prometheus-client registry (as the
//! syncer's), served as OpenMetrics text on `/metrics` (see docs/orchestrator.md).
//!
//! The reconcile workers report every pass ([`Metrics::pass`]), the fleet worker every step
//! ([`Metrics::fleet_step`]), the patch update sweep every sweep ([`Metrics::patch_sweep`]),
//! the usage sampler every round ([`Metrics::usage_round`]), the API's middleware every request ([`Metrics::request`]); the
//! `/metrics` handler sets the tenant counts it reads from the inventory ([`Metrics::tenants`])
//! and encodes the lot ([`Metrics::encode`]).
//!
//! - `vcp_reconcile_passes_total`, `vcp_reconcile_pass_errors_total` (passes stopped by an
//!   error), `vcp_reconcile_pass_seconds_total` (time in passes);
//!   `vcp_reconcile_pass_duration_seconds{pass}`: one pass, `bring_up` or `tear_down`;
//!   `vcp_reconcile_errors_total{error}`: the errors that stopped passes, by variant of the
//!   crate's error (`kube`, `database`, `render`, ...).
//! - `vcp_provision_work_duration_seconds{part}`: what one bring-up pass spent on one part of
//!   it (`namespace`, `expose`, `pki`, `etcd`, `apiserver`, `bootstrap`, `controller_manager`,
//!   `dns`, `syncer`: rendering, applying and reading readiness; the pass log line's `work`).
//! - `vcp_http_requests_total`, `vcp_http_client_errors_total` (4xx),
//!   `vcp_http_server_errors_total` (5xx); `vcp_http_request_duration_seconds{method, route,
//!   status}`: one request, `route` the matched route template (`/v1/tenants/{name}`), or
//!   `unmatched` for requests no route took (so paths never become label values).
//! - `vcp_usage_samples_total`, `vcp_usage_sample_errors_total`.
//! - `vcp_fleet_steps_total` (fleet upgrade steps this replica ran),
//!   `vcp_fleet_tenant_starts_total` (tenant upgrades they started),
//!   `vcp_fleet_step_errors_total{error}` (steps stopped by an error, by variant).
//! - `vcp_patch_update_sweeps_total`, `vcp_patch_updates_started_total`,
//!   `vcp_patch_update_sweep_errors_total{error}`: the automatic patch update sweep.
//! - `vcp_tenants{phase}`: live tenants per phase, every live phase listed (0 when none).
//! - `vcp_tenant_usage{owner, tenant, resource}`: what each live tenant's latest usage sample
//!   holds (CPU in millicores, memory and storage in bytes), read from the inventory at every
//!   scrape like the tenant counts; a deleted tenant's series go with it.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use std::time::Duration;
use vcp_core::lifecycle::Phase;

/// The content type of [`Metrics::encode`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PassLabels {
    pass: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PartLabels {
    part: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    error: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    method: &'static str,
    route: String,
    status: u16,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabels {
    phase: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UsageLabels {
    owner: String,
    tenant: String,
    resource: &'static str,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

fn pass_histogram() -> Histogram {
    // 10 ms to ~160 s: a pass over a Ready tenant re-applies a few dozen objects; one that
    // issues certificates or waits on a slow host takes seconds.
    Histogram::new(exponential_buckets(0.01, 2.0, 15))
}

fn request_histogram() -> Histogram {
    // 1 ms to ~16 s: most answers are one inventory query; issuing a kubeconfig reads the host.
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

/// Which kind of pass ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PassKind {
    BringUp,
    TearDown,
}

impl PassKind {
    fn as_str(self) -> &'static str {
        match self {
            PassKind::BringUp => "bring_up",
            PassKind::TearDown => "tear_down",
        }
    }
}

/// The replica's metrics and their registry.
pub struct Metrics {
    registry: Registry,
    passes: Counter,
    pass_errors: Counter,
    pass_seconds: Counter<f64, AtomicU64>,
    pass_duration: Histograms<PassLabels>,
    work_duration: Histograms<PartLabels>,
    errors: Family<ErrorLabels, Counter>,
    requests: Counter,
    client_errors: Counter,
    server_errors: Counter,
    request_duration: Histograms<RequestLabels>,
    usage_samples: Counter,
    usage_errors: Counter,
    fleet_steps: Counter,
    fleet_starts: Counter,
    fleet_errors: Family<ErrorLabels, Counter>,
    patch_sweeps: Counter,
    patch_starts: Counter,
    patch_errors: Family<ErrorLabels, Counter>,
    tenants: Family<PhaseLabels, Gauge>,
    usage: Family<UsageLabels, Gauge>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

/// A method as a label value: the ones the API serves, everything else `other` (a client can
/// send any token as a method; label values must stay few).
fn method_label(m: &http::Method) -> &'static str {
    match *m {
        http::Method::GET => "GET",
        http::Method::POST => "POST",
        http::Method::PUT => "PUT",
        http::Method::PATCH => "PATCH",
        http::Method::DELETE => "DELETE",
        http::Method::HEAD => "HEAD",
        http::Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut r = Registry::default();
        let m = Metrics {
            passes: Counter::default(),
            pass_errors: Counter::default(),
            pass_seconds: Counter::default(),
            pass_duration: Histograms::new_with_constructor(pass_histogram),
            work_duration: Histograms::new_with_constructor(request_histogram),
            errors: Family::default(),
            requests: Counter::default(),
            client_errors: Counter::default(),
            server_errors: Counter::default(),
            request_duration: Histograms::new_with_constructor(request_histogram),
            usage_samples: Counter::default(),
            usage_errors: Counter::default(),
            fleet_steps: Counter::default(),
            fleet_starts: Counter::default(),
            fleet_errors: Family::default(),
            patch_sweeps: Counter::default(),
            patch_starts: Counter::default(),
            patch_errors: Family::default(),
            tenants: Family::default(),
            usage: Family::default(),
            registry: Registry::default(),
        };
        // Counters get their `_total` suffix from the registry.
        r.register(
            "vcp_reconcile_passes",
            "Reconcile passes run by this replica",
            m.passes.clone(),
        );
        r.register(
            "vcp_reconcile_pass_errors",
            "Passes that ended with a step in error",
            m.pass_errors.clone(),
        );
        r.register(
            "vcp_reconcile_pass_seconds",
            "Time spent in reconcile passes",
            m.pass_seconds.clone(),
        );
        r.register(
            "vcp_reconcile_pass_duration_seconds",
            "Duration of one reconcile pass, by kind (bring_up, tear_down)",
            m.pass_duration.clone(),
        );
        r.register(
            "vcp_provision_work_duration_seconds",
            "Time one bring-up pass spent on one part of it (pki, etcd, apiserver, ...)",
            m.work_duration.clone(),
        );
        r.register(
            "vcp_reconcile_errors",
            "Errors that stopped reconcile passes, by error variant",
            m.errors.clone(),
        );
        r.register(
            "vcp_http_requests",
            "API requests served",
            m.requests.clone(),
        );
        r.register(
            "vcp_http_client_errors",
            "API requests answered 4xx",
            m.client_errors.clone(),
        );
        r.register(
            "vcp_http_server_errors",
            "API requests answered 5xx",
            m.server_errors.clone(),
        );
        r.register(
            "vcp_http_request_duration_seconds",
            "Duration of one API request, by method, route template and status",
            m.request_duration.clone(),
        );
        r.register(
            "vcp_usage_samples",
            "Tenant usage samples this replica recorded",
            m.usage_samples.clone(),
        );
        r.register(
            "vcp_usage_sample_errors",
            "Tenants (or whole rounds) whose usage this replica could not sample",
            m.usage_errors.clone(),
        );
        r.register(
            "vcp_fleet_steps",
            "Fleet upgrade steps this replica ran",
            m.fleet_steps.clone(),
        );
        r.register(
            "vcp_fleet_tenant_starts",
            "Tenant upgrades started by this replica's fleet worker",
            m.fleet_starts.clone(),
        );
        r.register(
            "vcp_fleet_step_errors",
            "Errors that stopped fleet upgrade steps, by error variant",
            m.fleet_errors.clone(),
        );
        r.register(
            "vcp_patch_update_sweeps",
            "Automatic patch update sweeps this replica ran",
            m.patch_sweeps.clone(),
        );
        r.register(
            "vcp_patch_updates_started",
            "Patch updates (tenant upgrades inside a minor) this replica started",
            m.patch_starts.clone(),
        );
        r.register(
            "vcp_patch_update_sweep_errors",
            "Errors that stopped patch update sweeps, by error variant",
            m.patch_errors.clone(),
        );
        r.register("vcp_tenants", "Live tenants by phase", m.tenants.clone());
        r.register(
            "vcp_tenant_usage",
            "What each live tenant's latest usage sample holds, by resource (CPU in millicores, memory and storage in bytes)",
            m.usage.clone(),
        );
        // Both kinds of pass from the start, so rates and quantiles have a series before the
        // first pass of each kind.
        for kind in [PassKind::BringUp, PassKind::TearDown] {
            drop(m.pass_duration.get_or_create(&PassLabels {
                pass: kind.as_str(),
            }));
        }
        Metrics { registry: r, ..m }
    }

    /// Time a bring-up pass spent on one part of it.
    pub fn bring_up_work(&self, part: &'static str, took: Duration) {
        self.work_duration
            .get_or_create(&PartLabels { part })
            .observe(took.as_secs_f64());
    }

    /// A reconcile pass: how long it took, and the variant of the error that stopped it.
    pub fn pass(&self, kind: PassKind, took: Duration, error: Option<&'static str>) {
        self.passes.inc();
        self.pass_seconds.inc_by(took.as_secs_f64());
        self.pass_duration
            .get_or_create(&PassLabels {
                pass: kind.as_str(),
            })
            .observe(took.as_secs_f64());
        if let Some(error) = error {
            self.pass_errors.inc();
            self.errors.get_or_create(&ErrorLabels { error }).inc();
        }
    }

    /// An API request: `route` is the matched route template, `None` if no route matched.
    pub fn request(
        &self,
        method: &http::Method,
        route: Option<&str>,
        status: http::StatusCode,
        took: Duration,
    ) {
        self.requests.inc();
        if status.is_client_error() {
            self.client_errors.inc();
        } else if status.is_server_error() {
            self.server_errors.inc();
        }
        self.request_duration
            .get_or_create(&RequestLabels {
                method: method_label(method),
                route: route.unwrap_or("unmatched").to_owned(),
                status: status.as_u16(),
            })
            .observe(took.as_secs_f64());
    }

    /// A fleet upgrade step: the tenant upgrades it started, and the variant of the error that
    /// stopped it.
    pub fn fleet_step(&self, started: usize, error: Option<&'static str>) {
        self.fleet_steps.inc();
        self.fleet_starts.inc_by(started as u64);
        if let Some(error) = error {
            self.fleet_errors
                .get_or_create(&ErrorLabels { error })
                .inc();
        }
    }

    /// A patch update sweep: the updates it started, and the variant of the error that stopped
    /// it.
    pub fn patch_sweep(&self, started: usize, error: Option<&'static str>) {
        self.patch_sweeps.inc();
        self.patch_starts.inc_by(started as u64);
        if let Some(error) = error {
            self.patch_errors
                .get_or_create(&ErrorLabels { error })
                .inc();
        }
    }

    /// A usage sampling round: samples recorded, tenants (or whole rounds) that failed.
    pub fn usage_round(&self, recorded: usize, failed: usize) {
        self.usage_samples.inc_by(recorded as u64);
        self.usage_errors.inc_by(failed as u64);
    }

    /// Live tenants per phase, as the inventory counted them now (`None`: it could not; the
    /// series go away rather than go stale).
    pub fn tenants(&self, counts: Option<&[(Phase, i64)]>) {
        let Some(counts) = counts else {
            self.tenants.clear();
            return;
        };
        for phase in Phase::LIVE {
            let n = counts
                .iter()
                .find(|(p, _)| *p == phase)
                .map_or(0, |(_, n)| *n);
            self.tenants
                .get_or_create(&PhaseLabels {
                    phase: phase.as_str(),
                })
                .set(n);
        }
    }

    /// Sets the per-tenant usage gauges to these samples (owner, tenant, usage) and drops the
    /// series of tenants not among them; `None` (the inventory unavailable) drops them all.
    pub fn usage(&self, samples: Option<&[(String, String, vcp_policy::quota::Usage)]>) {
        self.usage.clear();
        for (owner, tenant, used) in samples.unwrap_or_default() {
            for resource in vcp_core::quota::RESOURCES {
                let v = used.get(resource).unwrap_or(0);
                self.usage
                    .get_or_create(&UsageLabels {
                        owner: owner.clone(),
                        tenant: tenant.clone(),
                        resource,
                    })
                    .set(i64::try_from(v).unwrap_or(i64::MAX));
            }
        }
    }

    /// The metrics in the OpenMetrics text format ([`CONTENT_TYPE`]).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_usage_is_one_series_per_tenant_and_resource_and_goes_with_the_tenant() {
        let m = Metrics::new();
        let used = vcp_policy::quota::Usage {
            pods: 3,
            requests_cpu: 1500,
            ..Default::default()
        };
        m.usage(Some(&[("team-a".into(), "shop".into(), used)]));
        let text = m.encode();
        for line in [
            r#"vcp_tenant_usage{owner="team-a",tenant="shop",resource="pods"} 3"#,
            r#"vcp_tenant_usage{owner="team-a",tenant="shop",resource="requests_cpu"} 1500"#,
            r#"vcp_tenant_usage{owner="team-a",tenant="shop",resource="namespaces"} 0"#,
        ] {
            assert!(text.contains(line), "{line} not in {text}");
        }
        m.usage(Some(&[]));
        assert!(!m.encode().contains("vcp_tenant_usage{"));
        m.usage(Some(&[("team-a".into(), "shop".into(), used)]));
        m.usage(None);
        assert!(!m.encode().contains("vcp_tenant_usage{"));
    }

    fn has(text: &str, lines: &[&str]) {
        for line in lines {
            assert!(text.contains(line), "{line} missing in:\n{text}");
        }
    }

    #[test]
    fn passes_are_timed_by_kind_and_errors_counted_by_variant() {
        let m = Metrics::new();
        m.pass(PassKind::BringUp, Duration::from_millis(1500), None);
        m.pass(PassKind::BringUp, Duration::from_millis(250), Some("kube"));
        m.pass(PassKind::TearDown, Duration::from_millis(250), Some("kube"));
        has(
            &m.encode(),
            &[
                "vcp_reconcile_passes_total 3",
                "vcp_reconcile_pass_errors_total 2",
                "vcp_reconcile_pass_seconds_total 2",
                r#"vcp_reconcile_pass_duration_seconds_count{pass="bring_up"} 2"#,
                r#"vcp_reconcile_pass_duration_seconds_count{pass="tear_down"} 1"#,
                r#"vcp_reconcile_pass_duration_seconds_bucket{le="+Inf",pass="bring_up"} 2"#,
                r#"vcp_reconcile_errors_total{error="kube"} 2"#,
            ],
        );
    }

    #[test]
    fn bring_up_work_is_timed_by_part() {
        let m = Metrics::new();
        m.bring_up_work("pki", Duration::from_millis(400));
        m.bring_up_work("pki", Duration::from_millis(20));
        m.bring_up_work("etcd", Duration::from_millis(30));
        has(
            &m.encode(),
            &[
                r#"vcp_provision_work_duration_seconds_count{part="pki"} 2"#,
                r#"vcp_provision_work_duration_seconds_count{part="etcd"} 1"#,
            ],
        );
    }

    #[test]
    fn requests_are_timed_by_route_template_never_by_path() {
        let m = Metrics::new();
        let ms = Duration::from_millis(3);
        m.request(
            &http::Method::GET,
            Some("/v1/tenants/{name}"),
            http::StatusCode::OK,
            ms,
        );
        m.request(
            &http::Method::GET,
            Some("/v1/tenants/{name}"),
            http::StatusCode::NOT_FOUND,
            ms,
        );
        m.request(
            &http::Method::from_bytes(b"BREW").unwrap(),
            None,
            http::StatusCode::METHOD_NOT_ALLOWED,
            ms,
        );
        m.request(
            &http::Method::POST,
            Some("/v1/tokens"),
            http::StatusCode::INTERNAL_SERVER_ERROR,
            ms,
        );
        has(
            &m.encode(),
            &[
                "vcp_http_requests_total 4",
                "vcp_http_client_errors_total 2",
                "vcp_http_server_errors_total 1",
                r#"vcp_http_request_duration_seconds_count{method="GET",route="/v1/tenants/{name}",status="200"} 1"#,
                r#"vcp_http_request_duration_seconds_count{method="GET",route="/v1/tenants/{name}",status="404"} 1"#,
                r#"vcp_http_request_duration_seconds_count{method="other",route="unmatched",status="405"} 1"#,
            ],
        );
    }

    #[test]
    fn every_live_phase_is_counted_and_an_unknown_count_clears_them() {
        let m = Metrics::new();
        m.tenants(Some(&[(Phase::Ready, 3), (Phase::Deleting, 1)]));
        let text = m.encode();
        has(
            &text,
            &[
                r#"vcp_tenants{phase="Ready"} 3"#,
                r#"vcp_tenants{phase="Deleting"} 1"#,
                r#"vcp_tenants{phase="Pending"} 0"#,
            ],
        );
        assert!(!text.contains("Deleted"), "{text}");
        m.tenants(None);
        assert!(!m.encode().contains("vcp_tenants{"));
    }

    #[test]
    fn patch_update_sweeps_count_starts_and_errors_by_variant() {
        let m = Metrics::new();
        m.patch_sweep(2, None);
        m.patch_sweep(0, Some("database"));
        has(
            &m.encode(),
            &[
                "vcp_patch_update_sweeps_total 2",
                "vcp_patch_updates_started_total 2",
                r#"vcp_patch_update_sweep_errors_total{error="database"} 1"#,
            ],
        );
    }

    #[test]
    fn the_names_served_before_the_registry_are_still_served() {
        let m = Metrics::new();
        m.usage_round(2, 0);
        m.tenants(Some(&[]));
        has(
            &m.encode(),
            &[
                "vcp_reconcile_passes_total 0",
                "vcp_reconcile_pass_errors_total 0",
                "vcp_reconcile_pass_seconds_total 0",
                "vcp_http_requests_total 0",
                "vcp_http_client_errors_total 0",
                "vcp_http_server_errors_total 0",
                "vcp_usage_samples_total 2",
                "vcp_usage_sample_errors_total 0",
                "vcp_fleet_steps_total 0",
                "vcp_fleet_tenant_starts_total 0",
                r#"vcp_tenants{phase="Ready"} 0"#,
                r#"vcp_reconcile_pass_duration_seconds_count{pass="bring_up"} 0"#,
                r#"vcp_reconcile_pass_duration_seconds_count{pass="tear_down"} 0"#,
            ],
        );
    }
}
