//! `kubectl top` inside a tenant: the syncer serves the tenant's `metrics.k8s.io` API from the
//! host's.
//!
//! Data flow: [`register`] makes the tenant apiserver aggregate `v1beta1.metrics.k8s.io` to
//! the syncer's kubelet endpoint (an `APIService` over a tenant Service of type ExternalName
//! that names the endpoint's address, a ClusterRole that lets `view`, `edit` and `admin` read
//! it). The tenant apiserver authenticates and authorizes each request, then passes it on with
//! its front-proxy client certificate, the only certificate this API admits
//! ([`crate::kubelet`] tells it from the kubelet client by its CA). [`MetricsApi::handle`]
//! reads the route ([`translate::parse`]), lists the host's `PodMetrics` in the host
//! namespace of each tenant namespace asked for (the syncer may read pod metrics only in its
//! own host namespaces), keeps those whose host pod is this tenant's copy of a tenant pod (by
//! its markers, through the host pod cache) and answers with the tenant's names; node metrics
//! are the sums of the tenant's own pods per virtual node ([`translate::node`]).
//!
//! Nothing is cached here: every request reads the host's current figures, which
//! metrics-server itself refreshes every resolution period.

pub mod translate;

use crate::answer::{Body, json, status};
use crate::engine::Engine;
use crate::kinds::pods::nodes::VIRTUAL_NODE_LABEL;
use crate::{Result, kube_err};
use base64::Engine as _;
use hyper::{Request, Response, StatusCode};
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use std::collections::BTreeMap;
use std::sync::Arc;
use translate::{PodMetrics, PodMetricsList, Route, Selector};
use vcp_core::naming;

/// The tenant Service the APIService names; reserved (the syncer never copies it to the host).
pub const SERVICE_NAMESPACE: &str = vcp_policy::services::METRICS_SERVICE.0;
pub const SERVICE_NAME: &str = vcp_policy::services::METRICS_SERVICE.1;
/// The APIService's name.
pub const API_SERVICE: &str = "v1beta1.metrics.k8s.io";
/// The ClusterRole aggregated into `view`, `edit` and `admin`.
pub const READER_ROLE: &str = "vcp:metrics-reader";
/// The common name of the tenant apiserver's front-proxy client certificate.
pub const DEFAULT_CLIENT: &str = "front-proxy-client";
/// Field manager of the objects [`register`] applies in the tenant.
const FIELD_MANAGER: &str = "vcp-syncer-metrics";

/// Serves the tenant's metrics.k8s.io requests.
pub struct MetricsApi {
    pub engine: Arc<Engine>,
}

/// Applies the tenant objects that aggregate metrics.k8s.io to the endpoint at
/// `address:port`, whose serving certificate `ca_bundle` (PEM) verifies.
#[tracing::instrument(skip_all, fields(%address, port))]
pub async fn register(
    tenant: &kube::Client,
    address: &str,
    port: u16,
    ca_bundle: &[u8],
) -> Result<()> {
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    let svc = serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": SERVICE_NAME, "namespace": SERVICE_NAMESPACE,
                     "labels": {"app.kubernetes.io/managed-by": "vcp-syncer"}},
        "spec": {"type": "ExternalName", "externalName": address,
                 "ports": [{"name": "https", "port": port, "protocol": "TCP"}]},
    });
    Api::<Service>::namespaced(tenant.clone(), SERVICE_NAMESPACE)
        .patch(SERVICE_NAME, &pp, &Patch::Apply(&svc))
        .await
        .map_err(kube_err("apply the tenant's metrics Service".into()))?;
    let role = serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": READER_ROLE, "labels": {
            "app.kubernetes.io/managed-by": "vcp-syncer",
            "rbac.authorization.k8s.io/aggregate-to-view": "true",
            "rbac.authorization.k8s.io/aggregate-to-edit": "true",
            "rbac.authorization.k8s.io/aggregate-to-admin": "true"}},
        "rules": [{"apiGroups": [translate::GROUP], "resources": ["pods", "nodes"], "verbs": ["get", "list"]}],
    });
    Api::<ClusterRole>::all(tenant.clone())
        .patch(READER_ROLE, &pp, &Patch::Apply(&role))
        .await
        .map_err(kube_err("apply the tenant's metrics reader role".into()))?;
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_bundle);
    let api_service = serde_json::json!({
        "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
        "metadata": {"name": API_SERVICE, "labels": {"app.kubernetes.io/managed-by": "vcp-syncer"}},
        "spec": {"group": translate::GROUP, "version": translate::VERSION,
                 "service": {"name": SERVICE_NAME, "namespace": SERVICE_NAMESPACE, "port": port},
                 "caBundle": ca, "groupPriorityMinimum": 100, "versionPriority": 100},
    });
    let gvk = kube::api::GroupVersionKind::gvk("apiregistration.k8s.io", "v1", "APIService");
    let ar = kube::api::ApiResource::from_gvk_with_plural(&gvk, "apiservices");
    Api::<kube::api::DynamicObject>::all_with(tenant.clone(), &ar)
        .patch(API_SERVICE, &pp, &Patch::Apply(&api_service))
        .await
        .map_err(kube_err("apply the tenant's metrics APIService".into()))?;
    Ok(())
}

fn failure(code: StatusCode, reason: &str, message: &str) -> Response<Body> {
    json(code, &status(code.as_u16(), reason, message))
}

/// The query parameters served: label and field selectors.
struct Query {
    selector: Selector,
    name: Option<String>,
}

fn query(q: Option<&str>) -> Result<Query, String> {
    let mut out = Query {
        selector: Selector::default(),
        name: None,
    };
    for (k, v) in form_urlencoded::parse(q.unwrap_or("").as_bytes()) {
        match k.as_ref() {
            "labelSelector" => out.selector = Selector::parse(&v)?,
            "fieldSelector" => out.name = translate::field_name(&v)?,
            "watch" if v == "true" || v == "1" => {
                return Err("watch is not supported by metrics.k8s.io".into());
            }
            _ => {}
        }
    }
    Ok(out)
}

impl MetricsApi {
    /// Serves one request of the tenant apiserver.
    pub async fn handle<B>(&self, req: Request<B>) -> Response<Body> {
        if req.method() != hyper::Method::GET {
            return failure(
                StatusCode::METHOD_NOT_ALLOWED,
                "MethodNotAllowed",
                "metrics.k8s.io is read-only",
            );
        }
        let Some(route) = translate::parse(req.uri().path()) else {
            return failure(
                StatusCode::NOT_FOUND,
                "NotFound",
                "the server could not find the requested resource",
            );
        };
        let q = match query(req.uri().query()) {
            Ok(q) => q,
            Err(e) => return failure(StatusCode::BAD_REQUEST, "BadRequest", &e),
        };
        let user = req
            .headers()
            .get("x-remote-user")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        tracing::debug!(?route, user, "metrics request");
        let result = match route {
            Route::Resources => return json(StatusCode::OK, &translate::resources()),
            Route::Group => return json(StatusCode::OK, &translate::group()),
            Route::Pods { namespace, name } => {
                self.pods(namespace, name.or(q.name), &q.selector).await
            }
            Route::Nodes { name } => self.nodes(name.or(q.name), &q.selector).await,
        };
        match result {
            Ok(Answer::Found(v)) => json(StatusCode::OK, &v),
            Ok(Answer::NotFound(what)) => failure(
                StatusCode::NOT_FOUND,
                "NotFound",
                &format!("{what} not found"),
            ),
            Err(e) => {
                tracing::warn!(error = %crate::chain(&e), "metrics request failed");
                failure(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "ServiceUnavailable",
                    "the host's resource metrics are not available",
                )
            }
        }
    }

    /// Tenant pods in `namespace` (all when `None`) matching the request, by namespace.
    fn tenant_pods(
        &self,
        namespace: Option<&str>,
        name: Option<&str>,
        selector: &Selector,
    ) -> Result<BTreeMap<String, Vec<Arc<Pod>>>> {
        let Some(cache) = self.engine.tenant_pods.get() else {
            return Err(crate::Error::NotReady("the tenant pod cache".into()));
        };
        let mut by_ns: BTreeMap<String, Vec<Arc<Pod>>> = BTreeMap::new();
        for p in cache.store().state() {
            let ns = p.namespace().unwrap_or_default();
            if namespace.is_some_and(|n| n != ns)
                || name.is_some_and(|n| n != p.name_any())
                || !selector.matches(p.labels())
            {
                continue;
            }
            by_ns.entry(ns).or_default().push(p);
        }
        Ok(by_ns)
    }

    /// The host's pod metrics of each tenant namespace's host namespace, paired with the tenant
    /// pods whose host copies they are.
    async fn metrics_of(
        &self,
        by_ns: BTreeMap<String, Vec<Arc<Pod>>>,
    ) -> Result<Vec<(Arc<Pod>, PodMetrics)>> {
        let key = self.engine.key();
        let host_pods = self
            .engine
            .host_pods
            .get()
            .ok_or_else(|| crate::Error::NotReady("the host pod cache".into()))?
            .store();
        let lists = futures::future::try_join_all(by_ns.into_iter().map(|(ns, pods)| {
            let host = self.engine.host.clone();
            let host_ns = naming::host_namespace(key, &ns);
            async move {
                let uri = format!(
                    "/apis/{}/namespaces/{host_ns}/pods",
                    translate::GROUP_VERSION
                );
                let req = http::Request::get(&uri)
                    .body(Vec::new())
                    .map_err(|e| crate::Error::Kubelet(e.to_string()))?;
                let list: PodMetricsList = host
                    .request(req)
                    .await
                    .map_err(kube_err(format!("list host pod metrics in {host_ns}")))?;
                Ok::<_, crate::Error>((ns, host_ns, pods, list))
            }
        }))
        .await?;
        let mut out = Vec::new();
        for (ns, host_ns, pods, list) in lists {
            let mut by_name: BTreeMap<String, PodMetrics> = list
                .items
                .into_iter()
                .filter_map(|m| Some((m.metadata.name.clone()?, m)))
                .collect();
            for t in pods {
                let name = t.name_any();
                let Some(m) = by_name.remove(&name) else {
                    continue;
                };
                // Only the host pod that is this tenant's copy of exactly this tenant pod.
                let Some(h) = host_pods.get(&ObjectRef::new(&name).within(&host_ns)) else {
                    continue;
                };
                let ours = naming::tenant_ref(key, h.labels(), h.annotations()).is_some_and(|r| {
                    r.namespace.as_deref() == Some(ns.as_str())
                        && r.name == name
                        && r.uid.is_none_or(|u| t.uid().as_deref() == Some(u.as_str()))
                });
                if ours {
                    out.push((t, m));
                }
            }
        }
        Ok(out)
    }

    async fn pods(
        &self,
        namespace: Option<String>,
        name: Option<String>,
        selector: &Selector,
    ) -> Result<Answer> {
        let by_ns = self.tenant_pods(namespace.as_deref(), name.as_deref(), selector)?;
        let items: Vec<PodMetrics> = self
            .metrics_of(by_ns)
            .await?
            .iter()
            .map(|(t, m)| translate::tenant_pod(t, m))
            .collect();
        Ok(match (namespace, name) {
            (Some(ns), Some(n)) => match items.first() {
                Some(m) => Answer::Found(translate::object("PodMetrics", m)),
                None => Answer::NotFound(format!("podmetrics.metrics.k8s.io \"{ns}/{n}\"")),
            },
            _ => Answer::Found(translate::list("PodMetricsList", &items)),
        })
    }

    async fn nodes(&self, name: Option<String>, selector: &Selector) -> Result<Answer> {
        let lp = ListParams::default().labels(&format!("{VIRTUAL_NODE_LABEL}=true"));
        let nodes: Vec<Node> = Api::<Node>::all(self.engine.tenant.clone())
            .list(&lp)
            .await
            .map_err(kube_err("list virtual nodes".into()))?
            .items
            .into_iter()
            .filter(|n| {
                name.as_ref().is_none_or(|w| *w == n.name_any()) && selector.matches(n.labels())
            })
            .collect();
        let all = self.tenant_pods(None, None, &Selector::default())?;
        let metrics = self.metrics_of(all).await?;
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let items: Vec<_> = nodes
            .iter()
            .map(|n| {
                let on: Vec<&PodMetrics> = metrics
                    .iter()
                    .filter(|(t, _)| {
                        t.spec.as_ref().and_then(|s| s.node_name.as_deref())
                            == Some(n.name_any().as_str())
                    })
                    .map(|(_, m)| m)
                    .collect();
                translate::node(&n.name_any(), n.labels(), &on, &now)
            })
            .collect();
        Ok(match name {
            Some(n) => match items.first() {
                Some(m) => Answer::Found(translate::object("NodeMetrics", m)),
                None => Answer::NotFound(format!("nodemetrics.metrics.k8s.io \"{n}\"")),
            },
            None => Answer::Found(translate::list("NodeMetricsList", &items)),
        })
    }
}

enum Answer {
    Found(serde_json::Value),
    NotFound(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_give_selectors_and_refuse_watches_and_other_fields() {
        let q = query(Some(
            "labelSelector=app%3Dweb&fieldSelector=metadata.name%3Dx",
        ))
        .unwrap();
        assert!(
            q.selector
                .matches(&BTreeMap::from([("app".into(), "web".into())]))
        );
        assert_eq!(q.name.as_deref(), Some("x"));
        assert!(query(Some("watch=true")).is_err());
        assert!(query(Some("fieldSelector=spec.nodeName%3Dn")).is_err());
        assert!(query(Some("labelSelector=%3D")).is_err());
        assert!(query(None).unwrap().name.is_none());
    }
}
