//! The tenant apiserver's egress: a hostile tenant admin steers its apiserver at addresses
//! outside the tenant (a forged pod IP through `pods/proxy`, an aggregated APIService, a
//! changed Node address), and none of them is dialled; its own pods and Services stay
//! reachable through `pods/proxy` and `services/proxy`.
//!
//! The apiserver runs as a provisioned tenant's does, with its cluster egress through the
//! syncer's egress proxy ([`TenantControlPlane::start_with_egress`]). The
//! targets: listeners on this machine's non-loopback address standing in for vcp's API and for
//! another tenant's syncer and etcd metrics ports (each answers with a marker and counts who
//! connects), the dev cluster's Postgres and the host apiserver.

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use vcp_dev::DevCluster;
use vcp_dev::tenant::TenantControlPlane;
use vcp_dev::testing::{eventually, namespace, running};

type Res<T = ()> = anyhow::Result<T>;

/// The machine's own address off loopback: the apiserver refuses to proxy to loopback by
/// itself, so only an address like this shows what the egress proxy does.
const LOCAL: &str = "192.0.2.2";

/// A listener that answers any connection with an HTTP response carrying `marker`.
struct Decoy {
    name: &'static str,
    port: u16,
    accepted: Arc<AtomicUsize>,
}

impl Decoy {
    async fn start(name: &'static str) -> Res<Decoy> {
        let listener = tokio::net::TcpListener::bind((LOCAL, 0)).await?;
        let port = listener.local_addr()?.port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            while let Ok((mut conn, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    let _ = conn.read(&mut buf).await;
                    let body = format!("SECRET-OF-{name}");
                    let _ = conn
                        .write_all(
                            format!(
                                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                                body.len()
                            )
                            .as_bytes(),
                        )
                        .await;
                });
            }
        });
        Ok(Decoy {
            name,
            port,
            accepted,
        })
    }

    fn marker(&self) -> String {
        format!("SECRET-OF-{}", self.name)
    }
}

/// `host:port` of a URL's authority (`postgres://u:p@127.0.0.1:5432/db`).
fn authority(url: &str) -> String {
    let rest = url.split("://").nth(1).unwrap_or(url);
    let rest = rest.rsplit('@').next().unwrap_or(rest);
    rest.split('/').next().unwrap_or(rest).to_owned()
}

/// The host apiserver's `host:port`, from the dev cluster's kubeconfig.
fn host_apiserver(cluster: &DevCluster) -> Res<String> {
    let text = std::fs::read_to_string(cluster.kubeconfig_path())?;
    let server = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("server:"))
        .ok_or_else(|| anyhow::anyhow!("no server in the host kubeconfig"))?;
    Ok(authority(server.trim()))
}

/// What the tenant gets for a GET of `path`, through kubectl (which retries nothing): the
/// body, or the error's text.
fn get(cluster: &DevCluster, cp: &TenantControlPlane, path: &str) -> String {
    let out = std::process::Command::new(cluster.kubectl())
        .arg(format!("--kubeconfig={}", cp.kubeconfig.display()))
        .args(["--request-timeout=30s", "get", "--raw", path])
        .output()
        .expect("kubectl runs");
    let answer = format!(
        "{}: {}{}",
        if out.status.success() { "ok" } else { "error" },
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("GET {path}: {answer}");
    answer
}

/// Asserts a refusal by the egress proxy that carries nothing of the target.
fn refused(what: &str, answer: &str, markers: &[String]) {
    for m in markers {
        assert!(
            !answer.contains(m.as_str()),
            "{what}: {m} reached the tenant: {answer}"
        );
    }
    for leak in [
        "gitVersion",
        "startup packet",
        "HTTP response to HTTPS client",
        "EOF",
        "connection refused",
    ] {
        assert!(
            !answer.contains(leak),
            "{what}: the answer tells what is there ({leak}): {answer}"
        );
    }
    assert!(
        answer.contains("code 403"),
        "{what}: not refused by the egress proxy: {answer}"
    );
}

/// The answer with the target's address taken out: what must be the same for every target.
fn shape(answer: &str, target: &str) -> String {
    answer.replace(target, "TARGET")
}

#[tokio::test]
async fn the_apiserver_dials_nothing_outside_the_tenant() -> Res {
    let cluster = DevCluster::shared().await?;
    let cp = TenantControlPlane::start_with_egress("egress1").await?;
    let _syncer = cp.start_syncer(cluster, &[])?;
    let tenant = cp.connect().await?;
    namespace(&tenant, "apps").await?;

    let decoys = [
        Decoy::start("vcp-api").await?,
        Decoy::start("other-syncer-metrics").await?,
        Decoy::start("other-etcd-metrics").await?,
    ];
    let closed = {
        let l = std::net::TcpListener::bind((LOCAL, 0))?;
        l.local_addr()?.port()
    };
    let mut targets: Vec<String> = decoys
        .iter()
        .map(|d| format!("{LOCAL}:{}", d.port))
        .collect();
    targets.push(format!("{LOCAL}:{closed}"));
    targets.push(authority(cluster.database_url()));
    targets.push(host_apiserver(cluster)?);
    let markers: Vec<String> = decoys.iter().map(Decoy::marker).collect();

    // A pod that runs (on a kwok worker), so the tenant has a virtual node for step 4.
    let anchor: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "anchor"},
        "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
    }))?;
    Api::<Pod>::namespaced(tenant.clone(), "apps")
        .create(&PostParams::default(), &anchor)
        .await?;

    // 1. pods/proxy on a pod whose podIP the tenant forged: a pod the policy refuses, so the
    //    syncer never writes its status again.
    let pods: Api<Pod> = Api::namespaced(tenant.clone(), "apps");
    let forged: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "forged"},
        "spec": {"hostNetwork": true, "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
    }))?;
    pods.create(&PostParams::default(), &forged).await?;
    eventually("the pod refused", Duration::from_secs(60), || async {
        let p = pods.get("forged").await?;
        let refused = p
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| {
                c.iter()
                    .any(|c| c.type_ == "PodScheduled" && c.status == "False")
            });
        Ok(refused.then_some(()))
    })
    .await?;
    pods.patch_status(
        "forged",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"status": {"phase": "Running", "podIP": LOCAL, "podIPs": [{"ip": LOCAL}]}})),
    )
    .await?;
    let mut shapes = Vec::new();
    for port in decoys.iter().map(|d| d.port).chain([closed]) {
        let target = format!("{LOCAL}:{port}");
        let answer = get(
            cluster,
            &cp,
            &format!("/api/v1/namespaces/apps/pods/forged:{port}/proxy/"),
        );
        refused(&format!("pods/proxy to {target}"), &answer, &markers);
        shapes.push(shape(&answer, &target).replace(&port.to_string(), "PORT"));
    }
    shapes.dedup();
    assert_eq!(
        shapes.len(),
        1,
        "open and closed targets answer alike: {shapes:#?}"
    );

    // Webhooks by URL are not here: kube-apiserver dials them in its control-plane egress
    // context, which stays direct so that the revocation authorizer on the pod's loopback
    // answers while the syncer is down (docs/syncer.md, "Known limits").

    // 3. An aggregated APIService over an ExternalName Service naming a target.
    let svcs: Api<k8s_openapi::api::core::v1::Service> = Api::namespaced(tenant.clone(), "apps");
    let decoy = &decoys[0];
    let svc = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "evil"},
        "spec": {"type": "ExternalName", "externalName": LOCAL, "ports": [{"port": decoy.port}]},
    }))?;
    svcs.create(&PostParams::default(), &svc).await?;
    let apis: Api<k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService> =
        Api::all(tenant.clone());
    let apisvc = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "v1.evil.egress.test"},
        "spec": {
            "group": "evil.egress.test", "version": "v1",
            "service": {"namespace": "apps", "name": "evil", "port": decoy.port},
            "insecureSkipTLSVerify": true,
            "groupPriorityMinimum": 1000, "versionPriority": 15,
        },
    }))?;
    apis.create(&PostParams::default(), &apisvc).await?;
    let status = eventually(
        "the APIService checked",
        Duration::from_secs(60),
        || async {
            let a = apis.get("v1.evil.egress.test").await?;
            let cond = a
                .status
                .and_then(|s| s.conditions)
                .and_then(|c| c.into_iter().find(|c| c.type_ == "Available"));
            Ok(cond
                .filter(|c| c.message.is_some())
                .map(|c| format!("{}: {}", c.status, c.message.unwrap_or_default())))
        },
    )
    .await?;
    eprintln!("APIService: {status}");
    assert!(status.starts_with("False"), "{status}");
    refused("APIService status", &status, &markers);
    let answer = get(cluster, &cp, "/apis/evil.egress.test/v1");
    for m in &markers {
        assert!(
            !answer.contains(m.as_str()),
            "APIService: {m} reached the tenant: {answer}"
        );
    }

    // 4. A virtual Node's address and kubelet port changed to a target, then proxied to.
    let nodes: Api<Node> = Api::all(tenant.clone());
    let node = eventually("a virtual node", Duration::from_secs(120), || async {
        Ok(nodes
            .list(&Default::default())
            .await?
            .items
            .into_iter()
            .next())
    })
    .await?;
    let name = kube::ResourceExt::name_any(&node);
    let decoy = &decoys[1];
    nodes
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {
                "addresses": [{"type": "InternalIP", "address": LOCAL}, {"type": "Hostname", "address": LOCAL}],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": decoy.port}},
            }})),
        )
        .await?;
    let answer = get(
        cluster,
        &cp,
        &format!("/api/v1/nodes/{name}:{}/proxy/metrics", decoy.port),
    );
    refused("nodes/proxy", &answer, &markers);

    for d in &decoys {
        assert_eq!(
            d.accepted.load(Ordering::SeqCst),
            0,
            "{} was dialled",
            d.name
        );
    }
    Ok(())
}

#[tokio::test]
async fn the_tenants_own_pods_and_services_stay_reachable_through_the_proxy() -> Res {
    let cluster = DevCluster::shared().await?;
    let cp = TenantControlPlane::start_with_egress("egress2").await?;
    // The tenant's workload pool is the devnode: its pods run as real processes with real
    // addresses.
    let policy = cp.policy_flag(vcp_dev::testing::DEVNODE_PLACEMENT)?;
    let _syncer = cp.start_syncer(cluster, &[&policy])?;
    let tenant = cp.connect().await?;
    namespace(&tenant, "apps").await?;
    let pods: Api<Pod> = Api::namespaced(tenant.clone(), "apps");
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "main", "image": "vcp.dev/host:any", "command": [
            "sh", "-c", "mkdir -p /tmp/egress2 && cd /tmp/egress2 && echo own-pod-page > index.html && exec python3 -m http.server 8081",
        ], "ports": [{"containerPort": 8081}]}]},
    }))?;
    pods.create(&PostParams::default(), &pod).await?;
    eventually(
        "the tenant pod running",
        Duration::from_secs(120),
        || async {
            let p = pods.get("web").await?;
            Ok(running(&p).then_some(()))
        },
    )
    .await?;
    let svcs: Api<k8s_openapi::api::core::v1::Service> = Api::namespaced(tenant.clone(), "apps");
    let svc = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 8081, "targetPort": 8081}]},
    }))?;
    svcs.create(&PostParams::default(), &svc).await?;

    for path in [
        "/api/v1/namespaces/apps/pods/web:8081/proxy/",
        "/api/v1/namespaces/apps/services/web:8081/proxy/",
    ] {
        let answer = eventually(path, Duration::from_secs(60), || async {
            let a = get(cluster, &cp, path);
            Ok(a.contains("own-pod-page").then_some(a))
        })
        .await
        .map_err(|e| anyhow::anyhow!("{e}; syncer log: {}", cp.syncer_log().display()))?;
        assert!(answer.starts_with("ok:"), "{answer}");
    }
    // kubectl logs still reaches the syncer's kubelet endpoint through the proxy.
    let logs = get(cluster, &cp, "/api/v1/namespaces/apps/pods/web/log");
    assert!(logs.starts_with("ok:"), "{logs}");
    Ok(())
}
