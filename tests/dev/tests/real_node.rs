//! The real node (`vcp_dev::node`): a kubelet, containerd and runc joined to the dev cluster,
//! running containers from the images `vcp_dev::images` writes. Nothing here is simulated: the
//! pod's probe, token, volumes, logs and exec all go through the real kubelet and runtime.

use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use kube::api::{Api, LogParams, PostParams};
use std::net::SocketAddr;
use std::time::Duration;
use vcp_dev::testing::{eventually, kubectl_with, namespace, real_node_cluster};
use vcp_dev::{DevCluster, images, node};

/// Imports what vcp's platform runs from into the real node (`images::platform_images`).
fn import_platform_images(cluster: &DevCluster) -> anyhow::Result<()> {
    let (imgs, skipped) = images::platform_images(&images::workspace_bin_dir()?)?;
    anyhow::ensure!(
        skipped.is_empty(),
        "every catalog minor is built here: {skipped:?}"
    );
    cluster.import_node_images(&imgs)?;
    Ok(())
}

/// A local `vcp serve` whose tenants run on the real node: its plans and `more_plans`,
/// exposed at the node.
async fn platform_on_node(
    cluster: &DevCluster,
    dir: &std::path::Path,
    name: &str,
    more_plans: &str,
) -> anyhow::Result<vcp_dev::testing::TestPlatform> {
    let (_, net) = cluster.real_node()?;
    let plans = dir.join(format!("{name}-plans.yaml"));
    std::fs::write(
        &plans,
        format!("{}{more_plans}", vcp_dev::platform::REAL_NODE_PLANS),
    )?;
    vcp_dev::testing::platform_with(
        cluster,
        name,
        2,
        vec![
            ("VCP_PLANS".into(), plans.to_string_lossy().into_owned()),
            ("VCP_EXPOSE_ADDRESS".into(), net.node_ip().to_string()),
        ],
    )
    .await
}

/// A client of a tenant from a kubeconfig's YAML.
async fn client_of(kubeconfig: &str) -> anyhow::Result<kube::Client> {
    Ok(kube::Client::try_from(
        kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::from_yaml(kubeconfig)?,
            &kube::config::KubeConfigOptions::default(),
        )
        .await?,
    )?)
}

fn pod(name: &str, image: &str, command: &str) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {node::NODE_LABEL.0: node::NODE_LABEL.1},
            "tolerations": [{"key": node::NODE_LABEL.0, "operator": "Exists"}],
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "web",
                "image": image,
                "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", command],
                "readinessProbe": {"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1},
                "volumeMounts": [
                    {"name": "www", "mountPath": "/www"},
                    {"name": "scratch", "mountPath": "/scratch"},
                ],
            }],
            "volumes": [
                {"name": "www", "configMap": {"name": "web"}},
                {"name": "scratch", "emptyDir": {}},
            ],
        },
    }))?)
}

/// A pod of one container `c` (its JSON) pinned to the real node, stopped at once when deleted.
fn on_node(name: &str, labels: serde_json::Value, c: serde_json::Value) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "nodeSelector": {node::NODE_LABEL.0: node::NODE_LABEL.1},
            "tolerations": [{"key": node::NODE_LABEL.0, "operator": "Exists"}],
            "terminationGracePeriodSeconds": 1,
            "containers": [c],
        },
    }))?)
}

/// The first container of pod `name` waiting in `ErrImagePull` (its message is the pull's
/// error), within a minute.
async fn pull_failure(
    pods: &Api<Pod>,
    name: &str,
) -> anyhow::Result<k8s_openapi::api::core::v1::ContainerStateWaiting> {
    eventually(
        &format!("{name}'s image pull failure"),
        Duration::from_secs(60),
        || async {
            let p = pods.get(name).await?;
            Ok(p.status
                .and_then(|s| s.container_statuses)
                .and_then(|c| c.into_iter().next())
                .and_then(|c| c.state?.waiting)
                .filter(|w| w.reason.as_deref() == Some("ErrImagePull")))
        },
    )
    .await
}

fn ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

#[tokio::test]
async fn a_pod_runs_on_the_real_node_with_probe_token_volumes_logs_and_exec() -> anyhow::Result<()>
{
    let (dir, mut cluster) = real_node_cluster().await?;
    let client = cluster.client();
    let n = Api::<Node>::all(client.clone())
        .get(node::NODE_NAME)
        .await?;
    let info = n
        .status
        .as_ref()
        .and_then(|s| s.node_info.as_ref())
        .expect("node info");
    assert!(
        info.container_runtime_version.starts_with("containerd://"),
        "{}",
        info.container_runtime_version
    );

    namespace(&client, "real").await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "real");
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web"},
            "data": {"index.html": "served by a real container\n"},
        }))?,
    )
    .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "real");
    pods.create(
        &PostParams::default(),
        &pod(
            "web",
            images::BUSYBOX_IMAGE,
            "echo started on the real node; exec httpd -f -p 8080 -h /www",
        )?,
    )
    .await?;
    let p = eventually(
        "pod web Ready on the real node",
        Duration::from_secs(90),
        || async { Ok(pods.get("web").await.ok().filter(ready)) },
    )
    .await?;
    assert_eq!(
        p.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        Some(node::NODE_NAME)
    );
    let ip = p
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .expect("pod IP");
    assert!(
        ip.starts_with("10.246."),
        "a bridge address of the node: {ip}"
    );

    // The host reaches the pod at its address, through the node's link.
    let body = reqwest::get(format!("http://{ip}:8080/"))
        .await?
        .text()
        .await?;
    assert_eq!(body, "served by a real container\n");

    let logs = pods.logs("web", &LogParams::default()).await?;
    assert!(logs.contains("started on the real node"), "{logs}");

    let kc = cluster.kubeconfig_path().to_owned();
    let (ok, out, err) = kubectl_with(
        &cluster,
        &kc,
        &[
            "-n",
            "real",
            "exec",
            "web",
            "--",
            "sh",
            "-c",
            "echo kept > /scratch/f && cat /scratch/f && echo $(cat /var/run/secrets/kubernetes.io/serviceaccount/namespace) && test -s /var/run/secrets/kubernetes.io/serviceaccount/token && echo token",
        ],
    );
    assert!(ok, "kubectl exec: {err}");
    assert_eq!(out, "kept\nreal\ntoken\n");

    // The CRI's own view (crictl, as the kubelet sees the runtime): the container runs.
    let (layout, _) = cluster.real_node()?;
    let ps = node::crictl(
        &layout,
        &["ps", "--name", "web", "--state", "running", "-q"],
    )?;
    assert_eq!(
        ps.lines().count(),
        1,
        "one running container named web: {ps}"
    );

    // agnhost, the conformance suite's image, run as the suite runs it: the image's
    // entrypoint with a subcommand as arguments.
    let agnhost = format!("{}:{}", images::AGNHOST_REPOSITORY, images::agnhost_tag()?);
    pods.create(
        &PostParams::default(),
        &on_node(
            "agnhost",
            serde_json::json!({}),
            serde_json::json!({"name": "c", "image": agnhost, "args": ["netexec", "--http-port=8081"]}),
        )?,
    )
    .await?;
    let a = eventually("agnhost running", Duration::from_secs(60), || async {
        Ok(pods
            .get("agnhost")
            .await
            .ok()
            .filter(vcp_dev::testing::running))
    })
    .await?;
    let aip = a.status.and_then(|s| s.pod_ip).expect("pod IP");
    let hostname = eventually("agnhost answering", Duration::from_secs(30), || async {
        Ok(reqwest::get(format!("http://{aip}:8081/hostname"))
            .await
            .ok()
            .map(|r| r.text()))
    })
    .await?
    .await?;
    assert_eq!(hostname, "agnhost");

    // An image nobody built fails to pull at once, named in the container's state with how
    // images come to the node.
    pods.create(
        &PostParams::default(),
        &pod("missing", "vcp.dev/never-built:1", "true")?,
    )
    .await?;
    let waiting = pull_failure(&pods, "missing").await?;
    let message = waiting.message.as_deref().unwrap_or_default();
    assert!(
        message.contains("vcp.dev/never-built:1 is not on this node")
            && message.contains("vcp-dev images --state-dir"),
        "{waiting:?}"
    );

    // Stopping the cluster stops the node and everything it ran, and removes its network.
    let netns = cluster.real_node()?.1.netns();
    assert!(std::path::Path::new("/run/netns").join(&netns).exists());
    cluster.stop();
    assert!(
        !std::path::Path::new("/run/netns").join(&netns).exists(),
        "{netns} removed"
    );
    let node_dir = dir.path().join("node").to_string_lossy().into_owned();
    let left: Vec<String> = std::fs::read_dir("/proc")?
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(&node_dir))
        .collect();
    assert!(left.is_empty(), "node processes left: {left:?}");
    Ok(())
}

/// One HTTP request from host pod `ns/pod` to `target`: whether it was answered.
fn fetch(cluster: &DevCluster, ns: &str, pod: &str, target: &str) -> bool {
    vcp_dev::testing::http_get_from_pod(cluster, cluster.kubeconfig_path(), ns, pod, target)
}

/// Counts the TCP connections accepted on `addr`, answering each with an empty 200. A thread
/// of its own: the test's runtime is blocked while `kubectl exec` runs.
fn listener(
    addr: std::net::IpAddr,
) -> anyhow::Result<(u16, std::sync::Arc<std::sync::atomic::AtomicUsize>)> {
    let l = std::net::TcpListener::bind((addr, 0))?;
    let port = l.local_addr()?.port();
    let n = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = n.clone();
    std::thread::spawn(move || {
        for mut s in l.incoming().flatten() {
            seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let _ = std::io::Write::write_all(&mut s, b"HTTP/1.0 200 OK\r\n\r\n");
        }
    });
    Ok((port, n))
}

#[tokio::test]
async fn network_policy_is_enforced_by_connection_and_pod_traffic_stays_on_the_node()
-> anyhow::Result<()> {
    let (dir, cluster) = real_node_cluster().await?;
    let client = cluster.client();
    namespace(&client, "np").await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "np");
    let spec = |name: &str, labels: serde_json::Value, command: &str| {
        on_node(
            name,
            labels,
            serde_json::json!({"name": "c", "image": images::BUSYBOX_IMAGE, "command": ["sh", "-c", command]}),
        )
    };
    let serve = "mkdir -p /www && echo ok > /www/index.html && exec httpd -f -p 8080 -h /www";
    for (name, labels, cmd) in [
        ("server", serde_json::json!({"app": "server"}), serve),
        (
            "friend",
            serde_json::json!({"role": "friend"}),
            "exec sleep 3600",
        ),
        ("stranger", serde_json::json!({}), "exec sleep 3600"),
    ] {
        pods.create(&PostParams::default(), &spec(name, labels, cmd)?)
            .await?;
    }
    let mut server_ip = String::new();
    for name in ["server", "friend", "stranger"] {
        let p = eventually(
            &format!("pod {name} running"),
            Duration::from_secs(90),
            || async { Ok(pods.get(name).await.ok().filter(vcp_dev::testing::running)) },
        )
        .await?;
        if name == "server" {
            server_ip = p.status.and_then(|s| s.pod_ip).expect("pod IP");
        }
    }
    let server = format!("{server_ip}:8080");
    let host_get = |url: String| async move {
        reqwest::Client::new()
            .get(url)
            .timeout(Duration::from_secs(2))
            .send()
            .await
            .is_ok()
    };
    // No policy selects the server: everyone reaches it.
    eventually("the server answering", Duration::from_secs(30), || async {
        Ok(fetch(&cluster, "np", "friend", &server).then_some(()))
    })
    .await?;
    assert!(fetch(&cluster, "np", "stranger", &server));
    assert!(host_get(format!("http://{server}/")).await);

    let policies: Api<k8s_openapi::api::networking::v1::NetworkPolicy> =
        Api::namespaced(client.clone(), "np");
    policies
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({
                "metadata": {"name": "only-friends"},
                "spec": {
                    "podSelector": {"matchLabels": {"app": "server"}},
                    "policyTypes": ["Ingress"],
                    "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "friend"}}}]}],
                },
            }))?,
        )
        .await?;
    eventually("the stranger refused", Duration::from_secs(30), || async {
        Ok((!fetch(&cluster, "np", "stranger", &server)).then_some(()))
    })
    .await?;
    assert!(
        fetch(&cluster, "np", "friend", &server),
        "the friend still gets in"
    );
    assert!(
        !host_get(format!("http://{server}/")).await,
        "nor does the host"
    );

    // Egress: the friend may now talk to nobody.
    policies
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({
                "metadata": {"name": "friend-silent"},
                "spec": {"podSelector": {"matchLabels": {"role": "friend"}}, "policyTypes": ["Egress"]},
            }))?,
        )
        .await?;
    eventually(
        "the friend's egress refused",
        Duration::from_secs(30),
        || async { Ok((!fetch(&cluster, "np", "friend", &server)).then_some(())) },
    )
    .await?;

    // Pod traffic leaves the bridge only for the host's end of the node's link. Give the node
    // a route to another address of this machine (the devnode's bridge: local, so even a
    // packet that got through would never leave the machine) and count what arrives.
    let (_, net) = cluster.real_node()?;
    let devnet =
        vcp_dev::devnet::recorded(&dir.path().join("devnode")).expect("the devnode's network");
    let elsewhere: std::net::IpAddr = [10, 245, devnet, 1].into();
    let (far_port, far_seen) = listener(elsewhere)?;
    let (near_port, near_seen) = listener(net.host_ip().into())?;
    let ip_netns = |args: &[&str]| {
        std::process::Command::new("ip")
            .args(["netns", "exec", &net.netns()])
            .args(args)
            .output()
            .expect("ip netns exec runs")
    };
    let added = ip_netns(&[
        "ip",
        "route",
        "add",
        &format!("{elsewhere}/32"),
        "via",
        &net.host_ip().to_string(),
    ]);
    assert!(
        added.status.success(),
        "{}",
        String::from_utf8_lossy(&added.stderr)
    );
    assert!(
        fetch(
            &cluster,
            "np",
            "stranger",
            &format!("{}:{near_port}", net.host_ip())
        ),
        "the host's end of the link is reachable"
    );
    assert_eq!(near_seen.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert!(!fetch(
        &cluster,
        "np",
        "stranger",
        &format!("{elsewhere}:{far_port}")
    ));
    assert_eq!(
        far_seen.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "nothing arrived elsewhere"
    );
    let rules = ip_netns(&[
        "iptables",
        "-w",
        "-t",
        "mangle",
        "-L",
        node::POD_OUT_CHAIN,
        "-v",
        "-x",
        "-n",
    ]);
    let rules = String::from_utf8_lossy(&rules.stdout);
    let dropped: u64 = rules
        .lines()
        .find(|l| l.contains("DROP"))
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    assert!(dropped > 0, "the node's rule dropped them:\n{rules}");
    Ok(())
}

#[tokio::test]
async fn the_control_plane_and_vcp_images_built_here_run_on_the_real_node() -> anyhow::Result<()> {
    let (_dir, cluster) = real_node_cluster().await?;
    let t0 = std::time::Instant::now();
    import_platform_images(&cluster)?;
    println!("imported the platform's images in {:?}", t0.elapsed());

    let client = cluster.client();
    namespace(&client, "imgs").await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "imgs");
    // What each image must hold: the templates' commands on PATH, or the Dockerfiles'
    // entrypoint, as the user the templates run it as.
    let k8s = vcp_dev::bins::host_kubernetes_version();
    // (pod, image, command (empty: the entrypoint with --version), user, expected output)
    type Case<'a> = (&'a str, String, Vec<&'a str>, Option<i64>, &'a str);
    let cases: Vec<Case> = vec![
        (
            "etcd",
            "registry.k8s.io/etcd:3.6.16-0".into(),
            vec!["etcdctl", "version"],
            None,
            "etcdctl version: 3.6.16",
        ),
        (
            "etcdutl",
            "registry.k8s.io/etcd:3.6.16-0".into(),
            vec!["etcdutl", "version"],
            None,
            "etcdutl version: 3.6.16",
        ),
        (
            "apiserver",
            format!("registry.k8s.io/kube-apiserver:{k8s}"),
            vec!["kube-apiserver", "--version"],
            Some(65532),
            k8s,
        ),
        (
            "kcm",
            format!("registry.k8s.io/kube-controller-manager:{k8s}"),
            vec!["kube-controller-manager", "--version"],
            None,
            k8s,
        ),
        (
            "coredns",
            "registry.k8s.io/coredns/coredns:v1.15.0".into(),
            vec!["coredns", "-version"],
            None,
            "CoreDNS-1.15.0",
        ),
        (
            "syncer",
            images::SYNCER_DEV_IMAGE.into(),
            vec![],
            Some(65532),
            "vcp-syncer",
        ),
        (
            "vcp",
            format!("ghcr.io/vcp-dev/vcp:{}", env!("CARGO_PKG_VERSION")),
            vec![],
            Some(65532),
            "vcp",
        ),
    ];
    for (name, image, command, user, _) in &cases {
        let mut c = serde_json::json!({
            "name": "c",
            "image": image,
            "imagePullPolicy": "IfNotPresent",
            "securityContext": {"readOnlyRootFilesystem": true, "allowPrivilegeEscalation": false},
        });
        if command.is_empty() {
            c["args"] = serde_json::json!(["--version"]);
        } else {
            c["command"] = serde_json::json!(command);
        }
        if let Some(uid) = user {
            c["securityContext"]["runAsNonRoot"] = true.into();
            c["securityContext"]["runAsUser"] = (*uid).into();
            c["securityContext"]["runAsGroup"] = (*uid).into();
        }
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {
                "restartPolicy": "Never",
                "nodeSelector": {node::NODE_LABEL.0: node::NODE_LABEL.1},
                "tolerations": [{"key": node::NODE_LABEL.0, "operator": "Exists"}],
                "containers": [c],
            },
        }))?;
        pods.create(&PostParams::default(), &pod).await?;
    }
    for (name, image, _, _, expect) in &cases {
        let phase = eventually(
            &format!("pod {name} to finish"),
            Duration::from_secs(120),
            || async {
                let p = pods.get(name).await?;
                Ok(p.status
                    .and_then(|s| s.phase)
                    .filter(|ph| ph == "Succeeded" || ph == "Failed"))
            },
        )
        .await?;
        let logs = pods.logs(name, &LogParams::default()).await?;
        assert_eq!(phase, "Succeeded", "{name} ({image}): {logs}");
        assert!(
            logs.contains(expect),
            "{name} ({image}) printed {logs:?}, not {expect:?}"
        );
    }
    Ok(())
}

/// Runs agnhost's `webhook` in tenant namespace `app`, registers it by URL at the pod's
/// address (`/always-deny`, for ConfigMaps labelled `own-hook`), and waits for a creation to
/// be denied with its message. Until the apiserver has taken the webhook in, creations pass;
/// until the pod listens, the syncer's proxy answers 502 for it.
async fn own_webhook_answers(tenant: &kube::Client, net: &node::NodeNet) -> anyhow::Result<()> {
    use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
    use k8s_openapi::api::core::v1::Secret;
    let now = time::OffsetDateTime::now_utc();
    let ca = vcp_pki::Ca::generate("own-hook-ca", now, time::Duration::hours(1))?;
    let range: Vec<std::net::IpAddr> = (1..=254)
        .map(|i| std::net::Ipv4Addr::new(10, 246, net.index, i).into())
        .collect();
    assert!(
        net.pod_cidr()
            .starts_with(&format!("10.246.{}.", net.index)),
        "the node's pod range moved: {}",
        net.pod_cidr()
    );
    let leaf = ca.issue(
        &vcp_pki::LeafSpec::server("own-hook", vec![], range),
        now,
        time::Duration::hours(1),
    )?;
    let secrets: Api<Secret> = Api::namespaced(tenant.clone(), "app");
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({
                "metadata": {"name": "own-hook-tls"},
                "type": "kubernetes.io/tls",
                "stringData": {"tls.crt": leaf.cert_pem, "tls.key": leaf.key_pem},
            }))?,
        )
        .await?;
    let agnhost = format!("{}:{}", images::AGNHOST_REPOSITORY, images::agnhost_tag()?);
    let pods: Api<Pod> = Api::namespaced(tenant.clone(), "app");
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(serde_json::json!({
            "metadata": {"name": "own-hook"},
            "spec": {
                "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "c", "image": agnhost, "args": [
                    "webhook", "--tls-cert-file=/tls/tls.crt",
                    "--tls-private-key-file=/tls/tls.key", "--port=8443",
                ], "volumeMounts": [{"name": "tls", "mountPath": "/tls", "readOnly": true}]}],
                "volumes": [{"name": "tls", "secret": {"secretName": "own-hook-tls"}}],
            },
        }))?,
    )
    .await?;
    let ip = eventually(
        "the webhook pod running",
        Duration::from_secs(120),
        || async {
            let p = pods.get("own-hook").await?;
            Ok(vcp_dev::testing::running(&p)
                .then(|| p.status.and_then(|s| s.pod_ip))
                .flatten())
        },
    )
    .await?;
    let hooks: Api<ValidatingWebhookConfiguration> = Api::all(tenant.clone());
    hooks
        .create(
            &PostParams::default(),
            &vcp_dev::testing::webhook_by_url(
                "own-hook",
                "own-hook.vcp.test",
                &format!("https://{ip}:8443/always-deny"),
                Some(&ca.cert_key().cert_pem),
                ("own-hook", "yes"),
            )?,
        )
        .await?;
    let cms: Api<ConfigMap> = Api::namespaced(tenant.clone(), "app");
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    let mut last = String::new();
    while std::time::Instant::now() < deadline {
        let cm: ConfigMap = serde_json::from_value(serde_json::json!({
            "metadata": {"generateName": "probe-", "labels": {"own-hook": "yes"}},
        }))?;
        match cms.create(&PostParams::default(), &cm).await {
            Err(e) if e.to_string().contains("this webhook denies all requests") => return Ok(()),
            Err(e) => last = e.to_string(),
            Ok(_) => last = "created: the webhook is not in force yet".into(),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    anyhow::bail!("the tenant's own webhook at {ip} never answered; last: {last}")
}

#[tokio::test]
async fn tenants_provisioned_by_vcp_run_on_the_real_node_reach_their_services_and_nothing_of_each_other()
-> anyhow::Result<()> {
    let (dir, cluster) = real_node_cluster().await?;
    import_platform_images(&cluster)?;
    let (_, net) = cluster.real_node()?;
    let platform = platform_on_node(&cluster, dir.path(), "realnode", "").await?;
    let t0 = std::time::Instant::now();
    platform.admin.create_tenant("demo").await?;
    platform
        .admin
        .wait_ready("demo", Duration::from_secs(300))
        .await?;
    println!("tenant demo Ready on the real node in {:?}", t0.elapsed());
    let kc = platform
        .admin
        .kubeconfig("demo", "alice", &["admin"], "1h")
        .await?;
    let kc_path = dir.path().join("demo.kubeconfig");
    std::fs::write(&kc_path, &kc)?;
    let tenant = client_of(&kc).await?;

    // Every control-plane pod of the tenant runs on the real node.
    let host_pods: Api<Pod> = Api::all(cluster.client());
    let cp_pods = host_pods.list(&Default::default()).await?;
    let ours: Vec<&Pod> = cp_pods
        .items
        .iter()
        .filter(|p| {
            p.metadata
                .namespace
                .as_deref()
                .is_some_and(|n| n.starts_with("vcp-"))
        })
        .collect();
    assert!(!ours.is_empty());
    for p in &ours {
        assert_eq!(
            p.spec.as_ref().and_then(|s| s.node_name.as_deref()),
            Some(node::NODE_NAME),
            "{:?}",
            p.metadata.name
        );
    }

    // A server and a client in the tenant: the client reaches the server's Service.
    namespace(&tenant, "app").await?;
    let pods: Api<Pod> = Api::namespaced(tenant.clone(), "app");
    let mk = |name: &str, labels: serde_json::Value, command: &str| -> anyhow::Result<Pod> {
        Ok(serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": labels},
            "spec": {
                "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "c", "image": images::BUSYBOX_IMAGE, "command": ["sh", "-c", command]}],
            },
        }))?)
    };
    pods.create(
        &PostParams::default(),
        &mk(
            "server",
            serde_json::json!({"app": "server"}),
            "echo serving from the real node; mkdir -p /www && echo tenant-ok > /www/index.html && exec httpd -f -p 8080 -h /www",
        )?,
    )
    .await?;
    // The client carries a readiness gate, as a pod behind a load balancer controller would.
    let gate = "example.com/registered";
    let mut client = mk("client", serde_json::json!({}), "exec sleep 3600")?;
    if let Some(spec) = client.spec.as_mut() {
        spec.readiness_gates = Some(vec![k8s_openapi::api::core::v1::PodReadinessGate {
            condition_type: gate.into(),
        }]);
    }
    pods.create(&PostParams::default(), &client).await?;
    let services: Api<k8s_openapi::api::core::v1::Service> = Api::namespaced(tenant.clone(), "app");
    services
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({
                "metadata": {"name": "server"},
                "spec": {"selector": {"app": "server"}, "ports": [{"port": 80, "targetPort": 8080}]},
            }))?,
        )
        .await?;
    for name in ["server", "client"] {
        eventually(
            &format!("tenant pod {name} running"),
            Duration::from_secs(120),
            || async { Ok(pods.get(name).await.ok().filter(vcp_dev::testing::running)) },
        )
        .await?;
    }
    // The real kubelet holds the client unready until its gate is met; the tenant's
    // controller meets it in the tenant, the syncer writes it to the host pod (with the host
    // rights vcp gives it), and the kubelet's `Ready` comes back up.
    let condition = |p: &Pod, t: &str| {
        vcp_dev::testing::condition(p, t)
            .map(|c| (c.status.clone(), c.reason.clone().unwrap_or_default()))
    };
    let held = eventually(
        "the client's containers ready",
        Duration::from_secs(60),
        || async {
            let p = pods.get("client").await?;
            Ok(
                (condition(&p, "ContainersReady").map(|c| c.0).as_deref() == Some("True"))
                    .then_some(p),
            )
        },
    )
    .await?;
    assert_eq!(
        condition(&held, "Ready"),
        Some(("False".into(), "ReadinessGatesNotReady".into())),
        "held by its gate"
    );
    pods.patch_status(
        "client",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Strategic(serde_json::json!({"status": {"conditions": [
            {"type": gate, "status": "True", "reason": "Registered"},
        ]}})),
    )
    .await?;
    eventually(
        "the client Ready through its gate",
        Duration::from_secs(60),
        || async { Ok(pods.get("client").await.ok().filter(ready)) },
    )
    .await?;
    let cluster_ip = services
        .get("server")
        .await?
        .spec
        .and_then(|s| s.cluster_ip)
        .expect("a ClusterIP");
    let (ok, out, err) = kubectl_with(
        &cluster,
        &kc_path,
        &[
            "-n",
            "app",
            "exec",
            "client",
            "--",
            "sh",
            "-c",
            &format!("printf 'GET / HTTP/1.0\\r\\n\\r\\n' | timeout 5 nc -w 2 {cluster_ip} 80"),
        ],
    );
    assert!(
        ok && out.contains("tenant-ok"),
        "by ClusterIP {cluster_ip}: {out} {err}"
    );

    // The tenant's apiserver reaches its pods through its egress proxy, the syncer's pod
    // (`pods/proxy`, as webhooks and aggregated APIs do): the host's NetworkPolicies let the
    // syncer in.
    let (ok, out, err) = kubectl_with(
        &cluster,
        &kc_path,
        &[
            "get",
            "--raw",
            "/api/v1/namespaces/app/pods/server:8080/proxy/",
        ],
    );
    assert!(ok && out.contains("tenant-ok"), "pods/proxy: {out} {err}");

    // A webhook by URL at one of the tenant's own pods, agnhost's `webhook` as the conformance
    // suite runs it: the tenant's apiserver dials it in its control-plane egress, through the
    // syncer's pod, and TLS runs end to end to the pod. Its certificate names every address of
    // the node's pod range, since the pod's own is known only once it runs.
    own_webhook_answers(&tenant, &net).await?;

    // By name, through the tenant's own CoreDNS (busybox's nslookup: its own resolver).
    let (ok, out, err) = kubectl_with(
        &cluster,
        &kc_path,
        &[
            "-n",
            "app",
            "exec",
            "client",
            "--",
            "nslookup",
            "server.app.svc.cluster.local",
        ],
    );
    assert!(
        ok && out.contains(&cluster_ip),
        "server.app by DNS: {out} {err}"
    );
    // Logs (as exec above) through the tenant's apiserver and syncer, from the real kubelet.
    let logs = pods.logs("server", &LogParams::default()).await?;
    assert!(logs.contains("serving from the real node"), "{logs}");
    // An image nobody built: the tenant sees the pull fail, naming the image, at once.
    pods.create(
        &PostParams::default(),
        &mk("unbuilt", serde_json::json!({}), "true").map(|mut p| {
            if let Some(spec) = p.spec.as_mut() {
                spec.containers[0].image = Some("vcp.dev/never-built:1".into());
            }
            p
        })?,
    )
    .await?;
    let waiting = pull_failure(&pods, "unbuilt").await?;
    assert!(
        waiting
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("vcp.dev/never-built:1 is not on this node"),
        "{waiting:?}"
    );
    // And as the pod's Warning event in the tenant, saying how images come to the node.
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(tenant.clone(), "app");
    let failed =
        vcp_dev::testing::event_about(&events, "unbuilt", "Failed", "vcp-dev images --state-dir")
            .await?;

    assert_eq!(failed.type_.as_deref(), Some("Warning"));

    // A second tenant, its data on the shared datastore (three members on the node): its pod
    // reaches nothing of the first, and neither reaches any etcd (demo's own, the datastore's
    // members) or the other's apiserver, DNS or syncer. Each probe is a TCP connection from a
    // pod.
    platform
        .admin
        .create_tenant_with_plan("other", "lean-shared")
        .await?;
    let other_t = platform
        .admin
        .wait_ready("other", Duration::from_secs(300))
        .await?;
    let demo_t = platform
        .admin
        .get_tenant("demo")
        .await?
        .expect("demo exists");
    let okc = platform
        .admin
        .kubeconfig("other", "bob", &["admin"], "1h")
        .await?;
    let okc_path = dir.path().join("other.kubeconfig");
    std::fs::write(&okc_path, &okc)?;
    let (ok, _, err) = kubectl_with(
        &cluster,
        &okc_path,
        &[
            "run",
            "intruder",
            &format!("--image={}", images::BUSYBOX_IMAGE),
            "--command",
            "--",
            "sleep",
            "3600",
        ],
    );
    assert!(ok, "{err}");
    let other = client_of(&okc).await?;
    let other_pods: Api<Pod> = Api::namespaced(other, "default");
    eventually("the intruder running", Duration::from_secs(120), || async {
        Ok(other_pods
            .get("intruder")
            .await
            .ok()
            .filter(vcp_dev::testing::running))
    })
    .await?;
    // The host address of a tenant's control-plane pod, by name prefix.
    let host = cluster.client();
    let cp_ip = |t: &serde_json::Value, component: &str| {
        let ns = format!("vcp-{}", t["key"].as_str().unwrap_or_default());
        let host = host.clone();
        let component = component.to_owned();
        async move {
            let list = Api::<Pod>::namespaced(host, &ns)
                .list(&Default::default())
                .await?;
            list.items
                .into_iter()
                .find(|p| {
                    p.metadata
                        .name
                        .as_deref()
                        .is_some_and(|n| n.starts_with(&component))
                })
                .and_then(|p| p.status?.pod_ip)
                .ok_or_else(|| anyhow::anyhow!("no {component} pod in {ns}"))
        }
    };
    // A member of the datastore `other` keeps its data on (its apiserver reaches it: `other`
    // is Ready and answers).
    let datastore_member = Api::<Pod>::namespaced(host.clone(), "vcp-datastore-shared-real")
        .get("etcd-0")
        .await?
        .status
        .and_then(|s| s.pod_ip)
        .expect("the member's address");
    let server_ip = pods
        .get("server")
        .await?
        .status
        .and_then(|s| s.pod_ip)
        .expect("server IP");
    let connects = |kc: &std::path::Path, ns: &str, pod: &str, ip: &str, port: u16| {
        let (_, out, _) = kubectl_with(
            &cluster,
            kc,
            &[
                "-n",
                ns,
                "exec",
                pod,
                "--",
                "sh",
                "-c",
                &format!(
                    "timeout 4 nc -w 2 {ip} {port} </dev/null >/dev/null 2>&1 && echo connected || echo refused"
                ),
            ],
        );
        out.trim() == "connected"
    };
    // (what, address, port, demo's client connects, other's pod connects): a tenant's pods
    // reach their own apiserver and DNS, as in any cluster, and nothing else of the control
    // planes or of each other.
    // A pod of the host's own, in a namespace no policy selects: the datastore's ingress
    // policy alone refuses it (the tenants' pods also have their namespaces' egress policies
    // in the way), while the host apiserver, which no policy guards, answers it.
    namespace(&host, "probe").await?;
    let probes: Api<Pod> = Api::namespaced(host.clone(), "probe");
    probes
        .create(
            &PostParams::default(),
            &on_node(
                "host-probe",
                serde_json::json!({}),
                serde_json::json!({"name": "c", "image": images::BUSYBOX_IMAGE,
                    "command": ["sleep", "3600"]}),
            )?,
        )
        .await?;
    eventually(
        "the host probe running",
        Duration::from_secs(90),
        || async {
            Ok(probes
                .get("host-probe")
                .await
                .ok()
                .filter(vcp_dev::testing::running))
        },
    )
    .await?;
    let host_kc = cluster.kubeconfig_path().to_path_buf();
    let host_api = net.host_ip().to_string();
    let from_host = [
        (datastore_member.as_str(), 2379, false),
        (host_api.as_str(), node::API_PORT, true),
    ]
    .map(|(ip, port, want)| {
        let got = connects(&host_kc, "probe", "host-probe", ip, port);
        assert_eq!(got, want, "a host pod to {ip}:{port}");
        format!("a host pod to {ip}:{port}: {got}")
    });
    println!("{}", from_host.join("\n"));

    let mut seen = Vec::new();
    for (what, ip, port, from_demo, from_other) in [
        ("demo's server pod", server_ip.clone(), 8080, true, false),
        (
            "demo's etcd",
            cp_ip(&demo_t, "etcd").await?,
            2379,
            false,
            false,
        ),
        (
            "the shared datastore other's data is on",
            datastore_member.clone(),
            2379,
            false,
            false,
        ),
        (
            "demo's apiserver",
            cp_ip(&demo_t, "kube-apiserver").await?,
            6443,
            true,
            false,
        ),
        (
            "other's apiserver",
            cp_ip(&other_t, "kube-apiserver").await?,
            6443,
            false,
            true,
        ),
        (
            "demo's CoreDNS",
            cp_ip(&demo_t, "coredns").await?,
            53,
            true,
            false,
        ),
        (
            "other's CoreDNS",
            cp_ip(&other_t, "coredns").await?,
            53,
            false,
            true,
        ),
        (
            "demo's syncer",
            cp_ip(&demo_t, "vcp-syncer").await?,
            10250,
            false,
            false,
        ),
        (
            "the host apiserver",
            net.host_ip().to_string(),
            node::API_PORT,
            false,
            false,
        ),
    ] {
        let d = connects(&kc_path, "app", "client", &ip, port);
        let o = connects(&okc_path, "default", "intruder", &ip, port);
        seen.push(format!("{what} {ip}:{port}: demo {d}, other {o}"));
        assert_eq!((d, o), (from_demo, from_other), "{}", seen.join("\n"));
    }
    println!("{}", seen.join("\n"));
    Ok(())
}

#[tokio::test]
async fn a_killed_node_comes_back_with_the_tenant_and_its_data() -> anyhow::Result<()> {
    let (dir, mut cluster) = real_node_cluster().await?;
    import_platform_images(&cluster)?;
    let platform = platform_on_node(&cluster, dir.path(), "restart", "").await?;
    platform.admin.create_tenant("keep").await?;
    let t = platform
        .admin
        .wait_ready("keep", Duration::from_secs(300))
        .await?;
    let kc = platform
        .admin
        .kubeconfig("keep", "alice", &["admin"], "1h")
        .await?;
    let tenant = client_of(&kc).await?;
    let cms: Api<ConfigMap> = Api::namespaced(tenant.clone(), "default");
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(serde_json::json!({
            "metadata": {"name": "kept"},
            "data": {"written": "before the node died"},
        }))?,
    )
    .await?;
    let ns = format!("vcp-{}", t["key"].as_str().unwrap_or_default());
    let host_pods: Api<Pod> = Api::namespaced(cluster.client(), &ns);
    let etcd_container = |p: Pod| {
        p.status
            .and_then(|s| s.container_statuses)
            .and_then(|c| c.into_iter().next())
            .and_then(|c| c.container_id)
    };
    let before = etcd_container(host_pods.get("etcd-0").await?).expect("a running etcd");

    let t0 = std::time::Instant::now();
    cluster.restart_real_node()?;
    // etcd runs again in a new container, on the data it had.
    let back = eventually(
        "etcd in a new container",
        Duration::from_secs(180),
        || async {
            let p = host_pods.get("etcd-0").await?;
            let ready = vcp_dev::testing::running(&p);
            Ok(etcd_container(p).filter(|c| ready && *c != before))
        },
    )
    .await;
    if let Err(e) = back {
        // What the kubelet says of the control plane, and the node's last log lines.
        for p in host_pods.list(&Default::default()).await?.items {
            eprintln!(
                "{}: {}",
                p.metadata.name.unwrap_or_default(),
                serde_json::to_string(&p.status).unwrap_or_default()
            );
        }
        let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(cluster.client(), &ns);
        for ev in events.list(&Default::default()).await?.items {
            eprintln!(
                "event {:?} {:?} {:?}: {:?}",
                ev.involved_object.name, ev.reason, ev.count, ev.message
            );
        }
        let (layout, _) = cluster.real_node()?;
        for log in ["node", "kubelet", "containerd"] {
            let text = std::fs::read_to_string(layout.dir.join(format!("logs/{log}.log")))
                .unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            for l in &lines[lines.len().saturating_sub(40)..] {
                eprintln!("{log}: {l}");
            }
        }
        return Err(e);
    }
    let kept = eventually(
        "the tenant's ConfigMap read back",
        Duration::from_secs(180),
        || async { Ok(cms.get("kept").await.ok()) },
    )
    .await?;
    assert_eq!(
        kept.data
            .unwrap_or_default()
            .get("written")
            .map(String::as_str),
        Some("before the node died")
    );
    platform
        .admin
        .wait_ready("keep", Duration::from_secs(180))
        .await?;
    println!(
        "the tenant answered again {:?} after the node was killed",
        t0.elapsed()
    );
    Ok(())
}

/// A TLS handshake with the gateway at `gateway` for server name `sni`, trusting only
/// `ca_pem`: `Ok` when it completed (the peer's certificate verified for `sni`), `Err` with
/// rustls' or the socket's error otherwise.
fn tls_handshake(gateway: SocketAddr, sni: &str, ca_pem: &str) -> anyhow::Result<()> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c?)?;
    }
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let mut conn =
        rustls::ClientConnection::new(std::sync::Arc::new(config), sni.to_owned().try_into()?)?;
    let mut sock = std::net::TcpStream::connect_timeout(&gateway, Duration::from_secs(5))?;
    sock.set_read_timeout(Some(Duration::from_secs(10)))?;
    while conn.is_handshaking() {
        conn.complete_io(&mut sock)?;
    }
    Ok(())
}

/// The CA of a kubeconfig (`certificate-authority-data`), as PEM.
fn kubeconfig_ca(kubeconfig: &str) -> anyhow::Result<String> {
    use base64::Engine;
    let v: serde_yaml::Value = serde_yaml::from_str(kubeconfig)?;
    let b64 = v["clusters"][0]["cluster"]["certificate-authority-data"]
        .as_str()
        .ok_or_else(|| anyhow::anyhow!("no certificate-authority-data"))?;
    Ok(String::from_utf8(
        base64::engine::general_purpose::STANDARD.decode(b64)?,
    )?)
}

/// Tenants behind the chart's gateway: kubectl for two tenants on the gateway's one port, each
/// seeing only its own objects; the tenant's own certificate verified end to end (the gateway
/// holds none: another tenant's CA does not verify it); an unknown name and a connection
/// without a server name closed at once, and the gateway's log naming the unknown one.
async fn through_the_gateway(
    cluster: &DevCluster,
    api: &vcp_dev::platform::ApiClient,
    first: &serde_json::Value,
    gateway: SocketAddr,
    dir: &std::path::Path,
) -> anyhow::Result<()> {
    use vcp_dev::chart;
    api.create_tenant("charted-b").await?;
    let second = api
        .wait_ready("charted-b", Duration::from_secs(300))
        .await?;
    let mut kubeconfigs = Vec::new();
    for (t, tag) in [(first, "a"), (&second, "b")] {
        let name = t["name"].as_str().unwrap_or_default();
        let key = t["key"].as_str().unwrap_or_default();
        let host = format!("{key}.{}", chart::GATEWAY_DOMAIN);
        assert_eq!(
            t["endpoint"].as_str(),
            Some(format!("https://{host}:{}", gateway.port()).as_str()),
            "the endpoint names the tenant under the gateway's domain"
        );
        let kc = api.kubeconfig(name, "alice", &["admin"], "1h").await?;
        let v: serde_yaml::Value = serde_yaml::from_str(&kc)?;
        let c = &v["clusters"][0]["cluster"];
        assert_eq!(
            c["server"].as_str(),
            Some(format!("https://{gateway}").as_str())
        );
        assert_eq!(c["tls-server-name"].as_str(), Some(host.as_str()));
        let path = dir.join(format!("gateway-{tag}.kubeconfig"));
        std::fs::write(&path, &kc)?;
        kubeconfigs.push((host, kc, path));
    }
    // kubectl, unmodified, for both tenants through the one port; each sees only its own.
    for (i, (_, _, path)) in kubeconfigs.iter().enumerate() {
        let name = format!("only-in-{i}");
        let (ok, _, err) = kubectl_with(cluster, path, &["create", "configmap", &name]);
        assert!(ok, "kubectl create through the gateway: {err}");
    }
    for (i, (_, _, path)) in kubeconfigs.iter().enumerate() {
        let (ok, out, err) = kubectl_with(cluster, path, &["get", "configmaps", "-o", "name"]);
        assert!(ok, "kubectl get through the gateway: {err}");
        assert!(out.contains(&format!("only-in-{i}")), "{out}");
        assert!(!out.contains(&format!("only-in-{}", 1 - i)), "{out}");
    }
    // The certificate is the tenant's own, end to end: its CA verifies it, the other tenant's
    // CA does not (the gateway presents nothing of its own).
    let (host_a, kc_a, _) = &kubeconfigs[0];
    let (host_b, kc_b, _) = &kubeconfigs[1];
    let (ca_a, ca_b) = (kubeconfig_ca(kc_a)?, kubeconfig_ca(kc_b)?);
    tls_handshake(gateway, host_a, &ca_a)?;
    tls_handshake(gateway, host_b, &ca_b)?;
    let crossed = tls_handshake(gateway, host_a, &ca_b);
    assert!(crossed.is_err(), "B's CA verified A's apiserver");
    // An unknown name and no name at all: closed at once (well within the handshake timeout).
    let unknown = format!("nosuchtenant1.{}", chart::GATEWAY_DOMAIN);
    for (what, sni) in [
        ("an unknown name", unknown.as_str()),
        ("an address", "10.0.0.1"),
    ] {
        let t = std::time::Instant::now();
        let r = tls_handshake(gateway, sni, &ca_a);
        assert!(r.is_err(), "{what} got a handshake");
        assert!(
            t.elapsed() < Duration::from_secs(3),
            "{what}: closed after {:?}",
            t.elapsed()
        );
    }
    // Asleep: no pod of its control plane, and one call through the gateway wakes it and
    // answers, with its objects there.
    api.raw(reqwest::Method::POST, "/v1/tenants/charted-b/sleep", None)
        .await?;
    let key_b = second["key"].as_str().unwrap_or_default().to_owned();
    let host = cluster.client();
    eventually(
        "charted-b asleep with no pod",
        Duration::from_secs(120),
        || async {
            let t = api.get_tenant("charted-b").await?.unwrap_or_default();
            let pods = Api::<Pod>::namespaced(host.clone(), &format!("vcp-{key_b}"))
                .list(&Default::default())
                .await?;
            Ok((t["phase"] == "Sleeping" && pods.items.is_empty()).then_some(()))
        },
    )
    .await?;
    let woke = std::time::Instant::now();
    let b = {
        let mut config = kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::from_yaml(kc_b)?,
            &kube::config::KubeConfigOptions::default(),
        )
        .await?;
        config.connect_timeout = Some(chart::WAKE_TIMEOUT);
        kube::Client::try_from(config)?
    };
    let cm = Api::<ConfigMap>::namespaced(b, "default")
        .get("only-in-1")
        .await?;
    assert_eq!(cm.metadata.name.as_deref(), Some("only-in-1"));
    println!(
        "a sleeping tenant answered its first call through the gateway in {:?}",
        woke.elapsed()
    );
    api.wait_ready("charted-b", Duration::from_secs(120))
        .await?;

    // The gateway says which name it refused.
    eventually(
        "the gateway's log naming the unknown tenant",
        Duration::from_secs(20),
        || async {
            let pods = Api::<Pod>::namespaced(host.clone(), chart::NAMESPACE)
                .list(
                    &kube::api::ListParams::default()
                        .labels(&chart::gateway_selector(chart::RELEASE)),
                )
                .await?;
            for p in pods.items {
                let name = p.metadata.name.unwrap_or_default();
                let log = Api::<Pod>::namespaced(host.clone(), chart::NAMESPACE)
                    .logs(&name, &LogParams::default())
                    .await?;
                if log.contains("nosuchtenant1") {
                    return Ok(Some(()));
                }
            }
            Ok(None)
        },
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn the_chart_runs_vcp_on_the_real_node_and_provisions_a_tenant_there() -> anyhow::Result<()> {
    use vcp_dev::chart;
    let (dir, cluster) = real_node_cluster().await?;
    import_platform_images(&cluster)?;
    let (_, net) = cluster.real_node()?;
    let t0 = std::time::Instant::now();
    let gateway_port = chart::free_node_port()?;
    chart::install(
        cluster.kubeconfig_path(),
        chart::RELEASE,
        chart::NAMESPACE,
        &chart::real_node_values(net.node_ip(), None, gateway_port),
        &dir.path().join("values.yaml"),
    )?;
    let host = cluster.client();
    chart::ready_pods(
        &host,
        dir.path(),
        chart::NAMESPACE,
        &chart::orchestrator_selector(chart::RELEASE),
        2,
        "vcp",
        Duration::from_secs(300),
    )
    .await?;
    println!(
        "two vcp replicas Ready on the real node in {:?}",
        t0.elapsed()
    );
    let full = chart::fullname(chart::RELEASE);
    let token = chart::secret_value(
        &host,
        chart::NAMESPACE,
        &format!("{full}-admin-token"),
        "token",
    )
    .await?;
    let port = chart::node_port(&host, chart::NAMESPACE, &full).await?;
    let api =
        vcp_dev::platform::ApiClient::new(&format!("http://{}:{port}", net.node_ip()), &token);
    eventually(
        "the API at the node's NodePort",
        Duration::from_secs(60),
        || async { Ok(api.ready().await.then_some(())) },
    )
    .await?;
    let pods = Api::<Pod>::namespaced(host.clone(), chart::NAMESPACE)
        .list(&Default::default())
        .await?;
    for p in &pods.items {
        assert_eq!(
            p.spec.as_ref().and_then(|s| s.node_name.as_deref()),
            Some(node::NODE_NAME),
            "{:?}",
            p.metadata.name
        );
    }
    api.create_tenant("charted").await?;
    let charted = api.wait_ready("charted", Duration::from_secs(300)).await?;
    println!(
        "tenant Ready through the chart's vcp {:?} after install",
        t0.elapsed()
    );
    chart::ready_pods(
        &host,
        dir.path(),
        chart::NAMESPACE,
        &chart::gateway_selector(chart::RELEASE),
        2,
        "vcp-gateway",
        Duration::from_secs(120),
    )
    .await?;
    through_the_gateway(
        &cluster,
        &api,
        &charted,
        SocketAddr::from((net.node_ip(), gateway_port)),
        dir.path(),
    )
    .await?;

    // A `helm upgrade` to a rebuilt vcp image rolls both replicas while a client polls the
    // API through the node's NodePort (kube-proxy) every 100 ms and another reads the
    // tenant's apiserver: neither may see a failed request.
    let mut rebuilt =
        images::vcp_images(&images::workspace_bin_dir()?, env!("CARGO_PKG_VERSION"))?.remove(0);
    rebuilt.reference = "vcp.dev/vcp:rebuilt".into();
    rebuilt.also.clear();
    rebuilt.entries.push(images::Entry::file(
        "etc/vcp-rebuilt",
        0o644,
        b"a different image\n".to_vec(),
    ));
    cluster.import_node_images(&[rebuilt])?;
    let kc = api.kubeconfig("charted", "alice", &["admin"], "1h").await?;
    let tenant = client_of(&kc).await?;
    let cms: Api<ConfigMap> = Api::namespaced(tenant, "default");
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(
            serde_json::json!({"metadata": {"name": "probe"}, "data": {"k": "v"}}),
        )?,
    )
    .await?;
    let tenant_poller = vcp_dev::testing::Poller::start(cms, "probe");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let url = format!("http://{}:{port}/v1/tenants/charted", net.node_ip());
    let api_poller = {
        let (stop, token) = (stop.clone(), token.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            rt.block_on(async move {
                let http = reqwest::Client::builder()
                    .timeout(Duration::from_secs(5))
                    .build()
                    .expect("a client");
                let (mut ok, mut failed) = (0u64, Vec::new());
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    match http.get(&url).bearer_auth(&token).send().await {
                        Ok(r) if r.status().is_success() => ok += 1,
                        Ok(r) => failed.push(format!("{}", r.status())),
                        Err(e) => failed.push(e.to_string()),
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                (ok, failed)
            })
        })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    let values = dir.path().join("values.yaml");
    let (kubeconfig, values_s) = (
        cluster.kubeconfig_path().to_owned(),
        values.to_string_lossy().into_owned(),
    );
    let chart_dir = chart::chart_dir().to_string_lossy().into_owned();
    let rolled = std::time::Instant::now();
    tokio::task::spawn_blocking(move || {
        chart::helm(
            &kubeconfig,
            &[
                "upgrade",
                chart::RELEASE,
                &chart_dir,
                "--namespace",
                chart::NAMESPACE,
                "-f",
                &values_s,
                "--set",
                "image.repository=vcp.dev/vcp",
                "--set",
                "image.tag=rebuilt",
                "--wait",
                "--timeout",
                "5m",
            ],
        )
    })
    .await??;
    let rolled = rolled.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (api_ok, api_failed) = api_poller.join().expect("the poller");
    let (tenant_ok, tenant_failed) = tenant_poller.finish().await?;
    println!(
        "helm upgrade to a rebuilt image: rolled in {rolled:?}; API {api_ok} answered, {} failed; tenant {tenant_ok} answered, {tenant_failed} failed",
        api_failed.len()
    );
    assert!(api_failed.is_empty(), "the API failed: {api_failed:?}");
    assert_eq!(tenant_failed, 0, "the tenant's apiserver failed");
    let running = Api::<Pod>::namespaced(host.clone(), chart::NAMESPACE)
        .list(
            &kube::api::ListParams::default().labels(&chart::orchestrator_selector(chart::RELEASE)),
        )
        .await?;
    assert!(
        running
            .items
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .all(|p| p
                .spec
                .as_ref()
                .is_some_and(|s| s.containers[0].image.as_deref() == Some("vcp.dev/vcp:rebuilt"))),
        "every replica runs the rebuilt image"
    );
    Ok(())
}

/// The plan of the egress and NodePort test: tenant pods may reach the first outside address
/// and only it, be reached from it, and hold one NodePort Service. (The real node's `default`
/// plan lets them reach everywhere, be reached from nowhere, and hold no NodePort Service.)
const EDGE_PLAN: &str = r#"edge:
  node_selector: {vcp.dev/node: real}
  tolerations: [{key: vcp.dev/node, operator: Equal, value: real, effect: NoSchedule}]
  policy:
    placement:
      node_selector: {vcp.dev/node: real}
      tolerations: [{key: vcp.dev/node, operator: Exists}]
    network:
      egress_cidrs: [198.51.100.0/24]
      ingress_cidrs: [198.51.100.0/24]
    services: {node_port_services: 1, node_ports: 1}
"#;

#[tokio::test]
async fn the_plans_egress_and_node_port_allowances_hold_by_traffic() -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::{Event, Service};
    use vcp_dev::outside::ADDRESSES;
    let (dir, cluster) = real_node_cluster().await?;
    import_platform_images(&cluster)?;
    let (_, net) = cluster.real_node()?;
    let outside = cluster.outside()?;
    let [allowed, other] = ADDRESSES;
    let allowed_srv = outside.serve(allowed, 8080)?;
    let other_srv = outside.serve(other, 8080)?;
    let platform = platform_on_node(&cluster, dir.path(), "edge", EDGE_PLAN).await?;
    platform
        .admin
        .create_tenant_with_plan("edge", "edge")
        .await?;
    platform.admin.create_tenant("plain").await?;
    // Each tenant: a web server behind a NodePort Service, and a client.
    let mut tenants = Vec::new();
    for name in ["edge", "plain"] {
        platform
            .admin
            .wait_ready(name, Duration::from_secs(300))
            .await?;
        let kc = platform
            .admin
            .kubeconfig(name, "alice", &["admin"], "1h")
            .await?;
        let kc_path = dir.path().join(format!("{name}.kubeconfig"));
        std::fs::write(&kc_path, &kc)?;
        let tenant = client_of(&kc).await?;
        namespace(&tenant, "app").await?;
        let pods: Api<Pod> = Api::namespaced(tenant.clone(), "app");
        for (pod, labels, command) in [
            (
                "server",
                serde_json::json!({"app": "server"}),
                format!(
                    "mkdir -p /www && echo {name}-ok > /www/index.html && exec httpd -f -p 8080 -h /www"
                ),
            ),
            (
                "client",
                serde_json::json!({}),
                "exec sleep 3600".to_owned(),
            ),
        ] {
            pods.create(
                &PostParams::default(),
                &serde_json::from_value(serde_json::json!({
                    "metadata": {"name": pod, "labels": labels},
                    "spec": {
                        "terminationGracePeriodSeconds": 1,
                        "containers": [{"name": "c", "image": images::BUSYBOX_IMAGE, "command": ["sh", "-c", command]}],
                    },
                }))?,
            )
            .await?;
        }
        tenants.push((name, kc_path, tenant, pods));
    }
    let mut client_ips = Vec::new();
    for (name, _, _, pods) in &tenants {
        for pod in ["server", "client"] {
            let p = eventually(
                &format!("{name}'s {pod} running"),
                Duration::from_secs(120),
                || async { Ok(pods.get(pod).await.ok().filter(vcp_dev::testing::running)) },
            )
            .await?;
            if pod == "client" {
                client_ips.push(p.status.and_then(|s| s.pod_ip).expect("pod IP"));
            }
        }
    }
    let connects = |kc: &std::path::Path, to: &str| {
        vcp_dev::testing::http_get_from_pod(&cluster, kc, "app", "client", to)
    };

    // Egress: edge's plan allows the first outside address only; plain's allows everywhere.
    let (edge_kc, plain_kc) = (&tenants[0].1, &tenants[1].1);
    let mut seen = Vec::new();
    for (tenant, kc, to, expect) in [
        ("edge", edge_kc, allowed, true),
        ("edge", edge_kc, other, false),
        ("plain", plain_kc, allowed, true),
        ("plain", plain_kc, other, true),
    ] {
        let got = connects(kc, &format!("{to}:8080"));
        seen.push(format!("{tenant} -> {to}: {got}"));
        assert_eq!(got, expect, "{}", seen.join("\n"));
    }
    println!("{}", seen.join("\n"));
    // Counted where they arrive: each from its pod's own address (no masquerade).
    assert_eq!(allowed_srv.peers(), client_ips);
    assert_eq!(other_srv.peers(), vec![client_ips[1].clone()]);

    // NodePort: edge's Service gets a port on the node, reached from the allowed outside
    // address only; plain's plan holds none, so its Service is served inside only.
    let svc = |port: Option<u16>| -> anyhow::Result<Service> {
        Ok(serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web"},
            "spec": {
                "type": "NodePort",
                "selector": {"app": "server"},
                "ports": [{"port": 80, "targetPort": 8080, "nodePort": port}],
            },
        }))?)
    };
    let edge_svcs: Api<Service> = Api::namespaced(tenants[0].2.clone(), "app");
    let created = edge_svcs
        .create(&PostParams::default(), &svc(None)?)
        .await?
        .spec
        .and_then(|s| s.ports?.into_iter().next()?.node_port)
        .and_then(|p| u16::try_from(p).ok())
        .expect("the tenant apiserver allocates a NodePort at once");
    let node_port = |port: u16| SocketAddr::from((net.node_ip(), port));
    // The tenant's apiserver allocates a port of its own at once; the host Service asks for
    // that one, so a client that read it from its create call finds the Service there (the
    // syncer would put the host's in its place had another tenant held it).
    let (edge_port, answer) = eventually(
        "edge's server through the host's NodePort",
        Duration::from_secs(60),
        || async {
            let port = edge_svcs
                .get("web")
                .await?
                .spec
                .and_then(|s| s.ports?.into_iter().next()?.node_port)
                .and_then(|p| u16::try_from(p).ok());
            Ok(port.and_then(|p| Some((p, outside.connect(allowed, node_port(p))?))))
        },
    )
    .await?;
    assert!(answer.contains("edge-ok"), "{answer}");
    assert_eq!(edge_port, created, "the host took the tenant's port");
    assert_eq!(
        outside.connect(other, node_port(edge_port)),
        None,
        "the rest of the outside is not let in"
    );
    // Another tenant's pod does not get in through the node either.
    assert!(!connects(plain_kc, &node_port(edge_port).to_string()));

    // plain asks for a port the host has not given anyone.
    let plain_port = if edge_port >= 32767 {
        30000
    } else {
        edge_port + 1
    };
    let plain_svcs: Api<Service> = Api::namespaced(tenants[1].2.clone(), "app");
    plain_svcs
        .create(&PostParams::default(), &svc(Some(plain_port))?)
        .await?;
    let events: Api<Event> = Api::namespaced(tenants[1].2.clone(), "app");
    let refusal = vcp_dev::testing::event_about(&events, "web", "PolicyRefused", "").await?;

    assert_eq!(refusal.type_.as_deref(), Some("Warning"));
    println!("plain's refusal: {:?}", refusal.message);
    // Served inside its cluster, and not on the node.
    let plain_ip = plain_svcs
        .get("web")
        .await?
        .spec
        .and_then(|s| s.cluster_ip)
        .expect("a ClusterIP");
    assert!(connects(plain_kc, &format!("{plain_ip}:80")));
    assert_eq!(outside.connect(allowed, node_port(plain_port)), None);
    Ok(())
}
