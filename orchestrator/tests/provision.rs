//! End to end on the dev cluster: tenants provisioned through the API by a real `vcp serve`,
//! their control planes running as real processes on the devnode, workloads synced by the
//! syncer vcp deployed, and nothing left on the host after deletion.

use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, Pod, Service, ServiceAccount};
use kube::Client;
use kube::ResourceExt;
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

    // kubectl logs and exec reach a tenant pod through the syncer's kubelet endpoint (the
    // tenant apiserver dials the syncer's Service by name and verifies it with the tenant CA).
    let pod = tenant_pods
        .list(&ListParams::default().labels("app=web"))
        .await?
        .items[0]
        .name_any();
    let kubectl = |args: &[&str]| -> anyhow::Result<String> {
        let out = std::process::Command::new(cluster.kubectl())
            .arg("--kubeconfig")
            .arg(&path)
            .args(["--request-timeout=60s", "-n", "default"])
            .args(args)
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    // Until the apiserver resolves the syncer's name: the devnode's hosts file gains it once the
    // syncer's endpoint is ready, and Go rereads that file at most every 5 s (as cluster DNS
    // caches a miss).
    // Each try is bounded (a dial to a name not yet resolvable must not eat the whole wait),
    // and a timeout says what the last try answered.
    let last_try = std::sync::Mutex::new(String::new());
    let logs = eventually(
        &format!("{name}: kubectl logs through the syncer"),
        Duration::from_secs(60),
        || async {
            match kubectl(&["logs", &pod, "--tail=2", "--request-timeout=10s"]) {
                Ok(out) => Ok(Some(out)),
                Err(err) => {
                    *last_try.lock().unwrap_or_else(|p| p.into_inner()) = err.to_string();
                    Ok(None)
                }
            }
        },
    )
    .await
    .map_err(|err| {
        let last = last_try.lock().unwrap_or_else(|p| p.into_inner());
        err.context(format!("last try: {last}"))
    })?;
    assert_eq!(
        logs.lines().collect::<Vec<_>>(),
        vcp_dev::kwok::APP_LINES[3..]
    );
    assert_eq!(
        kubectl(&["exec", &pod, "--", "sh", "-c", "echo $((6*7))"])?,
        "42\n"
    );
    // kubectl top: the tenant apiserver aggregates metrics.k8s.io to the same endpoint, by the
    // tenant Service the syncer keeps, and the syncer answers from the host's metrics-server.
    let top = eventually(
        &format!("{name}: kubectl top pods in the tenant"),
        Duration::from_secs(120),
        || async {
            Ok(kubectl(&["top", "pods", "-l", "app=web"])
                .ok()
                .filter(|out| out.lines().count() == 3))
        },
    )
    .await?;
    assert!(top.contains(&pod), "{top}");
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
    syncer_grants_stay_in_their_tenant(&client, &cluster.connect().await?, a, b).await
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
    host: &Client,
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
    // Shared by every tenant's syncer (templates/host-roles.yaml): confined per tenant by
    // where and to whom the policy lets it be bound.
    let own_role = "vcp:syncer-namespaced";
    let own_sa = format!("vcp-{a}");
    // The one binding it may write (what its syncer writes in every host namespace): a dry
    // run, so the admission policy judges it and nothing stays.
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    Api::<RoleBinding>::namespaced(client.clone(), &format!("{a}-default"))
        .create(&dry, &binding("probe", own_role, &own_sa)?)
        .await
        .map_err(|e| anyhow::anyhow!("its own binding was refused: {e}"))?;
    // And its syncer did write it, in each of its host namespaces.
    for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        Api::<RoleBinding>::namespaced(host.clone(), &format!("{a}-{ns}"))
            .get("vcp-syncer")
            .await
            .map_err(|e| anyhow::anyhow!("no syncer binding in {a}-{ns}: {e}"))?;
    }
    for (what, ns, rb) in [
        (
            "binding its role in b's namespace",
            format!("{b}-default"),
            binding("grab", own_role, &own_sa)?,
        ),
        (
            "binding cluster-admin in its own namespace",
            format!("{a}-default"),
            binding("grab", "cluster-admin", &own_sa)?,
        ),
        (
            "binding vcp's own namespace role in its own namespace",
            format!("{a}-default"),
            binding("grab", "vcp:tenant-namespace", &own_sa)?,
        ),
        (
            "binding its role to b's syncer",
            format!("{a}-default"),
            binding("grab", own_role, &format!("vcp-{b}"))?,
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

fn pod_with(name: &str, resources: serde_json::Value) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "nginx:1.29", "resources": resources}]},
    }))?)
}

/// A tenant's quota usage, counted on the host by a sampling round and served by the API: the
/// latest sample with the plan's limits on the tenant, every sample by range, for the owner
/// and admins only; bad ranges refused.
#[tokio::test]
async fn tenant_usage_is_sampled_from_the_host_and_served_by_the_api() -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::PersistentVolumeClaim;
    use reqwest::Method;
    use vcp_orchestrator::inventory::Inventory;
    use vcp_orchestrator::usage::Sampler;
    use vcp_policy::quota::Usage;

    let cluster = DevCluster::shared().await?;
    let host = cluster.connect().await?;
    let platform = vcp_dev::testing::platform(cluster, "vcp-usage", 2).await?;
    let admin = platform.admin.clone();
    let mut owners = Vec::new();
    for name in ["team-u", "team-v"] {
        let (s, b) = admin
            .raw(
                Method::POST,
                "/v1/tokens",
                Some(&serde_json::json!({"name": name, "role": "owner"})),
            )
            .await?;
        assert_eq!(s, 201, "{b}");
        owners.push(admin.with_token(b["token"].as_str().unwrap()));
    }
    let (owner, stranger) = (&owners[0], &owners[1]);
    owner.create_tenant("gamma").await?;
    let t = owner.wait_ready("gamma", READY_TIMEOUT).await?;
    let key = t["key"].as_str().unwrap().to_owned();

    // This test is another replica: it samples on demand instead of waiting for an interval.
    let inventory = Inventory::connect(&platform.database_url).await?;
    let plans = vcp_orchestrator::render::parse_plans(vcp_dev::platform::DEV_PLANS)?;
    let sampler = Sampler::new(inventory, host.clone(), &plans);
    let sample = || async {
        let round = sampler.round(Duration::ZERO).await?;
        anyhow::ensure!(round.failed.is_empty(), "{:?}", round.failed);
        round
            .recorded
            .into_iter()
            .find(|(name, ..)| name == "gamma")
            .map(|(_, at, used)| (at, used))
            .ok_or_else(|| anyhow::anyhow!("gamma was not sampled"))
    };
    let (_, before) = sample().await?;
    assert_eq!(
        before,
        Usage::default(),
        "a new tenant holds nothing: its built-in namespaces and default/kubernetes do not count"
    );

    // Three pods (one without resources: the plan's defaults count), a Service and a claim in
    // a new namespace.
    let tenant = tenant_client(&owner.kubeconfig("gamma", "u", &["admin"], "1h").await?).await?;
    vcp_dev::testing::namespace(&tenant, "shop").await?;
    let pods: Api<Pod> = Api::namespaced(tenant.clone(), "shop");
    let sized = serde_json::json!({
        "requests": {"cpu": "250m", "memory": "64Mi"},
        "limits": {"cpu": "500m", "memory": "128Mi"},
    });
    for (name, r) in [
        ("a", sized.clone()),
        ("b", sized),
        ("plain", serde_json::json!({})),
    ] {
        pods.create(&PostParams::default(), &pod_with(name, r)?)
            .await?;
    }
    Api::<Service>::namespaced(tenant.clone(), "shop")
        .create(&PostParams::default(), &web_service()?)
        .await?;
    let claim: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }))?;
    Api::<PersistentVolumeClaim>::namespaced(tenant.clone(), "shop")
        .create(&PostParams::default(), &claim)
        .await?;
    let host_ns = format!("{key}-shop");
    eventually(
        "the syncer put gamma's pods, Service and claim on the host",
        Duration::from_secs(120),
        || async {
            let p = Api::<Pod>::namespaced(host.clone(), &host_ns)
                .list(&ListParams::default())
                .await?
                .items
                .len();
            let s = Api::<Service>::namespaced(host.clone(), &host_ns)
                .list(&ListParams::default())
                .await?
                .items
                .len();
            let c = Api::<PersistentVolumeClaim>::namespaced(host.clone(), &host_ns)
                .list(&ListParams::default())
                .await?
                .items
                .len();
            Ok((p == 3 && s == 1 && c == 1).then_some(()))
        },
    )
    .await?;

    let (at, used) = sample().await?;
    let mi = 1u64 << 20;
    assert_eq!(
        used,
        Usage {
            pods: before.pods + 3,
            requests_cpu: before.requests_cpu + 250 + 250 + 100,
            requests_memory: before.requests_memory + 64 * mi + 64 * mi + 128 * mi,
            limits_cpu: before.limits_cpu + 500 + 500 + 1000,
            limits_memory: before.limits_memory + 128 * mi + 128 * mi + 512 * mi,
            services: before.services + 1,
            persistent_volume_claims: before.persistent_volume_claims + 1,
            requests_storage: before.requests_storage + 1024 * mi,
            namespaces: before.namespaces + 1,
        },
        "before: {before:?}"
    );
    let used_json = serde_json::to_value(used)?;
    let rfc3339 = |t: time::OffsetDateTime| {
        t.format(&time::format_description::well_known::Rfc3339)
            .unwrap()
    };

    // The tenant shows it (or a later sample of vcp serve's own, which counts the same).
    let (s, t) = owner.raw(Method::GET, "/v1/tenants/gamma", None).await?;
    assert_eq!(s, 200, "{t}");
    let usage = &t["usage"];
    assert_eq!(usage["used"], used_json, "{t}");
    let shown = time::OffsetDateTime::parse(
        usage["sampled_at"].as_str().unwrap(),
        &time::format_description::well_known::Rfc3339,
    )?;
    assert!(
        shown >= at,
        "{shown} is older than the sample taken at {at}"
    );
    assert_eq!(
        usage["limits"],
        serde_json::json!({
            "pods": 100, "requests_cpu": 20_000, "requests_memory": 64u64 << 30,
            "limits_cpu": 100_000, "limits_memory": 128u64 << 30, "services": 50,
            "persistent_volume_claims": 20, "requests_storage": 200u64 << 30, "namespaces": 20,
        }),
        "the default plan's quota"
    );

    // The range endpoint has this very sample, for the owner and for admins.
    let range = format!(
        "/v1/tenants/gamma/usage?since={}&until={}",
        rfc3339(at - time::Duration::seconds(1)),
        rfc3339(at + time::Duration::seconds(1)),
    );
    for who in [owner, &admin] {
        let (s, u) = who.raw(Method::GET, &range, None).await?;
        assert_eq!(s, 200, "{u}");
        let items = u["items"].as_array().unwrap();
        assert!(
            items
                .iter()
                .any(|i| i["sampled_at"] == rfc3339(at) && i["used"] == used_json),
            "{u}"
        );
        assert_eq!(u["limits"], usage["limits"]);
    }
    // Every sample since provisioning, oldest first; pages of one follow `next_since`.
    let (_, all) = owner
        .raw(Method::GET, "/v1/tenants/gamma/usage?limit=10000", None)
        .await?;
    let all = all["items"].as_array().unwrap().clone();
    assert!(all.len() >= 2, "{all:?}");
    let mut paged = Vec::new();
    let mut since = all[0]["sampled_at"].as_str().unwrap().to_owned();
    let until = rfc3339(time::OffsetDateTime::now_utc() + time::Duration::minutes(1));
    loop {
        let (s, page) = owner
            .raw(
                Method::GET,
                &format!("/v1/tenants/gamma/usage?since={since}&until={until}&limit=1"),
                None,
            )
            .await?;
        assert_eq!(s, 200, "{page}");
        paged.extend(page["items"].as_array().unwrap().iter().cloned());
        match page["next_since"].as_str() {
            Some(next) => since = next.to_owned(),
            None => break,
        }
    }
    assert_eq!(paged[..all.len()], all[..], "pages add up to the range");

    // Another owner sees nothing; bad ranges name their parameter.
    for path in ["/v1/tenants/gamma", "/v1/tenants/gamma/usage", &range] {
        let (s, b) = stranger.raw(Method::GET, path, None).await?;
        assert_eq!((s, b["status"].as_u64()), (404, Some(404)), "{path}: {b}");
    }
    for (query, field) in [
        (
            format!(
                "since={}&until={}",
                rfc3339(at),
                rfc3339(at - time::Duration::seconds(1))
            ),
            "since",
        ),
        ("since=not-a-time".to_owned(), "since"),
        ("until=2026-02-30T00:00:00Z".to_owned(), "until"),
    ] {
        let (s, b) = owner
            .raw(
                Method::GET,
                &format!("/v1/tenants/gamma/usage?{query}"),
                None,
            )
            .await?;
        assert_eq!((s, b["field"].as_str()), (422, Some(field)), "{query}: {b}");
    }

    // The client commands show the same.
    let vcp = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_vcp"))
            .args(args)
            .env("VCP_API_URL", &platform.orchestrator.url)
            .env("VCP_TOKEN", &platform.admin_token)
            .env("COLUMNS", "80")
            .env_remove("RUST_LOG")
            .output()
            .expect("vcp runs");
        assert!(out.status.success(), "{args:?}: {out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let shown = vcp(&["tenant", "get", "gamma"]);
    assert!(
        shown
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>()
                == ["pods", &used.pods.to_string(), "100"]),
        "{shown}"
    );
    let exported: serde_json::Value = serde_json::from_str(&vcp(&[
        "tenant", "usage", "gamma", "--since", "1h", "-o", "json",
    ]))?;
    assert!(
        exported["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|i| i["sampled_at"] == rfc3339(at) && i["used"] == used_json),
        "{exported}"
    );
    drop(platform);
    Ok(())
}
