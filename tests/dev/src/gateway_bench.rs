//! `vcp-dev bench gateway`: what the gateway adds to a tenant request, side by side with a
//! direct connection.
//!
//! Against a running dev cluster on the real node whose vcp exposes tenants through the gateway
//! (`up --real-node`, chart mode), it issues a kubeconfig of `--tenant` and makes a second one
//! that differs only in its server: a NodePort Service of its own (`vcp-dev-bench-direct`, in
//! the tenant's control-plane namespace, selecting the same apiserver pods) instead of the
//! gateway. Both dial the node's address, both go through kube-proxy's NodePort, and both
//! verify the tenant's serving certificate under the same `tls-server-name`: the gateway's hop
//! is the only difference. Then it times `GET /api/v1/namespaces/default` through each, in
//! alternating rounds so that load on the machine falls on both alike:
//! - over one kept connection (what a controller or kubectl's cache sees): the splice alone;
//! - over a new connection per request (what each `kubectl get` pays): also the gateway's
//!   ClientHello read, route lookup and its dial of the apiserver.
//!
//! Data flow: latencies per path -> [`Figures`] ([`figures`], pure) -> one summary line. The
//! Service it made is deleted at the end.

use anyhow::Context;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{Api, DeleteParams, PostParams};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// `bench gateway` settings.
#[derive(Debug, Clone, clap::Args)]
pub struct GatewayBench {
    #[arg(long, env = "VCP_DEV_STATE_DIR")]
    pub state_dir: PathBuf,
    /// The tenant to call (its kubeconfig is issued for the run).
    #[arg(long, env = "VCP_BENCH_TENANT", default_value = "demo")]
    pub tenant: String,
    /// Requests per path and connection kind.
    #[arg(long, env = "VCP_BENCH_REQUESTS", default_value_t = 400)]
    pub requests: usize,
}

/// Latencies of one path, in ms, sorted.
fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

/// The `q` quantile of sorted values (nearest rank).
fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// p50 and p99 of each path and what the gateway adds to them.
#[derive(Debug, Clone, PartialEq)]
pub struct Figures {
    pub direct: (f64, f64),
    pub gateway: (f64, f64),
}

impl Figures {
    pub fn added(&self) -> (f64, f64) {
        (
            self.gateway.0 - self.direct.0,
            self.gateway.1 - self.direct.1,
        )
    }
}

/// [`Figures`] of two sets of latencies (ms).
pub fn figures(direct: Vec<f64>, gateway: Vec<f64>) -> Figures {
    let (d, g) = (sorted(direct), sorted(gateway));
    Figures {
        direct: (quantile(&d, 0.5), quantile(&d, 0.99)),
        gateway: (quantile(&g, 0.5), quantile(&g, 0.99)),
    }
}

/// The summary line.
pub fn line(requests: usize, kept: &Figures, fresh: &Figures) -> String {
    let (ka50, ka99) = kept.added();
    let (fa50, fa99) = fresh.added();
    format!(
        "bench-gateway requests={requests} \
         kept_direct_p50_ms={:.2} kept_direct_p99_ms={:.2} kept_gateway_p50_ms={:.2} kept_gateway_p99_ms={:.2} \
         kept_added_p50_ms={ka50:.2} kept_added_p99_ms={ka99:.2} \
         new_direct_p50_ms={:.2} new_direct_p99_ms={:.2} new_gateway_p50_ms={:.2} new_gateway_p99_ms={:.2} \
         new_added_p50_ms={fa50:.2} new_added_p99_ms={fa99:.2}",
        kept.direct.0,
        kept.direct.1,
        kept.gateway.0,
        kept.gateway.1,
        fresh.direct.0,
        fresh.direct.1,
        fresh.gateway.0,
        fresh.gateway.1,
    )
}

/// `kubeconfig` with its cluster's server replaced by `server` (the `tls-server-name` kept).
pub fn with_server(kubeconfig: &str, server: &str) -> anyhow::Result<String> {
    let mut v: serde_yaml::Value = serde_yaml::from_str(kubeconfig)?;
    let cluster = v
        .get_mut("clusters")
        .and_then(|c| c.get_mut(0))
        .and_then(|c| c.get_mut("cluster"))
        .and_then(serde_yaml::Value::as_mapping_mut)
        .context("the kubeconfig has no cluster")?;
    cluster.insert("server".into(), server.into());
    Ok(serde_yaml::to_string(&v)?)
}

async fn client_of(kubeconfig: &str) -> anyhow::Result<kube::Client> {
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::from_yaml(kubeconfig)?,
        &kube::config::KubeConfigOptions::default(),
    )
    .await?;
    Ok(kube::Client::try_from(config)?)
}

/// One `GET /api/v1/namespaces/default`, in ms.
async fn get(client: &kube::Client) -> anyhow::Result<f64> {
    let req = http::Request::get("/api/v1/namespaces/default").body(Vec::new())?;
    let t = Instant::now();
    client.request_text(req).await?;
    Ok(t.elapsed().as_secs_f64() * 1e3)
}

/// Runs the benchmark (see the module docs).
pub async fn run(b: GatewayBench) -> anyhow::Result<()> {
    let record = vcp_dev::platform::read_record(&b.state_dir)?
        .context("no platform in this state dir: run `vcp-dev up --real-node` first")?;
    let token = crate::density::admin_token(&b.state_dir)?;
    let api = vcp_dev::platform::ApiClient::new(&record.api_url, &token);
    let host = vcp_dev::cluster::client_from(&b.state_dir.join("host.kubeconfig")).await?;
    let tenant = api
        .get_tenant(&b.tenant)
        .await?
        .with_context(|| format!("no tenant {:?}", b.tenant))?;
    let key = tenant["key"].as_str().context("the tenant has no key")?;
    let via_gateway = api.kubeconfig(&b.tenant, "bench", &["admin"], "1h").await?;
    let doc: serde_yaml::Value = serde_yaml::from_str(&via_gateway)?;
    anyhow::ensure!(
        doc["clusters"][0]["cluster"]["tls-server-name"].is_string(),
        "the tenant's kubeconfig names no tls-server-name: is vcp exposing tenants through the \
         gateway (`up --real-node` in chart mode)?"
    );
    let ns = format!("vcp-{key}");
    let (_, net) = vcp_dev::node::recorded(&b.state_dir.join(vcp_dev::node::DIR))
        .context("no real node in this state dir")?;
    let services: Api<Service> = Api::namespaced(host.clone(), &ns);
    let direct_svc: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "vcp-dev-bench-direct"},
        "spec": {
            "type": "NodePort",
            "selector": {"vcp.dev/control-plane-of": key, "app.kubernetes.io/component": "kube-apiserver"},
            "ports": [{"name": "https", "port": 6443, "targetPort": 6443}],
        },
    }))?;
    let _ = services
        .delete("vcp-dev-bench-direct", &DeleteParams::default())
        .await;
    let made = services
        .create(&PostParams::default(), &direct_svc)
        .await
        .context("creating the direct NodePort Service")?;
    let port = made
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .and_then(|p| p.first())
        .and_then(|p| p.node_port)
        .context("no NodePort assigned")?;
    let result = measure(
        &b,
        &via_gateway,
        &net.node_ip().to_string(),
        port,
        &host,
        &ns,
    )
    .await;
    let _ = services
        .delete("vcp-dev-bench-direct", &DeleteParams::default())
        .await;
    let (kept, fresh) = result?;
    println!("{}", line(b.requests, &kept, &fresh));
    Ok(())
}

async fn measure(
    b: &GatewayBench,
    via_gateway: &str,
    node_ip: &str,
    port: i32,
    host: &kube::Client,
    ns: &str,
) -> anyhow::Result<(Figures, Figures)> {
    let direct = with_server(via_gateway, &format!("https://{node_ip}:{port}"))?;
    // The apiserver is up, but kube-proxy on the node learns of the new NodePort in a moment.
    let probe = client_of(&direct).await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while get(&probe).await.is_err() {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the direct NodePort {node_ip}:{port} did not answer in 30 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let apiservers = Api::<Pod>::namespaced(host.clone(), ns)
        .list(
            &kube::api::ListParams::default().labels("app.kubernetes.io/component=kube-apiserver"),
        )
        .await?
        .items
        .len();
    eprintln!("gateway bench: {apiservers} apiserver pod(s); direct path {node_ip}:{port}");
    let kept_clients = [client_of(&direct).await?, client_of(via_gateway).await?];
    // Warm both: the first request of a client pays its handshake.
    for c in &kept_clients {
        get(c).await?;
    }
    let rounds = 10usize;
    let per_round = b.requests.div_ceil(rounds);
    let (mut kd, mut kg, mut nd, mut ng) = (vec![], vec![], vec![], vec![]);
    for round in 0..rounds {
        // Alternate which path goes first in each round.
        let order: [usize; 2] = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for path in order {
            for _ in 0..per_round {
                let ms = get(&kept_clients[path]).await?;
                if path == 0 { kd.push(ms) } else { kg.push(ms) }
            }
            for _ in 0..per_round {
                let kc = if path == 0 { &direct } else { via_gateway };
                let c = client_of(kc).await?;
                let ms = get(&c).await?;
                if path == 0 { nd.push(ms) } else { ng.push(ms) }
            }
        }
    }
    Ok((figures(kd, kg), figures(nd, ng)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_nearest_rank_and_the_added_cost_is_the_difference() {
        let direct: Vec<f64> = (1..=100).map(f64::from).collect();
        let gateway: Vec<f64> = (1..=100).rev().map(|v| f64::from(v) + 0.5).collect();
        let f = figures(direct, gateway);
        assert_eq!(f.direct, (50.0, 99.0));
        assert_eq!(f.gateway, (50.5, 99.5));
        assert_eq!(f.added(), (0.5, 0.5));
        assert!(quantile(&[], 0.5).is_nan());
        assert_eq!(quantile(&[3.0], 0.99), 3.0);
    }

    #[test]
    fn the_direct_kubeconfig_changes_only_the_server() {
        let kc = "apiVersion: v1\nkind: Config\nclusters:\n- name: t\n  cluster:\n    server: https://10.0.0.2:31443\n    tls-server-name: k1.tenants.vcp.test\n    certificate-authority-data: Q0E=\nusers: []\n";
        let direct = with_server(kc, "https://10.0.0.2:30111").unwrap();
        let v: serde_yaml::Value = serde_yaml::from_str(&direct).unwrap();
        let c = &v["clusters"][0]["cluster"];
        assert_eq!(c["server"].as_str(), Some("https://10.0.0.2:30111"));
        assert_eq!(c["tls-server-name"].as_str(), Some("k1.tenants.vcp.test"));
        assert_eq!(c["certificate-authority-data"].as_str(), Some("Q0E="));
        assert!(with_server("clusters: []", "https://x").is_err());
    }
}
