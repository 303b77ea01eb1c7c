//! The devnode runs real control-plane pods: etcd and kube-apiserver from their built
//! binaries, with TLS from Secrets, peers found through a headless Service, volumes, probes,
//! restarts, deletion and NodePorts. Everything against the real dev cluster.

use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use kube::api::{Api, DeleteParams, PostParams};
use kube::{Client, ResourceExt};
use std::time::{Duration, Instant};
use vcp_dev::DevCluster;
use vcp_dev::pki::{Ca, CertKey, LeafSpec};
use vcp_dev::testing::{eventually, namespace};

type Res<T = ()> = anyhow::Result<T>;

async fn apply_yaml(client: &Client, ns: &str, yaml: &str) -> Res {
    use kube::api::{DynamicObject, Patch, PatchParams};
    use kube::discovery::{ApiResource, Discovery};
    let discovery = Discovery::new(client.clone()).run().await?;
    for doc in serde_yaml::Deserializer::from_str(yaml) {
        let obj: DynamicObject = serde::Deserialize::deserialize(doc)?;
        let gvk = obj
            .types
            .as_ref()
            .map(kube::api::GroupVersionKind::try_from)
            .transpose()?
            .unwrap();
        let (ar, caps): (ApiResource, _) = discovery.resolve_gvk(&gvk).unwrap();
        let api: Api<DynamicObject> = if caps.scope == kube::discovery::Scope::Namespaced {
            Api::namespaced_with(client.clone(), ns, &ar)
        } else {
            Api::all_with(client.clone(), &ar)
        };
        api.patch(
            &obj.name_any(),
            &PatchParams::apply("devnode-test").force(),
            &Patch::Apply(&obj),
        )
        .await?;
    }
    Ok(())
}

async fn secret(client: &Client, ns: &str, name: &str, data: &[(&str, &str)]) -> Res {
    let s: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "stringData": data.iter().map(|(k, v)| (k.to_string(), serde_json::Value::from(*v))).collect::<serde_json::Map<_, _>>(),
    }))?;
    Api::<Secret>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &s)
        .await?;
    Ok(())
}

fn ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

async fn wait_ready(pods: &Api<Pod>, name: &str, timeout: Duration) -> Res<Pod> {
    eventually(&format!("pod {name} Ready"), timeout, || async {
        Ok(pods.get_opt(name).await?.filter(ready))
    })
    .await
}

fn pid_of(p: &Pod, container: usize) -> Option<u32> {
    let id = p
        .status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .get(container)?
        .container_id
        .clone()?;
    id.strip_prefix("devnode://")?.parse().ok()
}

fn now() -> time::OffsetDateTime {
    time::OffsetDateTime::now_utc()
}

/// nodeSelector and toleration for the devnode, indented for a pod template.
const PLACEMENT: &str = r#"
      nodeSelector: {vcp.dev/runtime: process}
      tolerations: [{key: vcp.dev/runtime, operator: Exists}]"#;
/// The same for a bare Pod.
const POD_PLACEMENT: &str = r#"
  nodeSelector: {vcp.dev/runtime: process}
  tolerations: [{key: vcp.dev/runtime, operator: Exists}]"#;

/// PKI for an etcd cluster and an apiserver in namespace `ns`.
struct ControlPlanePki {
    ca: CertKey,
    etcd: CertKey,
    etcd_client: CertKey,
    api: CertKey,
    admin: CertKey,
    sa_key: String,
    sa_pub: String,
}

fn control_plane_pki(ns: &str) -> Res<ControlPlanePki> {
    use vcp_dev::pki::{CA_VALIDITY, LEAF_VALIDITY};
    let ca = Ca::generate("test-ca", now(), CA_VALIDITY)?;
    let issue = |spec: LeafSpec| ca.issue(&spec, now(), LEAF_VALIDITY);
    let names = |n: &[&str]| n.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    let peers = format!("*.etcd.{ns}.svc");
    let peers_long = format!("*.etcd.{ns}.svc.cluster.local");
    let mut etcd_spec = LeafSpec::server(
        "etcd",
        names(&[&peers, &peers_long, "localhost"]),
        vec![[127, 0, 0, 1].into()],
    );
    etcd_spec.client = true;
    let (sa_key, sa_pub) = vcp_dev::pki::service_account_key()?;
    Ok(ControlPlanePki {
        etcd: issue(etcd_spec)?,
        etcd_client: issue(LeafSpec::client("kube-apiserver-etcd-client", &[]))?,
        api: issue(LeafSpec::server(
            "kube-apiserver",
            names(&["kube-apiserver", "kubernetes.default.svc"]),
            vec![],
        ))?,
        admin: issue(LeafSpec::client("test-admin", &["system:masters"]))?,
        sa_key,
        sa_pub,
        ca: ca.cert_key().clone(),
    })
}

fn etcd_yaml(ns: &str) -> String {
    let peer = |i: u32| format!("etcd-{i}=https://etcd-{i}.etcd.{ns}.svc:2380");
    format!(
        r#"
apiVersion: v1
kind: Service
metadata: {{name: etcd, namespace: {ns}}}
spec:
  clusterIP: None
  publishNotReadyAddresses: true
  selector: {{app: etcd}}
  ports: [{{name: client, port: 2379}}, {{name: peer, port: 2380}}]
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {{name: etcd, namespace: {ns}}}
spec:
  serviceName: etcd
  replicas: 3
  podManagementPolicy: Parallel
  selector: {{matchLabels: {{app: etcd}}}}
  template:
    metadata: {{labels: {{app: etcd}}}}
    spec:{PLACEMENT}
      containers:
      - name: etcd
        image: registry.k8s.io/etcd:3.6.16-0
        command: [etcd]
        args:
        - --name=$(POD_NAME)
        - --data-dir=/var/lib/etcd/data
        - --listen-client-urls=https://$(POD_IP):2379
        - --advertise-client-urls=https://$(POD_NAME).etcd.{ns}.svc:2379
        - --listen-peer-urls=https://$(POD_IP):2380
        - --initial-advertise-peer-urls=https://$(POD_NAME).etcd.{ns}.svc:2380
        - --initial-cluster={p0},{p1},{p2}
        - --initial-cluster-token={ns}
        - --listen-metrics-urls=http://$(POD_IP):2381
        - --cert-file=/etc/etcd/pki/tls.crt
        - --key-file=/etc/etcd/pki/tls.key
        - --trusted-ca-file=/etc/etcd/pki/ca.crt
        - --client-cert-auth
        - --peer-cert-file=/etc/etcd/pki/tls.crt
        - --peer-key-file=/etc/etcd/pki/tls.key
        - --peer-trusted-ca-file=/etc/etcd/pki/ca.crt
        - --peer-client-cert-auth
        - --unsafe-no-fsync
        env:
        - {{name: POD_NAME, valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}}}
        - {{name: POD_IP, valueFrom: {{fieldRef: {{fieldPath: status.podIP}}}}}}
        ports: [{{name: client, containerPort: 2379}}, {{name: peer, containerPort: 2380}}, {{name: metrics, containerPort: 2381}}]
        readinessProbe: {{httpGet: {{path: /health, port: metrics}}, periodSeconds: 1, failureThreshold: 2}}
        volumeMounts:
        - {{name: pki, mountPath: /etc/etcd/pki, readOnly: true}}
        - {{name: data, mountPath: /var/lib/etcd}}
      volumes:
      - {{name: pki, secret: {{secretName: etcd-pki}}}}
  volumeClaimTemplates:
  - metadata: {{name: data}}
    spec: {{accessModes: [ReadWriteOnce], resources: {{requests: {{storage: 1Gi}}}}}}
"#,
        p0 = peer(0),
        p1 = peer(1),
        p2 = peer(2),
    )
}

fn apiserver_yaml(ns: &str) -> String {
    let etcd = (0..3)
        .map(|i| format!("https://etcd-{i}.etcd.{ns}.svc:2379"))
        .collect::<Vec<_>>()
        .join(",");
    format!(
        r#"
apiVersion: apps/v1
kind: Deployment
metadata: {{name: kube-apiserver, namespace: {ns}}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: kube-apiserver}}}}
  template:
    metadata: {{labels: {{app: kube-apiserver}}}}
    spec:{PLACEMENT}
      containers:
      - name: kube-apiserver
        image: registry.k8s.io/kube-apiserver:v1.37.1
        command: [kube-apiserver]
        args:
        - --bind-address=$(POD_IP)
        - --advertise-address=$(POD_IP)
        - --secure-port=6443
        - --etcd-servers={etcd}
        - --etcd-cafile=/pki/etcd/ca.crt
        - --etcd-certfile=/pki/etcd/tls.crt
        - --etcd-keyfile=/pki/etcd/tls.key
        - --tls-cert-file=/pki/api/tls.crt
        - --tls-private-key-file=/pki/api/tls.key
        - --client-ca-file=/pki/api/ca.crt
        - --service-account-issuer=https://kubernetes.default.svc
        - --service-account-key-file=/pki/api/sa.pub
        - --service-account-signing-key-file=/pki/api/sa.key
        - --service-cluster-ip-range=10.96.0.0/16
        - --authorization-mode=RBAC
        env:
        - {{name: POD_IP, valueFrom: {{fieldRef: {{fieldPath: status.podIP}}}}}}
        ports: [{{name: https, containerPort: 6443}}]
        readinessProbe: {{httpGet: {{path: /readyz, port: https, scheme: HTTPS}}, periodSeconds: 1}}
        volumeMounts:
        - {{name: etcd-client, mountPath: /pki/etcd, readOnly: true}}
        - {{name: api, mountPath: /pki/api, readOnly: true}}
      volumes:
      - {{name: etcd-client, secret: {{secretName: etcd-client}}}}
      - {{name: api, secret: {{secretName: apiserver-pki}}}}
---
apiVersion: v1
kind: Service
metadata: {{name: kube-apiserver, namespace: {ns}}}
spec:
  type: NodePort
  selector: {{app: kube-apiserver}}
  ports: [{{name: https, port: 443, targetPort: 6443}}]
"#
    )
}

fn kubeconfig(server: &str, pki: &ControlPlanePki) -> String {
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: t\n  cluster:\n    server: {server}\n    tls-server-name: kube-apiserver\n    certificate-authority-data: {}\nusers:\n- name: admin\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\ncontexts:\n- name: t\n  context: {{cluster: t, user: admin}}\ncurrent-context: t\n",
        b64(&pki.ca.cert_pem),
        b64(&pki.admin.cert_pem),
        b64(&pki.admin.key_pem)
    )
}

#[tokio::test]
async fn etcd_and_kube_apiserver_run_as_real_pods_and_serve_through_pod_ip_and_node_port() -> Res {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cluster = DevCluster::shared().await?;
    let client = cluster.connect().await?;
    let ns = "cp-a";
    namespace(&client, ns).await?;
    let pki = control_plane_pki(ns)?;
    secret(
        &client,
        ns,
        "etcd-pki",
        &[
            ("ca.crt", &pki.ca.cert_pem),
            ("tls.crt", &pki.etcd.cert_pem),
            ("tls.key", &pki.etcd.key_pem),
        ],
    )
    .await?;
    secret(
        &client,
        ns,
        "etcd-client",
        &[
            ("ca.crt", &pki.ca.cert_pem),
            ("tls.crt", &pki.etcd_client.cert_pem),
            ("tls.key", &pki.etcd_client.key_pem),
        ],
    )
    .await?;
    secret(
        &client,
        ns,
        "apiserver-pki",
        &[
            ("ca.crt", &pki.ca.cert_pem),
            ("tls.crt", &pki.api.cert_pem),
            ("tls.key", &pki.api.key_pem),
            ("sa.key", &pki.sa_key),
            ("sa.pub", &pki.sa_pub),
        ],
    )
    .await?;

    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let t0 = Instant::now();
    apply_yaml(&client, ns, &etcd_yaml(ns)).await?;
    for i in 0..3 {
        wait_ready(&pods, &format!("etcd-{i}"), Duration::from_secs(90)).await?;
    }
    let etcd_ready = t0.elapsed();

    // Health with a client certificate, by the peer name the certificate carries.
    let etcd0 = pods.get("etcd-0").await?;
    let ip: std::net::IpAddr = etcd0
        .status
        .as_ref()
        .unwrap()
        .pod_ip
        .as_ref()
        .unwrap()
        .parse()?;
    let host = format!("etcd-0.etcd.{ns}.svc");
    let identity = reqwest::Identity::from_pem(
        format!("{}{}", pki.etcd_client.cert_pem, pki.etcd_client.key_pem).as_bytes(),
    )?;
    let http = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(pki.ca.cert_pem.as_bytes())?)
        .identity(identity)
        .resolve(&host, std::net::SocketAddr::new(ip, 2379))
        .timeout(Duration::from_secs(5))
        .build()?;
    let health: serde_json::Value = http
        .get(format!("https://{host}:2379/health"))
        .send()
        .await?
        .json()
        .await?;
    assert_eq!(health["health"], "true", "{health}");
    let members: serde_json::Value = http
        .post(format!("https://{host}:2379/v3/cluster/member/list"))
        .body("{}")
        .send()
        .await?
        .json()
        .await?;
    assert_eq!(
        members["members"].as_array().map(Vec::len),
        Some(3),
        "{members}"
    );
    let anonymous = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(pki.ca.cert_pem.as_bytes())?)
        .resolve(&host, std::net::SocketAddr::new(ip, 2379))
        .build()?;
    assert!(
        anonymous
            .get(format!("https://{host}:2379/health"))
            .send()
            .await
            .is_err(),
        "etcd accepted a client without a certificate"
    );

    let t1 = Instant::now();
    apply_yaml(&client, ns, &apiserver_yaml(ns)).await?;
    let api_pod = eventually("an apiserver pod", Duration::from_secs(30), || async {
        let list = pods
            .list(&kube::api::ListParams::default().labels("app=kube-apiserver"))
            .await?;
        Ok(list.items.into_iter().next())
    })
    .await?;
    let api_pod = wait_ready(&pods, &api_pod.name_any(), Duration::from_secs(120)).await?;
    let apiserver_ready = t1.elapsed();
    eprintln!(
        "devnode timings: 3-member etcd create->Ready {:.1}s, kube-apiserver create->Ready {:.1}s",
        etcd_ready.as_secs_f64(),
        apiserver_ready.as_secs_f64()
    );

    let dir = tempfile::tempdir()?;
    let api_ip = api_pod.status.as_ref().unwrap().pod_ip.clone().unwrap();
    let kc = dir.path().join("pod-ip.kubeconfig");
    std::fs::write(&kc, kubeconfig(&format!("https://{api_ip}:6443"), &pki))?;
    let out = std::process::Command::new(cluster.kubectl())
        .args(["--kubeconfig"])
        .arg(&kc)
        .args(["get", "namespaces", "-o", "name"])
        .output()?;
    assert!(
        out.status.success(),
        "kubectl via pod IP: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let names = String::from_utf8_lossy(&out.stdout);
    assert!(
        names.contains("namespace/default") && names.contains("namespace/kube-system"),
        "{names}"
    );

    let svc = Api::<Service>::namespaced(client.clone(), ns)
        .get("kube-apiserver")
        .await?;
    let node_port = svc.spec.unwrap().ports.unwrap()[0].node_port.unwrap();
    let kc = dir.path().join("node-port.kubeconfig");
    std::fs::write(
        &kc,
        kubeconfig(&format!("https://127.0.0.1:{node_port}"), &pki),
    )?;
    let out = eventually(
        "the NodePort to forward",
        Duration::from_secs(30),
        || async {
            let out = std::process::Command::new(cluster.kubectl())
                .args(["--kubeconfig"])
                .arg(&kc)
                .args(["get", "namespaces", "-o", "name"])
                .output()?;
            Ok(out.status.success().then_some(out))
        },
    )
    .await?;
    assert!(String::from_utf8_lossy(&out.stdout).contains("namespace/default"));

    // A killed etcd member restarts, rejoins with its data, and is Ready again.
    let pid = pid_of(&etcd0, 0).expect("etcd-0 reports its process");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )?;
    let restarted = eventually(
        "etcd-0 restarted and Ready",
        Duration::from_secs(60),
        || async {
            let p = pods.get("etcd-0").await?;
            let count = p
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .map(|c| c[0].restart_count)
                .unwrap_or(0);
            Ok((count >= 1 && ready(&p)).then_some(p))
        },
    )
    .await?;
    let last = restarted.status.unwrap().container_statuses.unwrap()[0]
        .last_state
        .clone()
        .unwrap();
    assert_eq!(last.terminated.unwrap().exit_code, 137);
    Ok(())
}

#[tokio::test]
async fn a_pod_reaches_a_node_port_on_its_default_gateway_as_on_its_nodes_address() -> Res {
    let cluster = DevCluster::shared().await?;
    let client = cluster.connect().await?;
    let ns = "node-port-gw";
    namespace(&client, ns).await?;
    apply_yaml(
        &client,
        ns,
        &format!(
            r#"
apiVersion: v1
kind: Pod
metadata: {{name: web, namespace: {ns}, labels: {{app: web}}}}
spec:{POD_PLACEMENT}
  containers:
  - name: web
    image: vcp.dev/host:any
    command: [sh, -c, "cd /site && echo served-through-the-gateway > index.html && exec python3 -m http.server --bind $POD_IP 8080"]
    env: [{{name: POD_IP, valueFrom: {{fieldRef: {{fieldPath: status.podIP}}}}}}]
    readinessProbe: {{tcpSocket: {{port: 8080}}, periodSeconds: 1}}
    volumeMounts: [{{name: site, mountPath: /site}}]
  volumes: [{{name: site, emptyDir: {{}}}}]
---
apiVersion: v1
kind: Service
metadata: {{name: web, namespace: {ns}}}
spec:
  type: NodePort
  selector: {{app: web}}
  ports: [{{name: http, port: 80, targetPort: 8080}}]
"#
        ),
    )
    .await?;
    let node_port = Api::<Service>::namespaced(client.clone(), ns)
        .get("web")
        .await?
        .spec
        .and_then(|s| s.ports)
        .and_then(|p| p[0].node_port)
        .expect("a NodePort");
    // The client finds the node's address as a pod would, from its default route; until the
    // devnode sees web's ready endpoint a connection is accepted and closed, so it retries.
    let script = format!(
        r#"{gateway}
import time, urllib.request
gw = default_gateway()
for attempt in range(120):
    try:
        body = urllib.request.urlopen("http://%s:{node_port}/" % gw, timeout=2).read().decode()
        print("via %s: %s" % (gw, body.strip()))
        break
    except Exception as e:
        time.sleep(0.5)
else:
    raise SystemExit("never reached %s:{node_port}" % gw)
"#,
        gateway = vcp_dev::testing::PY_DEFAULT_GATEWAY
    );
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "client", "namespace": ns},
        "spec": {
            "nodeSelector": {"vcp.dev/runtime": "process"},
            "tolerations": [{"key": "vcp.dev/runtime", "operator": "Exists"}],
            "restartPolicy": "Never",
            "containers": [{"name": "client", "image": "vcp.dev/host:any",
                "command": ["python3", "-c", script]}],
        },
    }))?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    pods.create(&PostParams::default(), &pod).await?;
    let log = cluster
        .state_dir()
        .join(format!("devnode/logs/{ns}_client_client.log"));
    eventually("the client to finish", Duration::from_secs(120), || async {
        let p = pods.get("client").await?;
        let phase = p
            .status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_default();
        anyhow::ensure!(
            phase != "Failed",
            "client failed: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        Ok((phase == "Succeeded").then_some(()))
    })
    .await?;
    let text = std::fs::read_to_string(&log)?;
    let gateway = text
        .lines()
        .find_map(|l| l.strip_prefix("via "))
        .unwrap_or_default();
    assert!(
        gateway.starts_with("10.245.") && gateway.contains(".1: served-through-the-gateway"),
        "{text}"
    );
    Ok(())
}

#[tokio::test]
async fn a_changed_secret_shows_in_the_mounted_file_and_a_deleted_pod_leaves_nothing() -> Res {
    let cluster = DevCluster::shared().await?;
    let client = cluster.connect().await?;
    let ns = "lifecycle";
    namespace(&client, ns).await?;
    secret(&client, ns, "greeting", &[("message", "hello-1")]).await?;
    apply_yaml(&client, ns, &format!(r#"
apiVersion: v1
kind: Pod
metadata: {{name: sleeper, namespace: {ns}}}
spec:{POD_PLACEMENT}
  terminationGracePeriodSeconds: 5
  containers:
  - name: sleep
    image: vcp.dev/host:any
    command: [sleep, "3600"]
    volumeMounts: [{{name: greeting, mountPath: /etc/greeting}}, {{name: scratch, mountPath: /scratch}}]
  volumes:
  - {{name: greeting, secret: {{secretName: greeting}}}}
  - {{name: scratch, emptyDir: {{}}}}
"#)).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pod = wait_ready(&pods, "sleeper", Duration::from_secs(30)).await?;
    let pid = pid_of(&pod, 0).unwrap();
    // /proc/<pid>/root shows the container's own mount namespace.
    let file = format!("/proc/{pid}/root/etc/greeting/message");
    assert_eq!(std::fs::read_to_string(&file)?, "hello-1");
    assert!(
        !std::path::Path::new("/etc/greeting/message").exists(),
        "the mount leaked to the host"
    );

    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let patch = serde_json::json!({"stringData": {"message": "hello-2"}});
    let changed = Instant::now();
    secrets
        .patch(
            "greeting",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await?;
    eventually(
        "the new secret value in the container",
        Duration::from_secs(10),
        || async { Ok((std::fs::read_to_string(&file)? == "hello-2").then_some(())) },
    )
    .await?;
    eprintln!(
        "secret change visible in the container after {:.1}s",
        changed.elapsed().as_secs_f64()
    );

    let ip = pod.status.as_ref().unwrap().pod_ip.clone().unwrap();
    let uid = pod.uid().unwrap();
    pods.delete("sleeper", &DeleteParams::default()).await?;
    eventually(
        "the pod to be gone from the API",
        Duration::from_secs(30),
        || async { Ok(pods.get_opt("sleeper").await?.is_none().then_some(())) },
    )
    .await?;
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "the container process outlived its pod"
    );
    let mounts = std::fs::read_to_string("/proc/self/mountinfo")?;
    assert!(!mounts.contains(&uid), "a mount outlived its pod");
    let octets: Vec<u8> = ip.split('.').map(|o| o.parse().unwrap()).collect();
    let netns = vcp_dev::devnet::netns(octets[2], octets[3]);
    assert!(
        !std::path::Path::new("/run/netns").join(&netns).exists(),
        "{netns} outlived its pod"
    );
    let leftovers: Vec<_> = std::fs::read_dir(cluster.state_dir().join("devnode/pods"))?
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n.to_string_lossy() == uid)
        .collect();
    assert!(leftovers.is_empty(), "pod files left: {leftovers:?}");
    Ok(())
}

#[tokio::test]
async fn unknown_images_and_failing_commands_show_in_status_instead_of_hanging() -> Res {
    let cluster = DevCluster::shared().await?;
    let client = cluster.connect().await?;
    let ns = "failures";
    namespace(&client, ns).await?;
    apply_yaml(
        &client,
        ns,
        &format!(
            r#"
apiVersion: v1
kind: Pod
metadata: {{name: no-image, namespace: {ns}}}
spec:{POD_PLACEMENT}
  containers: [{{name: c, image: "docker.io/library/nginx:1.29"}}]
---
apiVersion: v1
kind: Pod
metadata: {{name: crash, namespace: {ns}}}
spec:{POD_PLACEMENT}
  containers: [{{name: c, image: "vcp.dev/host:any", command: [sh, -c, "exit 3"]}}]
---
apiVersion: v1
kind: Pod
metadata: {{name: once, namespace: {ns}}}
spec:{POD_PLACEMENT}
  restartPolicy: Never
  containers: [{{name: c, image: "vcp.dev/host:any", command: [sh, -c, "exit 4"]}}]
"#
        ),
    )
    .await?;
    let pods: Api<Pod> = Api::namespaced(client, ns);
    let waiting = |p: &Pod| -> Option<(String, String)> {
        let w = p
            .status
            .as_ref()?
            .container_statuses
            .as_ref()?
            .first()?
            .state
            .as_ref()?
            .waiting
            .clone()?;
        Some((w.reason?, w.message.unwrap_or_default()))
    };
    let (reason, message) = eventually("ErrImagePull", Duration::from_secs(30), || async {
        Ok(waiting(&pods.get("no-image").await?).filter(|(r, _)| r == "ErrImagePull"))
    })
    .await?;
    assert!(message.contains("nginx"), "{reason}: {message}");

    let crash = eventually(
        "CrashLoopBackOff after restarts",
        Duration::from_secs(30),
        || async {
            let p = pods.get("crash").await?;
            let cs = p
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .and_then(|c| c.first().cloned());
            Ok(cs.filter(|c| {
                c.restart_count >= 1 && waiting(&p).is_some_and(|(r, _)| r == "CrashLoopBackOff")
            }))
        },
    )
    .await?;
    assert_eq!(crash.last_state.unwrap().terminated.unwrap().exit_code, 3);

    let once = eventually("phase Failed", Duration::from_secs(30), || async {
        let p = pods.get("once").await?;
        Ok((p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed")).then_some(p))
    })
    .await?;
    let term = once.status.unwrap().container_statuses.unwrap()[0]
        .state
        .clone()
        .unwrap()
        .terminated
        .unwrap();
    assert_eq!(term.exit_code, 4);
    Ok(())
}

#[tokio::test]
async fn init_containers_tokens_probes_grace_periods_and_logs_behave_like_a_kubelet() -> Res {
    let cluster = DevCluster::shared().await?;
    let client = cluster.connect().await?;
    let ns = "kubelet";
    namespace(&client, ns).await?;
    apply_yaml(
        &client,
        ns,
        &format!(
            r#"
apiVersion: v1
kind: ConfigMap
metadata: {{name: settings, namespace: {ns}}}
data: {{mode: fast}}
---
apiVersion: v1
kind: Pod
metadata: {{name: whoami, namespace: {ns}}}
spec:{POD_PLACEMENT}
  restartPolicy: Never
  initContainers:
  - name: prepare
    image: vcp.dev/host:any
    command: [sh, -c, "cat /config/mode > /work/mode"]
    volumeMounts: [{{name: work, mountPath: /work}}, {{name: config, mountPath: /config}}]
  containers:
  - name: kubectl
    image: registry.k8s.io/kubectl:v1.37.1
    command: [kubectl]
    args: [auth, whoami, -o, "jsonpath={{.status.userInfo.username}} $(MODE)"]
    env: [{{name: MODE, valueFrom: {{configMapKeyRef: {{name: settings, key: mode}}}}}}]
    volumeMounts: [{{name: work, mountPath: /work}}]
  volumes:
  - {{name: work, emptyDir: {{}}}}
  - {{name: config, configMap: {{name: settings}}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: probed, namespace: {ns}}}
spec:{POD_PLACEMENT}
  containers:
  - name: web
    image: vcp.dev/host:any
    command: [python3, -m, http.server, --bind, $(POD_IP), "8080"]
    env: [{{name: POD_IP, valueFrom: {{fieldRef: {{fieldPath: status.podIP}}}}}}]
    startupProbe: {{tcpSocket: {{port: 8080}}, periodSeconds: 1, failureThreshold: 30}}
    readinessProbe: {{tcpSocket: {{port: 8080}}, periodSeconds: 1}}
  - name: doomed
    image: vcp.dev/host:any
    command: [sleep, "3600"]
    livenessProbe: {{exec: {{command: ["false"]}}, periodSeconds: 1, failureThreshold: 1}}
---
apiVersion: v1
kind: Pod
metadata: {{name: stubborn, namespace: {ns}}}
spec:{POD_PLACEMENT}
  terminationGracePeriodSeconds: 2
  containers:
  - name: ignore-term
    image: vcp.dev/host:any
    command: [sh, -c, "trap '' TERM; while true; do sleep 0.2; done"]
"#
        ),
    )
    .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);

    // The init container ran first; the main one authenticated to the host apiserver with
    // its projected service-account token (through the gateway, the hosts file and the CA).
    eventually("whoami to succeed", Duration::from_secs(60), || async {
        let p = pods.get("whoami").await?;
        let phase = p
            .status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_default();
        anyhow::ensure!(phase != "Failed", "whoami failed: {:?}", p.status);
        Ok((phase == "Succeeded").then_some(()))
    })
    .await?;
    let log = cluster
        .state_dir()
        .join(format!("devnode/logs/{ns}_whoami_kubectl.log"));
    let text = std::fs::read_to_string(&log)?;
    assert!(
        text.contains(&format!("system:serviceaccount:{ns}:default fast")),
        "{text}"
    );
    let init_log = std::fs::read_to_string(
        cluster
            .state_dir()
            .join(format!("devnode/logs/{ns}_whoami_prepare.log")),
    )?;
    assert!(init_log.contains("vcp-devnode: starting"), "{init_log}");

    // tcpSocket startup and readiness probes make `web` ready; the exec liveness probe that
    // always fails keeps restarting `doomed`, which waits in CrashLoopBackOff between runs, and
    // the pod is not Ready while it waits. (Without a readiness probe `doomed` counts as ready
    // for the second it runs before its probe kills it, as under a kubelet: sampled then, the
    // pod could be Ready, so the check waits for the back-off.)
    let probed = eventually(
        "web ready and doomed restarted, waiting in CrashLoopBackOff",
        Duration::from_secs(60),
        || async {
            let p = pods.get("probed").await?;
            let cs = p
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.clone())
                .unwrap_or_default();
            let web = cs.iter().find(|c| c.name == "web").is_some_and(|c| c.ready);
            let doomed = cs.iter().find(|c| c.name == "doomed").is_some_and(|c| {
                c.restart_count >= 2
                    && c.state
                        .as_ref()
                        .and_then(|s| s.waiting.as_ref())
                        .and_then(|w| w.reason.as_deref())
                        == Some("CrashLoopBackOff")
            });
            Ok((web && doomed).then_some(p))
        },
    )
    .await?;
    assert!(
        !ready(&probed),
        "a pod whose container waits in CrashLoopBackOff must not be Ready"
    );

    // SIGTERM is ignored, so the process dies by SIGKILL after the 2 s grace period.
    let stubborn = wait_ready(&pods, "stubborn", Duration::from_secs(30)).await?;
    let pid = pid_of(&stubborn, 0).unwrap();
    let started = Instant::now();
    pods.delete("stubborn", &DeleteParams::default()).await?;
    eventually("stubborn gone", Duration::from_secs(30), || async {
        Ok(pods.get_opt("stubborn").await?.is_none().then_some(()))
    })
    .await?;
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(2),
        "deleted after {took:?}, before the grace period ended"
    );
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
    Ok(())
}

#[tokio::test]
async fn the_etcd_image_takes_and_checks_a_snapshot_with_etcdctl_and_etcdutl() -> Res {
    let cluster = DevCluster::shared().await?;
    let client = cluster.connect().await?;
    let ns = "snapshots";
    namespace(&client, ns).await?;
    apply_yaml(
        &client,
        ns,
        &format!(
            r#"
apiVersion: v1
kind: Pod
metadata: {{name: etcd, namespace: {ns}}}
spec:{POD_PLACEMENT}
  containers:
  - name: etcd
    image: registry.k8s.io/etcd:3.6.16-0
    args:
    - --data-dir=/var/lib/etcd/data
    - --listen-client-urls=http://$(POD_IP):2379
    - --advertise-client-urls=http://$(POD_IP):2379
    - --listen-peer-urls=http://$(POD_IP):2380
    - --initial-advertise-peer-urls=http://$(POD_IP):2380
    - --initial-cluster=default=http://$(POD_IP):2380
    - --listen-metrics-urls=http://$(POD_IP):2381
    - --unsafe-no-fsync
    env: [{{name: POD_IP, valueFrom: {{fieldRef: {{fieldPath: status.podIP}}}}}}]
    readinessProbe: {{httpGet: {{path: /health, port: 2381}}, periodSeconds: 1}}
    volumeMounts: [{{name: data, mountPath: /var/lib/etcd}}]
  volumes: [{{name: data, emptyDir: {{}}}}]
"#
        ),
    )
    .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let etcd = wait_ready(&pods, "etcd", Duration::from_secs(30)).await?;
    let ip = etcd.status.and_then(|s| s.pod_ip).unwrap();

    // No shell in the image, so each step is its own container: write a key, snapshot the
    // server through its API, then read the snapshot file offline.
    let endpoint = format!("http://{ip}:2379");
    apply_yaml(
        &client,
        ns,
        &format!(
            r#"
apiVersion: v1
kind: Pod
metadata: {{name: snapshot, namespace: {ns}}}
spec:{POD_PLACEMENT}
  restartPolicy: Never
  initContainers:
  - name: put
    image: registry.k8s.io/etcd:3.6.16-0
    command: [etcdctl, --endpoints, "{endpoint}", put, /registry/marker, "1"]
  - name: save
    image: registry.k8s.io/etcd:3.6.16-0
    command: [/usr/local/bin/etcdctl, --endpoints, "{endpoint}", snapshot, save, /snap/db]
    volumeMounts: [{{name: snap, mountPath: /snap}}]
  containers:
  - name: status
    image: registry.k8s.io/etcd:3.6.16-0
    command: [etcdutl, snapshot, status, /snap/db, -w, json]
    volumeMounts: [{{name: snap, mountPath: /snap}}]
  volumes: [{{name: snap, emptyDir: {{}}}}]
"#
        ),
    )
    .await?;
    let logs = cluster.state_dir().join("devnode/logs");
    let log = |container: &str| {
        std::fs::read_to_string(logs.join(format!("{ns}_snapshot_{container}.log")))
            .unwrap_or_default()
    };
    eventually(
        "snapshot pod to succeed",
        Duration::from_secs(45),
        || async {
            let p = pods.get("snapshot").await?;
            let phase = p
                .status
                .as_ref()
                .and_then(|s| s.phase.clone())
                .unwrap_or_default();
            anyhow::ensure!(
                phase != "Failed",
                "snapshot pod failed: {:?}\nsave: {}\nstatus: {}",
                p.status,
                log("save"),
                log("status")
            );
            Ok((phase == "Succeeded").then_some(()))
        },
    )
    .await?;
    assert!(
        log("save").contains("Snapshot saved at /snap/db"),
        "{}",
        log("save")
    );
    let status = log("status");
    let json = status
        .lines()
        .find(|l| l.starts_with('{'))
        .ok_or_else(|| anyhow::anyhow!("no JSON in the status log: {status}"))?;
    let status: serde_json::Value = serde_json::from_str(json)?;
    // A fresh etcd is at revision 1; the put makes it 2, so the snapshot holds the key.
    assert!(status["revision"].as_i64().unwrap_or(0) >= 2, "{status}");
    assert!(status["totalKey"].as_i64().unwrap_or(0) >= 1, "{status}");
    Ok(())
}

/// One field of /proc/<pid>/status ("Uid", "Groups", "NoNewPrivs").
fn proc_status(pid: u32, field: &str) -> Res<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .map(|v| v.trim().to_owned())
        .ok_or_else(|| anyhow::anyhow!("no {field} in /proc/{pid}/status"))
}

#[tokio::test]
async fn containers_run_as_their_run_as_user_and_fs_group_owns_their_writable_volumes() -> Res {
    use std::os::unix::fs::MetadataExt;
    let cluster = DevCluster::shared().await?;
    let client = cluster.connect().await?;
    let ns = "identity";
    namespace(&client, ns).await?;
    apply_yaml(
        &client,
        ns,
        &format!(
            r#"
apiVersion: v1
kind: Pod
metadata: {{name: user, namespace: {ns}}}
spec:{POD_PLACEMENT}
  securityContext: {{runAsNonRoot: true, runAsUser: 1234, runAsGroup: 1234, fsGroup: 4321, supplementalGroups: [77]}}
  volumes: [{{name: data, emptyDir: {{}}}}]
  containers:
    - name: c
      image: "vcp.dev/host:any"
      command: [sh, -c, "touch /data/made-by-the-pod && exec sleep 3600"]
      securityContext: {{allowPrivilegeEscalation: false}}
      volumeMounts: [{{name: data, mountPath: /data}}]
---
apiVersion: v1
kind: Pod
metadata: {{name: root, namespace: {ns}}}
spec:{POD_PLACEMENT}
  securityContext: {{runAsNonRoot: true}}
  containers: [{{name: c, image: "vcp.dev/host:any", command: [sleep, "3600"]}}]
"#
        ),
    )
    .await?;
    let pods: Api<Pod> = Api::namespaced(client, ns);
    let p = eventually("pod user running", Duration::from_secs(60), || async {
        Ok(pods.get("user").await?).map(|p| pid_of(&p, 0).map(|_| p))
    })
    .await?;
    let pid = pid_of(&p, 0).unwrap();
    // The container's process starts as setpriv, as root, and becomes the user as it execs
    // the command: under load the pod can be seen running in between. A process that never
    // becomes the user fails here after 20 s.
    let uids = eventually(
        "the process as its runAsUser",
        Duration::from_secs(20),
        || async {
            let uids = proc_status(pid, "Uid")?;
            Ok((uids.split_whitespace().collect::<Vec<_>>() == ["1234"; 4]).then_some(uids))
        },
    )
    .await;
    assert!(uids.is_ok(), "{uids:?}: Uid {:?}", proc_status(pid, "Uid"));
    assert_eq!(
        proc_status(pid, "Gid")?.split_whitespace().next(),
        Some("1234")
    );
    assert_eq!(
        proc_status(pid, "Groups")?,
        "77 4321",
        "supplemental groups and fsGroup"
    );
    assert_eq!(proc_status(pid, "NoNewPrivs")?, "1");
    assert_eq!(
        proc_status(pid, "CapEff")?,
        "0000000000000000",
        "no capabilities"
    );
    // The emptyDir belongs to the fsGroup, and what the pod writes there stays in it.
    let uid = p.uid().unwrap();
    let file = cluster
        .state_dir()
        .join("devnode/pods")
        .join(&uid)
        .join("volumes/data/made-by-the-pod");
    let meta = eventually("the pod's file", Duration::from_secs(30), || async {
        Ok(std::fs::metadata(&file).ok())
    })
    .await?;
    assert_eq!((meta.uid(), meta.gid()), (1234, 4321));

    // runAsNonRoot without a runAsUser: the devnode's images run as root, so it is refused.
    let (reason, message) = eventually(
        "CreateContainerConfigError",
        Duration::from_secs(30),
        || async {
            let p = pods.get("root").await?;
            let w = p
                .status
                .and_then(|s| s.container_statuses)
                .and_then(|c| c.first()?.state.as_ref()?.waiting.clone());
            Ok(
                w.and_then(|w| Some((w.reason?, w.message.unwrap_or_default())))
                    .filter(|(r, _)| r == "CreateContainerConfigError"),
            )
        },
    )
    .await?;
    assert!(message.contains("runAsNonRoot"), "{reason}: {message}");
    Ok(())
}

#[tokio::test]
async fn a_program_whose_directory_a_volume_covers_still_runs_as_the_pods_user() -> Res {
    // The chart's Postgres mounts an emptyDir at /tmp; a workspace cloned under /tmp holds
    // the program the devnode runs for its image. Here the emptyDir covers the directory
    // holding `vcp` itself, wherever the workspace is, with the Postgres pod's identity.
    let cluster = DevCluster::shared().await?;
    let client = cluster.connect().await?;
    let ns = "covered-program";
    namespace(&client, ns).await?;
    let bin_dir = std::fs::canonicalize(
        vcp_dev::cluster::devnode_binary()?
            .parent()
            .ok_or_else(|| anyhow::anyhow!("the devnode binary has no directory"))?,
    )?;
    anyhow::ensure!(
        bin_dir.join("vcp").is_file(),
        "{} is not built: cargo build --workspace --bins",
        bin_dir.join("vcp").display()
    );
    apply_yaml(
        &client,
        ns,
        &format!(
            r#"
apiVersion: v1
kind: Pod
metadata: {{name: covered, namespace: {ns}}}
spec:{POD_PLACEMENT}
  restartPolicy: Never
  securityContext: {{runAsNonRoot: true, runAsUser: 999, runAsGroup: 999, fsGroup: 999}}
  volumes: [{{name: over, emptyDir: {{}}}}]
  containers:
    - name: c
      image: "ghcr.io/vcp-dev/vcp:0.1.0"
      command: [vcp, --version]
      securityContext: {{allowPrivilegeEscalation: false}}
      volumeMounts: [{{name: over, mountPath: "{dir}"}}]
"#,
            dir = bin_dir.display()
        ),
    )
    .await?;
    let pods: Api<Pod> = Api::namespaced(client, ns);
    let phase = eventually("pod covered finished", Duration::from_secs(60), || async {
        Ok(pods
            .get("covered")
            .await?
            .status
            .and_then(|s| s.phase)
            .filter(|p| p == "Succeeded" || p == "Failed"))
    })
    .await?;
    let log = std::fs::read_to_string(
        cluster
            .state_dir()
            .join("devnode/logs")
            .join(format!("{ns}_covered_c.log")),
    )?;
    assert_eq!(phase, "Succeeded", "{log}");
    let version = format!("vcp {}", env!("CARGO_PKG_VERSION"));
    assert!(log.contains(&version), "{version} in {log}");
    // It ran from the devnode's program directory, not its own (covered) path.
    assert!(
        log.contains("starting /.vcp-devnode/bin/vcp --version"),
        "{log}"
    );
    Ok(())
}
