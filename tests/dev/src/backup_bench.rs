//! `vcp-dev bench backup`: what a backup and a restore cost a tenant with many objects, through
//! the real store (the dev cluster's S3 server).
//!
//! It starts a dev cluster and a `vcp serve` with a backup store, creates one tenant on the
//! process node (real etcd), writes `--objects` ConfigMaps of `--object-kib` KiB each into it,
//! then asks for a snapshot (taken, sealed and uploaded by its Job), deletes a tenth of the
//! ConfigMaps and restores (the object fetched, opened, checked and restored). It prints one
//! summary line: the end-to-end times through the API, the seconds each Job container ran (the
//! pods' container states: whole seconds), MiB/s of the snapshot file over those, and the
//! ConfigMaps back after the restore (all of them, or the run fails).
//!
//! Data flow: API calls and the Jobs' pods -> [`Figures`] -> one line.

use anyhow::Context;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use std::time::{Duration, Instant};

/// `bench backup` settings.
#[derive(Debug, Clone, clap::Args)]
pub struct BackupBench {
    /// ConfigMaps written into the tenant.
    #[arg(long, env = "VCP_BENCH_OBJECTS", default_value_t = 10_000)]
    pub objects: usize,
    /// Data per ConfigMap, KiB.
    #[arg(long, env = "VCP_BENCH_OBJECT_KIB", default_value_t = 1)]
    pub object_kib: usize,
    /// Concurrent creates.
    #[arg(long, env = "VCP_BENCH_CONCURRENCY", default_value_t = 32)]
    pub concurrency: usize,
}

/// Seconds each container of a finished pod ran, by name (init containers included).
fn container_seconds(p: &Pod) -> Vec<(String, f64)> {
    let status = p.status.clone().unwrap_or_default();
    status
        .init_container_statuses
        .into_iter()
        .flatten()
        .chain(status.container_statuses.into_iter().flatten())
        .filter_map(|c| {
            let t = c.state?.terminated?;
            let (s, f) = (t.started_at?.0, t.finished_at?.0);
            Some((c.name, f.duration_since(s).as_secs_f64()))
        })
        .collect()
}

/// The containers of the (last) pod of Job `job` in `ns`.
async fn job_containers(
    host: &kube::Client,
    ns: &str,
    job: &str,
) -> anyhow::Result<Vec<(String, f64)>> {
    let pods = Api::<Pod>::namespaced(host.clone(), ns)
        .list(&ListParams::default().labels(&format!("job-name={job}")))
        .await?;
    let last = pods
        .items
        .iter()
        .max_by_key(|p| p.metadata.creation_timestamp.clone().map(|t| t.0))
        .with_context(|| format!("no pod of job {job} in {ns}"))?;
    Ok(container_seconds(last))
}

fn seconds_of(c: &[(String, f64)], name: &str) -> f64 {
    c.iter()
        .find(|(n, _)| n == name)
        .map_or(f64::NAN, |(_, s)| *s)
}

/// What one run measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Figures {
    pub objects: usize,
    pub create_s: f64,
    pub size_mib: f64,
    pub snapshot_total_s: f64,
    pub snapshot_s: f64,
    pub upload_s: f64,
    pub restore_total_s: f64,
    pub fetch_s: f64,
    pub restore_s: f64,
    pub swap_s: f64,
    pub objects_after: usize,
}

impl Figures {
    /// The summary line. MiB/s over a container's whole seconds: a lower bound (a step that
    /// took 0.2 s shows as 0 or 1 s; `inf` for 0).
    pub fn line(&self) -> String {
        let rate = |s: f64| self.size_mib / s;
        format!(
            "bench-backup objects={} create_s={:.1} size_mib={:.1} snapshot_total_s={:.1} \
             snapshot_s={:.0} upload_s={:.0} upload_mib_s={:.1} e2e_backup_mib_s={:.1} \
             restore_total_s={:.1} fetch_s={:.0} fetch_mib_s={:.1} restore_s={:.0} swap_s={:.0} \
             objects_after={}",
            self.objects,
            self.create_s,
            self.size_mib,
            self.snapshot_total_s,
            self.snapshot_s,
            self.upload_s,
            rate(self.upload_s),
            rate(self.snapshot_total_s),
            self.restore_total_s,
            self.fetch_s,
            rate(self.fetch_s),
            self.restore_s,
            self.swap_s,
            self.objects_after,
        )
    }
}

pub async fn run(b: BackupBench) -> anyhow::Result<()> {
    use vcp_dev::platform::PROCESS_WORKLOADS_PLAN;
    let (cluster, orch, api) =
        crate::bench::bench_platform(false, 4, vec![], Some("vcp-bench".into())).await?;
    let t = api
        .create_tenant_with_plan("bk", PROCESS_WORKLOADS_PLAN)
        .await?;
    let ns = format!("vcp-{}", t["key"].as_str().unwrap_or_default());
    api.wait_ready("bk", Duration::from_secs(300)).await?;
    let kubeconfig = api.kubeconfig("bk", "bench", &["admin"], "2h").await?;
    let tenant = kube::Client::try_from(
        kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::from_yaml(&kubeconfig)?,
            &Default::default(),
        )
        .await?,
    )?;
    let cms: Api<ConfigMap> = Api::namespaced(tenant, "default");

    let data = "x".repeat(b.object_kib * 1024);
    let clock = Instant::now();
    let names: Vec<String> = (0..b.objects).map(|i| format!("bench-{i:06}")).collect();
    for chunk in names.chunks(b.concurrency.max(1)) {
        let creates = chunk.iter().map(|n| {
            let cm: ConfigMap = serde_json::from_value(
                serde_json::json!({"metadata": {"name": n}, "data": {"d": data}}),
            )
            .expect("a ConfigMap");
            let cms = cms.clone();
            async move { cms.create(&PostParams::default(), &cm).await }
        });
        for r in futures::future::join_all(creates).await {
            r?;
        }
    }
    let create_s = clock.elapsed().as_secs_f64();

    let clock = Instant::now();
    let snap = api.take_snapshot("bk", Duration::from_secs(1800)).await?;
    let snapshot_total_s = clock.elapsed().as_secs_f64();
    let number = snap["id"].as_i64().context("a snapshot id")?;
    anyhow::ensure!(
        snap["location"]
            .as_str()
            .is_some_and(|l| l.starts_with("s3://")),
        "the snapshot was not uploaded: {snap}"
    );
    let size_mib = snap["size_bytes"].as_f64().unwrap_or(0.0) / (1024.0 * 1024.0);
    let host = cluster.connect().await?;
    let taken = job_containers(&host, &ns, &format!("etcd-snapshot-{number}")).await?;

    for n in names.iter().step_by(10) {
        cms.delete(n, &DeleteParams::default()).await?;
    }
    let clock = Instant::now();
    let restore = api.restore("bk", number, Duration::from_secs(1800)).await?;
    let restore_total_s = clock.elapsed().as_secs_f64();
    let rid = restore["id"].as_i64().context("a restore id")?;
    let restored = job_containers(&host, &ns, &format!("etcd-restore-{rid}-0")).await?;
    // The tenant's own client relists after the restore's revision bump.
    let objects_after =
        vcp_dev::testing::eventually("every ConfigMap back", Duration::from_secs(120), || async {
            let l = cms.list(&ListParams::default().labels("")).await?;
            let n = l
                .items
                .iter()
                .filter(|c| {
                    c.metadata
                        .name
                        .as_deref()
                        .is_some_and(|n| n.starts_with("bench-"))
                })
                .count();
            Ok((n == b.objects).then_some(n))
        })
        .await?;
    let f = Figures {
        objects: b.objects,
        create_s,
        size_mib,
        snapshot_total_s,
        snapshot_s: seconds_of(&taken, "snapshot"),
        upload_s: seconds_of(&taken, "upload"),
        restore_total_s,
        fetch_s: seconds_of(&restored, "fetch"),
        restore_s: seconds_of(&restored, "restore"),
        swap_s: seconds_of(&restored, "swap"),
        objects_after,
    };
    println!("{}", f.line());
    drop(orch);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_names_every_figure_once() {
        let f = Figures {
            objects: 10_000,
            create_s: 40.0,
            size_mib: 24.0,
            snapshot_total_s: 6.0,
            snapshot_s: 1.0,
            upload_s: 2.0,
            restore_total_s: 45.0,
            fetch_s: 1.0,
            restore_s: 3.0,
            swap_s: 0.0,
            objects_after: 10_000,
        };
        let line = f.line();
        assert!(line.starts_with("bench-backup objects=10000 "), "{line}");
        assert!(line.contains(" upload_mib_s=12.0 "), "{line}");
        assert!(line.contains(" e2e_backup_mib_s=4.0 "), "{line}");
        assert!(line.contains(" fetch_mib_s=24.0 "), "{line}");
        assert!(line.ends_with(" objects_after=10000"), "{line}");
        let keys: Vec<&str> = line
            .split_whitespace()
            .skip(1)
            .map(|kv| kv.split('=').next().unwrap())
            .collect();
        let mut unique = keys.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(keys.len(), unique.len(), "{line}");
    }
}
