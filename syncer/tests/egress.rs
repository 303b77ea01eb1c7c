//! The tenant apiserver's egress: a hostile tenant admin steers its apiserver at addresses
//! outside the tenant (a forged pod IP through `pods/proxy`, admission webhooks by URL, an
//! aggregated APIService, a changed Node address), and none of them is dialled; its own pods
//! and Services stay reachable through `pods/proxy` and `services/proxy`, and a webhook by URL
//! at its own pod is called.
//!
//! The apiserver runs as a provisioned tenant's does, with its cluster egress through the
//! syncer's egress proxy and its control-plane egress (webhooks by URL) through the
//! revocation authorizer's relay, which asks that proxy
//! ([`TenantControlPlane::start_with_egress`]). The
//! targets: listeners on this machine's non-loopback address standing in for vcp's API and for
//! another tenant's syncer and etcd metrics ports (each answers with a marker and counts who
//! connects), the dev cluster's Postgres and the host apiserver.

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
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

/// A validating webhook named `label` at `url` (with `ca`, PEM, as its bundle), called for the
/// creation of ConfigMaps labelled `egress-hook: <label>` and failing closed.
fn webhook_by_url(label: &str, url: &str, ca: Option<&str>) -> Res<ValidatingWebhookConfiguration> {
    vcp_dev::testing::webhook_by_url(
        label,
        &format!("{label}.egress.test"),
        url,
        ca,
        ("egress-hook", label),
    )
}

/// What the tenant gets for creating a ConfigMap that the webhook `label` judges, once the
/// apiserver has taken the webhook in (until then a creation succeeds): the error's text.
async fn webhook_answer(cms: &Api<ConfigMap>, label: &str) -> Res<String> {
    let answer = eventually(
        &format!("webhook {label} called"),
        Duration::from_secs(60),
        || async {
            let cm: ConfigMap = serde_json::from_value(serde_json::json!({
                "metadata": {"generateName": "probe-", "labels": {"egress-hook": label}},
            }))?;
            Ok(cms
                .create(&PostParams::default(), &cm)
                .await
                .err()
                .map(|e| e.to_string()))
        },
    )
    .await?;
    eprintln!("webhook {label}: {answer}");
    Ok(answer)
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

    // 2. Admission webhooks by URL, which kube-apiserver dials in its control-plane egress
    //    context: through the revocation authorizer's relay, which asks the syncer's proxy.
    //    One configuration per target, each for ConfigMaps carrying its own label. Loopback
    //    targets too (Postgres, the host apiserver on the dev cluster): the relay runs in the
    //    apiserver's pod, and its loopback is no more the tenant's than any other address.
    let hooks: Api<ValidatingWebhookConfiguration> = Api::all(tenant.clone());
    let cms: Api<ConfigMap> = Api::namespaced(tenant.clone(), "apps");
    let mut shapes = Vec::new();
    for (i, target) in targets.iter().enumerate() {
        let label = format!("by-url-{i}");
        hooks
            .create(
                &PostParams::default(),
                &webhook_by_url(&label, &format!("https://{target}/admit"), None)?,
            )
            .await?;
        let answer = webhook_answer(&cms, &label).await?;
        refused(&format!("webhook by URL at {target}"), &answer, &markers);
        shapes.push(shape(&answer, target).replace(&label, "HOOK"));
    }
    shapes.dedup();
    assert_eq!(
        shapes.len(),
        1,
        "webhooks at open, closed and loopback targets answer alike: {shapes:#?}"
    );

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
    let mut syncer = cp.start_syncer(cluster, &[&policy])?;
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

    // A webhook by URL at one of the tenant's own pods: dialled in the control-plane context,
    // through the authorizer's relay and the syncer's proxy, and answered by the pod. It
    // makes a certificate for its own IP and prints it, which becomes the webhook's CA.
    let hook: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "hook"},
        "spec": {"containers": [{"name": "main", "image": "vcp.dev/host:any",
            "env": [
                {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                {"name": "HOOK", "value": OWN_HOOK},
            ],
            "command": ["sh", "-c", concat!(
                "set -e; mkdir -p /tmp/egress2-hook && cd /tmp/egress2-hook && ",
                "openssl req -x509 -newkey rsa:2048 -nodes -keyout key.pem -out cert.pem -days 1 ",
                "-subj /CN=own-hook -addext \"subjectAltName=IP:$POD_IP\" 2>/dev/null && ",
                "cat cert.pem && exec python3 -c \"$HOOK\"",
            )],
            "ports": [{"containerPort": 8443}]}]},
    }))?;
    pods.create(&PostParams::default(), &hook).await?;
    let (ip, ca) = eventually(
        "the webhook pod serving",
        Duration::from_secs(120),
        || async {
            let p = pods.get("hook").await?;
            let ip = p.status.as_ref().and_then(|s| s.pod_ip.clone());
            let log = get(cluster, &cp, "/api/v1/namespaces/apps/pods/hook/log");
            let ca = log
                .find("-----BEGIN CERTIFICATE-----")
                .zip(log.find("-----END CERTIFICATE-----"))
                .map(|(b, e)| log[b..e + "-----END CERTIFICATE-----".len()].to_owned());
            Ok((running(&p).then_some(())).and(ip).zip(ca))
        },
    )
    .await?;
    let hooks: Api<ValidatingWebhookConfiguration> = Api::all(tenant.clone());
    hooks
        .create(
            &PostParams::default(),
            &webhook_by_url("own", &format!("https://{ip}:8443/admit"), Some(&ca))?,
        )
        .await?;
    let cms: Api<ConfigMap> = Api::namespaced(tenant.clone(), "apps");
    // The pod prints its certificate before its server listens: until then the syncer's
    // proxy answers 502 for it (its own pod, not answering yet), passed on by the relay.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let answer = webhook_answer(&cms, "own").await?;
        if answer.contains("own-hook-says-no") {
            break;
        }
        assert!(
            answer.contains("code 502") && std::time::Instant::now() < deadline,
            "the tenant's own webhook was not reached: {answer}; authorizer log beside {}",
            cp.syncer_log().display()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // With the syncer stopped, the relay cannot ask its proxy: the same webhook fails with the
    // proxy's one refusal, as a webhook by Service would, and tells nothing more.
    syncer.stop_and_wait(Duration::from_secs(5));
    let answer = webhook_answer(&cms, "own").await?;
    refused("webhook by URL with the syncer down", &answer, &[]);
    assert!(!answer.contains("own-hook-says-no"), "{answer}");
    Ok(())
}

/// The tenant's own admission webhook (Python, in the pod of the test above): HTTPS on 8443
/// with the certificate the pod made, denying everything with a message of its own.
const OWN_HOOK: &str = r#"
import http.server, json, ssl
class Hook(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "response": {"uid": review["request"]["uid"], "allowed": False,
                         "status": {"code": 403, "message": "own-hook-says-no"}}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
server = http.server.HTTPServer(("", 8443), Hook)
tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
tls.load_cert_chain("cert.pem", "key.pem")
server.socket = tls.wrap_socket(server.socket, server_side=True)
server.serve_forever()
"#;
