//! Encryption at rest of a tenant's Secrets (and, on plan `encrypted-configmaps`, ConfigMaps),
//! against a real `vcp serve`, a real tenant apiserver and its real etcd on the dev cluster.
//! What is stored is read from etcd itself (its JSON gateway on the client port, with the
//! apiserver's etcd client certificate, as the snapshot Jobs read it), not through the
//! apiserver: every value must carry the provider's prefix and no plaintext. A key rotation
//! runs with clients reading a Secret and a ConfigMap every 200 ms, which count failures (the
//! target is zero), and Secrets written in each phase; after it, no value in etcd is under the
//! old key, and the inventory holds both keys, sealed, the old one retired.

use base64::Engine as _;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::api::{Api, PostParams};
use reqwest::Method;
use serde_json::{Value, json};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};
use vcp_dev::cluster::DevCluster;
use vcp_dev::platform::{DEV_INVENTORY_KEY, ENCRYPTED_CONFIGMAPS_PLAN};
use vcp_dev::testing;
use vcp_orchestrator::encryption::store::KeyRow;
use vcp_orchestrator::pki::seal::{InventoryKey, associated_data};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// A client of one tenant's etcd member `etcd-0`, as the tenant apiserver connects to it.
struct Etcd {
    http: reqwest::Client,
    url: String,
}

impl Etcd {
    /// Reads the apiserver's etcd client certificate and the member's pod address from the host.
    async fn connect(host: &kube::Client, ns: &str) -> anyhow::Result<Etcd> {
        let s = Api::<Secret>::namespaced(host.clone(), ns)
            .get("apiserver-etcd-client")
            .await?;
        let field = |k: &str| -> anyhow::Result<Vec<u8>> {
            Ok(s.data
                .as_ref()
                .and_then(|d| d.get(k))
                .ok_or_else(|| anyhow::anyhow!("apiserver-etcd-client has no {k}"))?
                .0
                .clone())
        };
        let mut identity = field("tls.crt")?;
        identity.push(b'\n');
        identity.extend(field("tls.key")?);
        let ip: IpAddr = Api::<Pod>::namespaced(host.clone(), ns)
            .get("etcd-0")
            .await?
            .status
            .and_then(|s| s.pod_ip)
            .ok_or_else(|| anyhow::anyhow!("etcd-0 has no address"))?
            .parse()?;
        // The member's certificate names it, not its pod address.
        let name = format!("etcd-0.etcd.{ns}.svc");
        let http = reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(&field("ca.crt")?)?)
            .identity(reqwest::Identity::from_pem(&identity)?)
            .resolve(&name, SocketAddr::new(ip, 2379))
            .timeout(Duration::from_secs(20))
            .build()?;
        Ok(Etcd {
            http,
            url: format!("https://{name}:2379"),
        })
    }

    /// Every (key, value) under `prefix`, as etcd stores them.
    async fn prefix(&self, prefix: &str) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
        let mut end = prefix.as_bytes().to_vec();
        *end.last_mut().expect("a prefix") += 1;
        let answer: Value = self
            .http
            .post(format!("{}/v3/kv/range", self.url))
            .json(&json!({"key": B64.encode(prefix), "range_end": B64.encode(&end)}))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        let mut out = Vec::new();
        for kv in answer["kvs"].as_array().into_iter().flatten() {
            let key = String::from_utf8(B64.decode(kv["key"].as_str().unwrap_or_default())?)?;
            out.push((key, B64.decode(kv["value"].as_str().unwrap_or_default())?));
        }
        Ok(out)
    }
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

/// Asserts every value under `prefix` is stored encrypted with key `key` and none holds a
/// marker; the number of values.
async fn all_under(
    etcd: &Etcd,
    prefix: &str,
    key: &str,
    markers: &[String],
) -> anyhow::Result<usize> {
    let want = vcp_orchestrator::render::encryption::stored_prefix(key);
    let values = etcd.prefix(prefix).await?;
    for (k, v) in &values {
        assert!(
            v.starts_with(want.as_bytes()),
            "{k} is not stored under {want}: {:?}",
            String::from_utf8_lossy(&v[..v.len().min(40)])
        );
        for m in markers {
            assert!(!contains(v, m), "{k} holds {m} in plaintext");
        }
    }
    Ok(values.len())
}

/// The keys the host Secret `encryption-config` gives the apiserver, in order, as (provider,
/// key name) with `identity` as ("identity", "").
async fn configured(host: &kube::Client, ns: &str) -> anyhow::Result<Vec<(String, String)>> {
    let s = Api::<Secret>::namespaced(host.clone(), ns)
        .get("encryption-config")
        .await?;
    let yaml = &s.data.unwrap_or_default()["encryption.yaml"].0;
    let doc: Value = serde_yaml::from_slice(yaml)?;
    let mut out = Vec::new();
    for p in doc["resources"][0]["providers"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if p.get("identity").is_some() {
            out.push(("identity".into(), String::new()));
        }
        for k in p["secretbox"]["keys"].as_array().into_iter().flatten() {
            out.push(("secretbox".into(), k["name"].as_str().unwrap_or("").into()));
        }
    }
    Ok(out)
}

/// The tenant's keys as the inventory holds them: (name, retired, the key opened).
async fn inventory_keys(
    database_url: &str,
    tenant: &str,
) -> anyhow::Result<Vec<(String, bool, Vec<u8>)>> {
    let pool = sqlx::PgPool::connect(database_url).await?;
    let rows: Vec<KeyRow> = sqlx::query_as(
        "SELECT k.* FROM encryption_keys k JOIN tenants t ON t.id = k.tenant_id
         WHERE t.name = $1 AND t.deleted_at IS NULL ORDER BY k.id",
    )
    .bind(tenant)
    .fetch_all(&pool)
    .await?;
    let kek = InventoryKey::from_base64(DEV_INVENTORY_KEY)?;
    let mut out = Vec::new();
    for k in rows {
        let key = kek.open(&k.name, &k.sealed(), &associated_data(k.tenant_id, &k.name))?;
        assert_eq!(key.len(), 32);
        out.push((k.name, k.retired_at.is_some(), key));
    }
    Ok(out)
}

/// Creates Secret and ConfigMap `name` in `apps`, each holding a fresh marker: (name, marker).
async fn write(
    secrets: &Api<Secret>,
    cms: &Api<ConfigMap>,
    name: &str,
) -> anyhow::Result<(String, String)> {
    let marker = format!(
        "plaintext-{name}-{}",
        &vcp_dev::platform::new_token()[4..20]
    );
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": name}, "stringData": {"password": marker}}),
            )?,
        )
        .await?;
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": name}, "data": {"v": marker}}))?,
    )
    .await?;
    Ok((name.to_owned(), marker))
}

#[tokio::test]
async fn secrets_are_encrypted_in_etcd_and_a_key_rotation_rewrites_them_without_a_failed_request()
-> anyhow::Result<()> {
    let cluster = DevCluster::shared().await?;
    let p = testing::platform(cluster, "vcp-encryption", 2).await?;
    let api = &p.admin;
    let host = cluster.connect().await?;
    api.create_tenant_with_plan("vault", ENCRYPTED_CONFIGMAPS_PLAN)
        .await?;
    let t = api.wait_ready("vault", Duration::from_secs(300)).await?;
    let ns = format!("vcp-{}", t["key"].as_str().unwrap_or_default());
    let kubeconfig = p.dir.path().join("vault-admin");
    std::fs::write(
        &kubeconfig,
        api.kubeconfig("vault", "vault-admin", &["admin"], "2h")
            .await?,
    )?;
    let tenant = vcp_dev::cluster::client_from(&kubeconfig).await?;
    testing::namespace(&tenant, "apps").await?;
    let secrets: Api<Secret> = Api::namespaced(tenant.clone(), "apps");
    let cms: Api<ConfigMap> = Api::namespaced(tenant.clone(), "apps");
    // (name, marker): a Secret and a ConfigMap of that name each hold the marker.
    let mut written: Vec<(String, String)> = Vec::new();
    written.push(write(&secrets, &cms, "sealed").await?);
    let markers =
        |w: &[(String, String)]| -> Vec<String> { w.iter().map(|(_, m)| m.clone()).collect() };

    // The first key: made with the tenant, the only key the apiserver writes with.
    assert_eq!(
        configured(&host, &ns).await?,
        [
            ("secretbox".into(), "key1".into()),
            ("identity".into(), String::new())
        ]
    );
    let keys = inventory_keys(&p.database_url, "vault").await?;
    assert_eq!(keys.len(), 1);
    assert_eq!((keys[0].0.as_str(), keys[0].1), ("key1", false));
    let etcd = Etcd::connect(&host, &ns).await?;
    let stored = etcd.prefix("/registry/secrets/apps/sealed").await?;
    assert_eq!(stored.len(), 1, "the Secret is in etcd");
    let n_secrets = all_under(&etcd, "/registry/secrets/", "key1", &markers(&written)).await?;
    let n_cms = all_under(&etcd, "/registry/configmaps/", "key1", &markers(&written)).await?;
    println!("before the rotation: {n_secrets} Secrets and {n_cms} ConfigMaps under key1");
    // Only what the plan names is encrypted: a Service is not.
    let services = etcd
        .prefix("/registry/services/specs/default/kubernetes")
        .await?;
    assert!(
        services.iter().all(|(_, v)| !v.starts_with(b"k8s:enc:")),
        "Services are not encrypted"
    );

    // The rotation, with both kinds read throughout and a Secret written in each phase.
    let apiserver_before = Api::<Deployment>::namespaced(host.clone(), &ns)
        .get("kube-apiserver")
        .await?
        .metadata
        .generation;
    let secret_reader = testing::Poller::start_for(secrets.clone(), "sealed");
    let cm_reader = testing::Poller::start(cms.clone(), "sealed");
    let (code, r) = api
        .raw(
            Method::POST,
            "/v1/tenants/vault/rotate",
            Some(&json!({"target": "encryption-key"})),
        )
        .await?;
    assert_eq!(code, 202, "{r}");
    assert_eq!(r["target"], "encryption-key");
    let id = r["id"].as_i64().unwrap_or_default();
    let since = Instant::now();
    let mut seen = Vec::new();
    loop {
        let (code, list) = api
            .raw(Method::GET, "/v1/tenants/vault/rotations", None)
            .await?;
        anyhow::ensure!(code == 200, "{code}: {list}");
        let r = list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|r| r["id"] == id)
            .cloned()
            .unwrap_or_default();
        let phase = r["phase"].as_str().unwrap_or_default().to_owned();
        if seen.last() != Some(&phase) {
            eprintln!("  {:>6.1}s phase {phase}", since.elapsed().as_secs_f64());
            if phase != "done" {
                written.push(write(&secrets, &cms, &format!("during-{phase}")).await?);
                // What the apiserver is told in this phase (once its pass wrote it).
                eprintln!("           configured: {:?}", configured(&host, &ns).await?);
            }
            seen.push(phase.clone());
        }
        if phase == "done" {
            break;
        }
        anyhow::ensure!(
            since.elapsed() < Duration::from_secs(600),
            "rotation {id} still in {phase}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let took = since.elapsed();
    let (s_ok, s_failed) = secret_reader.finish().await?;
    let (c_ok, c_failed) = cm_reader.finish().await?;
    println!(
        "encryption-key rotation took {:.0}s through {seen:?}: Secret reads {s_ok} answered / \
         {s_failed} failed, ConfigMap reads {c_ok} answered / {c_failed} failed",
        took.as_secs_f64()
    );
    assert!(s_ok > 0 && c_ok > 0, "a reader never got an answer");
    assert_eq!((s_failed, c_failed), (0, 0), "no read failed");

    // Nothing is stored under the old key; everything, old and new, under the new one.
    let n_secrets = all_under(&etcd, "/registry/secrets/", "key2", &markers(&written)).await?;
    let n_cms = all_under(&etcd, "/registry/configmaps/", "key2", &markers(&written)).await?;
    println!("after the rotation: {n_secrets} Secrets and {n_cms} ConfigMaps, all under key2");
    assert_eq!(
        configured(&host, &ns).await?,
        [
            ("secretbox".into(), "key2".into()),
            ("identity".into(), String::new())
        ],
        "the old key is gone from the apiserver's configuration"
    );
    // And every object still reads back as written.
    for (name, m) in &written {
        let s = secrets.get(name).await?;
        assert_eq!(
            s.data.unwrap_or_default()["password"].0,
            m.as_bytes(),
            "{name}"
        );
        assert_eq!(cms.get(name).await?.data.unwrap_or_default()["v"], *m);
    }
    // The inventory holds both keys sealed, the old one retired (older snapshots need it).
    let keys = inventory_keys(&p.database_url, "vault").await?;
    let names: Vec<(&str, bool)> = keys.iter().map(|(n, r, _)| (n.as_str(), *r)).collect();
    assert_eq!(names, [("key1", true), ("key2", false)]);
    assert_ne!(keys[0].2, keys[1].2, "a new key, not the old one again");
    // The rotation rolled the apiserver (trust, sign, retire change its configuration).
    let apiserver_after = Api::<Deployment>::namespaced(host.clone(), &ns)
        .get("kube-apiserver")
        .await?
        .metadata
        .generation;
    assert!(
        apiserver_after > apiserver_before,
        "{apiserver_before:?} -> {apiserver_after:?}"
    );
    // Each step is audited.
    let (code, audit) = api
        .raw(Method::GET, "/v1/audit?tenant=vault&limit=1000", None)
        .await?;
    anyhow::ensure!(code == 200, "{code}: {audit}");
    let actions: Vec<&str> = audit["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["action"].as_str())
        .collect();
    for a in [
        "tenant.encryption-key.create",
        "tenant.rotate",
        "tenant.rotate.phase",
        "tenant.encryption-key.retire",
        "tenant.rotate.done",
    ] {
        assert!(actions.contains(&a), "{a} not in {actions:?}");
    }
    Ok(())
}

/// The repository's templates in `dir` with the apiserver's `--encryption-provider-config`
/// left out: the apiserver of a vcp from before encryption at rest, which stores Secrets as
/// they come.
fn templates_without_encryption(dir: &std::path::Path) -> anyhow::Result<()> {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../templates");
    for f in std::fs::read_dir(&src)? {
        let f = f?;
        let text = std::fs::read_to_string(f.path())?;
        let text: String = text
            .lines()
            .filter(|l| !l.contains("--encryption-provider-config="))
            .map(|l| format!("{l}\n"))
            .collect();
        std::fs::write(dir.join(f.file_name()), text)?;
    }
    Ok(())
}

#[tokio::test]
async fn a_tenant_from_before_encryption_gets_its_first_key_through_a_rotation_that_loses_no_read()
-> anyhow::Result<()> {
    let cluster = DevCluster::shared().await?;
    let host = cluster.connect().await?;
    let templates = tempfile::tempdir()?;
    templates_without_encryption(templates.path())?;
    // The vcp of before: its apiserver stores plaintext.
    let mut p = testing::platform_with(
        cluster,
        "vcp-encryption-upgrade",
        2,
        vec![(
            "VCP_TEMPLATES".into(),
            templates.path().to_string_lossy().into_owned(),
        )],
    )
    .await?;
    p.admin.create_tenant("legacy").await?;
    let t = p
        .admin
        .wait_ready("legacy", Duration::from_secs(300))
        .await?;
    let ns = format!("vcp-{}", t["key"].as_str().unwrap_or_default());
    let kubeconfig = p.dir.path().join("legacy-admin");
    std::fs::write(
        &kubeconfig,
        p.admin
            .kubeconfig("legacy", "legacy-admin", &["admin"], "2h")
            .await?,
    )?;
    let tenant = vcp_dev::cluster::client_from(&kubeconfig).await?;
    testing::namespace(&tenant, "apps").await?;
    let secrets: Api<Secret> = Api::namespaced(tenant.clone(), "apps");
    let cms: Api<ConfigMap> = Api::namespaced(tenant.clone(), "apps");
    let (_, marker) = write(&secrets, &cms, "old").await?;
    let etcd = Etcd::connect(&host, &ns).await?;
    let stored = etcd.prefix("/registry/secrets/apps/old").await?;
    assert!(
        stored.len() == 1 && contains(&stored[0].1, &marker),
        "the vcp of before stores Secrets in plaintext"
    );
    // ... and had no key: the key this build made for the tenant goes, as if it never was.
    let pool = sqlx::PgPool::connect(&p.database_url).await?;
    sqlx::query("DELETE FROM encryption_keys")
        .execute(&pool)
        .await?;

    // The upgrade: this vcp over the same inventory, with its own templates.
    p.orchestrator.proc.stop(Duration::from_secs(5));
    let reader = testing::Poller::start_for(secrets.clone(), "old");
    let orch = testing::replica(
        cluster,
        p.dir.path(),
        &p.database_url,
        &p.admin_token,
        "vcp-encryption-upgraded",
    )
    .await?;
    let api = vcp_dev::platform::ApiClient::new(&orch.url, &p.admin_token);
    // A Ready tenant's next pass is at most 5 minutes away (its periodic re-check), which is
    // when an upgraded vcp reaches it; the test does not wait that long.
    sqlx::query("UPDATE tenants SET next_reconcile_at = now()")
        .execute(&pool)
        .await?;
    let since = Instant::now();
    let mut seen: Vec<String> = Vec::new();
    let r = loop {
        let (code, list) = api
            .raw(Method::GET, "/v1/tenants/legacy/rotations", None)
            .await?;
        anyhow::ensure!(code == 200, "{code}: {list}");
        let r = list["items"].as_array().and_then(|l| l.first()).cloned();
        if let Some(r) = &r {
            let phase = r["phase"].as_str().unwrap_or_default().to_owned();
            if seen.last() != Some(&phase) {
                eprintln!(
                    "  {:>6.1}s phase {phase}: configured {:?}",
                    since.elapsed().as_secs_f64(),
                    configured(&host, &ns).await?
                );
                seen.push(phase.clone());
            }
            if phase == "done" {
                break r.clone();
            }
        }
        anyhow::ensure!(
            since.elapsed() < Duration::from_secs(600),
            "no finished rotation after {:?}: {list}",
            since.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let (ok, failed) = reader.finish().await?;
    println!(
        "first key by rotation took {:.0}s through {seen:?}: Secret reads {ok} answered / {failed} failed",
        since.elapsed().as_secs_f64()
    );
    assert_eq!(r["target"], "encryption-key");
    assert!(
        r["requested_by"]
            .as_str()
            .is_some_and(|b| b.starts_with("reconciler/vcp-encryption-upgraded/")),
        "vcp's reconciler started it: {r}"
    );
    assert!(ok > 0);
    assert_eq!(failed, 0, "no read failed");
    // The plaintext Secret is now stored encrypted, with every other one.
    let n = all_under(
        &etcd,
        "/registry/secrets/",
        "key1",
        std::slice::from_ref(&marker),
    )
    .await?;
    println!("after: {n} Secrets under key1");
    assert_eq!(
        secrets.get("old").await?.data.unwrap_or_default()["password"].0,
        marker.as_bytes()
    );
    assert_eq!(
        configured(&host, &ns).await?,
        [
            ("secretbox".into(), "key1".into()),
            ("identity".into(), String::new())
        ]
    );
    let keys = inventory_keys(&p.database_url, "legacy").await?;
    assert_eq!(keys.len(), 1);
    assert_eq!((keys[0].0.as_str(), keys[0].1), ("key1", false));
    drop(orch);
    Ok(())
}
