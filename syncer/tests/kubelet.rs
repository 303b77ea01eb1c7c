//! `kubectl logs`, `exec`, `attach`, `port-forward` and `cp` inside a tenant, through the
//! syncer's kubelet endpoint and the host apiserver to the dev cluster's kwok workers, with the
//! kubectl of the host's version; and who the endpoint lets in.
//!
//! kwok serves the workers' kubelet API from configuration (`vcp_dev::kwok`): known log files,
//! commands run on this machine, an echo behind every port. So what a test sees through the
//! tenant is exactly what the host serves.

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::Api;
use kube::{Client, ResourceExt};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use vcp_dev::DevCluster;
use vcp_dev::kwok;
use vcp_dev::tenant::TenantControlPlane;
use vcp_dev::testing::{eventually, namespace, running};

type Res<T = ()> = anyhow::Result<T>;

/// A pod on a kwok worker with the three containers kwok logs differently.
async fn web_pod(tenant: &Client, ns: &str) -> Res<Pod> {
    namespace(tenant, ns).await?;
    let sas: Api<k8s_openapi::api::core::v1::ServiceAccount> = Api::namespaced(tenant.clone(), ns);
    eventually(
        "the default service account",
        Duration::from_secs(30),
        || async { Ok(sas.get_opt("default").await?) },
    )
    .await?;
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web"},
        "spec": {"containers": [
            {"name": "app", "image": "registry.k8s.io/pause:3.10"},
            {"name": "side", "image": "registry.k8s.io/pause:3.10"},
            {"name": kwok::FOLLOW_CONTAINER, "image": "registry.k8s.io/pause:3.10"},
        ]},
    }))?;
    let pods: Api<Pod> = Api::namespaced(tenant.clone(), ns);
    pods.create(&Default::default(), &pod).await?;
    eventually(
        "the tenant pod running and bound",
        Duration::from_secs(120),
        || async {
            let p = pods.get("web").await?;
            let bound = p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some();
            Ok((running(&p) && bound).then_some(p))
        },
    )
    .await
}

/// A tenant `key` with its syncer on the shared cluster and [`web_pod`] running in `apps`.
async fn tenant_with_web(
    key: &str,
) -> Res<(
    &'static DevCluster,
    TenantControlPlane,
    vcp_dev::process::Spawned,
    Client,
)> {
    let cluster = DevCluster::shared().await?;
    let cp = TenantControlPlane::start(key).await?;
    let syncer = cp.start_syncer(cluster, &[])?;
    let tenant = cp.connect().await?;
    web_pod(&tenant, "apps").await?;
    Ok((cluster, cp, syncer, tenant))
}

/// kubectl of the host's version against `kubeconfig`.
fn kubectl(cluster: &DevCluster, kubeconfig: &Path) -> Command {
    let mut c = Command::new(cluster.kubectl());
    c.arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg("--request-timeout=60s");
    c
}

/// Runs `kubectl port-forward pod/web :8080` (`k` is kubectl with its flags), sends `line`
/// (newline-terminated) through the local port as a client and returns what comes back, up to
/// the first newline (kwok answers every port with an echo).
fn echo_through_port_forward(k: Command, line: &[u8]) -> Res<String> {
    first_line_through_port_forward(k, "pod/web", 8080, line)
}

/// Runs `kubectl port-forward <target> :<port>`, sends `line` through the local port as a
/// client and returns what comes back up to the first newline.
fn first_line_through_port_forward(
    mut k: Command,
    target: &str,
    port: u16,
    line: &[u8],
) -> Res<String> {
    let mut pf = k
        .args(["port-forward", target, &format!(":{port}")])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    // Kept open while the connection runs: kubectl writes a line per connection.
    let mut stdout = BufReader::new(pf.stdout.take().expect("piped"));
    let echoed = (|| -> Res<String> {
        let mut first = String::new();
        stdout.read_line(&mut first)?;
        let port: u16 = first
            .split("127.0.0.1:")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| anyhow::anyhow!("no local port in {first:?}"))?;
        let mut conn = std::net::TcpStream::connect(("127.0.0.1", port))?;
        conn.set_read_timeout(Some(Duration::from_secs(20)))?;
        conn.write_all(line)?;
        let mut buf = vec![0; 64];
        let mut got = Vec::new();
        while !got.ends_with(b"\n") {
            let n = conn.read(&mut buf)?;
            anyhow::ensure!(n > 0, "closed after {got:?}");
            got.extend_from_slice(&buf[..n]);
        }
        Ok(String::from_utf8(got)?)
    })();
    let _ = pf.kill();
    let _ = pf.wait();
    echoed
}

/// Runs `cmd` to its end: (exit code, stdout, stderr).
fn run(cmd: &mut Command) -> Res<(i32, String, String)> {
    let out = cmd.stdin(Stdio::null()).output()?;
    Ok((
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

/// Runs `cmd` and fails with its output unless it succeeds; its stdout.
fn ok(cmd: &mut Command) -> Res<String> {
    let (code, out, err) = run(cmd)?;
    anyhow::ensure!(code == 0, "{cmd:?} exited {code}: {out}{err}");
    Ok(out)
}

/// Reads lines of `r` on a thread until one contains `want`, for at most `timeout`.
fn read_until(
    r: impl Read + Send + 'static,
    want: Vec<String>,
    timeout: Duration,
) -> Res<Vec<String>> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let start = Instant::now();
    let mut seen = Vec::new();
    while !want
        .iter()
        .all(|w| seen.iter().any(|l: &String| l.contains(w.as_str())))
    {
        let left = timeout.saturating_sub(start.elapsed());
        match rx.recv_timeout(left) {
            Ok(line) => seen.push(line),
            Err(_) => anyhow::bail!("saw {seen:?}, not all of {want:?}"),
        }
    }
    Ok(seen)
}

#[tokio::test]
async fn logs_exec_attach_port_forward_and_cp_work_inside_a_tenant() -> Res {
    let (cluster, cp, _syncer, tenant) = tenant_with_web("e2ek").await?;
    let kc = cp.kubeconfig.clone();
    let k = || {
        let mut c = kubectl(cluster, &kc);
        c.args(["-n", "apps"]);
        c
    };

    // The virtual node names the syncer first (the address the tenant apiserver dials), then
    // the host node's internal address only (where NodePorts answer).
    let node = Api::<Node>::all(tenant.clone())
        .list(&Default::default())
        .await?;
    let status = node.items[0].status.clone().unwrap_or_default();
    let address = status.addresses.unwrap_or_default();
    anyhow::ensure!(
        address.first().is_some_and(|a| a.address == "localhost")
            && address[1..].iter().all(|a| a.type_ == "InternalIP"),
        "virtual node addresses: {address:?}"
    );

    // Logs: whole, tail, previous, another container.
    let lines = |s: &str| s.lines().map(str::to_owned).collect::<Vec<_>>();
    assert_eq!(
        lines(&ok(k().args(["logs", "web", "-c", "app"]))?),
        kwok::APP_LINES
    );
    assert_eq!(
        lines(&ok(k().args(["logs", "web", "-c", "app", "--tail=2"]))?),
        kwok::APP_LINES[3..]
    );
    assert_eq!(
        lines(&ok(k().args(["logs", "web", "-c", "app", "--previous"]))?),
        kwok::PREVIOUS_LINES
    );
    assert_eq!(
        lines(&ok(k().args(["logs", "web", "-c", "side"]))?),
        kwok::SIDE_LINES
    );

    // Follow: lines written after the stream opened arrive through it.
    let follow_log = kwok::follow_log(cluster.state_dir());
    let mut follow = k()
        .args([
            "logs",
            "-f",
            "web",
            "-c",
            kwok::FOLLOW_CONTAINER,
            "--tail=0",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let stdout = follow.stdout.take().expect("piped");
    let marks: Vec<String> = (0..3)
        .map(|i| format!("e2ek follow {i} {}", std::process::id()))
        .collect();
    let writer = {
        let (path, marks) = (follow_log.clone(), marks.clone());
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(2));
            for m in &marks {
                let _ = kwok::append_log(&path, m);
                std::thread::sleep(Duration::from_millis(200));
            }
        })
    };
    let seen = read_until(stdout, marks.clone(), Duration::from_secs(30));
    let _ = follow.kill();
    let _ = follow.wait();
    let _ = writer.join();
    seen?;

    // Exec: output, error and exit status of a command, as the host reports them for its own
    // pod (kwok reports any failing command as status 1; a kubelet gives its code).
    let failing = [
        "exec",
        "web",
        "-c",
        "app",
        "--",
        "sh",
        "-c",
        "echo out; echo err >&2; exit 3",
    ];
    let (code, out, err) = run(k().args(failing))?;
    let (host_code, host_out, _) = run(kubectl(cluster, cluster.kubeconfig_path())
        .args(["-n", "e2ek-apps"])
        .args(failing))?;
    assert_eq!(
        (code, out.as_str()),
        (host_code, host_out.as_str()),
        "stderr: {err}"
    );
    assert!(
        code != 0 && out == "out\n" && err.contains("err"),
        "{code} {out:?} {err:?}"
    );
    assert_eq!(
        ok(k().args([
            "exec",
            "web",
            "-c",
            "app",
            "--",
            "sh",
            "-c",
            "echo $((6*7))"
        ]))?,
        "42\n"
    );

    // An interactive session on a terminal, driven by a script through `script`'s pty.
    let session = format!(
        "{} --kubeconfig={} -n apps exec -it web -c app -- sh",
        cluster.kubectl().display(),
        kc.display()
    );
    let mut script = Command::new("script")
        .args(["-qfec", &session, "/dev/null"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let mut stdin = script.stdin.take().expect("piped");
    let stdout = script.stdout.take().expect("piped");
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(3));
        let _ = stdin.write_all(b"tty; echo answer $((6*7))\n");
        std::thread::sleep(Duration::from_secs(2));
        let _ = stdin.write_all(b"exit 0\n");
    });
    let seen = read_until(
        stdout,
        vec!["/dev/pts/".into(), "answer 42".into()],
        Duration::from_secs(40),
    );
    let _ = script.kill();
    let _ = script.wait();
    seen?;

    // Port-forward: a real client through it (kwok answers every port with an echo).
    let echoed = echo_through_port_forward(k(), b"ping through the tenant\n")?;
    assert_eq!(echoed, "ping through the tenant\n");

    // Stdin reaches the command (kwok never passes on its end, so the command reads what it
    // needs: `kubectl cp` into a kwok pod waits for an end of input that never comes, on the
    // host as through a tenant).
    let mut head = k()
        .args(["exec", "-i", "web", "-c", "app", "--", "head", "-c", "5"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    head.stdin
        .take()
        .expect("piped")
        .write_all(b"hello world")?;
    let out = head.wait_with_output()?;
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello", "{out:?}");

    // cp out of the pod (kubectl runs tar through exec; kwok runs it on this machine).
    let dir = tempfile::tempdir()?;
    let remote = dir.path().join("in-pod");
    std::fs::create_dir(&remote)?;
    std::fs::write(remote.join("dst.txt"), "copied out of the pod\n")?;
    let source = format!("apps/web:{}", remote.join("dst.txt").display());
    let back = dir.path().join("back.txt");
    ok(kubectl(cluster, &kc).args(["cp", "-c", "app", &source, &back.display().to_string()]))?;
    assert_eq!(std::fs::read_to_string(&back)?, "copied out of the pod\n");

    // Attach: what the container writes from now on.
    let mut attach = k()
        .args(["attach", "web", "-c", kwok::FOLLOW_CONTAINER])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let stdout = attach.stdout.take().expect("piped");
    let mark = format!("e2ek attached {}", std::process::id());
    let writer = {
        let (path, mark) = (follow_log.clone(), mark.clone());
        std::thread::spawn(move || {
            for _ in 0..10 {
                std::thread::sleep(Duration::from_secs(2));
                let _ = kwok::append_log(&path, &mark);
            }
        })
    };
    let seen = read_until(stdout, vec![mark], Duration::from_secs(30));
    let _ = attach.kill();
    let _ = attach.wait();
    let _ = writer.join();
    seen?;
    Ok(())
}

/// The kubectl of every supported minor, over both of its streaming protocols (WebSocket, its
/// default, and SPDY, which it falls back to), reads logs, execs and forwards a port through
/// the tenant.
#[tokio::test]
async fn kubectl_of_every_supported_minor_over_websocket_and_spdy_works_through_a_tenant() -> Res {
    let (_cluster, cp, _syncer, _tenant) = tenant_with_web("e2ekv").await?;
    for version in vcp_dev::bins::supported_kubernetes_versions() {
        let bin = vcp_dev::bins::binary("kubectl", version)?;
        for websockets in ["true", "false"] {
            let what = format!("kubectl {version} websockets={websockets}");
            let k = || {
                let mut c = Command::new(&bin);
                c.arg(format!("--kubeconfig={}", cp.kubeconfig.display()))
                    .args(["--request-timeout=60s", "-n", "apps"])
                    .env("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", websockets)
                    .env("KUBECTL_PORT_FORWARD_WEBSOCKETS", websockets);
                c
            };
            let logs = ok(k().args(["logs", "web", "-c", "app", "--tail=1"]))?;
            assert_eq!(logs.trim_end(), kwok::APP_LINES[4], "{what}");
            let out = ok(k().args([
                "exec",
                "web",
                "-c",
                "app",
                "--",
                "sh",
                "-c",
                "echo $((6*7))",
            ]))?;
            assert_eq!(out, "42\n", "{what}");
            assert_eq!(
                echo_through_port_forward(k(), b"ping\n")?,
                "ping\n",
                "{what}"
            );
        }
    }
    Ok(())
}

/// `curl` against a kubelet endpoint on the loopback: (HTTP status, body), or `None` when the
/// TLS handshake is refused.
fn curl(
    port: u16,
    path: &str,
    ca: &Path,
    client: Option<(&Path, &Path)>,
) -> Res<Option<(u16, String)>> {
    let mut c = Command::new("curl");
    c.args([
        "-sS",
        "--max-time",
        "20",
        "-w",
        "\n%{http_code}",
        "--cacert",
    ])
    .arg(ca);
    if let Some((cert, key)) = client {
        c.arg("--cert").arg(cert).arg("--key").arg(key);
    }
    c.arg(format!("https://localhost:{port}{path}"));
    let out = c.output()?;
    if !out.status.success() {
        // 35/56/58: handshake failed or the peer closed it for want of a certificate.
        return Ok(None);
    }
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    Ok(Some((code.trim().parse()?, body.to_owned())))
}

/// The port a tenant's virtual nodes give for its kubelet endpoint.
async fn endpoint_port(tenant: &Client) -> Res<u16> {
    let nodes = Api::<Node>::all(tenant.clone())
        .list(&Default::default())
        .await?;
    let port = nodes.items[0]
        .status
        .as_ref()
        .and_then(|s| s.daemon_endpoints.as_ref())
        .and_then(|d| d.kubelet_endpoint.as_ref())
        .map(|k| k.port)
        .ok_or_else(|| anyhow::anyhow!("no kubelet port on {}", nodes.items[0].name_any()))?;
    Ok(u16::try_from(port)?)
}

/// Two tenants on the shared cluster, each with its syncer running and a client.
async fn two_tenants(
    a: &str,
    b: &str,
) -> Res<(
    &'static DevCluster,
    [(TenantControlPlane, vcp_dev::process::Spawned, Client); 2],
)> {
    let cluster = DevCluster::shared().await?;
    let (a, b) = tokio::try_join!(TenantControlPlane::start(a), TenantControlPlane::start(b))?;
    let (sa, sb) = (a.start_syncer(cluster, &[])?, b.start_syncer(cluster, &[])?);
    let (ta, tb) = (a.connect().await?, b.connect().await?);
    Ok((cluster, [(a, sa, ta), (b, sb, tb)]))
}

#[tokio::test]
async fn the_kubelet_endpoint_admits_only_its_apiserver_and_reaches_only_its_tenants_pods() -> Res {
    let (_cluster, [(a, _sa, ta), (b, _sb, tb)]) = two_tenants("e2eka", "e2ekb").await?;
    tokio::try_join!(web_pod(&ta, "apps"), web_pod(&tb, "private"))?;
    let port = endpoint_port(&ta).await?;
    let ca = a.pki_file("ca.crt");
    let own = (
        a.pki_file("kubelet-client.crt"),
        a.pki_file("kubelet-client.key"),
    );
    let own = Some((own.0.as_path(), own.1.as_path()));

    // The tenant apiserver's own certificate reaches its own pod's logs.
    let got = curl(port, "/containerLogs/apps/web/side", &ca, own)?;
    let (code, body) = got.ok_or_else(|| anyhow::anyhow!("handshake refused"))?;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains(kwok::SIDE_LINES[0]), "{body}");

    // No certificate, or one of another CA: refused at the handshake.
    assert_eq!(curl(port, "/containerLogs/apps/web/side", &ca, None)?, None);
    let (bc, bk) = (
        b.pki_file("kubelet-client.crt"),
        b.pki_file("kubelet-client.key"),
    );
    assert_eq!(
        curl(port, "/containerLogs/apps/web/side", &ca, Some((&bc, &bk)))?,
        None,
        "tenant B's apiserver certificate at tenant A's endpoint"
    );
    // A certificate of the tenant CA under another name (the tenant admin's): 403.
    let (ac, ak) = (a.pki_file("admin.crt"), a.pki_file("admin.key"));
    let (code, _) = curl(port, "/containerLogs/apps/web/side", &ca, Some((&ac, &ak)))?
        .ok_or_else(|| anyhow::anyhow!("handshake refused"))?;
    assert_eq!(code, 403);

    // Tenant B's pod, by its tenant namespace or by its host namespace: not A's to reach.
    for path in [
        "/containerLogs/private/web/side",
        "/containerLogs/e2ekb-private/web/side",
        "/exec/e2ekb-private/web/app?command=id&output=1",
    ] {
        let (code, body) =
            curl(port, path, &ca, own)?.ok_or_else(|| anyhow::anyhow!("handshake refused"))?;
        assert_eq!(code, 404, "{path}: {body}");
    }
    // Nothing but the four calls: no node-wide kubelet API.
    for path in [
        "/pods",
        "/run/apps/web/app",
        "/stats/summary",
        "/configz",
        "/../../api/v1/pods",
    ] {
        let (code, _) =
            curl(port, path, &ca, own)?.ok_or_else(|| anyhow::anyhow!("handshake refused"))?;
        assert!(code == 404 || code == 400, "{path}: {code}");
    }
    Ok(())
}

/// A kubeconfig for the dev host that impersonates `user`, who holds what a deployed syncer
/// holds: nothing namespaced cluster-wide, pods only in the host namespaces named (where a
/// deployed syncer binds its role).
async fn syncer_rights(
    cluster: &DevCluster,
    user: &str,
    own: &[&str],
    dir: &Path,
) -> Res<std::path::PathBuf> {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, RoleBinding};
    let host = cluster.connect().await?;
    let pp = kube::api::PostParams::default();
    // RBAC cannot subtract: the core kinds but pods are named, the other groups are whole.
    let core = [
        "namespaces",
        "configmaps",
        "secrets",
        "services",
        "endpoints",
        "events",
        "serviceaccounts",
        "serviceaccounts/token",
        "persistentvolumeclaims",
        "persistentvolumes",
        "nodes",
        "resourcequotas",
        "limitranges",
    ];
    let role: ClusterRole = serde_json::from_value(serde_json::json!({
        "metadata": {"name": user},
        "rules": [
            {"apiGroups": [""], "resources": core, "verbs": ["*"]},
            {"apiGroups": ["discovery.k8s.io", "networking.k8s.io", "storage.k8s.io",
                "rbac.authorization.k8s.io", "events.k8s.io", "coordination.k8s.io",
                "admissionregistration.k8s.io", "metrics.k8s.io"], "resources": ["*"], "verbs": ["*"]},
        ],
    }))?;
    Api::<ClusterRole>::all(host.clone())
        .create(&pp, &role)
        .await?;
    let subject = serde_json::json!([{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]);
    let binding: ClusterRoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": {"name": user},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": user},
        "subjects": subject,
    }))?;
    Api::<ClusterRoleBinding>::all(host.clone())
        .create(&pp, &binding)
        .await?;
    for ns in own {
        let binding: RoleBinding = serde_json::from_value(serde_json::json!({
            "metadata": {"name": user},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "admin"},
            "subjects": subject,
        }))?;
        Api::<RoleBinding>::namespaced(host.clone(), ns)
            .create(&pp, &binding)
            .await?;
    }
    let mut kubeconfig = kube::config::Kubeconfig::read_from(cluster.kubeconfig_path())?;
    for u in &mut kubeconfig.auth_infos {
        if let Some(info) = u.auth_info.as_mut() {
            info.impersonate = Some(user.into());
        }
    }
    let path = dir.join(format!("{user}.kubeconfig"));
    std::fs::write(&path, serde_yaml::to_string(&kubeconfig)?)?;
    Ok(path)
}

#[tokio::test]
async fn a_namespace_outside_the_tenant_is_not_found_with_a_deployed_syncers_host_rights() -> Res {
    let (cluster, cp, syncer, _tenant) = tenant_with_web("e2ekn").await?;
    drop(syncer);
    let dir = tempfile::tempdir()?;
    let rights = syncer_rights(cluster, "e2ekn-syncer", &["e2ekn-apps"], dir.path()).await?;
    let _syncer = cp.start_syncer_as(&rights, &vcp_dev::tenant::syncer_binary()?, &[])?;
    let tenant = cp.connect().await?;
    let ca = cp.pki_file("ca.crt");
    let own = (
        cp.pki_file("kubelet-client.crt"),
        cp.pki_file("kubelet-client.key"),
    );
    let own = Some((own.0.as_path(), own.1.as_path()));
    // The restarted syncer's endpoint (a new port, published on its virtual nodes) reaches its
    // own pod.
    let port = eventually(
        "the restarted syncer's endpoint serving the tenant's pod",
        Duration::from_secs(60),
        || async {
            let port = endpoint_port(&tenant).await?;
            let got = curl(port, "/containerLogs/apps/web/side", &ca, own)?;
            Ok(got.filter(|(code, _)| *code == 200).map(|_| port))
        },
    )
    .await?;
    // Names in host namespaces the syncer may not read (another tenant's, or none at all):
    // no such pod, as the docs say, not a host failure.
    for path in [
        "/containerLogs/private/web/side",
        "/containerLogs/e2ekb-private/web/side",
        "/exec/other/web/app?command=id&output=1",
        "/portForward/other/web",
    ] {
        let (code, body) =
            curl(port, path, &ca, own)?.ok_or_else(|| anyhow::anyhow!("handshake refused"))?;
        assert_eq!(code, 404, "{path}: {body}");
    }
    Ok(())
}

#[tokio::test]
async fn streams_broken_by_a_syncer_restart_end_with_a_clear_error_and_the_next_ones_work() -> Res {
    let (cluster, cp, syncer, _tenant) = tenant_with_web("e2ekr").await?;
    let kc = cp.kubeconfig.clone();
    let mut follow = kubectl(cluster, &kc)
        .args([
            "-n",
            "apps",
            "logs",
            "-f",
            "web",
            "-c",
            kwok::FOLLOW_CONTAINER,
            "--tail=1",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let mut follow_out = BufReader::new(follow.stdout.take().expect("piped"));
    let mut first = String::new();
    follow_out.read_line(&mut first)?;
    anyhow::ensure!(!first.is_empty(), "the log stream opened");
    // Exec sessions in the middle of a command, one over WebSocket (which the tenant apiserver
    // turns into SPDY towards the endpoint) and one over SPDY throughout.
    let exec = |websockets: &str| -> Res<std::process::Child> {
        let mut session = kubectl(cluster, &kc)
            .env("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", websockets)
            .args([
                "-n",
                "apps",
                "exec",
                "web",
                "-c",
                "app",
                "--",
                "sh",
                "-c",
                "echo started; sleep 300",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let mut out = BufReader::new(session.stdout.take().expect("piped"));
        let mut started = String::new();
        out.read_line(&mut started)?;
        anyhow::ensure!(
            started == "started\n",
            "the exec session opened: {started:?}"
        );
        Ok(session)
    };
    let mut sessions = [("websocket", exec("true")?), ("spdy", exec("false")?)];
    // A port-forward whose connection to the endpoint is open (kubectl opens it at start and
    // prints the local port then).
    let mut forward = kubectl(cluster, &kc)
        .args(["-n", "apps", "port-forward", "pod/web", ":8080"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let mut forward_out = BufReader::new(forward.stdout.take().expect("piped"));
    let mut forwarding = String::new();
    forward_out.read_line(&mut forwarding)?;
    anyhow::ensure!(
        forwarding.contains("Forwarding from 127.0.0.1:"),
        "port-forward started: {forwarding:?}"
    );
    drop(syncer);

    // None hangs, and kubectl reconnects none (it has no reconnect for these). Each ends with a
    // clear error: exec with the status the stopping syncer wrote on its error stream, the log
    // stream with a last line saying why, port-forward with kubectl's own "lost connection".
    let ended = |child: &mut std::process::Child, what: &str| -> Res<(bool, String)> {
        let start = Instant::now();
        let status = loop {
            if let Some(s) = child.try_wait()? {
                break s;
            }
            if start.elapsed() > Duration::from_secs(60) {
                let _ = child.kill();
                anyhow::bail!("{what} still running 60 s after the syncer stopped");
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        let mut err = String::new();
        child
            .stderr
            .take()
            .expect("piped")
            .read_to_string(&mut err)?;
        println!(
            "{what} after the syncer stopped: success={}, stderr={err:?}",
            status.success()
        );
        Ok((status.success(), err))
    };
    for (protocol, session) in &mut sessions {
        let (ok_exec, err_exec) = ended(session, &format!("kubectl exec over {protocol}"))?;
        assert!(
            !ok_exec && err_exec.contains(vcp_syncer::kubelet::STOP_STATUS),
            "exec over {protocol} fails saying why: {err_exec:?}"
        );
    }
    let (ok_forward, err_forward) = ended(&mut forward, "kubectl port-forward")?;
    assert!(
        !ok_forward && err_forward.contains("lost connection"),
        "port-forward fails saying why: {err_forward:?}"
    );
    let (_, _) = ended(&mut follow, "kubectl logs -f")?;
    // A stopping syncer (SIGTERM, as in a rollout) says why the log ended.
    let mut rest = String::new();
    follow_out.read_to_string(&mut rest)?;
    assert!(
        rest.trim_end()
            .ends_with(vcp_syncer::kubelet::STOP_NOTE.trim()),
        "the log stream's end: {rest:?}"
    );

    let _syncer = cp.start_syncer(cluster, &[])?;
    eventually(
        "logs through the restarted syncer",
        Duration::from_secs(60),
        || async {
            let (code, out, _) =
                run(kubectl(cluster, &kc).args(["-n", "apps", "logs", "web", "-c", "side"]))?;
            Ok((code == 0 && out.contains(kwok::SIDE_LINES[0])).then_some(()))
        },
    )
    .await?;
    Ok(())
}

/// Pods of `ns` whose containers kwok simulates as busy or idle: `busy` (containers `busy` and
/// `app`) and `idle` (labelled `tier=back`, container `app`).
async fn pods_with_usage(tenant: &Client, ns: &str) -> Res {
    namespace(tenant, ns).await?;
    let sas: Api<k8s_openapi::api::core::v1::ServiceAccount> = Api::namespaced(tenant.clone(), ns);
    eventually(
        "the default service account",
        Duration::from_secs(30),
        || async { Ok(sas.get_opt("default").await?) },
    )
    .await?;
    let pods: Api<Pod> = Api::namespaced(tenant.clone(), ns);
    for (name, labels, containers) in [
        (
            "busy",
            serde_json::json!({"tier": "front"}),
            vec![kwok::BUSY_CONTAINER, "app"],
        ),
        ("idle", serde_json::json!({"tier": "back"}), vec!["app"]),
    ] {
        let containers: Vec<_> = containers
            .iter()
            .map(|c| serde_json::json!({"name": c, "image": "registry.k8s.io/pause:3.10"}))
            .collect();
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": labels},
            "spec": {"containers": containers},
        }))?;
        pods.create(&Default::default(), &pod).await?;
    }
    Ok(())
}

/// Rows of `kubectl top` output (header dropped), split on whitespace.
fn rows(out: &str) -> Vec<Vec<String>> {
    out.lines()
        .skip(1)
        .map(|l| l.split_whitespace().map(str::to_owned).collect())
        .collect()
}

/// Millicores of a `kubectl top` CPU column (`252m`, `1`).
fn millicores(s: &str) -> Res<i64> {
    Ok(match s.strip_suffix('m') {
        Some(m) => m.parse()?,
        None => s.parse::<i64>()? * 1000,
    })
}

#[tokio::test]
async fn kubectl_top_shows_a_tenants_own_pods_and_nodes_from_the_hosts_metrics() -> Res {
    let (cluster, [(a, _sa, ta), (b, _sb, tb)]) = two_tenants("e2ekt", "e2eku").await?;
    // The same namespace and pod names in both tenants.
    tokio::try_join!(pods_with_usage(&ta, "apps"), pods_with_usage(&tb, "apps"))?;
    let k = || kubectl(cluster, &a.kubeconfig);
    let (busy_cpu, busy_mem) = kwok::BUSY_USAGE;
    let (idle_cpu, _) = kwok::IDLE_USAGE;
    let (busy_m, idle_m) = (millicores(busy_cpu)?, millicores(idle_cpu)?);

    // metrics-server needs two scrapes of a pod before it has a rate.
    let containers = eventually(
        "kubectl top of both pods' containers in the tenant",
        Duration::from_secs(120),
        || async {
            let (code, out, _) = run(k().args(["top", "pods", "-n", "apps", "--containers"]))?;
            let r = rows(&out);
            Ok((code == 0 && r.len() == 3).then_some(r))
        },
    )
    .await?;
    let find = |pod: &str, c: &str| {
        containers
            .iter()
            .find(|r| r[0] == pod && r[1] == c)
            .cloned()
            .ok_or_else(|| anyhow::anyhow!("no {pod}/{c} in {containers:?}"))
    };
    let busy = find("busy", kwok::BUSY_CONTAINER)?;
    assert!((millicores(&busy[2])? - busy_m).abs() <= 3, "{busy:?}");
    assert_eq!(busy[3], busy_mem, "{busy:?}");
    let app = find("busy", "app")?;
    assert!((millicores(&app[2])? - idle_m).abs() <= 1, "{app:?}");
    find("idle", "app")?;

    // One pod by name, by label, and every namespace: this tenant's pods only (tenant B has
    // the same names, and the host namespace of A's `apps` is not a tenant namespace).
    let one = ok(k().args(["top", "pod", "busy", "-n", "apps"]))?;
    let one = rows(&one);
    assert_eq!(one.len(), 1, "{one:?}");
    assert!(
        (millicores(&one[0][1])? - (busy_m + idle_m)).abs() <= 4,
        "{one:?}"
    );
    let back = rows(&ok(k().args([
        "top",
        "pods",
        "-n",
        "apps",
        "-l",
        "tier=back",
    ]))?);
    assert_eq!(
        back.iter().map(|r| r[0].as_str()).collect::<Vec<_>>(),
        ["idle"]
    );
    let all = rows(&ok(k().args(["top", "pods", "-A"]))?);
    assert_eq!(all.len(), 2, "only tenant A's two pods: {all:?}");
    assert!(all.iter().all(|r| r[0] == "apps"), "{all:?}");
    let (code, _, err) = run(k().args(["top", "pod", "missing", "-n", "apps"]))?;
    assert_ne!(code, 0);
    assert!(
        err.contains("not found") || err.contains("not available"),
        "{err}"
    );

    // Nodes: the sum of tenant A's own pods on each virtual node, never the host node's
    // figure (which counts tenant B's busy pod and every other test's pods).
    let nodes = rows(&ok(k().args(["top", "nodes"]))?);
    anyhow::ensure!(!nodes.is_empty(), "no virtual node in kubectl top nodes");
    let sum: i64 = nodes.iter().map(|r| millicores(&r[1])).sum::<Res<i64>>()?;
    let want = busy_m + 2 * idle_m;
    assert!(
        (sum - want).abs() <= 6,
        "node sum {sum}m, pods {want}m: {nodes:?}"
    );
    let virtual_nodes: Vec<String> = Api::<Node>::all(ta.clone())
        .list(&Default::default())
        .await?
        .items
        .iter()
        .map(|n| n.name_any())
        .collect();
    assert!(
        nodes.iter().all(|r| virtual_nodes.contains(&r[0])),
        "{nodes:?} vs {virtual_nodes:?}"
    );

    // The objects carry the tenant's labels, not the host's markers.
    let raw: serde_json::Value = ta
        .request(
            http::Request::get("/apis/metrics.k8s.io/v1beta1/namespaces/apps/pods/busy")
                .body(Vec::new())?,
        )
        .await?;
    assert_eq!(raw["kind"], "PodMetrics");
    assert_eq!(
        raw["metadata"]["labels"],
        serde_json::json!({"tier": "front"})
    );

    // Tenant users read it as they read pods: `view` includes it.
    ok(k().args([
        "create",
        "clusterrolebinding",
        "jane-view",
        "--clusterrole=view",
        "--user=jane",
    ]))?;
    let can = eventually(
        "view to include pod metrics",
        Duration::from_secs(30),
        || async {
            let (_, out, _) =
                run(k().args(["auth", "can-i", "list", "pods.metrics.k8s.io", "--as=jane"]))?;
            Ok((out.trim() == "yes").then_some(()))
        },
    )
    .await;
    can?;

    // At the endpoint: the front-proxy client of A's apiserver only, and only for
    // metrics.k8s.io; the kubelet client may not read metrics.
    let port = endpoint_port(&ta).await?;
    let ca = a.pki_file("ca.crt");
    let pair = |cp: &TenantControlPlane, n: &str| {
        (
            cp.pki_file(&format!("{n}.crt")),
            cp.pki_file(&format!("{n}.key")),
        )
    };
    let path = "/apis/metrics.k8s.io/v1beta1/namespaces/apps/pods";
    let (fc, fk) = pair(&a, "front-proxy-client");
    let (code, body) = curl(port, path, &ca, Some((&fc, &fk)))?
        .ok_or_else(|| anyhow::anyhow!("handshake refused"))?;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("\"busy\""), "{body}");
    let (code, _) = curl(port, "/containerLogs/apps/busy/app", &ca, Some((&fc, &fk)))?
        .ok_or_else(|| anyhow::anyhow!("handshake refused"))?;
    assert_eq!(
        code, 403,
        "the front-proxy client may not make kubelet calls"
    );
    let (kc, kk) = pair(&a, "kubelet-client");
    let (code, _) = curl(port, path, &ca, Some((&kc, &kk)))?
        .ok_or_else(|| anyhow::anyhow!("handshake refused"))?;
    assert_eq!(code, 403, "the kubelet client may not read metrics");
    let (bc, bk) = pair(&b, "front-proxy-client");
    assert_eq!(
        curl(port, path, &ca, Some((&bc, &bk)))?,
        None,
        "tenant B's front-proxy client at tenant A's endpoint"
    );
    assert_eq!(curl(port, path, &ca, None)?, None);
    // Tenant B, by its tenant namespace name at its own endpoint, sees its own pods.
    let b_pods = rows(&ok(
        kubectl(cluster, &b.kubeconfig).args(["top", "pods", "-n", "apps"])
    )?);
    assert_eq!(b_pods.len(), 2, "{b_pods:?}");
    Ok(())
}

#[tokio::test]
async fn logs_port_forward_exec_cp_and_top_reach_a_tenant_container_on_the_real_node() -> Res {
    // A dev cluster of its own with the real node: the tenant's pod is a container that the
    // real kubelet and containerd run, and everything below goes through them.
    let (_dir, real) = vcp_dev::testing::real_node_cluster().await?;
    let cluster = &real;
    let cp = TenantControlPlane::start("e2ekd").await?;
    let policy = cp.policy_flag(vcp_dev::testing::REAL_NODE_PLACEMENT)?;
    let _syncer = cp.start_syncer(cluster, &[&policy])?;
    let tenant = cp.connect().await?;
    namespace(&tenant, "apps").await?;
    let pods: Api<Pod> = Api::namespaced(tenant.clone(), "apps");
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "shell"},
        "spec": {"terminationGracePeriodSeconds": 1, "containers": [{"name": "main", "image": vcp_dev::images::BUSYBOX_IMAGE, "command": [
            "sh", "-c", "echo serving from the real node; mkdir -p /www && echo hello > /www/index.html && exec httpd -f -p 8081 -h /www",
        ]}]},
    }))?;
    pods.create(&Default::default(), &pod).await?;
    eventually(
        "the tenant pod running on the real node",
        Duration::from_secs(120),
        || async {
            let p = pods.get("shell").await?;
            let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
            Ok((running(&p) && node.as_deref() == Some(vcp_dev::node::NODE_NAME)).then_some(()))
        },
    )
    .await?;
    let k = || {
        let mut c = kubectl(cluster, &cp.kubeconfig);
        c.args(["-n", "apps"]);
        c
    };

    // The container's own output, and its port reached by a real HTTP client through kubectl
    // port-forward (the kubelet has containerd dial it inside the pod's network namespace).
    let logs = eventually(
        "the container's output through the tenant",
        Duration::from_secs(30),
        || async {
            let (code, out, _) = run(k().args(["logs", "shell"]))?;
            Ok((code == 0 && out.contains("serving from the real node")).then_some(out))
        },
    )
    .await?;
    assert!(logs.starts_with("serving from the real node\n"), "{logs:?}");
    let status = eventually(
        "an HTTP answer through port-forward",
        Duration::from_secs(30),
        || async {
            let mut pf = kubectl(cluster, &cp.kubeconfig);
            pf.args(["-n", "apps"]);
            Ok(
                first_line_through_port_forward(pf, "pod/shell", 8081, b"GET / HTTP/1.0\r\n\r\n")
                    .ok(),
            )
        },
    )
    .await?;
    assert!(
        status.starts_with("HTTP/1.") && status.contains(" 200 "),
        "{status:?}"
    );

    // A command's output, error output and exit code, from the container.
    let (code, out, err) = run(k().args([
        "exec",
        "shell",
        "--",
        "sh",
        "-c",
        "echo out; echo err >&2; exit 3",
    ]))?;
    assert_eq!((code, out.as_str()), (3, "out\n"), "{err}");
    assert!(err.contains("err"), "{err}");

    // kubectl cp into the pod and back out (tar through exec, stdin closed at the end).
    let dir = tempfile::tempdir()?;
    let local = dir.path().join("in.txt");
    std::fs::write(&local, "copied through the tenant\n")?;
    let remote = format!("/tmp/vcp-e2e-cp-{}.txt", std::process::id());
    ok(k().arg("cp").arg(&local).arg(format!("shell:{remote}")))?;
    assert_eq!(
        ok(k().args(["exec", "shell", "--", "cat", &remote]))?,
        "copied through the tenant\n"
    );
    let back = dir.path().join("back.txt");
    ok(k().arg("cp").arg(format!("shell:{remote}")).arg(&back))?;
    assert_eq!(
        std::fs::read_to_string(&back)?,
        "copied through the tenant\n"
    );
    let _ = std::fs::remove_file(&remote);

    // kubectl top: the container's own figures (the kubelet's), through the host's
    // metrics-server.
    let top = eventually(
        "kubectl top of the real node's pod in the tenant",
        Duration::from_secs(90),
        || async {
            let (code, out, _) = run(k().args(["top", "pod", "shell", "--containers"]))?;
            Ok((code == 0).then_some(out))
        },
    )
    .await?;
    let row = rows(&top);
    assert_eq!(row.len(), 1, "{top}");
    assert_eq!(row[0][1], "main", "{top}");
    assert!(
        row[0][3].ends_with("Mi") || row[0][3].ends_with("Ki"),
        "{top}"
    );
    Ok(())
}
