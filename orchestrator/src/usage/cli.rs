//! `vcp tenant usage`: a tenant's usage samples over a time range, and the usage table
//! `vcp tenant get` shows.

use crate::client::output::{bytes, cpu, table};
use crate::client::{Client, OutputArgs, instant, name, segment};
use crate::usage::types::UsageSamples;
use crate::{Error, Result};
use time::OffsetDateTime;
use vcp_policy::quota::Hard;
use vcp_policy::quota::Usage;

#[derive(Debug, clap::Args)]
pub struct TenantUsageArgs {
    /// Tenant name.
    pub name: String,
    /// Start of the range, inclusive: an RFC 3339 time (2026-01-01T00:00:00Z) or an age
    /// (90m, 12h, 30d ago); default: 24 hours before --until.
    #[arg(long, env = "VCP_USAGE_SINCE")]
    pub since: Option<String>,
    /// End of the range, exclusive: an RFC 3339 time or an age; default now.
    #[arg(long, env = "VCP_USAGE_UNTIL")]
    pub until: Option<String>,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// Every sample in the range, following `next_since` page by page.
pub(crate) async fn usage_samples(
    client: &Client,
    a: &TenantUsageArgs,
    now: OffsetDateTime,
) -> Result<UsageSamples> {
    let rfc3339 = &time::format_description::well_known::Rfc3339;
    let format = |t: OffsetDateTime| {
        t.format(rfc3339)
            .map_err(|e| Error::Client(format!("cannot format {t}: {e}")))
    };
    let mut query = String::new();
    let mut until = a
        .until
        .as_deref()
        .map(|v| instant("--until", v, now))
        .transpose()?;
    let mut since = a
        .since
        .as_deref()
        .map(|v| instant("--since", v, now))
        .transpose()?;
    let mut all: Option<UsageSamples> = None;
    loop {
        query.clear();
        for (k, v) in [("since", &since), ("until", &until)] {
            if let Some(v) = v {
                query.push(if query.is_empty() { '?' } else { '&' });
                query.push_str(&format!("{k}={}", segment(v)));
            }
        }
        let page: UsageSamples = client
            .get(&format!("/v1/tenants/{}/usage{query}", name(&a.name)?))
            .await?;
        let next = page.next_since;
        // The first answer fixed the range (a default `until` is the server's now): later
        // pages keep its end.
        until = Some(format(page.until)?);
        match &mut all {
            None => all = Some(page),
            Some(all) => {
                all.items.extend(page.items);
                all.limits = page.limits;
            }
        }
        let Some(next) = next else { break };
        since = Some(format(next)?);
    }
    let mut all = all.ok_or_else(|| Error::Client("no answer".into()))?;
    all.next_since = None;
    Ok(all)
}

/// One row per quota resource (named as a Kubernetes ResourceQuota names it): used, limit.
pub fn usage_rows(used: &Usage, limits: &Hard) -> Vec<Vec<String>> {
    let count = |n: u64| n.to_string();
    /// Name, used, limit, how to show them.
    type Row = (&'static str, u64, Option<u64>, fn(u64) -> String);
    let rows: [Row; 9] = [
        ("pods", used.pods, limits.pods, count),
        ("requests.cpu", used.requests_cpu, limits.requests_cpu, cpu),
        (
            "requests.memory",
            used.requests_memory,
            limits.requests_memory,
            bytes,
        ),
        ("limits.cpu", used.limits_cpu, limits.limits_cpu, cpu),
        (
            "limits.memory",
            used.limits_memory,
            limits.limits_memory,
            bytes,
        ),
        ("services", used.services, limits.services, count),
        (
            "persistentvolumeclaims",
            used.persistent_volume_claims,
            limits.persistent_volume_claims,
            count,
        ),
        (
            "requests.storage",
            used.requests_storage,
            limits.requests_storage,
            bytes,
        ),
        ("namespaces", used.namespaces, limits.namespaces, count),
    ];
    rows.iter()
        .map(|(name, u, l, show)| {
            vec![
                (*name).to_owned(),
                show(*u),
                l.map_or_else(|| "unlimited".to_owned(), show),
            ]
        })
        .collect()
}

/// Usage samples, oldest first, then the plan's limits (`-`: unlimited). CPU and memory as
/// `requests/limits`.
pub fn usage_table(u: &UsageSamples, width: usize) -> String {
    let row = |when: String, used: [Option<u64>; 9]| -> Vec<String> {
        let n = |v: Option<u64>, f: fn(u64) -> String| v.map_or_else(|| "-".to_owned(), f);
        let count = |v: u64| v.to_string();
        vec![
            when,
            n(used[0], count),
            format!("{}/{}", n(used[1], cpu), n(used[3], cpu)),
            format!("{}/{}", n(used[2], bytes), n(used[4], bytes)),
            n(used[5], count),
            n(used[6], count),
            n(used[7], bytes),
            n(used[8], count),
        ]
    };
    let mut rows: Vec<Vec<String>> = u
        .items
        .iter()
        .map(|s| {
            let x = &s.used;
            row(
                s.sampled_at
                    .format(&time::format_description::well_known::Rfc3339)
                    .unwrap_or_default(),
                [
                    x.pods,
                    x.requests_cpu,
                    x.requests_memory,
                    x.limits_cpu,
                    x.limits_memory,
                    x.services,
                    x.persistent_volume_claims,
                    x.requests_storage,
                    x.namespaces,
                ]
                .map(Some),
            )
        })
        .collect();
    let l = &u.limits;
    rows.push(row(
        "limit".to_owned(),
        [
            l.pods,
            l.requests_cpu,
            l.requests_memory,
            l.limits_cpu,
            l.limits_memory,
            l.services,
            l.persistent_volume_claims,
            l.requests_storage,
            l.namespaces,
        ],
    ));
    table(
        &[
            "SAMPLED", "PODS", "CPU", "MEMORY", "SVC", "PVC", "STORAGE", "NS",
        ],
        &rows,
        width,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::output::fixtures::{at, max_line, used};

    #[test]
    fn usage_samples_print_oldest_first_then_the_limits_within_80_columns() {
        let sample = |s: i64| crate::api::UsageSampleView {
            sampled_at: at(s),
            used: used(),
        };
        let u = UsageSamples {
            since: at(0),
            until: at(3600),
            items: vec![sample(0), sample(60)],
            next_since: None,
            limits: Hard {
                pods: Some(100),
                limits_cpu: Some(100_000),
                ..Default::default()
            },
        };
        let out = usage_table(&u, 80);
        assert!(max_line(&out) <= 80, "{out}");
        let lines: Vec<Vec<&str>> = out
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(
            lines[0],
            [
                "SAMPLED", "PODS", "CPU", "MEMORY", "SVC", "PVC", "STORAGE", "NS"
            ]
        );
        assert_eq!(
            lines[1],
            [
                "2027-01-15T08:00:00Z",
                "3",
                "300m/3",
                "384Mi/1.5Gi",
                "1",
                "1",
                "1Gi",
                "0"
            ]
        );
        assert_eq!(lines[2][0], "2027-01-15T08:01:00Z");
        assert_eq!(
            lines[3],
            ["limit", "100", "-/100", "-/-", "-", "-", "-", "-"]
        );
    }
}
