//! Backups off the host on the dev cluster, against its real S3 server (s3s-fs): a snapshot is
//! uploaded sealed (the object's bytes are not the file's, and opening them with the tenant's
//! backup key gives the file with the recorded SHA-256) and its copy on the claim removed; a
//! restore brings the data back from the object; and the backup sweep prunes exactly the scheduled
//! backups past the plan's `hourly: 2`.

use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolume, PersistentVolumeClaim, Secret};
use kube::Client;
use kube::api::{Api, DeleteParams, PostParams};
use reqwest::Method;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use std::time::{Duration, Instant};
use vcp_dev::cluster::DevCluster;
use vcp_dev::platform::{ApiClient, BACKED_UP_PLAN};
use vcp_dev::testing::eventually;
use vcp_orchestrator::snapshots::offsite::{Credentials, Store, parse_location};
use vcp_orchestrator::snapshots::sealed;

const READY_TIMEOUT: Duration = Duration::from_secs(240);
const DONE_TIMEOUT: Duration = Duration::from_secs(300);
/// In a ConfigMap of the tenant, so in its etcd snapshot in the clear (ConfigMaps are not
/// encrypted at rest on this plan): it must not show in the object.
const MARKER: &str = "backup-marker-5f1c0d9e-plaintext";

async fn tenant_client(kubeconfig: &str) -> anyhow::Result<Client> {
    let kc = kube::config::Kubeconfig::from_yaml(kubeconfig)?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
    Ok(Client::try_from(cfg)?)
}

async fn snapshot(api: &ApiClient, name: &str, id: i64) -> anyhow::Result<Value> {
    let (s, l) = api
        .raw(Method::GET, &format!("/v1/tenants/{name}/snapshots"), None)
        .await?;
    anyhow::ensure!(s == 200, "list: {s} {l}");
    l["snapshots"]
        .as_array()
        .and_then(|a| a.iter().find(|s| s["id"] == id).cloned())
        .ok_or_else(|| anyhow::anyhow!("no snapshot {id}: {l}"))
}

/// The password of the Secret `creds` the test wrote, as the tenant of `c` reads it.
async fn read_creds(c: Client) -> anyhow::Result<Vec<u8>> {
    let s = Api::<Secret>::namespaced(c, "default").get("creds").await?;
    Ok(s.data.unwrap()["password"].0.clone())
}

/// Waits until clone `name` is Ready and checks that it holds its source's objects (the marker
/// ConfigMap, and the Secret, which opens only with the source's key); a client of it.
/// Waits until retention deleted `gone` (what, object) from the store, lets a few more sweeps
/// run, and checks that each of `kept` is still there.
async fn pruned_then_kept(
    store: &Store,
    gone: (&str, &str),
    kept: &[(&str, &str)],
) -> anyhow::Result<()> {
    eventually(
        &format!("{} pruned", gone.0),
        Duration::from_secs(60),
        || async { Ok((!store.exists(gone.1).await?).then_some(())) },
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(6)).await;
    for (what, object) in kept {
        assert!(store.exists(object).await?, "{what} is kept");
    }
    Ok(())
}

async fn ready_with_the_data(api: &ApiClient, name: &str) -> anyhow::Result<Client> {
    api.wait_ready(name, DONE_TIMEOUT).await?;
    let c = tenant_client(&api.kubeconfig(name, "alice", &["admin"], "1h").await?).await?;
    let cm = Api::<ConfigMap>::namespaced(c.clone(), "default")
        .get("marker")
        .await?;
    assert_eq!(
        cm.data.unwrap()["k"],
        MARKER,
        "{name}: the source's objects"
    );
    assert_eq!(
        read_creds(c.clone()).await?,
        b"hunter2",
        "{name}: the Secret"
    );
    Ok(c)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test]
async fn snapshots_go_to_s3_sealed_restore_from_there_and_expire() -> anyhow::Result<()> {
    let cluster = DevCluster::shared().await?;
    // A client of this test's runtime: the tests of this binary run side by side.
    let host = cluster.connect().await?;
    let prefix = "vcp-backup";
    let p = vcp_dev::testing::platform_with_backups(
        cluster,
        prefix,
        2,
        vec![("VCP_BACKUP_SWEEP_SECONDS".into(), "2".into())],
    )
    .await?;
    let api = &p.admin;
    let name = "bk";
    let t = api.create_tenant_with_plan(name, BACKED_UP_PLAN).await?;
    let key = t["key"].as_str().unwrap().to_owned();
    let ns = format!("vcp-{key}");
    api.wait_ready(name, READY_TIMEOUT).await?;
    let kubeconfig = api.kubeconfig(name, "alice", &["admin"], "1h").await?;
    let cms: Api<ConfigMap> = Api::namespaced(tenant_client(&kubeconfig).await?, "default");
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "marker"}, "data": {"k": MARKER}}))?;
    cms.create(&PostParams::default(), &cm).await?;
    // Encrypted at rest with the tenant's key: a clone reads it only with that key.
    let creds: Secret = serde_json::from_value(
        json!({"metadata": {"name": "creds"}, "stringData": {"password": "hunter2"}}),
    )?;
    Api::<Secret>::namespaced(tenant_client(&kubeconfig).await?, "default")
        .create(&PostParams::default(), &creds)
        .await?;

    // A snapshot, uploaded by its Job.
    let started = Instant::now();
    let snap = api.take_snapshot(name, DONE_TIMEOUT).await?;
    let id = snap["id"].as_i64().unwrap();
    eprintln!(
        "snapshot {id} taken and uploaded in {:.1}s: {snap}",
        started.elapsed().as_secs_f64()
    );
    let location = snap["location"].as_str().unwrap();
    eventually(
        "BackedUp True on the tenant",
        Duration::from_secs(60),
        || async {
            let t = api.get_tenant(name).await?.unwrap_or_default();
            Ok(t["conditions"]
                .as_array()
                .and_then(|a| a.iter().find(|c| c["type"] == "BackedUp").cloned())
                .filter(|c| {
                    c["status"] == "True" && c["message"] == format!("snapshot {id} taken")
                }))
        },
    )
    .await?;
    let s3 = cluster.state().s3.clone().expect("the dev cluster runs S3");
    let want = format!("s3://{}/{prefix}/{key}/snapshot-{id}.db.enc", s3.bucket);
    assert_eq!(location, want);
    let (access, secret) = s3.credentials()?;
    let store = Store::new(
        &s3.endpoint,
        &s3.bucket,
        "us-east-1",
        &Credentials {
            access_key_id: access,
            secret_access_key: secret,
        },
    )?;
    let (_, object) = parse_location(location).unwrap();
    let sealed_bytes = store.get(object).await?;
    let recorded = snap["sha256"].as_str().unwrap();
    assert!(
        !sealed_bytes
            .windows(MARKER.len())
            .any(|w| w == MARKER.as_bytes()),
        "the object shows the tenant's data in the clear"
    );
    assert_ne!(
        hex(&Sha256::digest(&sealed_bytes)),
        recorded,
        "stored as is"
    );
    assert_eq!(
        sealed_bytes.len() as u64,
        sealed::sealed_len(snap["size_bytes"].as_u64().unwrap())
    );
    // Opened with the tenant's backup key (which its header names), it is the file.
    let key_id = sealed::key_id(&sealed_bytes).expect("a vcp-backup-v1 header");
    let secrets: Api<Secret> = Api::namespaced(host.clone(), &ns);
    let backup = secrets.get("vcp-backup").await?;
    let tenant_key: [u8; 32] = backup.data.as_ref().unwrap()[&format!("key-{key_id}")]
        .0
        .as_slice()
        .try_into()?;
    let mut opener = sealed::Opener::new(&tenant_key, key_id);
    let mut plain = opener.push(&sealed_bytes)?;
    plain.extend(opener.finish()?);
    assert_eq!(hex(&Sha256::digest(&plain)), recorded);
    assert!(
        plain.windows(MARKER.len()).any(|w| w == MARKER.as_bytes()),
        "the snapshot holds the marker (so its absence above means something)"
    );
    // Another key does not open it.
    let mut wrong = tenant_key;
    wrong[0] ^= 1;
    let mut o = sealed::Opener::new(&wrong, key_id);
    assert!(o.push(&sealed_bytes).and_then(|_| o.finish()).is_err());

    // Uploaded, the claim's copy is gone (with its report): a restore must come from the store.
    let claim: PersistentVolumeClaim = Api::namespaced(host.clone(), &ns)
        .get("etcd-snapshots")
        .await?;
    let pv: PersistentVolume = Api::all(host.clone())
        .get(claim.spec.unwrap().volume_name.as_deref().unwrap())
        .await?;
    let dir = std::path::PathBuf::from(pv.spec.unwrap().host_path.unwrap().path);
    let file = dir.join(format!("snapshot-{id}.db"));
    let left: Vec<_> = std::fs::read_dir(&dir)?
        .filter_map(|e| e.ok().map(|e| e.file_name()))
        .collect();
    // (Only this one: the plan's hourly backup may be on its way through the claim now.)
    assert!(
        left.iter().all(|f| {
            let f = f.to_string_lossy();
            f != format!("snapshot-{id}.db") && f != format!("snapshot-{id}.db.report")
        }),
        "the claim keeps an uploaded snapshot: {left:?}"
    );
    cms.delete("marker", &DeleteParams::default()).await?;
    let started = Instant::now();
    api.restore(name, id, DONE_TIMEOUT).await?;
    eprintln!(
        "restore from s3 took {:.1}s",
        started.elapsed().as_secs_f64()
    );
    assert!(file.exists(), "fetched back onto the claim");
    let cms: Api<ConfigMap> = Api::namespaced(tenant_client(&kubeconfig).await?, "default");
    let back = eventually("the marker back", Duration::from_secs(60), || async {
        Ok(cms.get_opt("marker").await.ok().flatten())
    })
    .await?;
    assert_eq!(back.data.unwrap()["k"], MARKER);

    // A clone of the uploaded snapshot: refused when it cannot be one, each with its reason.
    let from = format!("{name}/{id}");
    let clone_body =
        |from: &str| json!({"name": "bk-clone", "plan": BACKED_UP_PLAN, "from_snapshot": from});
    let eve = api.new_owner("eve").await?;
    let other_minor = if t["version"] == "1.36" {
        "1.37"
    } else {
        "1.36"
    };
    let mut other_version = clone_body(&from);
    other_version["version"] = json!(other_minor);
    for (who, body, field, why) in [
        (api, clone_body(name), "from_snapshot", "not TENANT/N"),
        (
            api,
            clone_body(&format!("{name}/999")),
            "from_snapshot",
            "no such snapshot",
        ),
        (
            &eve,
            clone_body(&from),
            "from_snapshot",
            "another owner's tenant",
        ),
        (api, other_version, "version", "not the snapshot's version"),
    ] {
        let (s, b) = who.raw(Method::POST, "/v1/tenants", Some(&body)).await?;
        assert_eq!((s, b["field"].as_str()), (422, Some(field)), "{why}: {b}");
    }
    let started = Instant::now();
    let (s, clone) = api
        .raw(Method::POST, "/v1/tenants", Some(&clone_body(&from)))
        .await?;
    assert_eq!(s, 201, "{clone}");
    assert_eq!(
        clone["version"], t["version"],
        "a clone runs its snapshot's version"
    );
    let cloned = ready_with_the_data(api, "bk-clone").await?;
    eprintln!(
        "clone created and Ready with the snapshot's data in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    // Its snapshot 1 is the source's object (not copied), restored once.
    let copy = snapshot(api, "bk-clone", 1).await?;
    assert_eq!(
        (
            copy["state"].as_str(),
            copy["location"].as_str(),
            copy["sha256"].as_str()
        ),
        (Some("Succeeded"), Some(location), Some(recorded)),
        "{copy}"
    );
    let listed = api.snapshots("bk-clone").await?;
    let restores = listed["restores"].as_array().cloned().unwrap_or_default();
    assert_eq!(restores.len(), 1, "{listed}");
    assert_eq!(
        (
            restores[0]["snapshot"].as_i64(),
            restores[0]["state"].as_str()
        ),
        (Some(1), Some("Succeeded")),
        "{listed}"
    );
    // Then a key of its own: an encryption-key rotation started by vcp.
    let (s, rotations) = api
        .raw(Method::GET, "/v1/tenants/bk-clone/rotations", None)
        .await?;
    assert_eq!(s, 200, "{rotations}");
    let own_key = eventually(
        "the clone's own key rotation",
        Duration::from_secs(60),
        || async {
            let (_, r) = api
                .raw(Method::GET, "/v1/tenants/bk-clone/rotations", None)
                .await?;
            Ok(r["items"]
                .as_array()
                .and_then(|a| a.iter().find(|r| r["target"] == "encryption-key").cloned()))
        },
    )
    .await?;
    assert!(
        own_key["requested_by"]
            .as_str()
            .is_some_and(|r| r.starts_with("reconciler/")),
        "{own_key}"
    );

    let db = sqlx::PgPool::connect(&p.database_url).await?;
    let tenant_id: i64 = sqlx::query_scalar("SELECT id FROM tenants WHERE key = $1")
        .bind(&key)
        .fetch_one(&db)
        .await?;

    // The source's side (retention, then its deletion) and the clone's (its own key, a
    // tampered restore, its own schedule) touch different tenants: side by side.
    let source_side = async {
        // Retention: the plan keeps the newest two hourly backups. Beside the one the sweep took
        // for this hour, two older hours' backups (as earlier sweeps would have left them).
        let this_hour = eventually("this hour's scheduled backup", DONE_TIMEOUT, || async {
            let row: Option<(i64, String, String)> = sqlx::query_as(
                "SELECT number, state, location FROM etcd_snapshots
                 WHERE tenant_id = $1 AND schedule = 'hourly' AND scheduled_for = date_trunc('hour', now())",
            )
            .bind(tenant_id)
            .fetch_optional(&db)
            .await?;
            Ok(row.filter(|r| r.1 != "Pending"))
        })
        .await?;
        assert_eq!(this_hour.1, "Succeeded", "{this_hour:?}");
        let mut older = Vec::new();
        for (hours, number) in [(1i64, 9001i64), (2, 9002)] {
            let object = format!("{prefix}/{key}/snapshot-{number}.db.enc");
            store.put(&object, b"sealed bytes".to_vec()).await?;
            sqlx::query(
                "INSERT INTO etcd_snapshots (tenant_id, number, version, state, revision, size_bytes,
                   sha256, location, requested_by, schedule, scheduled_for, finished_at)
                 SELECT $1, $2, version, 'Succeeded', 1, 1, $3, $4, 'test', 'hourly',
                   date_trunc('hour', now()) - make_interval(hours => $5::int), now()
                 FROM tenants WHERE id = $1",
            )
            .bind(tenant_id)
            .bind(number)
            .bind("0".repeat(64))
            .bind(format!("s3://{}/{object}", s3.bucket))
            .bind(hours as i32)
            .execute(&db)
            .await?;
            older.push(object);
        }
        let (_, this_object) = parse_location(&this_hour.2)
            .map(|(b, k)| (b.to_owned(), k.to_owned()))
            .expect("uploaded");
        pruned_then_kept(
            &store,
            ("the oldest hourly backup", &older[1]),
            &[
                ("the second newest", &older[0]),
                ("this hour's", &this_object),
                ("an asked-for one, which never expires,", object),
            ],
        )
        .await?;
        let pruned: Vec<i64> = sqlx::query_scalar(
            "SELECT number FROM etcd_snapshots WHERE tenant_id = $1 AND pruned_at IS NOT NULL",
        )
        .bind(tenant_id)
        .fetch_all(&db)
        .await?;
        assert_eq!(pruned, [9002]);
        let gone = snapshot(api, name, 9002).await?;
        assert_eq!(
            (gone["schedule"].as_str(), gone["pruned_at"].is_string()),
            (Some("hourly"), true),
            "{gone}"
        );
        let (s, b) = api
            .raw(
                Method::POST,
                &format!("/v1/tenants/{name}/restore"),
                Some(&json!({"snapshot": 9002})),
            )
            .await?;
        assert_eq!(
            (s, b["field"].as_str()),
            (422, Some("snapshot")),
            "a pruned one: {b}"
        );

        // A deleted tenant's backups: cloned by its key, which names it for ever.
        api.delete_tenant(name).await?;
        eventually("bk gone", DONE_TIMEOUT, || async {
            Ok(api.get_tenant(name).await?.is_none().then_some(()))
        })
        .await?;
        // This hour's scheduled backup, restored into a new tenant from the store.
        let by_key = format!("{key}/{}", this_hour.0);
        // Refused: by its old name (it names no live tenant any more), and by its key for an
        // owner who does not own it.
        let by_old_name = format!("{name}/{}", this_hour.0);
        for (who, from, why) in [
            (api, &by_old_name, "by its old name"),
            (&eve, &by_key, "eve"),
        ] {
            let (s, b) = who
                .raw(
                    Method::POST,
                    "/v1/tenants",
                    Some(&json!({"name": "bk-again", "from_snapshot": from})),
                )
                .await?;
            assert_eq!(
                (s, b["field"].as_str()),
                (422, Some("from_snapshot")),
                "{why}: {b}"
            );
        }
        let (s, again) = api
            .raw(
                Method::POST,
                "/v1/tenants",
                Some(&json!({"name": "bk-again", "plan": BACKED_UP_PLAN, "from_snapshot": by_key})),
            )
            .await?;
        assert_eq!(s, 201, "{again}");
        let copy = snapshot(api, "bk-again", 1).await?;
        assert_eq!(
            copy["location"].as_str(),
            Some(this_hour.2.as_str()),
            "{copy}"
        );
        ready_with_the_data(api, "bk-again").await?;
        api.delete_tenant("bk-again").await?;
        // Its backups go once its plan's retention has passed: the hour before this one's, moved
        // three hours back (as if the tenant were deleted that long ago), is past its two hours;
        // the live rule alone (the two newest) would keep it.
        sqlx::query(
            "UPDATE etcd_snapshots SET scheduled_for = date_trunc('hour', now()) - interval '3 hours'
             WHERE tenant_id = $1 AND number = 9001",
        )
        .bind(tenant_id)
        .execute(&db)
        .await?;
        pruned_then_kept(
            &store,
            ("the deleted tenant's expired backup", &older[0]),
            &[
                ("one within retention", &this_object),
                ("an asked-for one, which never expires,", object),
            ],
        )
        .await?;
        // Past retention too (an hour before 9001's new slot), the one bk-again was cloned
        // from goes, and its copy with it.
        sqlx::query(
            "UPDATE etcd_snapshots SET scheduled_for = date_trunc('hour', now()) - interval '4 hours'
             WHERE tenant_id = $1 AND number = $2",
        )
        .bind(tenant_id)
        .bind(this_hour.0)
        .execute(&db)
        .await?;
        eventually(
            "bk-again's copy pruned with its source",
            Duration::from_secs(60),
            || async {
                let pruned: Option<bool> = sqlx::query_scalar(
                    "SELECT c.pruned_at IS NOT NULL FROM etcd_snapshots c
                     JOIN tenants t ON t.seed_snapshot_id = c.id WHERE t.name = 'bk-again'",
                )
                .fetch_optional(&db)
                .await?;
                Ok(pruned.filter(|p| *p))
            },
        )
        .await?;
        assert!(!store.exists(&this_object).await?, "the object is gone");
        anyhow::Ok(())
    };
    let clone_side = async {
        // The clone's own key: every Secret rewritten with it, the shared one retired.
        let clone_id: i64 = sqlx::query_scalar(
            "SELECT id FROM tenants WHERE name = 'bk-clone' AND deleted_at IS NULL",
        )
        .fetch_one(&db)
        .await?;
        eventually("the clone's rotation done", DONE_TIMEOUT, || async {
            let (_, r) = api
                .raw(Method::GET, "/v1/tenants/bk-clone/rotations", None)
                .await?;
            Ok(r["items"].as_array().and_then(|a| {
                a.iter()
                    .find(|r| r["id"] == own_key["id"] && r["phase"] == "done")
                    .cloned()
            }))
        })
        .await?;
        let keys: Vec<(String, bool, Option<i64>)> = sqlx::query_as(
            "SELECT name, retired_at IS NULL, rotation_id FROM encryption_keys
             WHERE tenant_id = $1 ORDER BY id",
        )
        .bind(clone_id)
        .fetch_all(&db)
        .await?;
        let source_keys: Vec<String> =
            sqlx::query_scalar("SELECT name FROM encryption_keys WHERE tenant_id = $1 ORDER BY id")
                .bind(tenant_id)
                .fetch_all(&db)
                .await?;
        assert_eq!(keys.len(), 2, "{keys:?}");
        assert_eq!(
            (keys[0].0.as_str(), keys[0].1),
            (source_keys[0].as_str(), false),
            "the shared key retired: {keys:?}"
        );
        assert_eq!(
            (keys[1].1, keys[1].2),
            (true, own_key["id"].as_i64()),
            "its own key live: {keys:?}"
        );
        assert_eq!(
            read_creds(cloned.clone()).await?,
            b"hunter2",
            "read under its own key"
        );

        // A backup changed in the store is refused at restore, and the tenant keeps its data.
        let snap = api.take_snapshot("bk-clone", DONE_TIMEOUT).await?;
        let n = snap["id"].as_i64().unwrap();
        let (_, object) = parse_location(snap["location"].as_str().unwrap()).unwrap();
        let mut bytes = store.get(object).await?;
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x01;
        store.put(object, bytes).await?;
        let (s, r) = api
            .raw(
                Method::POST,
                "/v1/tenants/bk-clone/restore",
                Some(&json!({"snapshot": n})),
            )
            .await?;
        assert_eq!(s, 202, "{r}");
        let failed = eventually("the tampered restore refused", DONE_TIMEOUT, || async {
            let l = api.snapshots("bk-clone").await?;
            Ok(l["restores"]
                .as_array()
                .and_then(|a| a.iter().find(|x| x["id"] == r["id"]).cloned())
                .filter(|x| x["state"] != "Running"))
        })
        .await?;
        eprintln!("tampered restore: {failed}");
        assert_eq!(failed["state"], "Failed", "{failed}");
        assert_eq!(failed["restored"], false, "{failed}");
        api.wait_ready("bk-clone", DONE_TIMEOUT).await?;
        let cm = eventually(
            "bk-clone's data after the refused restore",
            Duration::from_secs(60),
            || async {
                Ok(Api::<ConfigMap>::namespaced(cloned.clone(), "default")
                    .get_opt("marker")
                    .await
                    .ok()
                    .flatten())
            },
        )
        .await?;
        assert_eq!(cm.data.unwrap()["k"], MARKER);

        // A schedule of the tenant's own in place of its plan's `hourly: 2`: one daily backup,
        // no hourly ones (those it had are pruned at the next sweep).
        let (s, b) = api
            .raw(
                Method::PATCH,
                "/v1/tenants/bk-clone",
                Some(&json!({"backups": {"hourly": 1001}})),
            )
            .await?;
        assert_eq!((s, b["field"].as_str()), (422, Some("backups")), "{b}");
        let (s, b) = api
            .raw(
                Method::PATCH,
                "/v1/tenants/bk-clone",
                Some(&json!({"backups": {"hourly": 0, "daily": 1}})),
            )
            .await?;
        assert_eq!(s, 200, "{b}");
        assert_eq!(b["backups"], json!({"hourly": 0, "daily": 1}), "{b}");
        eventually(
            "bk-clone's daily backup, and no hourly one left",
            DONE_TIMEOUT,
            || async {
                let l = api.snapshots("bk-clone").await?;
                let all = l["snapshots"].as_array().cloned().unwrap_or_default();
                let daily = all
                    .iter()
                    .any(|s| s["schedule"] == "daily" && s["state"] == "Succeeded");
                let hourly_left = all
                    .iter()
                    .any(|s| s["schedule"] == "hourly" && s["pruned_at"].is_null());
                Ok((daily && !hourly_left).then_some(()))
            },
        )
        .await?;
        let (s, b) = api
            .raw(
                Method::PATCH,
                "/v1/tenants/bk-clone",
                Some(&json!({"backups": null})),
            )
            .await?;
        assert_eq!(
            (s, &b["backups"]),
            (200, &Value::Null),
            "back to the plan's: {b}"
        );
        anyhow::Ok(())
    };
    tokio::try_join!(source_side, clone_side)?;
    Ok(())
}

/// Bad credentials for the store: the backup fails with the store's reason, on the snapshot
/// and on the tenant (`BackedUp`), and nothing is lost: the tenant serves on, and the snapshot
/// stays on its claim.
#[tokio::test]
async fn a_refused_store_fails_the_backup_visibly_and_loses_nothing() -> anyhow::Result<()> {
    let cluster = DevCluster::shared().await?;
    let host = cluster.connect().await?;
    let p = vcp_dev::testing::platform_with_backups(
        cluster,
        "vcp-badstore",
        2,
        vec![(
            "VCP_BACKUP_SECRET_ACCESS_KEY".into(),
            "not-the-secret-key-0123456789".into(),
        )],
    )
    .await?;
    let api = &p.admin;
    let t = api.create_tenant_with_plan("nb", BACKED_UP_PLAN).await?;
    let ns = format!("vcp-{}", t["key"].as_str().unwrap());
    api.wait_ready("nb", READY_TIMEOUT).await?;
    let kubeconfig = api.kubeconfig("nb", "alice", &["admin"], "1h").await?;
    let cms: Api<ConfigMap> = Api::namespaced(tenant_client(&kubeconfig).await?, "default");
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "kept"}, "data": {"k": "v"}}))?;
    cms.create(&PostParams::default(), &cm).await?;
    let (s, snap) = api
        .raw(Method::POST, "/v1/tenants/nb/snapshots", None)
        .await?;
    assert_eq!(s, 202, "{snap}");
    let id = snap["id"].as_i64().unwrap();
    let failed = eventually("the backup failed", DONE_TIMEOUT, || async {
        let s = snapshot(api, "nb", id).await?;
        Ok((s["state"] != "Pending").then_some(s))
    })
    .await?;
    eprintln!("refused backup: {failed}");
    assert_eq!(failed["state"], "Failed", "{failed}");
    let reason = failed["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("upload") && reason.contains("403"),
        "the store's refusal, named: {reason}"
    );
    let tenant = eventually(
        "BackedUp False on the tenant",
        Duration::from_secs(60),
        || async {
            let t = api.get_tenant("nb").await?.unwrap_or_default();
            Ok(t["conditions"]
                .as_array()
                .and_then(|a| a.iter().find(|c| c["type"] == "BackedUp").cloned())
                .filter(|c| c["status"] == "False")
                .map(|c| (t, c)))
        },
    )
    .await?;
    assert_eq!(tenant.1["reason"], "Failed", "{}", tenant.1);
    assert!(
        tenant.1["message"]
            .as_str()
            .is_some_and(|m| m.contains(&format!("snapshot {id} failed")) && m.contains("403")),
        "{}",
        tenant.1
    );
    assert_eq!(tenant.0["phase"], "Ready", "the tenant serves on");
    assert_eq!(cms.get("kept").await?.data.unwrap()["k"], "v");
    // The snapshot the upload could not store is still on the claim.
    let claim: PersistentVolumeClaim = Api::namespaced(host.clone(), &ns)
        .get("etcd-snapshots")
        .await?;
    let pv: PersistentVolume = Api::all(host.clone())
        .get(claim.spec.unwrap().volume_name.as_deref().unwrap())
        .await?;
    let dir = std::path::PathBuf::from(pv.spec.unwrap().host_path.unwrap().path);
    assert!(
        dir.join(format!("snapshot-{id}.db")).exists(),
        "the claim keeps the snapshot"
    );
    Ok(())
}

/// `vcp tool backup-upload` (the snapshot Job's last step) killed in the middle of its upload:
/// the store holds no object at the key (a multipart upload shows nothing until completed), so
/// no restore can pick a partial one; run again (the Job's retry), it stores the whole sealed
/// file, which opens to the file's SHA-256.
#[tokio::test]
async fn an_upload_killed_midway_leaves_no_object_and_its_retry_stores_it() -> anyhow::Result<()> {
    use std::io::Write as _;
    let cluster = DevCluster::shared().await?;
    let s3 = cluster.state().s3.clone().expect("the dev cluster runs S3");
    let (access, secret) = s3.credentials()?;
    let store = Store::new(
        &s3.endpoint,
        &s3.bucket,
        "us-east-1",
        &Credentials {
            access_key_id: access.clone(),
            secret_access_key: secret.clone(),
        },
    )?;
    let dir = tempfile::tempdir()?;
    // 96 MiB that do not compress or repeat: a few multipart parts, seconds to send.
    let file = dir.path().join("snapshot-1.db");
    let mut hash = Sha256::new();
    {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&file)?);
        let mut block = [0u8; 32];
        for i in 0u64..(96 << 20) / 32 {
            block = Sha256::digest([&block[..], &i.to_le_bytes()].concat()).into();
            hash.update(block);
            f.write_all(&block)?;
        }
    }
    let sha = hex(&hash.finalize());
    let size = std::fs::metadata(&file)?.len();
    let report = dir.path().join("snapshot-1.db.report");
    let key_file = dir.path().join("key");
    std::fs::write(&key_file, [7u8; 32])?;
    let object = format!("vcp-killed/{}/snapshot-1.db.enc", std::process::id());
    let upload = || {
        std::fs::write(
            &report,
            json!({"revision": 1, "size": size, "sha256": sha, "storage_version": "3.6.0"})
                .to_string(),
        )?;
        anyhow::Ok(
            std::process::Command::new(vcp_dev::platform::orchestrator_binary()?)
                .args(["tool", "backup-upload"])
                .arg(format!("--endpoint={}", s3.endpoint))
                .arg(format!("--bucket={}", s3.bucket))
                .arg(format!("--file={}", file.display()))
                .arg(format!("--report-in={}", report.display()))
                .arg(format!("--object={object}"))
                .arg(format!("--key-file={}", key_file.display()))
                .arg("--key-id=1")
                .arg(format!("--report={}", dir.path().join("out").display()))
                .env("VCP_BACKUP_ACCESS_KEY_ID", &access)
                .env("VCP_BACKUP_SECRET_ACCESS_KEY", &secret)
                .stdout(std::process::Stdio::null())
                .spawn()?,
        )
    };
    // Killed (SIGKILL) once it has read a third of the file.
    let mut child = upload()?;
    let io = format!("/proc/{}/io", child.id());
    let read = || -> u64 {
        std::fs::read_to_string(&io)
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("rchar: ").and_then(|v| v.parse().ok()))
            })
            .unwrap_or(0)
    };
    let started = Instant::now();
    while read() < size / 3 {
        anyhow::ensure!(
            child.try_wait()?.is_none(),
            "the upload ended before it could be killed (read {} of {size} bytes)",
            read()
        );
        anyhow::ensure!(started.elapsed() < Duration::from_secs(120), "no progress");
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill()?;
    child.wait()?;
    eprintln!(
        "upload killed after reading {} of {size} bytes",
        read().max(size / 3)
    );
    assert!(!store.exists(&object).await?, "a partial object is visible");
    assert!(file.exists(), "the file stays for the retry");
    // The retry stores all of it.
    let status = upload()?.wait()?;
    assert!(status.success(), "the retry: {status}");
    let sealed_bytes = store.get(&object).await?;
    assert_eq!(sealed_bytes.len() as u64, sealed::sealed_len(size));
    let mut opener = sealed::Opener::new(&[7u8; 32], 1);
    let mut plain = opener.push(&sealed_bytes)?;
    plain.extend(opener.finish()?);
    assert_eq!(hex(&Sha256::digest(&plain)), sha);
    store.delete(&object).await?;
    Ok(())
}
