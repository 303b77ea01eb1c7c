//! vcp installed on the dev cluster with its own Helm chart (`charts/vcp`), the way a platform
//! team installs it: `helm upgrade --install` with values for the dev cluster, then waiting for
//! the chart's pods, reading the admin token from the Secret the chart generated, and reaching
//! the API through the Service's NodePort.
//!
//! The values place vcp's pods and the evaluation Postgres on the process node (the devnode
//! runs them as real processes: the workspace's `vcp`, Debian's PostgreSQL for the Postgres
//! image), and control planes there too (the dev plans). The devnode forwards every NodePort of
//! a Service whose ready endpoints are on its network from `127.0.0.1:<nodePort>`, so the API
//! Service is a NodePort: no `kubectl port-forward` process to keep alive, and the address
//! survives a replica being replaced (a port-forward sticks to the one pod it picked).

use crate::{Error, Result, bins, cluster};
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Release name `vcp-dev up` installs; the chart names its objects after it (`vcp`,
/// `vcp-admin-token`, `vcp-postgresql`).
pub const RELEASE: &str = "vcp";
/// Namespace `vcp-dev up` installs into.
pub const NAMESPACE: &str = "vcp-system";
/// Label selector of vcp's own pods of a release.
pub fn orchestrator_selector(release: &str) -> String {
    format!("app.kubernetes.io/instance={release},app.kubernetes.io/component=orchestrator")
}
/// Label selector of the gateway's pods of a release (`expose.mode: gateway`).
pub fn gateway_selector(release: &str) -> String {
    format!("app.kubernetes.io/instance={release},app.kubernetes.io/component=gateway")
}
/// The domain tenants are named under behind the real node's gateway: `.test` (RFC 2606) is
/// never a real name, and nothing resolves it; kubeconfigs dial the node's address and send
/// `<key>.<domain>` as their `tls-server-name`.
pub const GATEWAY_DOMAIN: &str = "tenants.vcp.test";
/// Label selector of the evaluation Postgres' pod of a release.
pub fn postgresql_selector(release: &str) -> String {
    format!("app.kubernetes.io/instance={release},app.kubernetes.io/component=postgresql")
}

/// The chart's directory in the workspace this crate was built from (the dev tools always run
/// from their workspace, as the devnode runs that workspace's binaries).
pub fn chart_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../charts/vcp")
}

/// The chart's name for a release's objects (`vcp.fullname` in `_helpers.tpl`).
pub fn fullname(release: &str) -> String {
    if release.contains("vcp") {
        release.to_owned()
    } else {
        format!("{release}-vcp")
    }
}

/// Values for the dev cluster: two vcp replicas (the chart's default) and the evaluation
/// Postgres on the devnode, control planes there too, tenant apiservers as NodePorts on
/// 127.0.0.1 (where the devnode forwards them) and, with `api_node_port`, the API as well.
pub fn dev_values(api_node_port: Option<u16>) -> String {
    let service = match api_node_port {
        Some(port) => format!("service: {{type: NodePort, nodePort: {port}}}\n"),
        None => String::new(),
    };
    format!(
        r#"replicas: 2
workers: 2
serviceCIDR: {cidr}
tenantAccess: service-name
expose: {{mode: node-port, address: 127.0.0.1}}
postgresql: {{enabled: true, storage: {{size: 1Gi}}}}
logging: {{format: text, level: "info"}}
nodeSelector: {{vcp.dev/runtime: process}}
tolerations: [{{key: vcp.dev/runtime, operator: Equal, value: process, effect: NoSchedule}}]
plans:
  default:
    node_selector: {{vcp.dev/runtime: process}}
    tolerations: [{{key: vcp.dev/runtime, operator: Equal, value: process, effect: NoSchedule}}]
    policy:
      placement:
        node_selector: {{type: kwok}}
{service}"#,
        cidr = cluster::SERVICE_CIDR
    )
}

/// How long the real node's gateway holds a connection for a sleeping tenant, and how long the
/// test's client waits for it. The default (30 s) is what a quiet machine needs several times
/// over, but with the whole suite beside it on two cores a wake once took longer than 30 s
/// (CI on 3f62c4f): the test is about the wake happening, not its speed, which
/// docs/benchmarks.md measures on its own.
pub const WAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(90);

/// Values of the dev environment on the real node ([`crate::node`]): vcp, its Postgres and
/// every tenant's control plane and workloads run there as containers from the images built
/// here (vcp's by the chart's own names), every tenant behind the gateway on the node's
/// `gateway_node_port`, as a platform runs vcp (no NodePort per tenant).
pub fn real_node_values(
    node_ip: std::net::Ipv4Addr,
    api_node_port: Option<u16>,
    gateway_node_port: u16,
) -> String {
    let (k, v) = crate::node::NODE_LABEL;
    let service = match api_node_port {
        Some(port) => format!("service: {{type: NodePort, nodePort: {port}}}\n"),
        None => "service: {type: NodePort}\n".to_owned(),
    };
    // The same plans as a local `vcp serve` on the real node gets.
    let plans: String = crate::platform::REAL_NODE_PLANS
        .lines()
        .map(|l| format!("  {l}\n"))
        .collect();
    let datastores: String = crate::platform::DEV_DATASTORES
        .lines()
        .map(|l| format!("  {l}\n"))
        .collect();
    format!(
        r#"replicas: 2
workers: 2
serviceCIDR: {cidr}
expose: {{mode: gateway, domain: {domain}, address: "{node_ip}", port: {gw}}}
gateway: {{service: {{type: NodePort, port: 443, nodePort: {gw}}}, wakeTimeoutMs: {wake}}}
postgresql: {{enabled: true, storage: {{size: 1Gi}}}}
logging: {{format: text, level: "info"}}
nodeSelector: {{{k}: {v}}}
tolerations: [{{key: {k}, operator: Equal, value: {v}, effect: NoSchedule}}]
plans:
{plans}datastores:
{datastores}{service}"#,
        cidr = cluster::SERVICE_CIDR,
        domain = GATEWAY_DOMAIN,
        gw = gateway_node_port,
        wake = WAKE_TIMEOUT.as_millis(),
    )
}

/// Runs the pinned helm against the cluster of `kubeconfig`; stdout on success.
pub fn helm(kubeconfig: &Path, args: &[&str]) -> Result<String> {
    let program = bins::tool("helm")?;
    let out = std::process::Command::new(&program)
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .output()
        .map_err(Error::io(&program))?;
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    if !out.status.success() {
        return Err(Error::Helm {
            args: args.join(" "),
            output: format!("{}{}", text(&out.stdout), text(&out.stderr)),
        });
    }
    Ok(text(&out.stdout))
}

/// `helm upgrade --install` of the workspace's chart as `release` in `ns` (created if needed)
/// with `values`, kept in `values_file` (where a developer can read what was installed).
/// Installing over an existing release changes nothing that is the same, so `up` on a stopped
/// state dir resumes the release it installed before.
pub fn install(
    kubeconfig: &Path,
    release: &str,
    ns: &str,
    values: &str,
    values_file: &Path,
) -> Result<()> {
    std::fs::write(values_file, values).map_err(Error::io(values_file))?;
    let chart = chart_dir();
    helm(
        kubeconfig,
        &[
            "upgrade",
            "--install",
            release,
            &chart.to_string_lossy(),
            "--namespace",
            ns,
            "--create-namespace",
            "-f",
            &values_file.to_string_lossy(),
        ],
    )?;
    Ok(())
}

/// Whether a pod's Ready condition is True.
pub fn pod_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The end of a devnode container's log.
pub fn container_log(state_dir: &Path, ns: &str, pod: &str, container: &str) -> String {
    let path = state_dir
        .join("devnode/logs")
        .join(format!("{ns}_{pod}_{container}.log"));
    crate::process::log_tail(&path, 30)
}

/// Waits until `n` live pods matching `selector` in `ns` are Ready and returns them; on
/// timeout the error carries each pod's status and the end of its `container`'s log.
pub async fn ready_pods(
    client: &Client,
    state_dir: &Path,
    ns: &str,
    selector: &str,
    n: usize,
    container: &str,
    timeout: Duration,
) -> Result<Vec<Pod>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let lp = ListParams::default().labels(selector);
    let start = Instant::now();
    loop {
        let list = pods
            .list(&lp)
            .await
            .map_err(Error::kube(format!("list pods {selector} in {ns}")))?;
        let ready: Vec<Pod> = list
            .items
            .iter()
            .filter(|p| pod_ready(p) && p.metadata.deletion_timestamp.is_none())
            .cloned()
            .collect();
        if ready.len() >= n {
            return Ok(ready);
        }
        if start.elapsed() > timeout {
            let detail = list
                .items
                .iter()
                .map(|p| {
                    format!(
                        "pod {}: {}\n{}",
                        p.name_any(),
                        serde_json::to_string(&p.status).unwrap_or_default(),
                        container_log(state_dir, ns, &p.name_any(), container)
                    )
                })
                .collect::<Vec<_>>()
                .join("\n");
            return Err(Error::NotReady {
                what: format!("{n} Ready pods {selector} in {ns}"),
                secs: timeout.as_secs(),
                detail,
            });
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// One value of a Secret.
pub async fn secret_value(client: &Client, ns: &str, name: &str, key: &str) -> Result<String> {
    let s = Api::<Secret>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .map_err(Error::kube(format!("get secret {ns}/{name}")))?;
    let bytes = s
        .data
        .and_then(|d| d.get(key).cloned())
        .ok_or_else(|| Error::InvalidOption(format!("secret {ns}/{name} has no key {key}")))?;
    String::from_utf8(bytes.0).map_err(|e| Error::Serde {
        what: "a secret value",
        source: e.into(),
    })
}

/// The NodePort of a Service's first port.
pub async fn node_port(client: &Client, ns: &str, name: &str) -> Result<u16> {
    let svc = Api::<Service>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .map_err(Error::kube(format!("get service {ns}/{name}")))?;
    svc.spec
        .and_then(|s| s.ports)
        .and_then(|ps| ps.first().and_then(|p| p.node_port))
        .and_then(|p| u16::try_from(p).ok())
        .ok_or_else(|| Error::InvalidOption(format!("service {ns}/{name} has no NodePort")))
}

/// Default NodePort range of kube-apiserver (the dev cluster keeps it).
const NODE_PORTS: std::ops::RangeInclusive<u16> = 30000..=32767;

/// A NodePort nothing listens on at 127.0.0.1 now. The devnodes of every dev cluster on this
/// machine forward their NodePorts from the same loopback, so a port the apiserver picked at
/// random could already be another cluster's; one that is free now rarely is later.
pub fn free_node_port() -> Result<u16> {
    let span = u32::from(NODE_PORTS.end() - NODE_PORTS.start()) + 1;
    // No RNG crate here: the clock's nanoseconds and the pid spread concurrent callers.
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0)
        ^ std::process::id().wrapping_mul(2_654_435_761);
    // 97 is coprime with the range's 2768 ports, so the walk visits every one of them.
    for i in 0..span {
        let port = NODE_PORTS.start() + ((seed.wrapping_add(i * 97)) % span) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Err(Error::InvalidOption(
        "no free NodePort on 127.0.0.1 (30000-32767)".into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dev_values_expose_the_api_on_the_node_port_only_when_asked() {
        let with: serde_json::Value = serde_yaml::from_str(&dev_values(Some(31234))).unwrap();
        assert_eq!(with["service"]["type"], "NodePort");
        assert_eq!(with["service"]["nodePort"], 31234);
        assert_eq!(with["postgresql"]["enabled"], true);
        assert_eq!(with["nodeSelector"]["vcp.dev/runtime"], "process");
        let without: serde_json::Value = serde_yaml::from_str(&dev_values(None)).unwrap();
        assert!(without.get("service").is_none(), "{without}");
    }

    #[test]
    fn real_node_values_put_vcp_and_the_plans_on_the_real_node() {
        let v: serde_json::Value = serde_yaml::from_str(&real_node_values(
            [10, 243, 3, 2].into(),
            Some(31000),
            31443,
        ))
        .unwrap();
        assert_eq!(v["nodeSelector"]["vcp.dev/node"], "real");
        assert_eq!(v["expose"]["mode"], "gateway");
        assert_eq!(v["expose"]["domain"], GATEWAY_DOMAIN);
        assert_eq!(v["expose"]["address"], "10.243.3.2");
        assert_eq!(v["expose"]["port"], 31443);
        assert_eq!(v["gateway"]["service"]["nodePort"], 31443);
        assert_eq!(v["gateway"]["wakeTimeoutMs"], 90_000);
        assert_eq!(v["service"]["nodePort"], 31000);
        let plans: serde_json::Value =
            serde_yaml::from_str(crate::platform::REAL_NODE_PLANS).unwrap();
        assert_eq!(v["plans"], plans);
        let datastores: serde_json::Value =
            serde_yaml::from_str(crate::platform::DEV_DATASTORES).unwrap();
        assert_eq!(v["datastores"], datastores);
        let v: serde_json::Value =
            serde_yaml::from_str(&real_node_values([10, 243, 3, 2].into(), None, 31443)).unwrap();
        assert_eq!(v["service"]["type"], "NodePort");
        assert!(v["service"].get("nodePort").is_none());
    }

    #[test]
    fn the_real_node_plans_are_valid_policies_and_conformance_reaches_the_test_handler() {
        let plans: std::collections::BTreeMap<String, serde_json::Value> =
            serde_yaml::from_str(crate::platform::REAL_NODE_PLANS).unwrap();
        for (name, plan) in &plans {
            let policy = serde_json::to_string(&plan["policy"]).unwrap();
            vcp_policy::TenantPolicy::from_yaml(&policy)
                .unwrap_or_else(|e| panic!("plan {name}: {e}"));
        }
        let conformance = vcp_policy::TenantPolicy::from_yaml(
            &serde_json::to_string(&plans[crate::platform::CONFORMANCE_PLAN]["policy"]).unwrap(),
        )
        .unwrap();
        let handlers = &conformance.scheduling.runtime_handlers;
        assert_eq!(
            handlers
                .get(crate::cluster::TEST_RUNTIME_HANDLER)
                .map(String::as_str),
            Some(crate::cluster::TEST_RUNTIME_HANDLER),
            "the host class every dev cluster has"
        );
        assert!(conformance.services.node_port_services > 0);
    }

    #[test]
    fn fullname_follows_the_chart_helper() {
        assert_eq!(fullname("vcp"), "vcp");
        assert_eq!(fullname("adopt-vcp"), "adopt-vcp");
        assert_eq!(fullname("acme"), "acme-vcp");
    }

    #[test]
    fn a_free_node_port_is_in_the_range_and_bindable() {
        let p = free_node_port().unwrap();
        assert!(NODE_PORTS.contains(&p));
        assert!(std::net::TcpListener::bind(("127.0.0.1", p)).is_ok());
    }

    #[test]
    fn the_chart_is_where_chart_dir_says() {
        assert!(chart_dir().join("Chart.yaml").is_file());
    }
}
