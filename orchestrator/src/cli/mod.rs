//! The client commands of `vcp` (`tenant`, `upgrade`, `kubeconfig`, `user`, `token`,
//! `snapshot`, `audit`, `version`): thin callers of the platform API, one file per feature.
//! They read the server from `VCP_API_URL` and the bearer token from `VCP_TOKEN` ([`client`]),
//! decode answers into the same types the server encodes ([`crate::api`]), and print them with
//! [`output`]. API problems come back as [`Error::Api`] with the server's detail and field.
//! This file holds what every command shares: the output flag, waiting and following,
//! parsing of times, labels and windows, and `vcp version`.

pub mod audit;
pub mod client;
pub mod kubeconfigs;
pub mod output;
pub mod rotations;
pub mod snapshots;
pub mod tenants;
pub mod tokens;
pub mod upgrades;
pub mod usage;

use client::Client;
pub use client::Connection;
use output::table;

use crate::api::{MaintenanceWindow, Phase, TenantView, VersionList};
use crate::{Error, Result};
use output::Format;
use std::collections::BTreeMap;
use std::io::Write as _;
use std::time::{Duration, Instant};
use time::OffsetDateTime;

/// Output format flag shared by the listing commands.
#[derive(Debug, Clone, clap::Args)]
pub struct OutputArgs {
    /// Output format.
    #[arg(
        short = 'o',
        long = "output",
        env = "VCP_OUTPUT",
        value_enum,
        default_value = "table"
    )]
    pub output: Format,
}

fn window(s: &str) -> Result<MaintenanceWindow, String> {
    s.parse()
        .map_err(|e: crate::window::WindowError| e.to_string())
}

#[derive(Debug, Clone, clap::Args)]
pub struct WaitArgs {
    /// Wait until done, showing progress on stderr.
    #[arg(long, env = "VCP_WAIT")]
    pub wait: bool,
    /// Give up waiting after this long (e.g. 90s, 10m).
    #[arg(long, env = "VCP_WAIT_TIMEOUT", default_value = "10m", value_parser = duration)]
    pub timeout: Duration,
}

/// `vcp version ...`
#[derive(Debug, clap::Subcommand)]
pub enum VersionCommand {
    /// Kubernetes versions tenants can run.
    List(OutputArgs),
}

fn duration(s: &str) -> Result<Duration, String> {
    crate::api::parse_ttl(s).ok_or_else(|| format!("{s:?} is not a duration like 90s, 10m or 1h"))
}

/// Writes to stdout; a reader that went away (`| head`) is not an error.
pub fn print(s: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(s.as_bytes()).and_then(|_| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(Error::Client(format!("cannot write to stdout: {e}")))
        }
        _ => Ok(()),
    }
}

fn progress(line: &str) {
    eprintln!("{line}");
}

fn now() -> OffsetDateTime {
    OffsetDateTime::now_utc()
}

fn labels(pairs: &[String]) -> Result<BTreeMap<String, String>> {
    pairs
        .iter()
        .map(|p| match p.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
            _ => Err(Error::Client(format!("--label {p:?}: expected KEY=VALUE"))),
        })
        .collect()
}

/// Polls a tenant until `done` says so, printing progress; fails on `Failed` or timeout.
async fn follow(
    client: &Client,
    name: &str,
    wait: &WaitArgs,
    done: impl Fn(&TenantView) -> bool,
) -> Result<Option<TenantView>> {
    let start = Instant::now();
    let mut p = tenants::Progress::default();
    let mut last_hint = String::new();
    let mut hint_at = Instant::now();
    loop {
        let t = match client.tenant(name).await {
            Ok(t) => t,
            // Gone: what a finished deletion looks like.
            Err(Error::Api { status: 404, .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        for line in p.update(&t, start.elapsed()) {
            progress(&line);
        }
        if done(&t) {
            return Ok(Some(t));
        }
        if t.phase == Phase::Failed {
            let why = t
                .conditions
                .iter()
                .find(|c| c.reason == vcp_core::lifecycle::ConditionReason::Failed)
                .map(|c| format!("{}: {}", c.type_, c.message))
                .unwrap_or_default();
            return Err(Error::Client(format!("tenant {name} failed: {why}")));
        }
        // While nothing changes, say what the tenant waits on every 10 s.
        if let Some(h) = tenants::Progress::waiting_on(&t)
            && (h != last_hint || hint_at.elapsed() > Duration::from_secs(10))
            && start.elapsed() > Duration::from_secs(5)
        {
            progress(&format!("{:>6.1}s  {h}", start.elapsed().as_secs_f64()));
            last_hint = h;
            hint_at = Instant::now();
        }
        if start.elapsed() > wait.timeout {
            return Err(Error::Client(format!(
                "tenant {name} is still {} after {}s",
                t.phase.as_str(),
                wait.timeout.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

pub async fn version(conn: &Connection, cmd: VersionCommand) -> Result<()> {
    let client = Client::new(conn)?;
    let VersionCommand::List(o) = cmd;
    let v: VersionList = client.get("/v1/versions").await?;
    match o.output {
        Format::Table => print(&versions_table(&v, output::terminal_width())),
        f => print(&output::structured(&v, f)),
    }
}

/// A `--since`/`--until` value as the API takes it: an RFC 3339 time as given, or an age
/// (`12h`) as the time that long before `now`.
fn instant(flag: &str, v: &str, now: OffsetDateTime) -> Result<String> {
    let rfc3339 = &time::format_description::well_known::Rfc3339;
    if OffsetDateTime::parse(v, rfc3339).is_ok() {
        return Ok(v.to_owned());
    }
    crate::api::parse_ttl(v)
        .and_then(|d| time::Duration::try_from(d).ok())
        .and_then(|d| now.checked_sub(d))
        .and_then(|t| t.format(rfc3339).ok())
        .ok_or_else(|| {
            Error::Client(format!(
                "{flag} {v:?}: expected an RFC 3339 time (2026-01-01T00:00:00Z) or an age (90m, 12h, 30d)"
            ))
        })
}

pub fn versions_table(v: &VersionList, width: usize) -> String {
    let rows: Vec<Vec<String>> = v
        .versions
        .iter()
        .map(|v| {
            vec![
                v.minor.clone(),
                v.kubernetes.clone(),
                v.class.as_str().to_owned(),
                if v.default { "*" } else { "" }.to_owned(),
            ]
        })
        .collect();
    table(&["MINOR", "KUBERNETES", "CLASS", "DEFAULT"], &rows, width)
}

#[cfg(test)]
mod tests {
    use super::client::{name, segment, with_owner};
    use super::*;

    #[test]
    fn names_stay_one_path_segment() {
        assert_eq!(segment("team-a"), "team-a");
        assert_eq!(segment("../tokens"), "%2E%2E%2Ftokens");
        assert!(name("..").is_err());
        assert_eq!(name("team-a").unwrap(), "team-a");
        assert_eq!(segment("a b?c"), "a%20b%3Fc");
    }

    #[test]
    fn usage_range_flags_take_rfc3339_times_or_ages() {
        let now = OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap();
        assert_eq!(
            instant("--since", "2026-01-01T00:00:00+02:00", now).unwrap(),
            "2026-01-01T00:00:00+02:00",
            "a time goes to the server as given"
        );
        assert_eq!(
            instant("--since", "12h", now).unwrap(),
            "2027-01-14T20:00:00Z"
        );
        for bad in ["yesterday", "2026-01-01", "-1h", ""] {
            let e = instant("--until", bad, now).unwrap_err().to_string();
            assert!(e.starts_with("--until"), "{bad}: {e}");
        }
        // `+` in an offset must survive the query string.
        assert_eq!(
            segment("2026-01-01T00:00:00+02:00"),
            "2026-01-01T00%3A00%3A00%2B02%3A00"
        );
    }

    #[test]
    fn owner_goes_with_every_request_about_one_tenant() {
        let o = Some("team-b");
        assert_eq!(with_owner("/v1/tenants/a", o), "/v1/tenants/a?owner=team-b");
        assert_eq!(
            with_owner("/v1/tenants/a?retain_data=true", o),
            "/v1/tenants/a?retain_data=true&owner=team-b"
        );
        assert_eq!(
            with_owner("/v1/tenants/a/kubeconfigs/0f", o),
            "/v1/tenants/a/kubeconfigs/0f?owner=team-b"
        );
        // Not about one tenant: the list, creating one, tokens, the fleet.
        for p in [
            "/v1/tenants",
            "/v1/tenants/",
            "/v1/tokens/a",
            "/v1/fleet-upgrades",
        ] {
            assert_eq!(with_owner(p, o), p);
        }
        assert_eq!(with_owner("/v1/tenants/a", None), "/v1/tenants/a");
    }

    #[test]
    fn labels_parse_as_key_value() {
        let l = labels(&["team=a".into(), "tier=".into()]).unwrap();
        assert_eq!(l["team"], "a");
        assert_eq!(l["tier"], "");
        assert!(labels(&["=x".into()]).is_err());
        assert!(labels(&["novalue".into()]).is_err());
    }
}
