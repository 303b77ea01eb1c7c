//! vcp really running from its Helm chart: `helm install` of `charts/vcp` on the dev cluster,
//! with the evaluation Postgres, vcp's and Postgres' pods placed on the devnode (which runs
//! them as real processes: the workspace's `vcp` and Debian's PostgreSQL 15), then the
//! platform used through its in-cluster API as NOTES.txt tells a user to: the admin token read
//! from its Secret, the API reached through `kubectl port-forward`, a tenant created and its
//! kubeconfig used.
//!
//! In cluster, vcp reads its service-account token and CA from the mounted volume, reaches the
//! host apiserver at `KUBERNETES_SERVICE_HOST`, finds Postgres by its Service name and tenant
//! apiservers by theirs (`--tenant-access service-name`: the devnode routes no cluster IP), and
//! names itself after its pod.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, DeleteParams, ListParams};
use kube::{Client, ResourceExt};
use std::process::Command;
use std::time::{Duration, Instant};
use tokio::io::AsyncBufReadExt;
use vcp_dev::DevCluster;
use vcp_dev::platform::ApiClient;
use vcp_dev::testing::eventually;

type Res<T = ()> = anyhow::Result<T>;

/// vcp's first start migrates an empty inventory, after Postgres initialised it; both on a
/// machine shared with other test binaries.
const INSTALL_TIMEOUT: Duration = Duration::from_secs(300);
const TENANT_TIMEOUT: Duration = Duration::from_secs(300);

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Runs the pinned helm against the cluster; its stdout.
fn helm(cluster: &DevCluster, args: &[&str]) -> Res<String> {
    Ok(vcp_dev::chart::helm(cluster.kubeconfig_path(), args)?)
}

/// `helm install` of release `release` in `ns` with the dev cluster's values.
fn install(cluster: &DevCluster, release: &str, ns: &str) -> Res {
    let dir = tempfile::tempdir()?;
    vcp_dev::chart::install(
        cluster.kubeconfig_path(),
        release,
        ns,
        &vcp_dev::chart::dev_values(None),
        &dir.path().join("values.yaml"),
    )?;
    Ok(())
}

/// The pid the devnode reports for a pod's first container (`devnode://<pid>`).
fn pid_of(p: &Pod) -> Option<u32> {
    let id = p
        .status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .first()?
        .container_id
        .clone()?;
    id.strip_prefix("devnode://")?.parse().ok()
}

/// Real and effective uid of a process.
fn uids(pid: u32) -> Res<(u32, u32)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .ok_or_else(|| anyhow::anyhow!("no Uid line for {pid}"))?;
    let ids: Vec<u32> = line
        .split_whitespace()
        .skip(1)
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    Ok((ids[0], ids[1]))
}

/// Waits until `n` pods matching `selector` in `ns` are Ready; returns them.
async fn ready_pods(
    cluster: &DevCluster,
    client: &Client,
    ns: &str,
    selector: &str,
    n: usize,
    container: &str,
) -> Res<Vec<Pod>> {
    Ok(vcp_dev::chart::ready_pods(
        client,
        cluster.state_dir(),
        ns,
        selector,
        n,
        container,
        INSTALL_TIMEOUT,
    )
    .await?)
}

/// `kubectl port-forward` to `target` in `ns`: the local URL, and the process (killed on drop).
async fn port_forward(
    cluster: &DevCluster,
    ns: &str,
    target: &str,
) -> Res<(String, tokio::process::Child)> {
    let mut child = tokio::process::Command::new(cluster.kubectl())
        .args(["-n", ns, "port-forward", target, ":8080"])
        .env("KUBECONFIG", cluster.kubeconfig_path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let stdout = child.stdout.take().expect("piped");
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    // "Forwarding from 127.0.0.1:41234 -> 8080"
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .map_err(|_| anyhow::anyhow!("kubectl port-forward printed nothing in 30 s"))??
        .ok_or_else(|| anyhow::anyhow!("kubectl port-forward ended"))?;
    let addr = line
        .strip_prefix("Forwarding from ")
        .and_then(|r| r.split(" -> ").next())
        .ok_or_else(|| anyhow::anyhow!("unexpected port-forward output {line:?}"))?;
    // Keep reading so kubectl never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok((format!("http://{addr}"), child))
}

/// `kubectl exec` in a pod (through the devnode's kubelet API: the command runs in the
/// container's network and mount namespaces, so it sees the pod's volumes and hosts file).
fn exec(cluster: &DevCluster, ns: &str, pod: &str, command: &[&str]) -> Res<String> {
    let out = Command::new(cluster.kubectl())
        .args(["-n", ns, "exec", pod, "--"])
        .args(command)
        .env("KUBECONFIG", cluster.kubeconfig_path())
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "exec {command:?} in {pod}: {}",
        text(&out.stderr)
    );
    Ok(text(&out.stdout))
}

async fn tenant_client(kubeconfig: &str) -> Res<Client> {
    let kc = kube::config::Kubeconfig::from_yaml(kubeconfig)?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
    Ok(Client::try_from(cfg)?)
}

/// The namespaces a tenant's admin kubeconfig lists.
async fn tenant_namespaces(api: &ApiClient, tenant: &str) -> Res<Vec<String>> {
    let kc = api.kubeconfig(tenant, "tester", &["admin"], "1h").await?;
    let client = tenant_client(&kc).await?;
    // The kubeconfig carries the NodePort the devnode forwards on 127.0.0.1.
    let list = eventually(
        "the tenant apiserver through its kubeconfig",
        Duration::from_secs(60),
        || async {
            Ok(Api::<Namespace>::all(client.clone())
                .list(&ListParams::default())
                .await
                .ok())
        },
    )
    .await?;
    Ok(list.items.iter().map(|n| n.name_any()).collect())
}

/// The inventory's view of a tenant: (phase, lease owner), read straight from the chart's
/// Postgres at its pod IP with the generated password (scram over a non-local address).
async fn inventory_row(url: &str, tenant: &str) -> Res<Option<(String, Option<String>)>> {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(url).await?;
    let row: Option<(String, Option<String>)> = sqlx::query_as(
        "SELECT phase::text, lease_owner FROM tenants WHERE name = $1 AND deleted_at IS NULL",
    )
    .bind(tenant)
    .fetch_optional(&mut conn)
    .await?;
    let _ = conn.close().await;
    Ok(row)
}

/// Who moved a tenant to Ready, from the audit trail: `reconciler/<replica>/<worker>`.
async fn made_ready_by(url: &str, tenant: &str) -> Res<Option<String>> {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(url).await?;
    let actor: Option<String> = sqlx::query_scalar(
        "SELECT a.actor FROM audit a JOIN tenants t ON t.id = a.tenant_id
         WHERE t.name = $1 AND t.deleted_at IS NULL AND a.action = 'tenant.phase'
           AND a.detail->>'to' = 'Ready'
         ORDER BY a.id LIMIT 1",
    )
    .bind(tenant)
    .fetch_optional(&mut conn)
    .await?;
    let _ = conn.close().await;
    Ok(actor)
}

/// What a client polling vcp's API through a rollout saw.
#[derive(Debug)]
struct Polled {
    ok: u64,
    failed: u64,
    /// Port-forwards started again after the first (each after a failed request).
    reforwards: u64,
    /// The longest time between two answered requests, or from the last answer to the end.
    longest_gap: Duration,
    last_ok: Instant,
    /// Each answer's time, for the test to wait for one after the rollout.
    answered: tokio::sync::watch::Sender<Instant>,
}

impl Polled {
    fn new() -> (Polled, tokio::sync::watch::Receiver<Instant>) {
        let now = Instant::now();
        let (answered, rx) = tokio::sync::watch::channel(now);
        let p = Polled {
            ok: 0,
            failed: 0,
            reforwards: 0,
            longest_gap: Duration::ZERO,
            last_ok: now,
            answered,
        };
        (p, rx)
    }

    fn answer(&mut self) {
        self.ok += 1;
        self.longest_gap = self.longest_gap.max(self.last_ok.elapsed());
        self.last_ok = Instant::now();
        self.answered.send_replace(self.last_ok);
    }

    fn failure(&mut self, who: &str, why: &str) {
        self.failed += 1;
        eprintln!(
            "{who}: request failed {:.1}s after the last answer: {why}",
            self.last_ok.elapsed().as_secs_f64()
        );
    }

    fn end(mut self) -> Polled {
        self.longest_gap = self.longest_gap.max(self.last_ok.elapsed());
        self
    }
}

/// One `GET /v1/tenants` at `base` on a new connection (a kept-alive one closed by a stopping
/// replica is not the API failing): `Ok` when answered 200, else why not.
async fn get_tenants(http: &reqwest::Client, base: &str, token: &str) -> Result<(), String> {
    match http
        .get(format!("{base}/v1/tenants"))
        .bearer_auth(token)
        .send()
        .await
    {
        Ok(r) if r.status() == reqwest::StatusCode::OK => Ok(()),
        Ok(r) => Err(format!("status {}", r.status())),
        Err(e) => Err(format!("{e:#}")),
    }
}

fn poll_client() -> Res<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(5))
        .build()?)
}

/// Asks vcp's API for its tenants every 200 ms until `stop`, through `kubectl port-forward
/// service/<release>` as NOTES.txt tells a user to. Such a port-forward is bound to the one
/// pod kubectl picked when it started and ends with that pod: after a failed request it is
/// started again (kubectl then picks a running pod of the Service), as the user would.
async fn poll_api_through_port_forward(
    cluster: &'static DevCluster,
    ns: String,
    service: String,
    token: String,
    mut polled: Polled,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Res<Polled> {
    let http = poll_client()?;
    let mut forward: Option<(String, tokio::process::Child)> = None;
    let mut forwards = 0u64;
    while !*stop.borrow() {
        let url = match &forward {
            Some((url, _)) => url.clone(),
            None => match port_forward(cluster, &ns, &format!("service/{service}")).await {
                Ok((url, child)) => {
                    forwards += 1;
                    forward = Some((url.clone(), child));
                    url
                }
                Err(e) => {
                    eprintln!("port-forward poller: kubectl port-forward: {e:#}");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
            },
        };
        match get_tenants(&http, &url, &token).await {
            Ok(()) => polled.answer(),
            Err(why) => {
                polled.failure("port-forward poller", &why);
                // Dropping the child kills kubectl; the next request starts another.
                forward = None;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    polled.reforwards = forwards.saturating_sub(1);
    Ok(polled.end())
}

/// Asks vcp's API for its tenants every 200 ms until `stop`, at the pod IPs the Service's
/// EndpointSlices list as ready, in turn, as kube-proxy routes a Service's connections (the
/// dev cluster has no kube-proxy; pod IPs are reachable from this machine): what a client of
/// the Service sees of the rolling update, readiness and shutdown of vcp's pods.
async fn poll_api_through_service_endpoints(
    client: Client,
    ns: String,
    service: String,
    token: String,
    mut polled: Polled,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Res<Polled> {
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    let http = poll_client()?;
    let slices: Api<EndpointSlice> = Api::namespaced(client, &ns);
    let by_service = ListParams::default().labels(&format!("kubernetes.io/service-name={service}"));
    let mut turn = 0usize;
    while !*stop.borrow() {
        let ready: Vec<String> = match slices.list(&by_service).await {
            Ok(list) => list
                .items
                .iter()
                .flat_map(|s| s.endpoints.iter().flatten())
                // An unknown readiness counts as ready, as kube-proxy counts it.
                .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) != Some(false))
                .filter_map(|e| e.addresses.first().cloned())
                .collect(),
            Err(e) => {
                eprintln!("endpoints poller: listing EndpointSlices: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        turn += 1;
        let Some(ip) = ready.get(turn % ready.len().max(1)) else {
            polled.failure("endpoints poller", "no ready endpoint");
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        match get_tenants(&http, &format!("http://{ip}:8080"), &token).await {
            Ok(()) => polled.answer(),
            Err(why) => polled.failure("endpoints poller", &format!("{ip}: {why}")),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(polled.end())
}

/// Rows of the inventory's tables that must outlive any vcp rollout: tenants, the
/// certificates and kubeconfigs issued for them, API tokens.
async fn inventory_counts(url: &str) -> Res<Vec<(&'static str, i64)>> {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(url).await?;
    let mut counts = Vec::new();
    for table in ["tenants", "certificates", "kubeconfigs", "api_tokens"] {
        let n: i64 =
            sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
                .fetch_one(&mut conn)
                .await?;
        counts.push((table, n));
    }
    let _ = conn.close().await;
    Ok(counts)
}

/// `helm upgrade` with a changed value (`workers`) that rolls vcp's pods, while clients poll
/// vcp's API (at the Service's ready endpoints, and through a port-forward to the Service)
/// and a tenant's apiserver through its kubeconfig. The tenant's control plane is not vcp's:
/// it must not notice (zero failures). The API has a Ready replica throughout (maxUnavailable
/// 0, a new pod Ready before an old one stops), so a client of the Service sees no failure.
/// A port-forward is bound to one pod and breaks when that pod stops: each of the two old
/// pods can break it once, and a forward started again can pick a pod that is stopping but
/// not yet reported so, at most two failed requests per old replica. Nothing in the
/// inventory is lost.
async fn upgrade_under_load(
    cluster: &'static DevCluster,
    client: &Client,
    release: &str,
    ns: &str,
    token: &str,
    tenant_kubeconfig: &str,
    db: &str,
) -> Res {
    use k8s_openapi::api::core::v1::ConfigMap;
    let t0 = Instant::now();
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let selector = "app.kubernetes.io/component=orchestrator";
    let old: Vec<String> = ready_pods(cluster, client, ns, selector, 2, "vcp")
        .await?
        .iter()
        .map(|p| p.name_any())
        .collect();
    let before = inventory_counts(db).await?;

    // The tenant side: a ConfigMap in the tenant, read every 200 ms.
    let tenant = tenant_client(tenant_kubeconfig).await?;
    let cms: Api<ConfigMap> = Api::namespaced(tenant, "default");
    let probe: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "upgrade-probe"}, "data": {"k": "v"},
    }))?;
    cms.create(&Default::default(), &probe).await?;
    let tenant_poller = vcp_dev::testing::Poller::start(cms, "upgrade-probe");
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let (polled, mut forward_answers) = Polled::new();
    let forward_poller = tokio::spawn(poll_api_through_port_forward(
        cluster,
        ns.to_owned(),
        release.to_owned(),
        token.to_owned(),
        polled,
        stopped.clone(),
    ));
    let (polled, mut endpoint_answers) = Polled::new();
    let endpoints_poller = tokio::spawn(poll_api_through_service_endpoints(
        client.clone(),
        ns.to_owned(),
        release.to_owned(),
        token.to_owned(),
        polled,
        stopped,
    ));
    tokio::time::sleep(Duration::from_secs(3)).await;

    let dir = tempfile::tempdir()?;
    let file = dir.path().join("values.yaml");
    std::fs::write(&file, vcp_dev::chart::dev_values(None))?;
    let chart = vcp_dev::chart::chart_dir();
    let args: Vec<String> = [
        "upgrade",
        release,
        chart.to_str().unwrap(),
        "--namespace",
        ns,
        "-f",
        file.to_str().unwrap(),
        "--set",
        "workers=3",
        "--wait",
        "--timeout",
        "10m",
    ]
    .map(str::to_owned)
    .into();
    let started = Instant::now();
    // Off the test's runtime (one thread): the pollers must go on while helm waits.
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        helm(cluster, &args)
    })
    .await??;
    let rollout = started.elapsed();
    // The rollout is done when both new replicas are Ready and no old one is left.
    let new = eventually(
        "two new Ready replicas and no old one",
        INSTALL_TIMEOUT,
        || async {
            let list = pods.list(&ListParams::default().labels(selector)).await?;
            let (new, left): (Vec<Pod>, Vec<Pod>) = list
                .items
                .into_iter()
                .partition(|p| !old.contains(&p.name_any()));
            let ready = new.iter().filter(|p| vcp_dev::chart::pod_ready(p)).count();
            Ok((ready == 2 && left.is_empty()).then_some(new))
        },
    )
    .await?;
    let rolled = started.elapsed();
    // Both API clients are answered again after the rollout (a port-forward whose pod went
    // away is started again), and go on for a few seconds more.
    let done = Instant::now();
    for answers in [&mut forward_answers, &mut endpoint_answers] {
        tokio::time::timeout(Duration::from_secs(120), answers.wait_for(|at| *at > done))
            .await
            .map_err(|_| {
                anyhow::anyhow!("the API was not answered within 120 s of the rollout")
            })??;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.send(true)?;
    let forwarded = forward_poller.await??;
    let routed = endpoints_poller.await??;
    let (tenant_ok, tenant_failed) = tenant_poller.finish().await?;
    let after = inventory_counts(db).await?;

    println!(
        "helm upgrade --wait: {:.1}s, old replicas gone: {:.1}s",
        rollout.as_secs_f64(),
        rolled.as_secs_f64()
    );
    println!(
        "API through the Service's ready endpoints: {} answered, {} failed, longest gap {:.1}s",
        routed.ok,
        routed.failed,
        routed.longest_gap.as_secs_f64()
    );
    println!(
        "API through port-forward: {} answered, {} failed, {} port-forwards started again, longest gap {:.1}s",
        forwarded.ok,
        forwarded.failed,
        forwarded.reforwards,
        forwarded.longest_gap.as_secs_f64()
    );
    println!("tenant apiserver: {tenant_ok} answered, {tenant_failed} failed");
    println!("inventory before {before:?}, after {after:?}");
    for p in &new {
        let args = p
            .spec
            .as_ref()
            .and_then(|s| s.containers.first())
            .and_then(|c| c.args.clone())
            .unwrap_or_default();
        assert!(
            args.contains(&"--workers=3".to_owned()),
            "{} runs the new value: {args:?}",
            p.name_any()
        );
    }
    assert_eq!(tenant_failed, 0, "the tenant apiserver never failed");
    assert!(tenant_ok > 0, "the tenant poller was answered");
    assert_eq!(
        routed.failed, 0,
        "a client of the Service always finds a Ready replica that answers"
    );
    let bound = 2 * old.len() as u64;
    assert!(
        forwarded.failed <= bound,
        "{} requests through the port-forward failed (at most {bound}: two per old replica)",
        forwarded.failed
    );
    assert_eq!(before, after, "the inventory lost nothing");
    println!("upgrade under load: {:.1}s", t0.elapsed().as_secs_f64());
    Ok(())
}

#[tokio::test]
async fn the_chart_runs_vcp_and_postgres_on_the_devnode_provisions_a_tenant_and_upgrades_under_load()
-> Res {
    let t0 = Instant::now();
    let cluster = DevCluster::shared().await?;
    let client = cluster.connect().await?;
    let (release, ns) = ("vcp", "incluster-install");
    install(cluster, release, ns)?;
    println!("helm install: {:.1}s", t0.elapsed().as_secs_f64());

    // Postgres: initialised by the image's entrypoint, Ready by its pg_isready probe, as 999.
    let pg = ready_pods(
        cluster,
        &client,
        ns,
        "app.kubernetes.io/component=postgresql",
        1,
        "postgresql",
    )
    .await?
    .remove(0);
    println!("postgres Ready: {:.1}s", t0.elapsed().as_secs_f64());
    assert_eq!(
        pg.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        Some(vcp_dev::cluster::DEVNODE_NAME)
    );
    let pid = pid_of(&pg).ok_or_else(|| anyhow::anyhow!("no pid for postgres"))?;
    assert_eq!(
        uids(pid)?,
        (999, 999),
        "Postgres runs as the chart's runAsUser"
    );

    // Two vcp replicas Ready by their /readyz probes (the inventory answers through the
    // Service name and the generated password), each as 65532, each named after its pod.
    let vcps = ready_pods(
        cluster,
        &client,
        ns,
        "app.kubernetes.io/component=orchestrator",
        2,
        "vcp",
    )
    .await?;
    println!("2 vcp replicas Ready: {:.1}s", t0.elapsed().as_secs_f64());
    for p in &vcps {
        assert_eq!(
            p.spec.as_ref().and_then(|s| s.node_name.as_deref()),
            Some(vcp_dev::cluster::DEVNODE_NAME)
        );
        let pid = pid_of(p).ok_or_else(|| anyhow::anyhow!("no pid for {}", p.name_any()))?;
        assert_eq!(
            uids(pid)?,
            (65532, 65532),
            "vcp runs as the chart's runAsUser"
        );
        let environ = std::fs::read(format!("/proc/{pid}/environ"))?;
        let env: Vec<String> = environ
            .split(|b| *b == 0)
            .map(|e| String::from_utf8_lossy(e).into_owned())
            .collect();
        assert!(
            env.contains(&format!("VCP_REPLICA_ID={}", p.name_any())),
            "the replica id is the pod name"
        );
        assert!(
            env.contains(&"KUBERNETES_SERVICE_HOST=kubernetes.default.svc.cluster.local".into()),
            "{env:?}"
        );
    }
    // What vcp needs in the cluster, seen from inside one of its pods: its service account's
    // token, CA and namespace; the host apiserver's name (the devnode's gateway) and the
    // Postgres Service's name (the Postgres pod) in its hosts file.
    let pod = vcps[0].name_any();
    let sa = "/var/run/secrets/kubernetes.io/serviceaccount";
    assert_eq!(
        exec(cluster, ns, &pod, &["cat", &format!("{sa}/namespace")])?,
        ns
    );
    exec(
        cluster,
        ns,
        &pod,
        &[
            "test",
            "-s",
            &format!("{sa}/token"),
            "-a",
            "-s",
            &format!("{sa}/ca.crt"),
        ],
    )?;
    let pg_ip = pg
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .ok_or_else(|| anyhow::anyhow!("postgres has no pod IP"))?;
    let db_host = format!("vcp-postgresql.{ns}.svc");
    let resolved = exec(cluster, ns, &pod, &["getent", "hosts", &db_host])?;
    assert!(
        resolved.starts_with(&format!("{pg_ip} ")),
        "{db_host}: {resolved:?}"
    );
    let resolved = exec(
        cluster,
        ns,
        &pod,
        &["getent", "hosts", "kubernetes.default.svc.cluster.local"],
    )?;
    let gateway = resolved.split_whitespace().next().unwrap_or_default();
    assert!(
        gateway.starts_with("10.245.") && gateway.ends_with(".1"),
        "the devnode's gateway (10.245.<k>.1): {resolved:?}"
    );
    let d = Api::<Deployment>::namespaced(client.clone(), ns)
        .get(release)
        .await?;
    assert_eq!(
        d.status.as_ref().and_then(|s| s.ready_replicas),
        Some(2),
        "the Deployment counts both"
    );

    // The API as NOTES.txt says: port-forward to the Service, the admin token from its Secret.
    let token = vcp_dev::chart::secret_value(&client, ns, "vcp-admin-token", "token").await?;
    let (url, _forward) = port_forward(cluster, ns, "service/vcp").await?;
    let api = ApiClient::new(&url, &token);
    let (status, body) = api.raw(reqwest::Method::GET, "/v1/tenants", None).await?;
    assert_eq!(status, 200, "{body}");
    let (status, _) = ApiClient::new(&url, "vcp_wrong")
        .raw(reqwest::Method::GET, "/v1/tenants", None)
        .await?;
    assert_eq!(status, 401, "only the Secret's token is admitted");

    // A tenant, provisioned by vcp in the cluster: control plane on the devnode, reached by
    // vcp through its Service name, by us through the NodePort its kubeconfig names.
    api.create_tenant("incluster").await?;
    api.wait_ready("incluster", TENANT_TIMEOUT).await?;
    println!("tenant Ready: {:.1}s", t0.elapsed().as_secs_f64());
    let names = tenant_namespaces(&api, "incluster").await?;
    for want in ["default", "kube-system"] {
        assert!(names.iter().any(|n| n == want), "{names:?}");
    }

    // The inventory holds it, in the chart's Postgres, with the password the chart generated.
    let password = vcp_dev::chart::secret_value(&client, ns, "vcp-postgresql", "password").await?;
    let db = format!("postgres://vcp:{password}@{pg_ip}:5432/vcp");
    let (phase, _) = inventory_row(&db, "incluster")
        .await?
        .ok_or_else(|| anyhow::anyhow!("tenant not in the inventory"))?;
    assert_eq!(phase, "Ready");
    let wrong = format!("postgres://vcp:not-{password}@{pg_ip}:5432/vcp");
    assert!(
        inventory_row(&wrong, "incluster").await.is_err(),
        "a wrong password is refused from outside the pod"
    );
    println!(
        "installed and provisioned: {:.1}s",
        t0.elapsed().as_secs_f64()
    );

    // Then vcp itself is upgraded, under load.
    let kc = api
        .kubeconfig("incluster", "poller", &["admin"], "2h")
        .await?;
    upgrade_under_load(cluster, &client, release, ns, &token, &kc, &db).await?;
    println!("total: {:.1}s", t0.elapsed().as_secs_f64());
    Ok(())
}

#[tokio::test]
async fn a_replica_deleted_mid_provision_leaves_the_tenant_to_the_other_and_a_reinstall_adopts_it()
-> Res {
    let t0 = Instant::now();
    let cluster = DevCluster::shared().await?;
    let client = cluster.connect().await?;
    // Another release name: the chart's ClusterRole and binding are named after it.
    let (release, ns) = ("adopt-vcp", "incluster-adopt");
    install(cluster, release, ns)?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let selector = "app.kubernetes.io/component=orchestrator";
    let (token_secret, db_secret) = (
        format!("{release}-admin-token"),
        format!("{release}-postgresql"),
    );
    let pg = ready_pods(
        cluster,
        &client,
        ns,
        "app.kubernetes.io/component=postgresql",
        1,
        "postgresql",
    )
    .await?
    .remove(0);
    let vcps = ready_pods(cluster, &client, ns, selector, 2, "vcp").await?;
    println!("installed: {:.1}s", t0.elapsed().as_secs_f64());
    let token = vcp_dev::chart::secret_value(&client, ns, &token_secret, "token").await?;
    let password = vcp_dev::chart::secret_value(&client, ns, &db_secret, "password").await?;
    let pod_ip = |p: &Pod| p.status.as_ref().and_then(|s| s.pod_ip.clone());
    let db = format!(
        "postgres://vcp:{password}@{}:5432/vcp",
        pod_ip(&pg).ok_or_else(|| anyhow::anyhow!("postgres has no pod IP"))?
    );
    // The pod IPs are in the devnode's network namespaces: reachable from here.
    let api_of = |p: &Pod| -> Res<ApiClient> {
        let ip = pod_ip(p).ok_or_else(|| anyhow::anyhow!("{} has no pod IP", p.name_any()))?;
        Ok(ApiClient::new(&format!("http://{ip}:8080"), &token))
    };

    // Mid-provision, the replica holding the tenant's lease is deleted: the other finishes.
    api_of(&vcps[0])?.create_tenant("adopted").await?;
    let holder = eventually("a replica leasing the tenant", TENANT_TIMEOUT, || async {
        Ok(match inventory_row(&db, "adopted").await? {
            Some((phase, Some(owner))) if phase != "Ready" => Some(owner),
            Some((phase, _)) if phase == "Ready" => {
                anyhow::bail!("the tenant was Ready before a replica could be deleted")
            }
            _ => None,
        })
    })
    .await?;
    let victim = holder.split('/').next().unwrap_or_default().to_owned();
    let survivor = vcps
        .iter()
        .find(|p| p.name_any() != victim)
        .ok_or_else(|| anyhow::anyhow!("lease holder {holder} is not one of the replicas"))?;
    println!(
        "deleting {victim} (holds {holder}) at {:.1}s",
        t0.elapsed().as_secs_f64()
    );
    pods.delete(&victim, &DeleteParams::default()).await?;
    let api = api_of(survivor)?;
    api.wait_ready("adopted", TENANT_TIMEOUT + Duration::from_secs(60))
        .await?;
    println!("tenant Ready: {:.1}s", t0.elapsed().as_secs_f64());
    let by = made_ready_by(&db, "adopted")
        .await?
        .ok_or_else(|| anyhow::anyhow!("no audit record of the tenant becoming Ready"))?;
    println!("made Ready by {by}");
    assert!(
        by.starts_with("reconciler/") && !by.starts_with(&format!("reconciler/{victim}/")),
        "another replica than the deleted {victim} finished it: {by}"
    );
    assert!(
        tenant_namespaces(&api, "adopted")
            .await?
            .contains(&"default".to_owned())
    );

    // Uninstalled, vcp is gone and the tenant stays: its control plane keeps serving.
    let kc = api.kubeconfig("adopted", "kept", &["admin"], "2h").await?;
    helm(
        cluster,
        &["uninstall", release, "--namespace", ns, "--wait"],
    )?;
    eventually("vcp's pods gone", Duration::from_secs(120), || async {
        Ok(pods
            .list(&ListParams::default().labels(selector))
            .await?
            .items
            .is_empty()
            .then_some(()))
    })
    .await?;
    let tenant = tenant_client(&kc).await?;
    let kept = Api::<Namespace>::all(tenant)
        .list(&ListParams::default())
        .await?;
    assert!(
        !kept.items.is_empty(),
        "the tenant apiserver serves without vcp"
    );
    println!("uninstalled: {:.1}s", t0.elapsed().as_secs_f64());

    // Reinstalled over the kept Secrets and volume: the new replicas find the tenant.
    install(cluster, release, ns)?;
    let vcps = ready_pods(cluster, &client, ns, selector, 2, "vcp").await?;
    let api = api_of(&vcps[0])?;
    let t = api
        .get_tenant("adopted")
        .await?
        .ok_or_else(|| anyhow::anyhow!("the reinstalled vcp does not know the tenant"))?;
    assert_eq!(t["phase"], "Ready", "{t}");
    assert!(
        tenant_namespaces(&api, "adopted")
            .await?
            .contains(&"default".to_owned())
    );
    println!(
        "reinstalled and adopted: {:.1}s",
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}
