//! Shared datastores on the dev cluster: two tenants whose plan keeps their data on one
//! three-member etcd run by vcp, each under its own prefix and etcd user. Each sees only its own
//! objects through its apiserver, and, below the apiservers, tenant A's etcd credentials are
//! refused every key of B's (and every key outside A's prefix), read with a real etcdctl. A
//! deleted tenant's user and keys go; the other tenant keeps working.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::Client;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;
use std::path::Path;
use std::process::Output;
use std::time::Duration;
use vcp_dev::cluster::DevCluster;
use vcp_dev::platform::SHARED_PLAN;
use vcp_dev::testing::eventually;

const READY_TIMEOUT: Duration = Duration::from_secs(360);

async fn tenant_client(kubeconfig: &str) -> anyhow::Result<Client> {
    let kc = kube::config::Kubeconfig::from_yaml(kubeconfig)?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
    Ok(Client::try_from(cfg)?)
}

fn secret_file(s: &Secret, key: &str, dir: &Path, name: &str) -> anyhow::Result<String> {
    let bytes = &s
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .ok_or_else(|| anyhow::anyhow!("secret has no {key}"))?
        .0;
    let path = dir.join(name);
    std::fs::write(&path, bytes)?;
    Ok(path.to_string_lossy().into_owned())
}

/// etcdctl against one member with the client certificate of Secret `s` (and, for root, its
/// password).
struct Etcdctl {
    endpoint: String,
    tls: Vec<String>,
    user: Option<String>,
}

impl Etcdctl {
    fn new(endpoint: &str, s: &Secret, dir: &Path, who: &str) -> anyhow::Result<Etcdctl> {
        let dir = dir.join(who);
        std::fs::create_dir_all(&dir)?;
        let tls = vec![
            format!("--cacert={}", secret_file(s, "ca.crt", &dir, "ca.crt")?),
            format!("--cert={}", secret_file(s, "tls.crt", &dir, "tls.crt")?),
            format!("--key={}", secret_file(s, "tls.key", &dir, "tls.key")?),
        ];
        let user = s
            .data
            .as_ref()
            .and_then(|d| d.get("password"))
            .map(|p| format!("root:{}", String::from_utf8_lossy(&p.0)));
        Ok(Etcdctl {
            endpoint: endpoint.to_owned(),
            tls,
            user,
        })
    }

    fn run(&self, args: &[&str]) -> anyhow::Result<Output> {
        let mut cmd = std::process::Command::new(vcp_dev::bins::tool("etcdctl")?);
        cmd.arg(format!("--endpoints={}", self.endpoint))
            // The members' certificate names their DNS names, not the pod address dialled here;
            // what is under test is who etcd takes the client for.
            .arg("--insecure-skip-tls-verify")
            .arg("--command-timeout=10s")
            .args(&self.tls);
        if let Some(u) = &self.user {
            cmd.arg(format!("--user={u}"));
        }
        Ok(cmd.args(args).output()?)
    }

    fn ok(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = self.run(args)?;
        anyhow::ensure!(
            out.status.success(),
            "etcdctl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn refused(&self, args: &[&str]) -> anyhow::Result<()> {
        let out = self.run(args)?;
        let err = String::from_utf8_lossy(&out.stderr);
        anyhow::ensure!(
            !out.status.success() && err.contains("permission denied"),
            "etcdctl {args:?} was not refused: status {}, stdout {:?}, stderr {err:?}",
            out.status,
            String::from_utf8_lossy(&out.stdout)
        );
        Ok(())
    }
}

#[tokio::test]
async fn tenants_on_a_shared_datastore_reach_only_their_own_keys() -> anyhow::Result<()> {
    let cluster = DevCluster::shared().await?;
    let host = cluster.connect().await?;
    let p = vcp_dev::testing::platform(cluster, "vcp-datastore", 2).await?;
    let api = &p.admin;
    for name in ["ds-a", "ds-b"] {
        api.create_tenant_with_plan(name, SHARED_PLAN).await?;
    }
    let mut keys = Vec::new();
    let mut clients = Vec::new();
    for name in ["ds-a", "ds-b"] {
        let t = api.wait_ready(name, READY_TIMEOUT).await?;
        keys.push(t["key"].as_str().unwrap().to_owned());
        let kc = api.kubeconfig(name, "alice", &["admin"], "1h").await?;
        clients.push(tenant_client(&kc).await?);
    }
    let (key_a, key_b) = (&keys[0], &keys[1]);

    // One datastore of three members; neither tenant has an etcd of its own.
    let ds = "vcp-datastore-shared";
    let sts = Api::<StatefulSet>::namespaced(host.clone(), ds)
        .get("etcd")
        .await?;
    assert_eq!(sts.status.and_then(|s| s.ready_replicas), Some(3));
    for key in &keys {
        let own = Api::<StatefulSet>::namespaced(host.clone(), &format!("vcp-{key}"))
            .get_opt("etcd")
            .await?;
        assert!(own.is_none(), "tenant {key} has an etcd of its own");
    }

    // Each tenant's objects are its own.
    let cms_a: Api<ConfigMap> = Api::namespaced(clients[0].clone(), "default");
    let cms_b: Api<ConfigMap> = Api::namespaced(clients[1].clone(), "default");
    let cm = |n: &str| -> anyhow::Result<ConfigMap> {
        Ok(serde_json::from_value(
            json!({"metadata": {"name": n}, "data": {"owner": n}}),
        )?)
    };
    cms_a.create(&PostParams::default(), &cm("only-a")?).await?;
    cms_b.create(&PostParams::default(), &cm("only-b")?).await?;
    assert!(cms_b.get_opt("only-a").await?.is_none());
    assert!(cms_a.get_opt("only-b").await?.is_none());

    // Below the apiservers: tenant A's own etcd credentials, as its apiserver holds them.
    let member = Api::<Pod>::namespaced(host.clone(), ds)
        .get("etcd-0")
        .await?
        .status
        .and_then(|s| s.pod_ip)
        .ok_or_else(|| anyhow::anyhow!("etcd-0 has no address"))?;
    let endpoint = format!("https://{member}:2379");
    let dir = tempfile::tempdir()?;
    let secret_of = |ns: String, name: &'static str| {
        let host = host.clone();
        async move { Api::<Secret>::namespaced(host, &ns).get(name).await }
    };
    let a_secret = secret_of(format!("vcp-{key_a}"), "apiserver-etcd-client").await?;
    let as_a = Etcdctl::new(&endpoint, &a_secret, dir.path(), "a")?;
    let own = as_a.ok(&[
        "get",
        &format!("/vcp/{key_a}/configmaps/default/only-a"),
        "--print-value-only",
    ])?;
    assert!(own.contains("only-a"), "A reads its own ConfigMap: {own:?}");
    as_a.refused(&["get", &format!("/vcp/{key_b}/"), "--prefix", "--keys-only"])?;
    as_a.refused(&["get", &format!("/vcp/{key_b}/configmaps/default/only-b")])?;
    as_a.refused(&["put", &format!("/vcp/{key_b}/configmaps/default/x"), "y"])?;
    as_a.refused(&["del", "/vcp/", "--prefix"])?;
    as_a.refused(&["get", "/registry/", "--prefix", "--keys-only"])?;
    // A key that only starts like A's is not A's.
    as_a.refused(&["put", &format!("/vcp/{key_a}x/evil"), "y"])?;

    // Deleting A takes its user and its keys; B goes on.
    api.delete_tenant("ds-a").await?;
    let root_secret = secret_of(ds.to_owned(), "etcd-root").await?;
    let as_root = Etcdctl::new(&endpoint, &root_secret, dir.path(), "root")?;
    eventually(
        "A's user and keys gone from the datastore",
        Duration::from_secs(240),
        || async {
            let users = as_root.ok(&["user", "list"])?;
            let left = as_root.ok(&[
                "get",
                &format!("/vcp/{key_a}/"),
                "--prefix",
                "--count-only",
                "--write-out=fields",
            ])?;
            let gone =
                !users.contains(&format!("tenant-{key_a}")) && left.contains("\"Count\" : 0");
            Ok(gone.then_some(()))
        },
    )
    .await?;
    let out = as_a.run(&["get", &format!("/vcp/{key_a}/"), "--prefix", "--keys-only"])?;
    assert!(
        !out.status.success(),
        "a deleted tenant's certificate reads nothing"
    );
    let b_keys = as_root.ok(&["get", &format!("/vcp/{key_b}/"), "--prefix", "--keys-only"])?;
    assert!(b_keys.contains("only-b"), "B's keys stay: {b_keys}");
    cms_b.create(&PostParams::default(), &cm("after")?).await?;
    let listed = Api::<Pod>::namespaced(host.clone(), ds)
        .list(&ListParams::default())
        .await?;
    println!(
        "datastore pods: {:?}",
        listed
            .items
            .iter()
            .filter_map(|p| p.metadata.name.clone())
            .collect::<Vec<_>>()
    );
    Ok(())
}
