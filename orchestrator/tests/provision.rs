//! End to end on the dev cluster: tenants provisioned through the API by a real `vcp serve`,
//! their control planes running as real processes on the devnode, workloads synced by the
//! syncer vcp deployed, and nothing left on the host after deletion.

use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, Pod, Service, ServiceAccount};
use kube::Client;
use kube::api::{Api, ListParams, PostParams};
use std::net::{Ipv4Addr, UdpSocket};
use std::time::Duration;
use vcp_dev::cluster::DevCluster;
use vcp_dev::platform::ApiClient;
use vcp_dev::testing::eventually;

const READY_TIMEOUT: Duration = Duration::from_secs(240);

async fn tenant_client(kubeconfig: &str) -> anyhow::Result<Client> {
    let kc = kube::config::Kubeconfig::from_yaml(kubeconfig)?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
    Ok(Client::try_from(cfg)?)
}

fn web(replicas: i32) -> anyhow::Result<Deployment> {
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": "nginx:1.29", "ports": [{"containerPort": 80}]}]},
            },
        },
    }))?)
}

fn web_service() -> anyhow::Result<Service> {
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]},
    }))?)
}

/// One DNS A query over UDP to `server`; the answer's addresses.
fn dns_a(server: Ipv4Addr, name: &str) -> anyhow::Result<Vec<Ipv4Addr>> {
    let mut q = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    for label in name.trim_end_matches('.').split('.') {
        q.push(label.len() as u8);
        q.extend(label.as_bytes());
    }
    q.extend([0, 0, 1, 0, 1]);
    let sock = UdpSocket::bind("0.0.0.0:0")?;
    sock.set_read_timeout(Some(Duration::from_secs(2)))?;
    sock.send_to(&q, (server, 53))?;
    let mut buf = [0u8; 512];
    let n = sock.recv(&mut buf)?;
    let r = &buf[..n];
    let answers = u16::from_be_bytes([r[6], r[7]]);
    // Skip the header and the echoed question.
    let mut i = q.len();
    let mut out = Vec::new();
    for _ in 0..answers {
        i += if r[i] & 0xc0 == 0xc0 {
            2
        } else {
            r[i..].iter().position(|b| *b == 0).unwrap_or(0) + 1
        };
        let (ty, len) = (
            u16::from_be_bytes([r[i], r[i + 1]]),
            u16::from_be_bytes([r[i + 8], r[i + 9]]) as usize,
        );
        i += 10;
        if ty == 1 && len == 4 {
            out.push(Ipv4Addr::new(r[i], r[i + 1], r[i + 2], r[i + 3]));
        }
        i += len;
    }
    Ok(out)
}

async fn provisioned_tenant_runs_workloads(
    cluster: &DevCluster,
    api: &ApiClient,
    name: &str,
) -> anyhow::Result<String> {
    let host = cluster.connect().await?;
    let t = api.wait_ready(name, READY_TIMEOUT).await?;
    let key = t["key"].as_str().unwrap().to_owned();
    let want_version = t["kubernetes_version"].as_str().unwrap().to_owned();
    assert!(
        t["endpoint"]
            .as_str()
            .unwrap()
            .starts_with("https://127.0.0.1:")
    );
    let kc = api.kubeconfig(name, "alice", &["admin"], "1h").await?;
    let tenant = tenant_client(&kc).await?;
    let served = tenant.apiserver_version().await?.git_version;
    assert_eq!(
        served, want_version,
        "{name} serves the version it asked for"
    );

    // A teammate's kubeconfig with two groups: both reach the apiserver; `view` reads and
    // cannot write.
    let bob = tenant_client(&api.kubeconfig(name, "bob", &["view", "ops"], "1h").await?).await?;
    use k8s_openapi::api::authentication::v1::SelfSubjectReview;
    let review = Api::<SelfSubjectReview>::all(bob.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({
                "apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview", "metadata": {}
            }))?,
        )
        .await?;
    let info = review.status.and_then(|s| s.user_info).unwrap_or_default();
    assert_eq!(info.username.as_deref(), Some("bob"));
    let groups = info.groups.unwrap_or_default();
    assert!(
        groups.iter().any(|g| g == "view") && groups.iter().any(|g| g == "ops"),
        "{groups:?}"
    );
    Api::<Namespace>::all(bob.clone())
        .list(&ListParams::default())
        .await?;
    let denied = Api::<Namespace>::all(bob)
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({"metadata": {"name": "nope"}}))?,
        )
        .await;
    assert!(
        matches!(denied, Err(kube::Error::Api(ref s)) if s.code == 403),
        "{denied:?}"
    );

    // kubectl works with the issued kubeconfig.
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("kubeconfig");
    std::fs::write(&path, &kc)?;
    let out = std::process::Command::new(cluster.kubectl())
        .arg("--kubeconfig")
        .arg(&path)
        .args(["get", "namespaces", "-o", "name"])
        .output()?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("namespace/default"));

    // A Deployment and a Service run on the host through the syncer vcp deployed.
    let deploys: Api<Deployment> = Api::namespaced(tenant.clone(), "default");
    deploys.create(&PostParams::default(), &web(2)?).await?;
    let services: Api<Service> = Api::namespaced(tenant.clone(), "default");
    services
        .create(&PostParams::default(), &web_service()?)
        .await?;
    let tenant_pods: Api<Pod> = Api::namespaced(tenant.clone(), "default");
    let host_ns = format!("{key}-default");
    let host_pods: Api<Pod> = Api::namespaced(host.clone(), &host_ns);
    eventually(
        &format!("{name}: two web pods Running in the tenant"),
        Duration::from_secs(120),
        || async {
            let pods = tenant_pods
                .list(&ListParams::default().labels("app=web"))
                .await?;
            let running = pods
                .items
                .iter()
                .filter(|p| vcp_dev::testing::running(p))
                .count();
            Ok((running == 2).then_some(()))
        },
    )
    .await?;
    assert_eq!(
        host_pods
            .list(&ListParams::default().labels("app=web"))
            .await?
            .items
            .len(),
        2
    );
    let ip = eventually(
        &format!("{name}: tenant Service has the host ClusterIP"),
        Duration::from_secs(60),
        || async {
            let host_svc = Api::<Service>::namespaced(host.clone(), &host_ns)
                .get_opt("web")
                .await?;
            let tenant_svc = services.get("web").await?;
            let (h, t) = (
                host_svc.and_then(|s| s.spec?.cluster_ip),
                tenant_svc.spec.and_then(|s| s.cluster_ip),
            );
            Ok((h.is_some() && h == t).then_some(h))
        },
    )
    .await?
    .unwrap_or_default();

    // The tenant's CoreDNS answers for the Service with that ClusterIP.
    let cp = format!("vcp-{key}");
    let dns_pod = Api::<Pod>::namespaced(host.clone(), &cp)
        .list(&ListParams::default().labels("app.kubernetes.io/component=coredns"))
        .await?
        .items
        .into_iter()
        .find_map(|p| p.status?.pod_ip)
        .expect("a CoreDNS pod with an IP");
    let server: Ipv4Addr = dns_pod.parse()?;
    let want: Ipv4Addr = ip.parse()?;
    eventually(
        &format!("{name}: CoreDNS answers for web.default"),
        Duration::from_secs(30),
        || async {
            let got =
                tokio::task::spawn_blocking(move || dns_a(server, "web.default.svc.cluster.local"))
                    .await??;
            Ok(got.contains(&want).then_some(()))
        },
    )
    .await?;
    Ok(key)
}

/// A client of the host apiserver with the credentials of tenant `key`'s syncer (a token of
/// its service account, as its pod has).
async fn syncer_client(cluster: &DevCluster, key: &str) -> anyhow::Result<Client> {
    let host = cluster.connect().await?;
    let sa = Api::<ServiceAccount>::namespaced(host, &format!("vcp-{key}"));
    let req: TokenRequest =
        serde_json::from_value(serde_json::json!({"spec": {"expirationSeconds": 600}}))?;
    let token = sa
        .create_token_request("vcp-syncer", &PostParams::default(), &req)
        .await?
        .status
        .and_then(|s| s.token)
        .ok_or_else(|| anyhow::anyhow!("no token for vcp-{key}/vcp-syncer"))?;
    let kc = kube::config::Kubeconfig::read_from(cluster.kubeconfig_path())?;
    let mut cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
    cfg.auth_info = kube::config::AuthInfo {
        token: Some(token.into()),
        ..Default::default()
    };
    Ok(Client::try_from(cfg)?)
}

/// Tenant `a`'s syncer credentials write in `a`'s host namespaces, and the host apiserver
/// refuses them everywhere else: `b`'s namespaces, a namespace the syncer would name for `b`,
/// `b`'s namespace itself, and a lower Pod Security level for `a`'s own.
async fn syncer_writes_stay_in_their_tenant(
    cluster: &DevCluster,
    a: &str,
    b: &str,
) -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::ConfigMap;
    let client = syncer_client(cluster, a).await?;
    let cm = |name: &str| -> anyhow::Result<ConfigMap> {
        Ok(serde_json::from_value(
            serde_json::json!({"metadata": {"name": name}, "data": {"x": "y"}}),
        )?)
    };
    let own = Api::<ConfigMap>::namespaced(client.clone(), &format!("{a}-default"));
    own.create(&PostParams::default(), &cm("allowed")?).await?;
    own.delete("allowed", &Default::default()).await?;
    let refused = |what: &str, r: Result<ConfigMap, kube::Error>| {
        let err = r.expect_err(&format!("{what} was allowed")).to_string();
        assert!(
            err.contains("Forbidden") || err.contains("forbidden"),
            "{what}: {err}"
        );
    };
    for ns in [
        format!("{b}-default"),
        format!("vcp-{b}"),
        "default".to_owned(),
    ] {
        let other = Api::<ConfigMap>::namespaced(client.clone(), &ns);
        refused(
            &format!("a write into {ns}"),
            other.create(&PostParams::default(), &cm("stolen")?).await,
        );
    }
    let namespaces = Api::<Namespace>::all(client.clone());
    let ns = |name: &str, key: &str, level: &str| -> anyhow::Result<Namespace> {
        Ok(serde_json::from_value(
            serde_json::json!({"metadata": {"name": name, "labels": {
            "vcp.dev/tenant": key, "pod-security.kubernetes.io/enforce": level}}}),
        )?)
    };
    for (what, obj) in [
        (
            "a namespace named for b",
            ns(&format!("{b}-forged"), a, "baseline")?,
        ),
        (
            "a namespace labelled for b",
            ns(&format!("{a}-forged"), b, "baseline")?,
        ),
        (
            "a privileged namespace",
            ns(&format!("{a}-forged"), a, "privileged")?,
        ),
    ] {
        let err = namespaces
            .create(&PostParams::default(), &obj)
            .await
            .expect_err(&format!("{what} was allowed"))
            .to_string();
        assert!(
            err.contains("Forbidden") || err.contains("forbidden"),
            "{what}: {err}"
        );
    }
    let err = namespaces
        .delete(&format!("{b}-default"), &Default::default())
        .await
        .expect_err("deleting b's namespace was allowed")
        .to_string();
    assert!(err.contains("orbidden"), "{err}");
    syncer_reads_stay_in_their_tenant(&client, a, b).await?;
    syncer_grants_stay_in_their_tenant(&client, a, b).await
}

/// Whether `r` was refused by the host apiserver's authorizer or admission (403).
fn forbidden<T: std::fmt::Debug>(what: &str, r: Result<T, kube::Error>) {
    match r {
        Err(kube::Error::Api(ae)) if ae.code == 403 => {}
        other => panic!("{what} was not forbidden: {other:?}"),
    }
}

/// Tenant `a`'s syncer credentials read only `a`'s host namespaces (through the RoleBinding
/// its syncer wrote there): not `b`'s CA nor `a`'s own, not `b`'s pods or Secrets, and no
/// namespaced kind across the cluster.
async fn syncer_reads_stay_in_their_tenant(
    client: &Client,
    a: &str,
    b: &str,
) -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::Secret;
    let own = format!("{a}-default");
    Api::<Secret>::namespaced(client.clone(), &own)
        .list(&ListParams::default())
        .await?;
    Api::<Pod>::namespaced(client.clone(), &own)
        .list(&ListParams::default())
        .await?;
    for cp in [format!("vcp-{b}"), format!("vcp-{a}")] {
        forbidden(
            &format!("reading the CA in {cp}"),
            Api::<Secret>::namespaced(client.clone(), &cp)
                .get("ca")
                .await,
        );
    }
    let other = format!("{b}-default");
    forbidden(
        &format!("listing Secrets in {other}"),
        Api::<Secret>::namespaced(client.clone(), &other)
            .list(&ListParams::default())
            .await,
    );
    forbidden(
        &format!("listing pods in {other}"),
        Api::<Pod>::namespaced(client.clone(), &other)
            .list(&ListParams::default())
            .await,
    );
    forbidden(
        "listing Secrets across the cluster",
        Api::<Secret>::all(client.clone())
            .list(&ListParams::default())
            .await,
    );
    forbidden(
        "listing pods across the cluster",
        Api::<Pod>::all(client.clone())
            .list(&ListParams::default())
            .await,
    );
    Ok(())
}

/// Tenant `a`'s syncer binds only its own namespaced role, only to itself, only in its own
/// host namespaces: it cannot grant itself `b`'s namespaces or more than its role.
async fn syncer_grants_stay_in_their_tenant(
    client: &Client,
    a: &str,
    b: &str,
) -> anyhow::Result<()> {
    use k8s_openapi::api::rbac::v1::RoleBinding;
    let binding = |name: &str, role: &str, sa_ns: &str| -> anyhow::Result<RoleBinding> {
        Ok(serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": "vcp-syncer", "namespace": sa_ns}],
        }))?)
    };
    let own_role = format!("vcp-syncer-namespaced-{a}");
    let own_sa = format!("vcp-{a}");
    for (what, ns, rb) in [
        (
            "binding its role in b's namespace",
            format!("{b}-default"),
            binding("grab", &own_role, &own_sa)?,
        ),
        (
            "binding cluster-admin in its own namespace",
            format!("{a}-default"),
            binding("grab", "cluster-admin", &own_sa)?,
        ),
        (
            "binding b's syncer role in its own namespace",
            format!("{a}-default"),
            binding("grab", &format!("vcp-syncer-namespaced-{b}"), &own_sa)?,
        ),
        (
            "binding its role to b's syncer",
            format!("{a}-default"),
            binding("grab", &own_role, &format!("vcp-{b}"))?,
        ),
    ] {
        forbidden(
            what,
            Api::<RoleBinding>::namespaced(client.clone(), &ns)
                .create(&PostParams::default(), &rb)
                .await,
        );
    }
    Ok(())
}

async fn nothing_left(cluster: &DevCluster, key: &str) -> anyhow::Result<()> {
    let host = cluster.connect().await?;
    eventually(
        &format!("no host namespace of {key} left"),
        Duration::from_secs(180),
        || async {
            let left = vcp_dev::testing::tenant_namespaces(&host, key).await?;
            Ok(left.is_empty().then_some(()))
        },
    )
    .await
}

#[tokio::test]
async fn two_tenants_with_identical_workloads_are_provisioned_used_and_deleted()
-> anyhow::Result<()> {
    let cluster = DevCluster::shared().await?;
    let host = cluster.connect().await?;
    let platform = vcp_dev::testing::platform(cluster, "vcp-e2e", 4).await?;
    let api = platform.admin.clone();
    api.create_tenant("alpha").await?;
    // beta runs the previous minor: the catalog's second entry end to end.
    let (s, beta) = api
        .raw(
            reqwest::Method::POST,
            "/v1/tenants",
            Some(&serde_json::json!({"name": "beta", "version": "1.36"})),
        )
        .await?;
    assert_eq!(s, 201, "{beta}");
    let (a, b) = tokio::join!(
        provisioned_tenant_runs_workloads(cluster, &api, "alpha"),
        provisioned_tenant_runs_workloads(cluster, &api, "beta"),
    );
    let (a, b) = (a?, b?);
    assert_ne!(a, b);
    syncer_writes_stay_in_their_tenant(cluster, &a, &b).await?;

    api.delete_tenant("alpha").await?;
    // beta keeps its etcd data.
    let (s, _) = api
        .raw(
            reqwest::Method::DELETE,
            "/v1/tenants/beta?retain_data=true",
            None,
        )
        .await?;
    assert_eq!(s, 202);
    eventually(
        "both tenants gone from the API",
        Duration::from_secs(180),
        || async {
            Ok((api.get_tenant("alpha").await?.is_none()
                && api.get_tenant("beta").await?.is_none())
            .then_some(()))
        },
    )
    .await?;
    nothing_left(cluster, &a).await?;
    nothing_left(cluster, &b).await?;
    let pvs = Api::<PersistentVolume>::all(host.clone());
    let volume_of = |key: String| {
        let pvs = pvs.clone();
        async move {
            anyhow::Ok(
                pvs.list(&ListParams::default())
                    .await?
                    .items
                    .into_iter()
                    .find(|pv| {
                        pv.spec
                            .as_ref()
                            .and_then(|s| s.claim_ref.as_ref())
                            .and_then(|c| c.namespace.clone())
                            == Some(format!("vcp-{key}"))
                    }),
            )
        }
    };
    let kept = volume_of(b.clone())
        .await?
        .expect("beta's etcd volume is retained");
    assert_eq!(
        kept.spec
            .as_ref()
            .and_then(|s| s.persistent_volume_reclaim_policy.as_deref()),
        Some("Retain")
    );
    assert!(
        volume_of(a.clone()).await?.is_none(),
        "alpha's etcd volume went with it"
    );
    pvs.delete(&kept.metadata.name.unwrap_or_default(), &Default::default())
        .await?;
    let roles = Api::<k8s_openapi::api::rbac::v1::ClusterRole>::all(host.clone());
    assert!(roles.get_opt(&format!("vcp-syncer-{a}")).await?.is_none());
    let policies = Api::<ValidatingAdmissionPolicy>::all(host.clone());
    assert!(
        policies
            .get_opt(&format!("vcp-syncer-{a}"))
            .await?
            .is_none()
    );
    drop(platform);
    Ok(())
}
