//! The API contract, checked from outside: schemathesis generates requests from the
//! document a real `vcp serve` publishes at `/openapi.json` and holds the answers to it.
//!
//! Both modes run. Positive examples are valid by the document, so the server must accept
//! them (2xx, or 404/409 for a name that is absent or taken); negative examples break one of
//! its rules, so the server must refuse them with a 4xx. Every answer must be documented (its
//! status, Content-Type and body schema), none may be a 5xx, and every `/v1` route must answer
//! 401 without a token. A rule the server enforces but the document does not state fails the
//! positive mode; one the document states but the server does not enforce fails the negative.
//!
//! The server runs a reconcile worker, so `POST /v1/tenants` provisions for real: the hooks
//! in `tests/contract/hooks.py` delete each generated tenant when the next one is created,
//! and the test waits for them all to be gone. A first run covers the operations on one
//! tenant (all but deletion) against a tenant the test provisioned, so issuing a kubeconfig
//! is exercised end to end; the second covers every operation with generated names.
//!
//! Schemathesis comes from PyPI, pinned in `tests/contract/requirements.txt`, in the
//! virtualenv that `tests/setup.sh` builds (`~/.cache/vcp/schemathesis`, or
//! `$VCP_SCHEMATHESIS_VENV`). Without it this test fails; `VCP_SKIP_SCHEMATHESIS=1` skips it
//! instead, saying so. `VCP_CONTRACT_EXAMPLES` (default 50) and `VCP_CONTRACT_SEED` (default
//! fixed, so CI is reproducible) tune the runs; `VCP_CONTRACT_REPORT_DIR` keeps their JUnit,
//! NDJSON and HTML reports.

use reqwest::Method;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use vcp_dev::cluster::DevCluster;

const REQUIREMENTS: &str = include_str!("../../tests/contract/requirements.txt");

/// Examples per operation and mode unless `VCP_CONTRACT_EXAMPLES` says otherwise: enough to
/// cover every rule, few enough for a few minutes on two cores.
const DEFAULT_EXAMPLES: u32 = 50;
const DEFAULT_SEED: u64 = 20_261_101;
const FIXTURE: &str = "contract-fixture";

fn contract_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/contract")
}

/// The pinned schemathesis version.
fn pinned() -> &'static str {
    REQUIREMENTS
        .lines()
        .find_map(|l| l.strip_prefix("schemathesis=="))
        .expect("tests/contract/requirements.txt pins schemathesis")
        .trim()
}

/// The `st` of the virtualenv, checked to be the pinned version; `None` when skipping.
fn schemathesis() -> anyhow::Result<Option<PathBuf>> {
    let venv = match std::env::var_os("VCP_SCHEMATHESIS_VENV") {
        Some(v) => PathBuf::from(v),
        None => {
            let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
            PathBuf::from(home).join(".cache/vcp/schemathesis")
        }
    };
    let st = venv.join("bin/st");
    let version = std::process::Command::new(&st).arg("--version").output();
    let found = match &version {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_owned(),
        Ok(o) => format!("{} {}", o.status, String::from_utf8_lossy(&o.stderr).trim()),
        Err(e) => e.to_string(),
    };
    if found == format!("st, version {}", pinned()) {
        return Ok(Some(st));
    }
    if std::env::var_os("VCP_SKIP_SCHEMATHESIS").is_some_and(|v| v == "1") {
        eprintln!(
            "SKIPPED: the schemathesis contract test (VCP_SKIP_SCHEMATHESIS=1; {} has {found:?})",
            st.display()
        );
        return Ok(None);
    }
    anyhow::bail!(
        "schemathesis {} is needed at {} (found: {found}); tests/setup.sh installs it from PyPI \
         (or set VCP_SKIP_SCHEMATHESIS=1 to skip this test)",
        pinned(),
        st.display()
    )
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> anyhow::Result<T> {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .map_err(|_| anyhow::anyhow!("{name}={v:?} is not a number")),
        Err(_) => Ok(default),
    }
}

#[tokio::test]
async fn schemathesis_finds_the_server_and_its_openapi_document_in_agreement() -> anyhow::Result<()>
{
    let Some(st) = schemathesis()? else {
        return Ok(());
    };
    let examples: u32 = env_or("VCP_CONTRACT_EXAMPLES", DEFAULT_EXAMPLES)?;
    let seed: u64 = env_or("VCP_CONTRACT_SEED", DEFAULT_SEED)?;
    let started = Instant::now();
    let cluster = DevCluster::shared().await?;
    let p = vcp_dev::testing::platform(cluster, "vcp-contract", 1).await?;
    let admin = &p.admin;

    // A token of its own (revoking the bootstrap `admin` would end the run) and a Ready tenant.
    let (s, t) = admin
        .raw(
            Method::POST,
            "/v1/tokens",
            Some(&json!({"name": "schemathesis", "role": "admin"})),
        )
        .await?;
    anyhow::ensure!(s == 201, "token: {t}");
    let token = t["token"].as_str().unwrap_or_default().to_owned();
    admin.create_tenant(FIXTURE).await?;
    admin.wait_ready(FIXTURE, Duration::from_secs(240)).await?;
    let ready = started.elapsed();

    let dir = contract_dir().canonicalize()?;
    let url = &p.orchestrator.url;
    // The tenant's operations first: the run over everything may delete any tenant it lists.
    let runs: [(&str, &[&str]); 2] = [
        (
            "tenant.toml",
            &[
                "--include-path-regex",
                "^/v1/tenants/\\{name\\}",
                "--exclude-method",
                "DELETE",
            ],
        ),
        ("schemathesis.toml", &[]),
    ];
    for (config, select) in runs {
        let run = Instant::now();
        let out = tokio::process::Command::new(&st)
            .arg("--no-color")
            .arg("--config-file")
            .arg(dir.join(config))
            .arg("run")
            .arg(format!("{url}/openapi.json"))
            .args(["--url", url, "--mode", "all", "--workers", "1"])
            .args(["--max-examples", &examples.to_string()])
            .args(["--seed", &seed.to_string()])
            .args(["--generation-database", "none"])
            .args(select)
            .args(match std::env::var_os("VCP_CONTRACT_REPORT_DIR") {
                Some(d) => vec![
                    "--report".into(),
                    "junit,ndjson,html".into(),
                    "--report-dir".into(),
                    Path::new(&d)
                        .join(config.trim_end_matches(".toml"))
                        .into_os_string(),
                ],
                None => vec![],
            })
            .current_dir(p.dir.path())
            .env("SCHEMATHESIS_HOOKS", dir.join("hooks.py"))
            .env("VCP_CONTRACT_URL", url)
            .env("VCP_CONTRACT_TOKEN", &token)
            .env("VCP_CONTRACT_TENANT", FIXTURE)
            .env("COLUMNS", "120")
            .kill_on_drop(true)
            .output()
            .await?;
        let report = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        anyhow::ensure!(
            out.status.success(),
            "schemathesis {} failed ({}; {config}, --seed {seed} --max-examples {examples}):\n{report}",
            pinned(),
            out.status
        );
        eprintln!(
            "schemathesis {} with {config}: {examples} examples per operation and mode, seed \
             {seed}, {:.0}s (platform and tenant Ready after {:.0}s):",
            pinned(),
            run.elapsed().as_secs_f64(),
            ready.as_secs_f64()
        );
        // Its summary: from the phases on.
        let phases = report.find("Examples (").unwrap_or(0);
        for l in report[phases..].lines() {
            eprintln!("  {l}");
        }
        // Its token still worked at the end (a 401 counts as a pass for valid data).
        let (s, body) = admin
            .with_token(&token)
            .raw(Method::GET, "/v1/tokens", None)
            .await?;
        anyhow::ensure!(s == 200, "the run's token stopped working: {body}");
        if config == "tenant.toml" {
            // Its positive examples reached the real thing.
            let (s, list) = admin
                .raw(
                    Method::GET,
                    &format!("/v1/tenants/{FIXTURE}/kubeconfigs"),
                    None,
                )
                .await?;
            let issued = list["items"].as_array().map_or(0, Vec::len);
            anyhow::ensure!(s == 200 && issued > 0, "no kubeconfig issued: {list}");
            eprintln!("  ({issued} kubeconfigs issued for {FIXTURE})");
        }
    }

    // The hooks deleted every generated tenant but the last; it and the fixture (unless a
    // generated sequence deleted that already) go now, and all of them must be gone.
    let (s, list) = admin.raw(Method::GET, "/v1/tenants", None).await?;
    anyhow::ensure!(s == 200, "{list}");
    // By name and owner: names are unique per owner only, and a generated tenant may have
    // the fixture's name.
    let live: Vec<(String, String)> = list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| t["phase"] != "Deleting")
        .filter_map(|t| {
            Some((
                t["name"].as_str()?.to_owned(),
                t["owner"].as_str()?.to_owned(),
            ))
        })
        .collect();
    anyhow::ensure!(
        live.len() <= 2,
        "more tenants live than the hooks allow: {live:?}"
    );
    for (name, owner) in &live {
        let (s, t) = admin
            .raw(
                Method::DELETE,
                &format!("/v1/tenants/{name}?owner={owner}"),
                None,
            )
            .await?;
        anyhow::ensure!(s == 202 || s == 404, "{t}");
    }
    vcp_dev::testing::eventually(
        "the runs' tenants to be deleted",
        Duration::from_secs(300),
        || async {
            let (s, list) = admin.raw(Method::GET, "/v1/tenants", None).await?;
            anyhow::ensure!(s == 200, "{list}");
            Ok(list["items"]
                .as_array()
                .is_some_and(Vec::is_empty)
                .then_some(()))
        },
    )
    .await?;
    let metrics = reqwest::get(format!("{url}/metrics")).await?.text().await?;
    anyhow::ensure!(
        metrics.contains("vcp_http_server_errors_total 0"),
        "{metrics}"
    );
    eprintln!("done in {:.0}s", started.elapsed().as_secs_f64());
    Ok(())
}
