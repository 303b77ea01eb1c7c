//! The inventory against a real Postgres: migrations from empty, claims, leases, tokens, audit,
//! usage samples.

use std::collections::BTreeMap;
use std::time::Duration;
use time::OffsetDateTime;
use vcp_core::lifecycle::{Desired, Phase};
use vcp_dev::postgres::EphemeralPostgres;
use vcp_orchestrator::Error;
use vcp_orchestrator::inventory::{Inventory, NewTenant};
use vcp_orchestrator::provision::Outcome;
use vcp_orchestrator::render::Catalog;
use vcp_policy::quota::Usage;

async fn fresh(pg: &EphemeralPostgres, db: &str) -> anyhow::Result<Inventory> {
    let url = pg.create_database(db).await?;
    let inv = Inventory::connect(&url).await?;
    inv.migrate().await?;
    inv.upsert_versions(&Catalog::builtin()).await?;
    Ok(inv)
}

fn tenant(name: &str, key: &str, owner: &str) -> NewTenant {
    NewTenant {
        name: name.into(),
        key: vcp_core::naming::TenantKey::new(key).unwrap(),
        owner: owner.into(),
        labels: BTreeMap::from([("team".into(), "a".into())]),
        version: "1.37".into(),
        plan: "default".into(),
        maintenance_window: None,
        fleet_upgrades: vcp_core::lifecycle::FleetUpgrades::Include,
        auto_update: None,
        release: "v1.37.1".into(),
    }
}

fn outcome(phase: &str, g: i64) -> Outcome {
    Outcome {
        phase: phase.parse().expect("a phase"),
        conditions: vec![],
        endpoint: Some("https://127.0.0.1:30001".into()),
        observed_generation: g,
        requeue_after: Duration::from_secs(300),
        upgrade: None,
        restore: None,
    }
}

#[tokio::test]
async fn migrations_apply_to_an_empty_database_and_again_as_a_no_op() -> anyhow::Result<()> {
    let pg = EphemeralPostgres::start().await?;
    let inv = fresh(&pg, "migrations").await?;
    inv.migrate().await?;
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables WHERE table_schema = 'public' ORDER BY 1",
    )
    .fetch_all(inv.pool())
    .await?;
    for t in [
        "api_tokens",
        "audit",
        "certificates",
        "encryption_keys",
        "fleet_upgrade_tenants",
        "fleet_upgrades",
        "kubeconfigs",
        "tenant_upgrades",
        "tenants",
        "usage_samples",
        "versions",
    ] {
        assert!(tables.iter().any(|x| x == t), "{t} missing from {tables:?}");
    }
    let default: String = sqlx::query_scalar("SELECT minor FROM versions WHERE is_default")
        .fetch_one(inv.pool())
        .await?;
    assert_eq!(default, "1.37");
    Ok(())
}

/// Names are unique per owner (migration 0009): another owner's tenant of the same name
/// neither blocks a create nor is seen by it; the same owner's does.
#[tokio::test]
async fn names_are_unique_per_owner_among_live_tenants_and_free_again_after_deletion()
-> anyhow::Result<()> {
    let pg = EphemeralPostgres::start().await?;
    let inv = fresh(&pg, "names").await?;
    let a = inv
        .create_tenant(&tenant("demo", "demoaaaaaa", "alice"), "alice")
        .await?;
    assert_eq!(a.phase, "Pending");
    let b = inv
        .create_tenant(&tenant("demo", "demobbbbbb", "bob"), "bob")
        .await?;
    assert!(matches!(
        inv.create_tenant(&tenant("demo", "demodddddd", "alice"), "alice").await,
        Err(Error::Duplicate(n)) if n == "demo"
    ));
    assert!(matches!(
        inv.create_tenant(&tenant("other", "demoaaaaaa", "bob"), "bob")
            .await,
        Err(Error::KeyCollision)
    ));
    let ids = |ts: Vec<vcp_orchestrator::inventory::Tenant>| -> Vec<i64> {
        ts.into_iter().map(|t| t.id).collect()
    };
    assert_eq!(ids(inv.tenants_named("demo", Some("bob")).await?), [b.id]);
    assert_eq!(ids(inv.tenants_named("demo", Some("alice")).await?), [a.id]);
    assert_eq!(
        ids(inv.tenants_named("demo", None).await?),
        [a.id, b.id],
        "every owner's, by owner"
    );
    assert!(inv.tenants_named("demo", Some("carol")).await?.is_empty());
    assert_eq!(inv.list_tenants(Some("bob")).await?.len(), 1);

    let d = inv.request_delete(&a, false, "alice").await?.unwrap();
    assert_eq!(
        (d.id, d.desired.as_str(), d.generation),
        (a.id, "absent", 2)
    );
    let bob_s = inv.tenants_named("demo", Some("bob")).await?.remove(0);
    assert_eq!(
        (bob_s.desired.as_str(), bob_s.generation),
        ("present", 1),
        "deleting alice's tenant leaves bob's of the same name alone"
    );
    // Both are due; tombstone alice's, whichever a worker claims first.
    for _ in 0..2 {
        let claimed = inv.claim("w1", Duration::from_secs(30)).await?.unwrap();
        if claimed.id == a.id {
            assert!(inv.tombstone(&claimed, "w1", "reconciler/w1").await?);
        }
    }
    assert_eq!(ids(inv.tenants_named("demo", None).await?), [b.id]);
    let again = inv
        .create_tenant(&tenant("demo", "democccccc", "alice"), "alice")
        .await?;
    assert_ne!(again.key, a.key);
    let trail = inv.audit_trail(a.id).await?;
    let actions: Vec<&str> = trail.iter().map(|(_, a)| a.as_str()).collect();
    assert_eq!(
        actions,
        ["tenant.create", "tenant.delete", "tenant.deleted"]
    );
    Ok(())
}

/// A pass that was running when its tenant's deletion was accepted must not write its
/// stale phase over `Deleting`, nor put the deletion off until its requeue time. (Seen in the
/// schemathesis contract test: a tenant deleted while its first pass ran was listed as
/// `Provisioning` again.)
#[tokio::test]
async fn a_deletion_accepted_during_a_pass_outlives_the_passs_outcome() -> anyhow::Result<()> {
    let pg = EphemeralPostgres::start().await?;
    let inv = fresh(&pg, "racedelete").await?;
    inv.create_tenant(&tenant("shop", "shopaaaaaa", "o"), "o")
        .await?;
    let claimed = inv.claim("w", Duration::from_secs(30)).await?.unwrap();
    assert_eq!(claimed.generation, 1);
    inv.request_delete(&claimed, false, "o").await?.unwrap();
    assert!(
        inv.finish(&claimed, "w", &outcome("Provisioning", 1), "w")
            .await?
    );
    let t = inv.tenants_named("shop", None).await?.remove(0);
    assert_eq!(
        (t.phase.as_str(), t.desired.as_str()),
        ("Deleting", "absent")
    );
    assert_eq!(t.observed_generation, 1);
    let next = inv.claim("w", Duration::from_secs(30)).await?;
    assert_eq!(
        next.map(|n| n.id),
        Some(t.id),
        "due at once, not after the pass's requeue"
    );
    Ok(())
}

/// A wake that arrives while a pass holds the tenant (the sleep pass that just saw the last
/// control-plane pod go, and asks to look again in five minutes) must not be put off by that
/// pass's outcome: the gateway holds a client's connection until the tenant answers. (Seen on
/// the real node: the first call after a sleep waited out its 30 s connect timeout.)
#[tokio::test]
async fn a_wake_accepted_during_a_sleep_pass_outlives_the_passs_outcome() -> anyhow::Result<()> {
    use vcp_core::lifecycle::Sleep;
    use vcp_orchestrator::sleep::store::Asked;
    let pg = EphemeralPostgres::start().await?;
    let inv = fresh(&pg, "racewake").await?;
    inv.create_tenant(&tenant("nap", "napaaaaaaa", "o"), "o")
        .await?;
    let first = inv.claim("w", Duration::from_secs(30)).await?.unwrap();
    assert!(inv.finish(&first, "w", &outcome("Ready", 1), "w").await?);
    let t = inv.tenants_named("nap", None).await?.remove(0);
    let Asked::Changed(asleep) = inv.ask_sleep(&t, Sleep::Asleep, "o", "asked").await? else {
        panic!("a Ready tenant goes to sleep");
    };
    assert_eq!(asleep.sleep, Sleep::Asleep);
    let pass = inv.claim("w", Duration::from_secs(30)).await?.unwrap();
    assert_eq!(pass.sleep, Sleep::Asleep, "the sleep pass is due at once");
    let Asked::Changed(_) = inv
        .ask_sleep(&pass, Sleep::Awake, "vcp:gateway", "a connection")
        .await?
    else {
        panic!("a wake is taken while a pass holds the tenant");
    };
    assert!(
        inv.finish(&pass, "w", &outcome("Sleeping", pass.generation), "w")
            .await?
    );
    let next = inv.claim("w", Duration::from_secs(30)).await?;
    assert_eq!(
        next.as_ref().map(|n| (n.id, n.sleep)),
        Some((t.id, Sleep::Awake)),
        "due at once, awake, not after the sleep pass's requeue"
    );
    Ok(())
}

/// Whatever makes a tenant due while a pass holds it (an owner's snapshot or restore asked
/// for, not only a spec change) outlives that pass's outcome. (CI on 58bf96c: a snapshot
/// asked for while a Ready tenant's pass ran waited out that pass's five-minute requeue.)
#[tokio::test]
async fn a_snapshot_asked_for_during_a_pass_is_taken_at_once_not_after_its_requeue()
-> anyhow::Result<()> {
    let pg = EphemeralPostgres::start().await?;
    let inv = fresh(&pg, "racesnap").await?;
    inv.create_tenant(&tenant("db", "dbaaaaaaaa", "o"), "o")
        .await?;
    let first = inv.claim("w", Duration::from_secs(30)).await?.unwrap();
    assert!(inv.finish(&first, "w", &outcome("Ready", 1), "w").await?);
    // Due again (as a Ready tenant is after its requeue), claimed, and asked for a snapshot.
    sqlx::query("UPDATE tenants SET next_reconcile_at = now() - interval '1 second'")
        .execute(inv.pool())
        .await?;
    let pass = inv.claim("w", Duration::from_secs(30)).await?.unwrap();
    let snap = inv
        .request_snapshot(&pass, "o")
        .await?
        .expect("a live tenant");
    assert_eq!(pass.generation, 1, "a snapshot is not a spec change");
    assert!(
        inv.finish(&pass, "w", &outcome("Ready", pass.generation), "w")
            .await?
    );
    let next = inv.claim("w", Duration::from_secs(30)).await?;
    assert_eq!(
        next.as_ref().map(|n| n.id),
        Some(pass.id),
        "due at once for snapshot {}, not after the pass's requeue",
        snap.number
    );
    // A pass with nothing new keeps its requeue.
    assert!(
        inv.finish(&next.unwrap(), "w", &outcome("Ready", 1), "w")
            .await?
    );
    assert!(
        inv.claim("w", Duration::from_secs(30)).await?.is_none(),
        "nothing woke it: due after its requeue"
    );
    Ok(())
}

/// A tenant's first Ready is recorded once and survives later passes that find its control
/// plane not ready (its owner's kubeconfigs are issued from then on); a pass whose outcome is
/// stale (the spec changed under it) records nothing. (CI on 5122a78: a Ready tenant's
/// periodic pass met a refused connection, made it Provisioning, and its owner's kubeconfig
/// request was refused 409.)
#[tokio::test]
async fn a_tenant_is_first_ready_once_and_stays_so_through_a_later_pass_that_is_not()
-> anyhow::Result<()> {
    let pg = EphemeralPostgres::start().await?;
    let inv = fresh(&pg, "firstready").await?;
    let created = inv
        .create_tenant(&tenant("fr", "fraaaaaaaa", "o"), "o")
        .await?;
    assert_eq!(created.first_ready_at, None);
    let due = || async {
        sqlx::query("UPDATE tenants SET next_reconcile_at = now() - interval '1 second'")
            .execute(inv.pool())
            .await
    };
    let pass = |phase: &'static str| {
        let inv = &inv;
        async move {
            due().await?;
            let t = inv.claim("w", Duration::from_secs(30)).await?.unwrap();
            assert!(
                inv.finish(&t, "w", &outcome(phase, t.generation), "w")
                    .await?
            );
            anyhow::Ok(inv.tenant_by_id(t.id).await?.unwrap())
        }
    };
    assert_eq!(pass("Provisioning").await?.first_ready_at, None);
    // Ready, but the spec changed during the pass: the outcome is stale and records nothing.
    due().await?;
    let t = inv.claim("w", Duration::from_secs(30)).await?.unwrap();
    sqlx::query("UPDATE tenants SET generation = generation + 1 WHERE id = $1")
        .bind(t.id)
        .execute(inv.pool())
        .await?;
    assert!(
        inv.finish(&t, "w", &outcome("Ready", t.generation), "w")
            .await?
    );
    let after = inv.tenant_by_id(t.id).await?.unwrap();
    assert_eq!(
        (after.phase.to_string(), after.first_ready_at),
        ("Provisioning".into(), None)
    );
    let ready = pass("Ready").await?;
    let first = ready
        .first_ready_at
        .expect("recorded by the first Ready pass");
    for phase in ["Provisioning", "Ready", "Upgrading"] {
        let t = pass(phase).await?;
        assert_eq!(t.phase.to_string(), phase);
        assert_eq!(t.first_ready_at, Some(first), "after a {phase} pass");
    }
    Ok(())
}

/// Migration 0021 gives the tenants already there their first Ready: the audit event that
/// made them Ready, else (no such event) their last update if they are in a phase only a
/// Ready tenant reaches; a tenant never Ready gets none.
#[tokio::test]
async fn migration_0021_dates_the_first_ready_of_tenants_already_there() -> anyhow::Result<()> {
    let pg = EphemeralPostgres::start().await?;
    let url = pg.create_database("firstready0021").await?;
    let pool = sqlx::PgPool::connect(&url).await?;
    let mut before = sqlx::migrate!("../migrations");
    before.migrations = before
        .migrations
        .iter()
        .filter(|m| m.version < 21)
        .cloned()
        .collect::<Vec<_>>()
        .into();
    before.run(&pool).await?;
    let inv = Inventory::connect(&url).await?;
    inv.upsert_versions(&Catalog::builtin()).await?;
    let mut ids = BTreeMap::new();
    for (name, key, phase) in [
        ("audited", "audaaaaaaa", "Provisioning"),
        ("sleeper", "sleaaaaaaa", "Sleeping"),
        ("pending", "penaaaaaaa", "Pending"),
        ("failing", "faiaaaaaaa", "Provisioning"),
    ] {
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO tenants (name, key, owner, version, plan, phase, updated_at)
             VALUES ($1, $2, 'o', '1.37', 'default', $3, '2026-11-02T00:00:00Z')
             RETURNING id",
        )
        .bind(name)
        .bind(key)
        .bind(phase)
        .fetch_one(&pool)
        .await?;
        ids.insert(name, id);
    }
    for (at, to) in [
        ("2026-11-01T10:00:00Z", "Provisioning"),
        ("2026-11-01T10:00:20Z", "Ready"),
        ("2026-11-01T11:00:00Z", "Provisioning"),
        ("2026-11-01T11:00:10Z", "Ready"),
    ] {
        sqlx::query(
            "INSERT INTO audit (at, actor, action, tenant_id, detail)
             VALUES ($1::timestamptz, 'reconciler/a', 'tenant.phase', $2, jsonb_build_object('to', $3::text))",
        )
        .bind(at)
        .bind(ids["audited"])
        .bind(to)
        .execute(&pool)
        .await?;
    }
    sqlx::query(
        "INSERT INTO audit (actor, action, tenant_id, detail)
         VALUES ('reconciler/a', 'tenant.phase', $1, '{\"to\": \"Provisioning\"}')",
    )
    .bind(ids["failing"])
    .execute(&pool)
    .await?;
    inv.migrate().await?;
    let at = |s: &str| OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339);
    for (name, want) in [
        ("audited", Some(at("2026-11-01T10:00:20Z")?)),
        ("sleeper", Some(at("2026-11-02T00:00:00Z")?)),
        ("pending", None),
        ("failing", None),
    ] {
        let t = inv.tenant_by_id(ids[name]).await?.unwrap();
        assert_eq!(t.first_ready_at, want, "{name}");
    }
    Ok(())
}

/// Retention follows a snapshot to the clones' copies of it: kept while a clone has yet to
/// restore from it, and once pruned, every copy is marked pruned too (in its clone's trail),
/// so no copy is offered for a restore whose object is gone.
#[tokio::test]
async fn a_pruned_snapshot_takes_its_copies_and_waits_for_a_clone_to_restore_it()
-> anyhow::Result<()> {
    use vcp_orchestrator::backup_store::Schedule;
    use vcp_orchestrator::clones::store::Seed;
    use vcp_orchestrator::snapshots::Report;
    use vcp_orchestrator::snapshots::store::NewRestore;
    let pg = EphemeralPostgres::start().await?;
    let inv = fresh(&pg, "copies").await?;
    let src = inv
        .create_tenant(&tenant("src", "srcaaaaaaa", "o"), "o")
        .await?;
    let hour = OffsetDateTime::now_utc()
        .replace_minute(0)?
        .replace_second(0)?;
    let n = inv
        .request_scheduled_snapshot(src.id, Schedule::Hourly, hour, "vcp")
        .await?
        .expect("asked for");
    let row = inv.numbered_snapshot(src.id, n).await?.unwrap();
    let report = Report {
        revision: 7,
        size: 100,
        sha256: "0".repeat(64),
        storage_version: "3.6.0".into(),
        object: Some("s3://vcp-backups/k/srcaaaaaaa/snapshot-1.db.enc".into()),
        backup_key: None,
    };
    inv.finish_snapshot(src.id, row.id, Ok(&report), "vcp")
        .await?;
    let snapshot = inv.snapshot(src.id, row.id).await?.unwrap();
    let seed = Seed {
        source: src.clone(),
        snapshot,
        key: None,
    };
    let kek = vcp_orchestrator::pki::seal::InventoryKey::new([7; 32]);
    let clone = inv
        .create_clone(&tenant("copy", "copyaaaaaa", "o"), &seed, &kek, "o")
        .await?;
    let copy = clone.seed_snapshot_id.expect("a clone has its seed");
    assert!(inv.seeds_a_clone(row.id).await?, "its restore not started");
    let r = inv
        .start_seed_restore(&clone, "vcp")
        .await?
        .expect("started");
    assert!(inv.seeds_a_clone(row.id).await?, "its restore running");
    // The restore ends through a pass's outcome, as the provisioner ends it.
    sqlx::query("UPDATE tenants SET next_reconcile_at = now() - interval '1 second'")
        .execute(inv.pool())
        .await?;
    let mut claimed = Vec::new();
    while let Some(t) = inv.claim("w", Duration::from_secs(30)).await? {
        claimed.push(t);
    }
    let pass = claimed.iter().find(|t| t.id == clone.id).expect("due");
    let mut o = outcome("Ready", pass.generation);
    o.restore = Some((r.id, NewRestore::Succeeded));
    assert!(inv.finish(pass, "w", &o, "w").await?);
    assert!(
        !inv.seeds_a_clone(row.id).await?,
        "restored: retention may delete it"
    );

    assert!(inv.mark_pruned(src.id, row.id, "vcp").await?);
    let copied = inv.snapshot(clone.id, copy).await?.unwrap();
    assert!(copied.pruned_at.is_some(), "the copy is pruned with it");
    let trail = inv.audit_trail(clone.id).await?;
    assert!(
        trail
            .iter()
            .any(|(a, action)| a == "vcp" && action == "tenant.snapshot.pruned"),
        "in the clone's trail: {trail:?}"
    );
    assert!(!inv.mark_pruned(src.id, row.id, "vcp").await?, "once only");
    Ok(())
}

#[tokio::test]
async fn two_workers_never_hold_one_tenant_and_lost_leases_write_nothing() -> anyhow::Result<()> {
    let pg = EphemeralPostgres::start().await?;
    let inv = fresh(&pg, "claims").await?;
    for i in 0..20 {
        inv.create_tenant(&tenant(&format!("t{i}"), &format!("t{i}xxxxxx"), "o"), "o")
            .await?;
    }
    // Many workers claim concurrently: every tenant is handed out exactly once.
    let mut tasks = Vec::new();
    for w in 0..8 {
        let inv = inv.clone();
        tasks.push(tokio::spawn(async move {
            let mut got = Vec::new();
            while let Some(t) = inv
                .claim(&format!("w{w}"), Duration::from_secs(30))
                .await
                .unwrap()
            {
                got.push(t.id);
            }
            got
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await?);
    }
    all.sort();
    let n = all.len();
    all.dedup();
    assert_eq!((n, all.len()), (20, 20), "each tenant claimed exactly once");

    // A finished pass releases the tenant until its requeue time.
    let t = inv.tenant_by_id(all[0]).await?.unwrap();
    let holder = sqlx::query_scalar::<_, String>("SELECT lease_owner FROM tenants WHERE id = $1")
        .bind(t.id)
        .fetch_one(inv.pool())
        .await?;
    assert!(
        !inv.finish(&t, "intruder", &outcome("Ready", 1), "x")
            .await?,
        "not the holder"
    );
    assert!(
        inv.finish(&t, &holder, &outcome("Provisioning", 1), "x")
            .await?
    );
    assert!(
        inv.claim("w9", Duration::from_secs(30)).await?.is_none(),
        "requeued 300 s out"
    );

    // An expired lease can be taken over; the old holder then cannot write.
    sqlx::query("UPDATE tenants SET next_reconcile_at = now(), lease_owner = 'dead', lease_until = now() - interval '1 s' WHERE id = $1")
        .bind(t.id)
        .execute(inv.pool())
        .await?;
    let taken = inv.claim("w10", Duration::from_secs(30)).await?.unwrap();
    assert_eq!(taken.id, t.id);
    assert!(!inv.renew(t.id, "dead", Duration::from_secs(30)).await?);
    assert!(
        !inv.finish(&taken, "dead", &outcome("Ready", 1), "x")
            .await?
    );
    assert!(inv.finish(&taken, "w10", &outcome("Ready", 1), "x").await?);
    let trail = inv.audit_trail(t.id).await?;
    assert!(
        trail
            .iter()
            .any(|(who, what)| who == "x" && what == "tenant.phase")
    );
    Ok(())
}

#[tokio::test]
async fn tokens_are_stored_as_hashes_and_revocation_is_final() -> anyhow::Result<()> {
    let pg = EphemeralPostgres::start().await?;
    let inv = fresh(&pg, "tokens").await?;
    let secret = vcp_orchestrator::http::auth::new_token();
    let hash = vcp_orchestrator::http::auth::token_hash(&secret);
    inv.create_token("team-a", "owner", &hash, "admin").await?;
    assert!(matches!(
        inv.create_token("team-a", "owner", b"other", "admin").await,
        Err(Error::Duplicate(_))
    ));
    let stored: Vec<u8> = sqlx::query_scalar("SELECT hash FROM api_tokens WHERE name = 'team-a'")
        .fetch_one(inv.pool())
        .await?;
    assert_eq!(stored, hash);
    assert!(!String::from_utf8_lossy(&stored).contains(&secret[4..]));
    assert_eq!(inv.token_by_hash(&hash).await?.unwrap().role, "owner");
    assert!(inv.revoke_token("team-a", "admin").await?);
    assert!(inv.token_by_hash(&hash).await?.is_none());
    assert!(!inv.revoke_token("team-a", "admin").await?);
    use vcp_orchestrator::tokens::store::AdminTokenChange as Change;
    assert_eq!(
        inv.ensure_admin_token("admin", b"h1", "vcp:r1").await?,
        Change::Created
    );
    assert_eq!(
        inv.ensure_admin_token("admin", b"h1", "vcp:r2").await?,
        Change::Unchanged
    );
    assert_eq!(
        inv.ensure_admin_token("admin", b"h2", "vcp:r1").await?,
        Change::Replaced
    );
    assert!(
        inv.token_by_hash(b"h1").await?.is_none(),
        "a replaced admin token stops working"
    );
    assert_eq!(inv.admin_tokens().await?, 1);
    // A revoked admin token stays revoked when a restart configures it again.
    assert!(inv.revoke_token("admin", "ops").await?);
    assert_eq!(
        inv.ensure_admin_token("admin", b"h2", "vcp:r1").await?,
        Change::StillRevoked
    );
    assert!(
        inv.token_by_hash(b"h2").await?.is_none(),
        "un-revoked by a restart"
    );
    assert_eq!(inv.admin_tokens().await?, 0);
    // Configuring another one replaces it.
    assert_eq!(
        inv.ensure_admin_token("admin", b"h3", "vcp:r1").await?,
        Change::Replaced
    );
    assert!(inv.token_by_hash(b"h3").await?.is_some());
    // Bootstrap, replacement and revocation are in the audit trail, in order, with their actors.
    let trail: Vec<(String, String)> = sqlx::query_as(
        "SELECT actor, action FROM audit WHERE action LIKE 'token.%' AND detail->>'name' = 'admin' ORDER BY id",
    )
    .fetch_all(inv.pool())
    .await?;
    let trail: Vec<(&str, &str)> = trail
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    assert_eq!(
        trail,
        [
            ("vcp:r1", "token.admin-bootstrap"),
            ("vcp:r1", "token.admin-replace"),
            ("ops", "token.revoke"),
            ("vcp:r1", "token.admin-replace"),
        ]
    );
    Ok(())
}

/// The lifecycle is read through checked mappings: a name the code does not know fails the
/// read, it is never taken for a default (a phase that reads `Redy` is not `Pending`).
#[tokio::test]
async fn unknown_lifecycle_values_in_the_database_are_errors_not_defaults() -> anyhow::Result<()> {
    let pg = EphemeralPostgres::start().await?;
    let inv = fresh(&pg, "lifecycle").await?;
    let known: Phase = sqlx::query_scalar("SELECT 'Deleted'::text")
        .fetch_one(inv.pool())
        .await?;
    assert_eq!(known, Phase::Deleted);
    let unknown = sqlx::query_scalar::<_, Phase>("SELECT 'Redy'::text")
        .fetch_one(inv.pool())
        .await;
    assert!(
        matches!(unknown, Err(sqlx::Error::ColumnDecode { .. })),
        "{unknown:?}"
    );
    let t = inv
        .create_tenant(&tenant("odd", "oddaaaaaaa", "o"), "o")
        .await?;
    assert_eq!((t.phase, t.desired), (Phase::Pending, Desired::Present));

    // The database refuses unknown phases and desired states itself...
    for set in ["phase = 'Redy'", "desired = 'gone'"] {
        let r = sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE tenants SET {set} WHERE id = $1"
        )))
        .bind(t.id)
        .execute(inv.pool())
        .await;
        assert!(r.is_err(), "{set}");
    }
    // ...conditions are JSONB, which it cannot check: one nobody knows fails the read.
    sqlx::query(
        r#"UPDATE tenants SET conditions = '[{"type": "EtcdHappy", "status": "True",
             "reason": "Ready", "message": "", "last_transition_time": "2026-01-01T00:00:00Z"}]'
           WHERE id = $1"#,
    )
    .bind(t.id)
    .execute(inv.pool())
    .await?;
    assert!(matches!(
        inv.tenants_named("odd", None).await,
        Err(Error::Database(_))
    ));

    // Without the constraint (a hand-made schema), an unknown phase fails the read too.
    sqlx::query("ALTER TABLE tenants DROP CONSTRAINT tenants_phase_check")
        .execute(inv.pool())
        .await?;
    sqlx::query("UPDATE tenants SET phase = 'Redy', conditions = '[]' WHERE id = $1")
        .bind(t.id)
        .execute(inv.pool())
        .await?;
    assert!(matches!(
        inv.tenants_named("odd", None).await,
        Err(Error::Database(_))
    ));
    assert!(inv.list_tenants(None).await.is_err());
    assert!(inv.phase_counts().await.is_err());
    Ok(())
}

#[tokio::test]
async fn certificates_are_recorded_once_per_serial() -> anyhow::Result<()> {
    let pg = EphemeralPostgres::start().await?;
    let inv = fresh(&pg, "certs").await?;
    let t = inv.create_tenant(&tenant("c", "cxxxxxx", "o"), "o").await?;
    let ca = vcp_orchestrator::pki::Ca::generate(
        "c",
        time::OffsetDateTime::now_utc(),
        vcp_orchestrator::pki::CA_VALIDITY,
    )?;
    let info = vcp_orchestrator::pki::inspect("cluster-ca", &ca.cert_key().cert_pem)?;
    inv.record_certificate(t.id, "cluster-ca", &info).await?;
    inv.record_certificate(t.id, "cluster-ca", &info).await?;
    let rows = inv.certificates(t.id).await?;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].fingerprint, info.fingerprint);
    Ok(())
}

#[tokio::test]
async fn encryption_keys_are_stored_sealed_made_once_and_bound_to_their_tenant()
-> anyhow::Result<()> {
    use vcp_orchestrator::pki::rotation::Target;
    use vcp_orchestrator::pki::seal::{InventoryKey, associated_data};
    let pg = EphemeralPostgres::start().await?;
    let inv = fresh(&pg, "enckeys").await?;
    let a = inv.create_tenant(&tenant("a", "axxxxxx", "o"), "o").await?;
    let b = inv.create_tenant(&tenant("b", "bxxxxxx", "o"), "o").await?;
    let kek = InventoryKey::new([7; 32]);
    let secret = [42u8; 32];
    // The first key is made once, however many replicas try.
    assert!(
        inv.add_encryption_key(a.id, None, &secret, &kek, "vcp:t")
            .await?
    );
    assert!(
        !inv.add_encryption_key(a.id, None, &[1; 32], &kek, "vcp:t")
            .await?
    );
    let rows = inv.live_encryption_keys(a.id).await?;
    assert_eq!(rows.len(), 1);
    let k1 = &rows[0];
    assert_eq!((k1.name.as_str(), k1.kek_id.as_str()), ("key1", kek.id()));
    // Sealed: the row holds no byte run of the key, and opens to it only as tenant a's key1.
    assert!(!k1.ciphertext.windows(8).any(|w| w == [42u8; 8]));
    assert_eq!(
        kek.open("key1", &k1.sealed(), &associated_data(a.id, "key1"))?,
        secret
    );
    assert!(
        kek.open("key1", &k1.sealed(), &associated_data(b.id, "key1"))
            .is_err()
    );
    // A row copied onto tenant b as its own key does not open there.
    sqlx::query(
        "INSERT INTO encryption_keys (tenant_id, name, kek_id, nonce, ciphertext)
         SELECT $2, name, kek_id, nonce, ciphertext FROM encryption_keys WHERE id = $1",
    )
    .bind(k1.id)
    .bind(b.id)
    .execute(inv.pool())
    .await?;
    let stolen = &inv.live_encryption_keys(b.id).await?[0];
    assert!(
        kek.open(
            "key1",
            &stolen.sealed(),
            &associated_data(b.id, &stolen.name)
        )
        .is_err(),
        "a swapped row is refused"
    );

    // A rotation's key: one per rotation, named after the keys the tenant ever had; retiring
    // keeps the rotation's key and the row of the old one.
    let r = inv
        .start_rotation(&a, Target::EncryptionKey, time::Duration::ZERO, "admin")
        .await?
        .expect("the rotation starts");
    assert!(
        inv.add_encryption_key(a.id, Some(r.id), &[2; 32], &kek, "vcp:t")
            .await?
    );
    assert!(
        !inv.add_encryption_key(a.id, Some(r.id), &[3; 32], &kek, "vcp:t")
            .await?
    );
    let live: Vec<String> = inv
        .live_encryption_keys(a.id)
        .await?
        .into_iter()
        .map(|k| k.name)
        .collect();
    assert_eq!(live, ["key1", "key2"]);
    let now = OffsetDateTime::now_utc();
    assert_eq!(
        inv.retire_encryption_keys(a.id, r.id, "vcp:t", now).await?,
        1
    );
    assert_eq!(
        inv.retire_encryption_keys(a.id, r.id, "vcp:t", now).await?,
        0
    );
    let all = inv.encryption_keys(a.id).await?;
    assert_eq!(all.len(), 2);
    assert!(all[0].retired_at.is_some() && all[1].retired_at.is_none());
    assert_eq!(inv.encryption_kek_ids().await?, [kek.id().to_owned()]);
    let bad = sqlx::query("UPDATE encryption_keys SET name = 'secrets' WHERE id = $1")
        .bind(k1.id)
        .execute(inv.pool())
        .await;
    assert!(bad.is_err(), "names are key<n>");
    Ok(())
}

#[tokio::test]
async fn vcp_migrate_runs_twice_and_bad_settings_fail_clearly() -> anyhow::Result<()> {
    let pg = EphemeralPostgres::start().await?;
    let url = pg.create_database("cli").await?;
    let vcp = env!("CARGO_BIN_EXE_vcp");
    for _ in 0..2 {
        let out = std::process::Command::new(vcp)
            .args(["migrate", "--database-url", &url])
            .output()?;
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(String::from_utf8_lossy(&out.stdout).contains("migrations applied"));
    }
    let bad = std::process::Command::new(vcp)
        .args([
            "migrate",
            "--database-url",
            "postgres://nobody@127.0.0.1:1/none",
        ])
        .output()?;
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("database request failed"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
    let no_address = std::process::Command::new(vcp)
        .args(["serve", "--database-url", &url, "--expose", "node-port"])
        .env_remove("VCP_EXPOSE_ADDRESS")
        .output()?;
    assert!(!no_address.status.success());
    assert!(
        String::from_utf8_lossy(&no_address.stderr)
            .contains("--expose node-port needs --expose-address"),
        "{}",
        String::from_utf8_lossy(&no_address.stderr)
    );
    // No inventory key, or one that is not 32 bytes of base64: refused before anything is
    // done, saying how to make one.
    for key in [None, Some("c2hvcnQ=")] {
        let mut cmd = std::process::Command::new(vcp);
        cmd.args([
            "serve",
            "--database-url",
            &url,
            "--expose-address",
            "127.0.0.1",
        ])
        .env_remove("VCP_INVENTORY_KEY");
        if let Some(k) = key {
            cmd.env("VCP_INVENTORY_KEY", k);
        }
        let out = cmd.output()?;
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{key:?}");
        assert!(
            err.contains("--inventory-key") && err.contains("head -c 32 /dev/urandom | base64"),
            "{key:?}: {err}"
        );
    }
    Ok(())
}

fn usage(pods: u64) -> Usage {
    Usage {
        pods,
        requests_cpu: 100 * pods,
        requests_memory: (128 << 20) * pods,
        limits_cpu: 1000 * pods,
        limits_memory: (512 << 20) * pods,
        services: 2,
        persistent_volume_claims: 1,
        // Beyond 32 bits: the columns are BIGINT.
        requests_storage: 1 << 42,
        namespaces: 3,
    }
}

#[tokio::test]
async fn usage_samples_are_recorded_once_per_gap_and_served_latest_and_by_range()
-> anyhow::Result<()> {
    let pg = EphemeralPostgres::start().await?;
    let inv = fresh(&pg, "usage").await?;
    let a = inv.create_tenant(&tenant("a", "axxxxxx", "o"), "o").await?;
    let b = inv.create_tenant(&tenant("b", "bxxxxxx", "o"), "o").await?;
    // a becomes Ready; b stays Pending and is never due.
    let claimed = inv.claim("w", Duration::from_secs(30)).await?.unwrap();
    assert_eq!(claimed.id, a.id);
    assert!(inv.finish(&claimed, "w", &outcome("Ready", 1), "w").await?);
    let gap = Duration::from_secs(45);
    let due = |g| {
        let inv = inv.clone();
        async move {
            anyhow::Ok(
                inv.tenants_due_for_usage(g)
                    .await?
                    .into_iter()
                    .map(|t| t.name)
                    .collect::<Vec<_>>(),
            )
        }
    };
    assert_eq!(due(gap).await?, ["a"], "Ready tenants only");
    assert!(inv.latest_usage(&[a.id, b.id]).await?.is_empty());

    let now = OffsetDateTime::now_utc();
    let min = move |m: i64| now - time::Duration::minutes(m);
    let t0 = inv
        .record_usage(a.id, min(10), &usage(1), gap)
        .await?
        .expect("the first sample is recorded");
    assert!((t0 - min(10)).abs() < time::Duration::microseconds(1));
    assert_eq!(due(gap).await?, ["a"], "ten minutes old: due again");
    assert!(
        inv.record_usage(a.id, min(10) + time::Duration::seconds(10), &usage(9), gap)
            .await?
            .is_none(),
        "within the gap: another replica got there first"
    );
    // Replicas racing for one tenant: exactly one records. (Their connections are open and
    // they start together, so the inserts overlap.)
    let warm = futures::future::try_join_all((0..8).map(|_| inv.pool().acquire())).await?;
    drop(warm);
    let start = std::sync::Arc::new(tokio::sync::Barrier::new(8));
    let mut racers = Vec::new();
    for i in 0..8 {
        let (inv, start) = (inv.clone(), start.clone());
        racers.push(tokio::spawn(async move {
            start.wait().await;
            inv.record_usage(
                a.id,
                min(5) + time::Duration::milliseconds(i),
                &usage(2),
                gap,
            )
            .await
            .unwrap()
        }));
    }
    let mut recorded = 0;
    for r in racers {
        recorded += usize::from(r.await?.is_some());
    }
    assert_eq!(
        recorded, 1,
        "one sample per gap, however many replicas race"
    );
    let last = inv
        .record_usage(a.id, min(0), &usage(3), gap)
        .await?
        .unwrap();
    assert!(due(gap).await?.is_empty(), "just sampled");
    assert_eq!(due(Duration::ZERO).await?, ["a"], "a zero gap samples now");
    assert!(
        inv.record_usage(a.id, last, &usage(3), Duration::ZERO)
            .await?
            .is_none(),
        "one sample per instant"
    );

    let latest = inv.latest_usage(&[a.id, b.id]).await?;
    assert_eq!(latest.len(), 1);
    assert_eq!(latest[&a.id].sampled_at, last);
    assert_eq!(latest[&a.id].used, usage(3), "every column round-trips");

    // Ranges are [since, until), oldest first, at most `limit`.
    let all = inv.usage_between(a.id, min(60), min(-1), 100).await?;
    let pods: Vec<u64> = all.iter().map(|s| s.used.pods).collect();
    assert_eq!(pods, [1, 2, 3]);
    assert!(all.windows(2).all(|w| w[0].sampled_at < w[1].sampled_at));
    let page = inv.usage_between(a.id, min(60), min(-1), 2).await?;
    assert_eq!(page, all[..2]);
    let from_second = inv
        .usage_between(a.id, all[1].sampled_at, last, 100)
        .await?;
    assert_eq!(from_second, all[1..2], "since inclusive, until exclusive");
    assert!(
        inv.usage_between(b.id, min(60), min(-1), 100)
            .await?
            .is_empty()
    );

    // A deleted tenant keeps its samples (billing), and its row cannot be removed under them.
    let d = inv.request_delete(&a, false, "o").await?.unwrap();
    sqlx::query("UPDATE tenants SET next_reconcile_at = now() WHERE id = $1")
        .bind(d.id)
        .execute(inv.pool())
        .await?;
    let claimed = inv.claim("w", Duration::from_secs(30)).await?.unwrap();
    assert!(inv.tombstone(&claimed, "w", "w").await?);
    assert!(inv.tenants_due_for_usage(Duration::ZERO).await?.is_empty());
    assert_eq!(inv.latest_usage(&[a.id]).await?[&a.id].sampled_at, last);
    let removed = sqlx::query("DELETE FROM tenants WHERE id = $1")
        .bind(a.id)
        .execute(inv.pool())
        .await;
    assert!(
        matches!(&removed, Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("23503")),
        "{removed:?}"
    );

    // Retention prunes by age, everyone's.
    assert_eq!(inv.prune_usage(min(4)).await?, 2);
    let left = inv.usage_between(a.id, min(60), min(-1), 100).await?;
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].sampled_at, last);
    assert_eq!(inv.prune_usage(min(4)).await?, 0);
    Ok(())
}

// Fleet upgrades: claims, the one-transaction start, idempotent steps, admin actions.

/// Tenants on `version`, Ready (as a finished bring-up leaves them); their ids.
async fn ready_tenants(inv: &Inventory, version: &str, names: &[&str]) -> anyhow::Result<Vec<i64>> {
    let mut ids = Vec::new();
    for n in names {
        let mut t = tenant(n, &format!("{n}xxxxxx"), "o");
        t.version = version.into();
        t.release = Catalog::builtin().get(version).unwrap().kubernetes.clone();
        let row = inv.create_tenant(&t, "o").await?;
        ids.push(row.id);
    }
    sqlx::query("UPDATE tenants SET phase = 'Ready' WHERE id = ANY($1)")
        .bind(&ids)
        .execute(inv.pool())
        .await?;
    Ok(ids)
}

async fn new_fleet(
    inv: &Inventory,
    catalog: &Catalog,
    target: &str,
    max_parallel: u32,
) -> anyhow::Result<vcp_orchestrator::upgrades::fleet_store::FleetRow> {
    use vcp_orchestrator::lifecycle::fleet::{self, Candidate, Request, Selector};
    let candidates: Vec<Candidate> = inv
        .list_tenants(None)
        .await?
        .into_iter()
        .map(|t| Candidate {
            id: t.id,
            name: t.name,
            version: t.version,
            labels: t.labels.0,
            fleet_upgrades: t.fleet_upgrades,
        })
        .collect();
    let req = Request {
        target: target.into(),
        selector: Selector::default(),
        chain: false,
        allow_preview: false,
        canary: 1,
    };
    let entries = fleet::plan(catalog, &req, &candidates)?;
    Ok(inv
        .create_fleet(
            &vcp_orchestrator::upgrades::fleet_store::NewFleet {
                target: target.into(),
                selector: serde_json::json!({}),
                chain: false,
                canary: 1,
                max_parallel,
                failure_budget: 0,
                soak_seconds: 0,
                respect_maintenance_windows: true,
                entries,
            },
            "admin",
        )
        .await?)
}

async fn upgrades_of(inv: &Inventory, tenant: i64) -> anyhow::Result<Vec<(String, String)>> {
    Ok(sqlx::query_as(
        "SELECT state, requested_by FROM tenant_upgrades WHERE tenant_id = $1 ORDER BY id",
    )
    .bind(tenant)
    .fetch_all(inv.pool())
    .await?)
}

#[tokio::test]
async fn a_fleet_tenant_starts_once_and_only_under_the_fleets_lease() -> anyhow::Result<()> {
    use vcp_core::lifecycle::{FleetEntryState, UpgradeState};
    use vcp_orchestrator::lifecycle::fleet::{Entry, Pace, step};
    use vcp_orchestrator::upgrades::fleet_store::StartOutcome;
    let pg = EphemeralPostgres::start().await?;
    let inv = fresh(&pg, "fleet_start").await?;
    let catalog = Catalog::builtin();
    let ids = ready_tenants(&inv, "1.36", &["fa", "fb", "fc"]).await?;
    let f = new_fleet(&inv, &catalog, "1.37", 2).await?;
    let entries = inv.fleet_entries(f.id).await?;
    assert_eq!(
        entries
            .iter()
            .map(|e| (e.name.as_str(), e.wave))
            .collect::<Vec<_>>(),
        [("fa", 0), ("fb", 1), ("fc", 1)]
    );

    // One holder at a time.
    let held = inv
        .claim_fleet("w1", Duration::from_secs(30))
        .await?
        .unwrap();
    assert_eq!(held.id, f.id);
    assert!(
        inv.claim_fleet("w2", Duration::from_secs(30))
            .await?
            .is_none()
    );
    let e = &entries[0];
    assert_eq!(
        inv.start_fleet_tenant(f.id, "w2", e, "1.37", "fleet/w2")
            .await?,
        StartOutcome::NotOurs,
        "not the holder"
    );

    // Racing starts of one entry (a worker retrying, a step computed twice): one wins.
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let (inv, e) = (inv.clone(), e.clone());
        tasks.push(tokio::spawn(async move {
            inv.start_fleet_tenant(f.id, "w1", &e, "1.37", "fleet/w1")
                .await
                .unwrap()
        }));
    }
    let mut started = 0;
    for t in tasks {
        match t.await? {
            StartOutcome::Started(_) => started += 1,
            StartOutcome::NotOurs => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(started, 1);
    let ups = upgrades_of(&inv, ids[0]).await?;
    assert_eq!(ups.len(), 1, "{ups:?}");
    // Started like any upgrade: its first hop snapshots the tenant before the version moves.
    assert_eq!(
        ups[0],
        ("Snapshotting".to_owned(), format!("fleet-upgrade/{}", f.id))
    );
    let t = inv.tenant_by_id(ids[0]).await?.unwrap();
    assert_eq!((t.version.as_str(), t.phase), ("1.36", Phase::Upgrading));
    let entries = inv.fleet_entries(f.id).await?;
    assert_eq!(entries[0].state, FleetEntryState::Running);
    assert_eq!(entries[0].upgrade_state, Some(UpgradeState::Snapshotting));

    // The holder's lease runs out: another worker takes over, the old one writes nothing.
    sqlx::query(
        "UPDATE fleet_upgrades SET lease_until = now() - interval '1 s', next_step_at = now()",
    )
    .execute(inv.pool())
    .await?;
    let taken = inv
        .claim_fleet("w2", Duration::from_secs(30))
        .await?
        .unwrap();
    assert_eq!(
        inv.start_fleet_tenant(f.id, "w1", &entries[1], "1.37", "fleet/w1")
            .await?,
        StartOutcome::NotOurs
    );
    let pace = Pace {
        max_parallel: 2,
        failure_budget: 0,
        soak: Duration::ZERO,
        respect_windows: true,
    };
    let view = |rows: &[vcp_orchestrator::upgrades::fleet_store::FleetEntryRow]| -> Vec<Entry> {
        rows.iter()
            .map(|r| Entry {
                tenant_id: r.tenant_id,
                wave: r.wave as u32,
                state: r.state,
                window: None,
                upgrade: r.upgrade_state.map(|s| (s, r.upgrade_reason.clone())),
            })
            .collect()
    };
    // The tenant's own upgrade ends; the step sees it, the next wave starts at once.
    sqlx::query(
        "UPDATE tenant_upgrades SET state = 'Succeeded', finished_at = now() WHERE tenant_id = $1",
    )
    .bind(ids[0])
    .execute(inv.pool())
    .await?;
    let rows = inv.fleet_entries(f.id).await?;
    let s = step(
        &taken.progress(),
        &pace,
        &view(&rows),
        OffsetDateTime::now_utc(),
    );
    assert_eq!(s.finished, [(ids[0], FleetEntryState::Succeeded, None)]);
    assert_eq!(
        (s.progress.current_wave, s.start.as_slice()),
        (1, &ids[1..])
    );
    assert!(
        !inv.record_fleet_step(&taken, "w1", &s, "fleet/w1").await?,
        "not the holder"
    );
    assert!(inv.record_fleet_step(&taken, "w2", &s, "fleet/w2").await?);
    let audits = |inv: Inventory| async move {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM audit WHERE action LIKE 'fleet.%'")
            .fetch_one(inv.pool())
            .await
    };
    let before = audits(inv.clone()).await?;
    // The same step recorded again (a replica that died before releasing, say) changes
    // nothing: entries move only from the state they leave.
    let again = inv.fleet(f.id).await?.unwrap();
    assert!(inv.record_fleet_step(&again, "w2", &s, "fleet/w2").await?);
    assert_eq!(audits(inv.clone()).await?, before);
    assert_eq!(inv.fleet(f.id).await?.unwrap().current_wave, 1);

    // A tenant that is not Ready when its turn comes: Provisioning waits, Failed is skipped.
    sqlx::query("UPDATE tenants SET phase = 'Provisioning' WHERE id = $1")
        .bind(ids[1])
        .execute(inv.pool())
        .await?;
    sqlx::query("UPDATE tenants SET phase = 'Failed' WHERE id = $1")
        .bind(ids[2])
        .execute(inv.pool())
        .await?;
    let rows = inv.fleet_entries(f.id).await?;
    assert!(matches!(
        inv.start_fleet_tenant(f.id, "w2", &rows[1], "1.37", "fleet/w2")
            .await?,
        StartOutcome::Waiting(_)
    ));
    assert!(matches!(
        inv.start_fleet_tenant(f.id, "w2", &rows[2], "1.37", "fleet/w2").await?,
        StartOutcome::Skipped(why) if why.contains("Failed")
    ));
    let rows = inv.fleet_entries(f.id).await?;
    assert_eq!(
        rows.iter().map(|r| r.state).collect::<Vec<_>>(),
        [
            FleetEntryState::Succeeded,
            FleetEntryState::Pending,
            FleetEntryState::Skipped
        ]
    );
    assert!(upgrades_of(&inv, ids[1]).await?.is_empty());
    assert!(upgrades_of(&inv, ids[2]).await?.is_empty());
    let trail = inv.audit_trail(ids[0]).await?;
    for action in [
        "tenant.upgrade.start",
        "fleet.tenant.start",
        "fleet.tenant.succeeded",
    ] {
        assert!(
            trail.iter().any(|(_, a)| a == action),
            "{action}: {trail:?}"
        );
    }
    Ok(())
}

#[tokio::test]
async fn pause_resume_and_cancel_follow_the_fleet_state_machine() -> anyhow::Result<()> {
    use vcp_core::lifecycle::{FleetEntryState, FleetState};
    use vcp_orchestrator::upgrades::fleet_store::{ActionOutcome, FleetAction, StartOutcome};
    let pg = EphemeralPostgres::start().await?;
    let inv = fresh(&pg, "fleet_actions").await?;
    ready_tenants(&inv, "1.36", &["pa", "pb"]).await?;
    let f = new_fleet(&inv, &Catalog::builtin(), "1.37", 5).await?;
    let act = |a| {
        let inv = inv.clone();
        async move {
            inv.fleet_action(f.id, a, Some("maintenance"), "admin")
                .await
        }
    };
    assert!(matches!(
        act(FleetAction::Resume).await?,
        ActionOutcome::Refused(FleetState::Running)
    ));
    assert!(
        matches!(act(FleetAction::Pause).await?, ActionOutcome::Done(r) if r.state == FleetState::Paused)
    );
    // Paused: the worker may observe, but not start.
    inv.claim_fleet("w", Duration::from_secs(30))
        .await?
        .unwrap();
    let rows = inv.fleet_entries(f.id).await?;
    assert_eq!(
        inv.start_fleet_tenant(f.id, "w", &rows[0], "1.37", "fleet/w")
            .await?,
        StartOutcome::NotOurs
    );
    inv.release_fleet(f.id, "w", Duration::ZERO).await?;
    assert!(
        matches!(act(FleetAction::Resume).await?, ActionOutcome::Done(r) if r.state == FleetState::Running)
    );
    let ActionOutcome::Done(r) = act(FleetAction::Cancel).await? else {
        panic!("cancel refused")
    };
    assert_eq!(r.state, FleetState::Cancelled);
    assert!(r.reason.as_deref().unwrap().contains("maintenance"));
    let rows = inv.fleet_entries(f.id).await?;
    assert!(rows.iter().all(|r| r.state == FleetEntryState::Skipped));
    assert!(matches!(
        act(FleetAction::Resume).await?,
        ActionOutcome::Refused(FleetState::Cancelled)
    ));
    assert!(matches!(
        inv.fleet_action(f.id + 100, FleetAction::Pause, None, "admin")
            .await?,
        ActionOutcome::NoSuchFleet
    ));
    // Finished with nothing moving: never claimed again.
    assert!(
        inv.claim_fleet("w", Duration::from_secs(30))
            .await?
            .is_none()
    );
    Ok(())
}

#[tokio::test]
async fn an_expired_tenant_that_opted_out_is_moved_one_minor_and_told_why() -> anyhow::Result<()> {
    use vcp_core::lifecycle::FleetUpgrades;
    use vcp_orchestrator::upgrades::fleet_store::StartOutcome;
    let pg = EphemeralPostgres::start().await?;
    let inv = fresh(&pg, "fleet_expired").await?;
    let yaml = include_str!("../../templates/versions.yaml");
    let catalog = Catalog::parse(&yaml.replace("class: deprecated", "class: expired"))?;
    let ids = ready_tenants(&inv, "1.35", &["old"]).await?;
    ready_tenants(&inv, "1.36", &["cur"]).await?;
    sqlx::query("UPDATE tenants SET fleet_upgrades = $2 WHERE id = $1")
        .bind(ids[0])
        .bind(FleetUpgrades::Exclude)
        .execute(inv.pool())
        .await?;
    let f = new_fleet(&inv, &catalog, "1.37", 5).await?;
    let rows = inv.fleet_entries(f.id).await?;
    let old = rows.iter().find(|r| r.name == "old").unwrap();
    assert_eq!(old.target_version, "1.36", "one minor only");
    inv.claim_fleet("w", Duration::from_secs(30))
        .await?
        .unwrap();
    assert!(matches!(
        inv.start_fleet_tenant(f.id, "w", old, "1.36", "fleet/w")
            .await?,
        StartOutcome::Started(_)
    ));
    let ups = upgrades_of(&inv, ids[0]).await?;
    assert!(
        ups[0].1.contains(&format!("fleet-upgrade/{}", f.id))
            && ups[0].1.contains("1.35 is expired")
            && ups[0].1.contains("opted out"),
        "{ups:?}"
    );
    Ok(())
}

#[tokio::test]
async fn a_restarted_replica_takes_back_its_own_tenant_and_fleet_leases_only() -> anyhow::Result<()>
{
    use vcp_orchestrator::inventory::Released;
    let pg = EphemeralPostgres::start().await?;
    let inv = fresh(&pg, "release").await?;
    let catalog = Catalog::builtin();
    let ids = ready_tenants(&inv, "1.36", &["ra", "rb", "rc"]).await?;
    let f = new_fleet(&inv, &catalog, "1.37", 1).await?;
    // r1's old run held two tenants and the fleet upgrade; r10 (a prefix of it by name) one.
    let lease = |table: &'static str, owner: &'static str, id: i64| {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE {table} SET lease_owner = $1, lease_until = now() + interval '1 h' WHERE id = $2"
        )))
        .bind(owner)
        .bind(id)
    };
    lease("tenants", "r1/0", ids[0]).execute(inv.pool()).await?;
    lease("tenants", "r1/1", ids[1]).execute(inv.pool()).await?;
    lease("tenants", "r10/0", ids[2])
        .execute(inv.pool())
        .await?;
    lease("fleet_upgrades", "r1/fleet", f.id)
        .execute(inv.pool())
        .await?;

    assert_eq!(
        inv.release_leases_of("r1").await?,
        Released {
            tenants: 2,
            fleet_upgrades: 1
        }
    );
    let owners: Vec<Option<String>> =
        sqlx::query_scalar("SELECT lease_owner FROM tenants ORDER BY id")
            .fetch_all(inv.pool())
            .await?;
    assert_eq!(owners, [None, None, Some("r10/0".to_owned())]);
    assert!(
        inv.claim_fleet("r1/fleet", Duration::from_secs(30))
            .await?
            .is_some(),
        "the fleet upgrade is free at once"
    );
    Ok(())
}

/// Patch updates: the sweep's candidates are the Ready tenants nothing moves that did not opt
/// out on their own; a start is one conditional transaction, so replicas racing for one tenant
/// start it once, and a start decided on a release the tenant no longer runs starts nothing.
/// The update is a hop inside the minor that records both releases, and the tenant runs the
/// new release once the hop starts (and the old one again if it is rolled back).
#[tokio::test]
async fn a_patch_update_starts_once_however_many_replicas_race_for_it() -> anyhow::Result<()> {
    use vcp_core::lifecycle::AutoUpdate;
    use vcp_orchestrator::lifecycle::upgrade::Transition;
    let pg = EphemeralPostgres::start().await?;
    let inv = fresh(&pg, "patch_updates").await?;
    let ids = ready_tenants(&inv, "1.37", &["opted", "plan", "out", "busy"]).await?;
    for (id, setting) in [
        (ids[0], Some(AutoUpdate::Patch)),
        (ids[2], Some(AutoUpdate::Off)),
    ] {
        sqlx::query("UPDATE tenants SET auto_update = $2 WHERE id = $1")
            .bind(id)
            .bind(setting)
            .execute(inv.pool())
            .await?;
    }
    sqlx::query("UPDATE tenants SET phase = 'Provisioning' WHERE id = $1")
        .bind(ids[3])
        .execute(inv.pool())
        .await?;
    let names = |c: &[(vcp_orchestrator::inventory::Tenant, Vec<String>)]| {
        c.iter().map(|(t, _)| t.name.clone()).collect::<Vec<_>>()
    };
    let candidates = inv.patch_update_candidates().await?;
    assert_eq!(names(&candidates), ["opted", "plan"]);
    let opted = candidates[0].0.clone();
    assert_eq!(opted.release.as_deref(), Some("v1.37.1"));

    // Eight replicas decide on the same tenant at once: one start.
    let starts = futures::future::join_all((0..8).map(|i| {
        let (inv, t) = (inv.clone(), opted.clone());
        async move {
            inv.start_patch_update(&t, "v1.37.2", "auto-update: test", &format!("r{i}"))
                .await
        }
    }))
    .await;
    let started: Vec<i64> = starts
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .flatten()
        .collect();
    assert_eq!(started.len(), 1, "{started:?}");
    assert_eq!(upgrades_of(&inv, ids[0]).await?.len(), 1);
    assert_eq!(names(&inv.patch_update_candidates().await?), ["plan"]);
    let u = inv.active_upgrade(ids[0]).await?.unwrap();
    assert_eq!((u.hop_from.as_str(), u.hop_to.as_str()), ("1.37", "1.37"));
    assert_eq!(
        (u.hop_from_release.as_deref(), u.hop_to_release.as_deref()),
        (Some("v1.37.1"), Some("v1.37.2"))
    );

    // The hop starts: the tenant runs the new release; rolled back: the old one again.
    // (Only this tenant is due, so the claims below take it.)
    sqlx::query("UPDATE tenants SET next_reconcile_at = now() + interval '1 hour' WHERE id <> $1")
        .bind(ids[0])
        .execute(inv.pool())
        .await?;
    let release = |inv: Inventory, id: i64| async move {
        let t = inv.tenant_by_id(id).await?.unwrap();
        anyhow::Ok(t.release)
    };
    let pass = |tr: Transition| Outcome {
        upgrade: Some((u.id, tr)),
        ..outcome("Upgrading", 2)
    };
    for (tr, want) in [
        (Transition::StartHop, "v1.37.2"),
        (
            Transition::RollBack {
                reason: "gate".into(),
                restore: None,
            },
            "v1.37.1",
        ),
    ] {
        let t = inv.claim("w", Duration::from_secs(30)).await?.unwrap();
        assert_eq!(t.id, ids[0]);
        assert!(inv.finish(&t, "w", &pass(tr), "w").await?);
        assert_eq!(release(inv.clone(), ids[0]).await?.as_deref(), Some(want));
    }

    // A start decided on a release the tenant no longer runs starts nothing.
    let mut stale = candidates[1].0.clone();
    stale.release = Some("v1.37.0".into());
    assert_eq!(
        inv.start_patch_update(&stale, "v1.37.2", "auto-update: test", "r")
            .await?,
        None
    );
    Ok(())
}

/// `pem` written into the server's data directory, owned by the server's user with `mode`
/// (Postgres refuses a key others may read).
fn server_file(pg: &EphemeralPostgres, name: &str, pem: &str, mode: u32) -> anyhow::Result<String> {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    let data = pg.dir().join("data");
    let owner = std::fs::metadata(&data)?;
    let path = data.join(name);
    std::fs::write(&path, pem)?;
    std::os::unix::fs::chown(&path, Some(owner.uid()), Some(owner.gid()))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))?;
    Ok(path.to_str().expect("UTF-8").to_owned())
}

/// A production database usually requires TLS: the inventory connects with `sslmode` and
/// `sslrootcert` in its URL, verifies the server's certificate against that CA, and refuses a
/// server whose certificate another CA signed.
#[tokio::test]
async fn the_inventory_connects_over_tls_verifying_the_servers_certificate() -> anyhow::Result<()> {
    use vcp_pki::{Ca, LeafSpec};
    let pg = EphemeralPostgres::start().await?;
    let url = pg.create_database("tls").await?;
    let now = OffsetDateTime::now_utc();
    let day = time::Duration::DAY;
    let ca = Ca::generate("db-ca", now, day)?;
    let leaf = ca.issue(
        &LeafSpec::server("db", vec!["localhost".into()], vec!["127.0.0.1".parse()?]),
        now,
        day,
    )?;
    let cert = server_file(&pg, "server.crt", &leaf.cert_pem, 0o644)?;
    let key = server_file(&pg, "server.key", &leaf.key_pem, 0o600)?;
    let dir = tempfile::tempdir()?;
    let root = dir.path().join("ca.crt");
    std::fs::write(&root, &ca.cert_key().cert_pem)?;
    let other_root = dir.path().join("other-ca.crt");
    std::fs::write(
        &other_root,
        &Ca::generate("other", now, day)?.cert_key().cert_pem,
    )?;
    // TLS on, by a reload (ALTER SYSTEM cannot run in a transaction: one simple query each).
    let admin = Inventory::connect(&url).await?;
    for statement in [
        format!("ALTER SYSTEM SET ssl_cert_file = '{cert}'"),
        format!("ALTER SYSTEM SET ssl_key_file = '{key}'"),
        "ALTER SYSTEM SET ssl = on".to_owned(),
        "SELECT pg_reload_conf()".to_owned(),
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
            .execute(admin.pool())
            .await?;
    }

    let tls = |root: &std::path::Path| {
        format!(
            "{url}?sslmode=verify-full&sslrootcert={}",
            root.to_str().expect("UTF-8")
        )
    };
    let inv = vcp_dev::testing::eventually(
        "a TLS connection once the server reloaded",
        Duration::from_secs(20),
        || async {
            match Inventory::connect(&tls(&root)).await {
                Ok(inv) => Ok(Some(inv)),
                Err(e) => {
                    println!("not yet: {}", vcp_orchestrator::chain(&e));
                    Ok(None)
                }
            }
        },
    )
    .await?;
    inv.migrate().await?;
    let encrypted: bool =
        sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
            .fetch_one(inv.pool())
            .await?;
    assert!(encrypted, "the inventory's own connection is TLS");
    let err = Inventory::connect(&tls(&other_root))
        .await
        .expect_err("a server certificate of another CA");
    let msg = vcp_orchestrator::chain(&err);
    assert!(
        msg.to_lowercase().contains("certificate"),
        "the error says why: {msg}"
    );

    // The chart's `database.tls`: the CA mounted in the pod and named by PGSSLROOTCERT, with
    // PGSSLMODE=verify-full, and a URL that names neither; vcp's driver reads both as libpq
    // does. Run as the chart runs it: the `vcp` binary with that environment.
    let migrate = |root: Option<&std::path::Path>| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_vcp"));
        cmd.args(["migrate", "--database-url", &url])
            .env_remove("PGSSLROOTCERT")
            .env("PGSSLMODE", "verify-full");
        if let Some(root) = root {
            cmd.env("PGSSLROOTCERT", root);
        }
        cmd.output()
    };
    let out = migrate(Some(&root))?;
    assert!(
        out.status.success(),
        "PGSSLROOTCERT names the server's CA: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (what, root) in [
        ("another CA", Some(other_root.as_path())),
        ("the system's roots", None),
    ] {
        let out = migrate(root)?;
        let err = String::from_utf8_lossy(&out.stderr);
        println!("verify-full against {what}: {}", err.trim());
        assert!(!out.status.success(), "verify-full against {what} connects");
        assert!(err.to_lowercase().contains("certificate"), "{what}: {err}");
    }
    Ok(())
}

/// A fleet upgrade waits for its next poll only while nothing changes: the pass that ends one
/// of its tenants' upgrades makes it due at once (a slot is free, or a wave done), also when
/// a fleet worker holds it at that moment (the release keeps it due).
#[tokio::test]
async fn a_fleet_is_due_at_once_when_one_of_its_tenants_upgrades_ends() -> anyhow::Result<()> {
    use vcp_orchestrator::lifecycle::upgrade::Transition;
    use vcp_orchestrator::upgrades::fleet_store::StartOutcome;
    let pg = EphemeralPostgres::start().await?;
    let inv = fresh(&pg, "fleet_due").await?;
    let catalog = Catalog::builtin();
    let ids = ready_tenants(&inv, "1.36", &["da", "db", "dc"]).await?;
    let f = new_fleet(&inv, &catalog, "1.37", 2).await?;
    let entries = inv.fleet_entries(f.id).await?;
    let poll = Duration::from_secs(600);
    // Starts entry `i` under a fleet lease, and releases it with a poll far away.
    let start = |i: usize| {
        let (inv, e) = (inv.clone(), entries[i].clone());
        async move {
            let held = inv.claim_fleet("w", Duration::from_secs(30)).await?;
            anyhow::ensure!(held.is_some(), "the fleet is due");
            let StartOutcome::Started(up) = inv
                .start_fleet_tenant(f.id, "w", &e, "1.37", "fleet/w")
                .await?
            else {
                anyhow::bail!("entry {i} did not start");
            };
            Ok::<_, anyhow::Error>(up)
        }
    };
    // Ends tenant `id`'s upgrade `up` the way a reconcile pass does.
    let end = |id: i64, up: i64| {
        let inv = inv.clone();
        async move {
            sqlx::query(
                "UPDATE tenants SET next_reconcile_at = now() + interval '1 h' WHERE id <> $1",
            )
            .bind(id)
            .execute(inv.pool())
            .await?;
            sqlx::query("UPDATE tenants SET next_reconcile_at = now() WHERE id = $1")
                .bind(id)
                .execute(inv.pool())
                .await?;
            let t = inv.claim("r", Duration::from_secs(30)).await?.unwrap();
            assert_eq!(t.id, id);
            let mut o = outcome("Ready", t.generation);
            o.upgrade = Some((up, Transition::Succeeded));
            assert!(inv.finish(&t, "r", &o, "r").await?);
            Ok::<_, anyhow::Error>(())
        }
    };

    let up = start(0).await?;
    inv.release_fleet(f.id, "w", poll).await?;
    assert!(
        inv.claim_fleet("w", Duration::from_secs(30))
            .await?
            .is_none(),
        "not due before its poll while nothing changed"
    );
    end(ids[0], up).await?;
    assert!(
        inv.claim_fleet("w", Duration::from_secs(30))
            .await?
            .is_some(),
        "due at once after its tenant's upgrade ended"
    );
    inv.release_fleet(f.id, "w", Duration::ZERO).await?;

    // The upgrade ends while a worker holds the fleet: its release keeps it due.
    let up = start(1).await?;
    end(ids[1], up).await?;
    inv.release_fleet(f.id, "w", poll).await?;
    assert!(
        inv.claim_fleet("w", Duration::from_secs(30))
            .await?
            .is_some(),
        "due at once: the upgrade ended during the step"
    );
    Ok(())
}

/// Snapshots are numbered per tenant (migration 0011): an owner's numbers say nothing about
/// other tenants' snapshots, and the ids handed out before the migration (global ones) still
/// name the same snapshot of the same tenant, with each tenant's numbers continuing after.
#[tokio::test]
async fn snapshots_are_numbered_per_tenant_and_ids_from_before_stay_addressable()
-> anyhow::Result<()> {
    let pg = EphemeralPostgres::start().await?;
    let url = pg.create_database("numbers").await?;
    let inv = Inventory::connect(&url).await?;
    // The inventory as it was before 0011, with a fleet's snapshots: ids 1 and 3 of one
    // tenant, 2 of another.
    let mut before = sqlx::migrate!("../migrations");
    before.migrations = before
        .migrations
        .iter()
        .filter(|m| m.version < 11)
        .cloned()
        .collect::<Vec<_>>()
        .into();
    before.run(inv.pool()).await?;
    // Rows of that schema written as it was (today's code reads and writes columns added
    // since).
    for (minor, release) in [("1.37", "v1.37.1")] {
        sqlx::query(
            "INSERT INTO versions (minor, kubernetes, images) VALUES ($1, $2, '{}')
             ON CONFLICT (minor) DO NOTHING",
        )
        .bind(minor)
        .bind(release)
        .execute(inv.pool())
        .await?;
    }
    let mut ids = BTreeMap::new();
    for (name, key, owner) in [("a", "numbersaaa", "alice"), ("b", "numbersbbb", "bob")] {
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO tenants (name, key, owner, version, release) VALUES ($1, $2, $3, '1.37', 'v1.37.1')
             RETURNING id",
        )
        .bind(name)
        .bind(key)
        .bind(owner)
        .fetch_one(inv.pool())
        .await?;
        ids.insert(name, (id, key));
    }
    for (id, t) in [(1, "a"), (2, "b"), (3, "a")] {
        let (tenant_id, key) = ids[t];
        sqlx::query(
            "INSERT INTO etcd_snapshots (id, tenant_id, version, state, location, requested_by)
             VALUES ($1, $2, '1.37', 'Pending', $3, 'alice')",
        )
        .bind(id)
        .bind(tenant_id)
        .bind(format!("pvc://vcp-{key}/etcd-snapshots/snapshot-{id}.db"))
        .execute(inv.pool())
        .await?;
    }
    sqlx::query("SELECT setval('etcd_snapshots_id_seq', 3)")
        .execute(inv.pool())
        .await?;
    inv.migrate().await?;
    inv.upsert_versions(&Catalog::builtin()).await?;
    let a = inv.tenants_named("a", None).await?.remove(0);
    let b = inv.tenants_named("b", None).await?.remove(0);

    let numbers =
        |rows: Vec<vcp_orchestrator::snapshots::store::SnapshotRow>| -> Vec<(i64, String)> {
            rows.into_iter().map(|s| (s.number, s.location)).collect()
        };
    assert_eq!(
        numbers(inv.snapshots(a.id).await?),
        [
            (
                3,
                format!("pvc://vcp-{}/etcd-snapshots/snapshot-3.db", a.key)
            ),
            (
                1,
                format!("pvc://vcp-{}/etcd-snapshots/snapshot-1.db", a.key)
            ),
        ],
        "kept their ids, and their files"
    );
    let three = inv.numbered_snapshot(a.id, 3).await?.unwrap();
    assert_eq!(three.id, 3);
    assert!(
        inv.numbered_snapshot(b.id, 3).await?.is_none(),
        "not another tenant's"
    );
    // New snapshots continue each tenant's own numbers; a new tenant starts at 1, whatever
    // the fleet has taken.
    let next_a = inv.request_snapshot(&a, "alice").await?.unwrap();
    let next_b = inv.request_snapshot(&b, "bob").await?.unwrap();
    assert_eq!((next_a.number, next_b.number), (4, 3));
    assert_eq!(
        next_a.location,
        format!("pvc://vcp-{}/etcd-snapshots/snapshot-4.db", a.key)
    );
    let c = inv
        .create_tenant(&tenant("c", "numbersccc", "carol"), "carol")
        .await?;
    let first = inv.request_snapshot(&c, "carol").await?.unwrap();
    let second = inv.request_snapshot(&c, "carol").await?.unwrap();
    assert_eq!((first.number, second.number), (1, 2));
    assert!(first.id > 3, "the row ids go on as before");
    // The audit trail names the tenant's numbers too.
    let detail: Vec<serde_json::Value> = sqlx::query_scalar(
        "SELECT detail FROM audit WHERE tenant_id = $1 AND action = 'tenant.snapshot.request'
         ORDER BY id",
    )
    .bind(c.id)
    .fetch_all(inv.pool())
    .await?;
    assert_eq!(detail[0]["snapshot"], 1);
    assert_eq!(detail[1]["snapshot"], 2);
    Ok(())
}
