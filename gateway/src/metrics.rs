//! The gateway's Prometheus metrics and its second port: `/metrics`, `/healthz`, `/readyz`.
//!
//! Data flow: the proxy counts each connection here as it goes (its outcome, the bytes it
//! moves, how long its ClientHello took); [`router`] serves the registry as text and the probes
//! for the kubelet.
//!
//! - `vcp_gateway_connections_total{outcome}`: accepted connections by what became of them
//!   ([`Outcome`]).
//! - `vcp_gateway_active_connections`: connections open now, routed or still in their
//!   handshake.
//! - `vcp_gateway_routed_connections_total{tenant}`: routed connections by tenant. Only names
//!   that had a route are labels, and a tenant's series goes when its route does
//!   ([`Metrics::forget_tenant`]), so clients cannot grow the label set; refused names go to
//!   the logs.
//! - `vcp_gateway_bytes_total{direction}`: bytes spliced, `to_backend` or `to_client`,
//!   counted as they pass (a long watch shows up while it runs, not when it ends).
//! - `vcp_gateway_handshake_duration_seconds`: from accept until the ClientHello was read and
//!   parsed (mostly the client's round trip), for connections that got that far.
//! - `vcp_gateway_wakes_total{result}`: wake requests to vcp for asleep tenants, one per tenant
//!   per two seconds however many connections arrive: `requested` (vcp took it), `not_found`
//!   (no live tenant has the key), `failed` (vcp unreachable, a wrong token, an error).
//! - `vcp_gateway_wake_wait_seconds`: for connections to an asleep tenant that got through, from
//!   accept until its apiserver accepted (what a client waited for the wake).
//! - `vcp_gateway_activity_reports_total{result}`: activity reports (chunks) sent to vcp,
//!   `sent` or `failed`; a failing report lets vcp put tenants in use to sleep, so alert on it.

use crate::route::TenantKey;
use crate::wake::Answer;
use axum::http::StatusCode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::Arc;
use std::time::Duration;

/// What became of an accepted connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Spliced to its tenant's apiserver.
    Routed,
    /// A server name that is no tenant's (outside the domain, not a tenant name, no route).
    Unknown,
    /// A ClientHello without a server name.
    NoSni,
    /// Not a ClientHello the gateway can read, or closed before one was complete.
    Invalid,
    /// No complete ClientHello within the handshake timeout.
    Timeout,
    /// The tenant's apiserver did not accept the connection in time.
    BackendUnreachable,
    /// An asleep tenant's apiserver did not accept the connection within the wake timeout.
    WakeTimeout,
    /// Closed at once: the gateway held its maximum of connections.
    OverLimit,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Routed => "routed",
            Outcome::Unknown => "unknown",
            Outcome::NoSni => "no_sni",
            Outcome::Invalid => "invalid",
            Outcome::Timeout => "timeout",
            Outcome::BackendUnreachable => "backend_unreachable",
            Outcome::WakeTimeout => "wake_timeout",
            Outcome::OverLimit => "over_limit",
        }
    }
}

/// Which way spliced bytes went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    ToBackend,
    ToClient,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TenantLabels {
    tenant: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DirectionLabels {
    direction: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

/// The gateway's metrics and their registry.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    connections: Family<OutcomeLabels, Counter>,
    active: Gauge,
    routed: Family<TenantLabels, Counter>,
    bytes: Family<DirectionLabels, Counter>,
    handshake: Histogram,
    wakes: Family<ResultLabels, Counter>,
    wake_wait: Histogram,
    reports: Family<ResultLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        let connections = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "vcp_gateway_connections",
            "Accepted connections, by outcome",
            connections.clone(),
        );
        let active = Gauge::default();
        registry.register(
            "vcp_gateway_active_connections",
            "Connections open now, routed or in their handshake",
            active.clone(),
        );
        let routed = Family::<TenantLabels, Counter>::default();
        registry.register(
            "vcp_gateway_routed_connections",
            "Connections routed to a tenant apiserver, by tenant",
            routed.clone(),
        );
        let bytes = Family::<DirectionLabels, Counter>::default();
        registry.register(
            "vcp_gateway_bytes",
            "Bytes spliced between clients and tenant apiservers, by direction",
            bytes.clone(),
        );
        // 0.1 ms to 6.5 s: a client on loopback to one that used up the default timeout.
        let handshake = Histogram::new(exponential_buckets(0.0001, 2.0, 17));
        registry.register(
            "vcp_gateway_handshake_duration_seconds",
            "Time from accept until the ClientHello was read and parsed",
            handshake.clone(),
        );
        let wakes = Family::<ResultLabels, Counter>::default();
        registry.register(
            "vcp_gateway_wakes",
            "Wake requests to vcp for asleep tenants, by result",
            wakes.clone(),
        );
        // 50 ms to 102 s: an apiserver already up to one that used up the longest wake timeout.
        let wake_wait = Histogram::new(exponential_buckets(0.05, 2.0, 12));
        registry.register(
            "vcp_gateway_wake_wait_seconds",
            "Time from accept until an asleep tenant's apiserver accepted the connection",
            wake_wait.clone(),
        );
        let reports = Family::<ResultLabels, Counter>::default();
        registry.register(
            "vcp_gateway_activity_reports",
            "Activity reports sent to vcp, by result",
            reports.clone(),
        );
        Metrics {
            registry,
            connections,
            active,
            routed,
            bytes,
            handshake,
            wakes,
            wake_wait,
            reports,
        }
    }

    /// Counts one connection's outcome.
    pub fn outcome(&self, outcome: Outcome) {
        self.connections
            .get_or_create(&OutcomeLabels {
                outcome: outcome.as_str(),
            })
            .inc();
    }

    /// Counts one connection routed to `tenant` (a name that has a route).
    pub fn routed(&self, tenant: &TenantKey) {
        self.routed
            .get_or_create(&TenantLabels {
                tenant: tenant.to_string(),
            })
            .inc();
    }

    /// Drops the series of a tenant whose route went.
    pub fn forget_tenant(&self, tenant: &str) {
        self.routed.remove(&TenantLabels {
            tenant: tenant.to_owned(),
        });
    }

    /// The open-connections gauge.
    pub fn active(&self) -> Gauge {
        self.active.clone()
    }

    /// The byte counter of one direction.
    pub fn bytes(&self, direction: Direction) -> Counter {
        let direction = match direction {
            Direction::ToBackend => "to_backend",
            Direction::ToClient => "to_client",
        };
        self.bytes
            .get_or_create(&DirectionLabels { direction })
            .clone()
    }

    /// Records how long a ClientHello took.
    pub fn handshake(&self, took: Duration) {
        self.handshake.observe(took.as_secs_f64());
    }

    /// Counts one wake request by vcp's answer (none is made without vcp: `NotAsked` is not
    /// counted).
    pub fn wake(&self, answer: Answer) {
        if answer != Answer::NotAsked {
            let result = answer.as_str();
            self.wakes.get_or_create(&ResultLabels { result }).inc();
        }
    }

    /// Records how long a connection waited for an asleep tenant's apiserver.
    pub fn wake_wait(&self, took: Duration) {
        self.wake_wait.observe(took.as_secs_f64());
    }

    /// Counts one activity report (chunk), sent or failed.
    pub fn activity_report(&self, sent: bool) {
        let result = if sent { "sent" } else { "failed" };
        self.reports.get_or_create(&ResultLabels { result }).inc();
    }

    /// The metrics in the Prometheus text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// `/metrics`, `/healthz` (the process answers) and `/readyz` (503 until `ready` says so: the
/// route table is synced and the gateway is not stopping).
pub fn router(
    metrics: Arc<Metrics>,
    ready: impl Fn() -> bool + Clone + Send + Sync + 'static,
) -> axum::Router {
    let scrape = move || async move {
        (
            [(
                axum::http::header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            metrics.encode(),
        )
    };
    let readyz = move || async move {
        if ready() {
            (StatusCode::OK, "ok")
        } else {
            (StatusCode::SERVICE_UNAVAILABLE, "not ready")
        }
    };
    axum::Router::new()
        .route("/metrics", axum::routing::get(scrape))
        .route("/healthz", axum::routing::get(|| async { "ok" }))
        .route("/readyz", axum::routing::get(readyz))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_are_exported_under_their_documented_names() {
        let m = Metrics::new();
        m.outcome(Outcome::Routed);
        m.outcome(Outcome::OverLimit);
        m.routed(&TenantKey::new("a").unwrap());
        m.bytes(Direction::ToBackend).inc_by(10);
        m.handshake(Duration::from_millis(3));
        m.wake(Answer::Requested);
        m.wake(Answer::NotFound);
        m.wake(Answer::Failed);
        m.wake(Answer::NotAsked);
        m.wake_wait(Duration::from_millis(1500));
        m.activity_report(true);
        m.activity_report(false);
        m.outcome(Outcome::WakeTimeout);
        let text = m.encode();
        for line in [
            "vcp_gateway_connections_total{outcome=\"routed\"} 1",
            "vcp_gateway_connections_total{outcome=\"over_limit\"} 1",
            "vcp_gateway_routed_connections_total{tenant=\"a\"} 1",
            "vcp_gateway_bytes_total{direction=\"to_backend\"} 10",
            "vcp_gateway_handshake_duration_seconds_count 1",
            "vcp_gateway_active_connections 0",
            "vcp_gateway_wakes_total{result=\"requested\"} 1",
            "vcp_gateway_wakes_total{result=\"not_found\"} 1",
            "vcp_gateway_wakes_total{result=\"failed\"} 1",
            "vcp_gateway_wake_wait_seconds_count 1",
            "vcp_gateway_activity_reports_total{result=\"sent\"} 1",
            "vcp_gateway_activity_reports_total{result=\"failed\"} 1",
            "vcp_gateway_connections_total{outcome=\"wake_timeout\"} 1",
        ] {
            assert!(text.contains(line), "{line} in\n{text}");
        }
        assert!(!text.contains("not_asked"), "no request, no count");
        m.forget_tenant("a");
        assert!(!m.encode().contains("tenant=\"a\""));
    }
}
