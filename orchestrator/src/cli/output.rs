//! What the client commands print: tables that fit the terminal, JSON and YAML, and the
//! progress lines of `--wait`. Pure functions of the API's answers.

use crate::api::{
    AuditEntryView, FleetUpgradeDetail, FleetUpgradeView, Hard, KubeconfigView, Phase, RestoreView,
    RotationView, SnapshotView, TenantView, TokenView, Usage, UsageSamples, VersionList,
};
use serde::Serialize;
use std::fmt::Write as _;
use time::OffsetDateTime;
use vcp_core::lifecycle::{ConditionStatus, ConditionType};

/// How a command prints its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Columns for people.
    Table,
    Json,
    Yaml,
}

/// `value` as JSON or YAML (for the table format, the caller prints its own table).
pub fn structured<T: Serialize>(value: &T, format: Format) -> String {
    match format {
        Format::Yaml => serde_yaml::to_string(value).unwrap_or_default(),
        _ => {
            let mut s = serde_json::to_string_pretty(value).unwrap_or_default();
            s.push('\n');
            s
        }
    }
}

/// Terminal width: `COLUMNS` when set, else 80 (the width the tables are designed for).
pub fn terminal_width() -> usize {
    std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.parse().ok())
        .filter(|&c: &usize| c >= 40)
        .unwrap_or(80)
}

/// Left-aligned columns, two spaces apart, no line wider than `width` characters. Columns
/// other than the first (the name people type next) give up characters first, down to 10;
/// then the widest column shrinks. Cut cells end in `~`.
pub fn table(header: &[&str], rows: &[Vec<String>], width: usize) -> String {
    let n = header.len();
    let cell_len = |s: &str| s.chars().count();
    let mut widths: Vec<usize> = header.iter().map(|h| cell_len(h)).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(cell_len(c));
        }
    }
    let gaps = 2 * n.saturating_sub(1);
    // One character at a time from the widest candidate: keeps short columns intact.
    while widths.iter().sum::<usize>() + gaps > width {
        let others = widths
            .iter()
            .enumerate()
            .skip(1)
            .filter(|(_, w)| **w > 10)
            .max_by_key(|(_, w)| **w);
        let pick = others.or_else(|| widths.iter().enumerate().max_by_key(|(_, w)| **w));
        match pick {
            Some((i, &w)) if w > 3 => widths[i] -= 1,
            _ => break,
        }
    }
    let mut out = String::new();
    let header: Vec<String> = header.iter().map(|h| (*h).to_owned()).collect();
    for r in std::iter::once(&header).chain(rows) {
        let mut line = String::new();
        for (i, w) in widths.iter().enumerate() {
            let c = cut(r.get(i).map(String::as_str).unwrap_or(""), *w);
            if i + 1 == n {
                line.push_str(&c);
            } else {
                let _ = write!(line, "{c:<w$}  ");
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// `s` in at most `w` characters, a cut marked with `~`.
fn cut(s: &str, w: usize) -> String {
    if s.chars().count() <= w {
        s.to_owned()
    } else {
        let mut t: String = s.chars().take(w.saturating_sub(1)).collect();
        t.push('~');
        t
    }
}

/// `3d`, `5h`, `12m`, `40s` (like kubectl's AGE).
pub fn age(since: OffsetDateTime, now: OffsetDateTime) -> String {
    let s = (now - since).whole_seconds().max(0);
    match s {
        s if s >= 2 * 86_400 => format!("{}d", s / 86_400),
        s if s >= 2 * 3600 => format!("{}h", s / 3600),
        s if s >= 2 * 60 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// `ready/total` over the step conditions (the final `Ready` condition is not a step).
pub fn steps(t: &TenantView) -> String {
    let steps: Vec<_> = t
        .conditions
        .iter()
        .filter(|c| c.type_ != ConditionType::Ready)
        .collect();
    let ready = steps
        .iter()
        .filter(|c| c.status == ConditionStatus::True)
        .count();
    format!("{ready}/{}", steps.len())
}

pub fn tenants_table(items: &[TenantView], now: OffsetDateTime, width: usize) -> String {
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|t| {
            vec![
                t.name.clone(),
                t.phase.as_str().to_owned(),
                steps(t),
                t.kubernetes_version.clone().unwrap_or(t.version.clone()),
                t.owner.clone(),
                age(t.created_at, now),
            ]
        })
        .collect();
    table(
        &["NAME", "PHASE", "STEPS", "VERSION", "OWNER", "AGE"],
        &rows,
        width,
    )
}

/// One tenant: its fields, then its conditions.
pub fn tenant_detail(t: &TenantView, now: OffsetDateTime, width: usize) -> String {
    let mut out = String::new();
    let fields = [
        ("Name", t.name.clone()),
        ("Key", t.key.clone()),
        ("Owner", t.owner.clone()),
        ("Phase", t.phase.as_str().to_owned()),
        (
            "Version",
            format!(
                "{} ({})",
                t.version,
                t.kubernetes_version.as_deref().unwrap_or("unknown")
            ),
        ),
        ("Plan", t.plan.clone()),
        ("Endpoint", t.endpoint.clone().unwrap_or_else(|| "-".into())),
        (
            "Labels",
            if t.labels.is_empty() {
                "-".into()
            } else {
                t.labels
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(",")
            },
        ),
        (
            "Window",
            t.maintenance_window
                .as_ref()
                .map_or_else(|| "- (the plan's, or any time)".into(), |w| w.to_string()),
        ),
        ("Fleet", t.fleet_upgrades.as_str().to_owned()),
        (
            "Auto",
            format!(
                "{}{}",
                t.auto_update_effective,
                if t.auto_update.is_none() {
                    " (the plan's)"
                } else {
                    ""
                }
            ),
        ),
        ("Age", age(t.created_at, now)),
    ];
    for (k, v) in fields {
        let _ = writeln!(
            out,
            "{:<10}{}",
            format!("{k}:"),
            cut(&v, width.saturating_sub(10))
        );
    }
    if let Some(u) = &t.upgrade {
        let _ = writeln!(
            out,
            "\nUpgrade:  {} {} -> {} (hop {} -> {}), by {}, {} ago",
            u.state,
            u.from,
            u.target,
            u.hop_from,
            u.hop_to,
            u.requested_by,
            age(u.started_at, now)
        );
        if let Some(why) = &u.reason {
            let _ = writeln!(out, "Reason:   {}", cut(why, width.saturating_sub(10)));
        }
        if let Some(id) = u.restore_id {
            let state = u.restore_state.map_or("unknown", |s| s.as_str());
            let _ = writeln!(
                out,
                "Restore:  {id} {state} (the rollback restored the snapshot before the hop)"
            );
        }
    }
    out.push_str("\nUsage:");
    match &t.usage {
        None => out.push_str(" not sampled yet\n"),
        Some(u) => {
            let at = u
                .sampled_at
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap_or_default();
            let _ = writeln!(out, " sampled {} ago ({at})", age(u.sampled_at, now));
            out.push_str(&table(
                &["RESOURCE", "USED", "LIMIT"],
                &usage_rows(&u.used, &u.limits),
                width,
            ));
        }
    }
    out.push_str("\nConditions:\n");
    let rows: Vec<Vec<String>> = t
        .conditions
        .iter()
        .map(|c| {
            vec![
                c.type_.to_string(),
                c.status.to_string(),
                c.reason.to_string(),
                age(c.last_transition_time, now),
                c.message.clone(),
            ]
        })
        .collect();
    out.push_str(&table(
        &["TYPE", "STATUS", "REASON", "SINCE", "MESSAGE"],
        &rows,
        width,
    ));
    out
}

/// CPU in millicores as Kubernetes writes it: `2`, `250m`.
pub fn cpu(millis: u64) -> String {
    if millis.is_multiple_of(1000) {
        (millis / 1000).to_string()
    } else {
        format!("{millis}m")
    }
}

/// Bytes in the largest binary unit they reach: `512`, `128Mi`, `1.5Gi` (one decimal when
/// not exact; the JSON output has the exact number).
pub fn bytes(b: u64) -> String {
    const UNITS: [&str; 6] = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    let Some(i) = (0..UNITS.len()).rev().find(|i| b >= 1u64 << (10 * (i + 1))) else {
        return b.to_string();
    };
    let unit = 1u64 << (10 * (i + 1));
    if b.is_multiple_of(unit) {
        format!("{}{}", b / unit, UNITS[i])
    } else {
        format!("{:.1}{}", b as f64 / unit as f64, UNITS[i])
    }
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

pub fn kubeconfigs_table(items: &[KubeconfigView], now: OffsetDateTime, width: usize) -> String {
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|k| {
            let left = if k.revoked_at.is_some() {
                "revoked".to_owned()
            } else if k.expires_at <= now {
                "expired".to_owned()
            } else {
                age(now, k.expires_at)
            };
            vec![
                k.user.clone(),
                if k.groups.is_empty() {
                    "-".into()
                } else {
                    k.groups.join(",")
                },
                left,
                k.created_by.clone(),
                k.serial.clone(),
            ]
        })
        .collect();
    table(
        &["USER", "GROUPS", "EXPIRES IN", "ISSUED BY", "SERIAL"],
        &rows,
        width,
    )
}

/// Audit entries, oldest first: when, who, what, which tenant, and the particulars as compact
/// JSON (cut to the width).
pub fn audit_table(items: &[AuditEntryView], width: usize) -> String {
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|e| {
            vec![
                e.id.to_string(),
                e.at.format(&time::format_description::well_known::Rfc3339)
                    .unwrap_or_default(),
                e.actor.clone(),
                e.action.clone(),
                e.tenant.clone().unwrap_or_else(|| "-".into()),
                e.detail.to_string(),
            ]
        })
        .collect();
    table(
        &["ID", "TIME", "ACTOR", "ACTION", "TENANT", "DETAIL"],
        &rows,
        width,
    )
}

pub fn tokens_table(items: &[TokenView], now: OffsetDateTime, width: usize) -> String {
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|t| {
            vec![
                t.name.clone(),
                t.role.as_str().to_owned(),
                if t.revoked_at.is_some() {
                    "revoked"
                } else {
                    "live"
                }
                .to_owned(),
                age(t.created_at, now),
            ]
        })
        .collect();
    table(&["NAME", "ROLE", "STATE", "AGE"], &rows, width)
}

/// Rotations: target, phase and for how long, and the kubeconfigs a CA rotation ends.
pub fn rotations_table(rotations: &[RotationView], now: OffsetDateTime, width: usize) -> String {
    let rows: Vec<Vec<String>> = rotations
        .iter()
        .map(|r| {
            vec![
                r.id.to_string(),
                serde_json::to_value(r.target)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default(),
                r.phase.clone(),
                age(r.phase_since, now),
                format!("{}s", r.overlap_seconds),
                r.requested_by.clone(),
                if r.reissue.is_empty() {
                    String::new()
                } else {
                    r.reissue
                        .iter()
                        .map(|k| format!("{} ({})", k.serial, k.user))
                        .collect::<Vec<_>>()
                        .join(", ")
                },
            ]
        })
        .collect();
    table(
        &["ID", "TARGET", "PHASE", "SINCE", "OVERLAP", "BY", "REISSUE"],
        &rows,
        width,
    )
}

/// Snapshots, then restores (each table only when it has rows).
pub fn snapshots_table(
    snapshots: &[SnapshotView],
    restores: &[RestoreView],
    now: OffsetDateTime,
    width: usize,
) -> String {
    let opt = |v: Option<i64>| v.map(|v| v.to_string()).unwrap_or_default();
    let mut out = String::new();
    if !snapshots.is_empty() || restores.is_empty() {
        let rows: Vec<Vec<String>> = snapshots
            .iter()
            .map(|s| {
                vec![
                    s.id.to_string(),
                    s.state.as_str().to_owned(),
                    s.version.clone(),
                    opt(s.revision),
                    s.size_bytes
                        .map(|b| bytes(b.max(0) as u64))
                        .unwrap_or_default(),
                    s.upgrade
                        .map(|u| format!("upgrade {u}"))
                        .unwrap_or_else(|| s.requested_by.clone()),
                    age(s.created_at, now),
                    s.reason.clone().unwrap_or_default(),
                ]
            })
            .collect();
        out.push_str(&table(
            &[
                "ID", "STATE", "VERSION", "REVISION", "SIZE", "BY", "AGE", "REASON",
            ],
            &rows,
            width,
        ));
    }
    if !restores.is_empty() {
        let rows: Vec<Vec<String>> = restores
            .iter()
            .map(|r| {
                vec![
                    r.id.to_string(),
                    r.snapshot.to_string(),
                    r.state.as_str().to_owned(),
                    r.requested_by.clone(),
                    age(r.started_at, now),
                    r.reason.clone().unwrap_or_default(),
                ]
            })
            .collect();
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&table(
            &["RESTORE", "SNAPSHOT", "STATE", "BY", "AGE", "REASON"],
            &rows,
            width,
        ));
    }
    out
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

/// A duration as people read it: `45s`, `3m20s`, `1h05m`.
pub fn span(secs: u64) -> String {
    match secs {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m{:02}s", s / 60, s % 60),
        s => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

/// One line of a fleet upgrade's progress, as `vcp upgrade create --wait` prints it.
pub fn fleet_progress(f: &FleetUpgradeView) -> String {
    let p = &f.progress;
    let done = p.succeeded + p.failed + p.skipped;
    let mut line = format!(
        "{} wave {}/{}  done {}/{} (failed {}, skipped {})  running {}  remaining {}",
        f.state,
        (f.current_wave + 1).min(f.waves.max(1)),
        f.waves,
        done,
        p.total,
        p.failed,
        p.skipped,
        p.running,
        p.pending + p.running
    );
    if let Some(until) = f.soak_until {
        let _ = write!(line, "  soaking until {}", until.time());
    }
    if let Some(eta) = p.eta_seconds.filter(|_| !f.state.finished()) {
        let _ = write!(line, "  eta {}", span(eta));
    }
    if let Some(r) = f.reason.as_deref().filter(|_| f.state.finished()) {
        let _ = write!(line, "  ({r})");
    }
    line
}

pub fn fleets_table(items: &[FleetUpgradeView], now: OffsetDateTime, width: usize) -> String {
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|f| {
            let p = &f.progress;
            vec![
                f.id.to_string(),
                f.target.clone(),
                f.state.as_str().to_owned(),
                format!("{}/{}", (f.current_wave + 1).min(f.waves.max(1)), f.waves),
                format!("{}/{}", p.succeeded, p.total),
                p.failed.to_string(),
                age(f.created_at, now),
            ]
        })
        .collect();
    table(
        &["ID", "TARGET", "STATE", "WAVE", "DONE", "FAILED", "AGE"],
        &rows,
        width,
    )
}

/// A fleet upgrade and its tenants.
pub fn fleet_detail(d: &FleetUpgradeDetail, now: OffsetDateTime, width: usize) -> String {
    let f = &d.upgrade;
    let mut out = format!(
        "fleet upgrade {} to {} (created by {}, {} ago)\n{}\n\n",
        f.id,
        f.target,
        f.created_by,
        age(f.created_at, now),
        fleet_progress(f)
    );
    let rows: Vec<Vec<String>> = d
        .tenants
        .iter()
        .map(|t| {
            vec![
                t.name.clone(),
                t.owner.clone(),
                t.wave.to_string(),
                format!("{} -> {}", t.from, t.target),
                t.state.as_str().to_owned(),
                t.reason
                    .clone()
                    .or_else(|| t.forced.clone())
                    .unwrap_or_default(),
            ]
        })
        .collect();
    out.push_str(&table(
        &["TENANT", "OWNER", "WAVE", "VERSION", "STATE", "REASON"],
        &rows,
        width,
    ));
    out
}

/// Follows a tenant while `--wait` polls it: remembers what was already reported so each
/// step is printed once, when it becomes ready.
#[derive(Debug, Default)]
pub struct Progress {
    reported: Vec<ConditionType>,
    phase: Option<Phase>,
}

impl Progress {
    /// Lines to print for a newly polled state (`elapsed` since the wait began).
    pub fn update(&mut self, t: &TenantView, elapsed: std::time::Duration) -> Vec<String> {
        let mut lines = Vec::new();
        if self.phase != Some(t.phase) {
            lines.push(format!(
                "{:>6.1}s  {} is {}",
                elapsed.as_secs_f64(),
                t.name,
                t.phase.as_str()
            ));
            self.phase = Some(t.phase);
        }
        let steps: Vec<_> = t
            .conditions
            .iter()
            .filter(|c| c.type_ != ConditionType::Ready)
            .collect();
        for (i, c) in steps.iter().enumerate() {
            if c.status == ConditionStatus::True && !self.reported.contains(&c.type_) {
                self.reported.push(c.type_);
                lines.push(format!(
                    "{:>6.1}s  [{}/{}] {}",
                    elapsed.as_secs_f64(),
                    i + 1,
                    steps.len(),
                    c.type_
                ));
            }
        }
        lines
    }

    /// What the tenant is waiting on now, if a step says so (shown while nothing changes).
    pub fn waiting_on(t: &TenantView) -> Option<String> {
        t.conditions
            .iter()
            .find(|c| c.type_ != ConditionType::Ready && c.status != ConditionStatus::True)
            .map(|c| {
                if c.message.is_empty() {
                    format!("waiting for {}", c.type_)
                } else {
                    format!("waiting for {}: {}", c.type_, c.message)
                }
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::time::Duration;
    use vcp_core::lifecycle::{Condition, ConditionStatus};

    fn at(s: i64) -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(1_800_000_000 + s).unwrap()
    }

    #[test]
    fn a_kubeconfig_listing_says_revoked_before_expired() {
        let k = |expires: i64, revoked: Option<i64>| KubeconfigView {
            user: "alice".into(),
            groups: vec!["edit".into()],
            serial: "0abc".into(),
            expires_at: at(expires),
            created_by: "admin".into(),
            created_at: at(0),
            revoked_at: revoked.map(at),
            break_glass: false,
        };
        let out = kubeconfigs_table(
            &[
                k(7200, None),
                k(7200, Some(60)),
                k(-1, Some(-60)),
                k(-1, None),
            ],
            at(0),
            80,
        );
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[1].contains(" 2h "), "{out}");
        assert!(
            lines[2].contains("revoked") && lines[3].contains("revoked"),
            "{out}"
        );
        assert!(lines[4].contains("expired"), "{out}");
    }

    fn cond(t: &str, status: &str, message: &str) -> Condition {
        Condition {
            type_: t.parse().unwrap(),
            status: status.parse().unwrap(),
            reason: if status == "True" { "Ready" } else { "Waiting" }
                .parse()
                .unwrap(),
            message: message.into(),
            last_transition_time: at(0),
        }
    }

    fn tenant(name: &str, owner: &str, conditions: Vec<Condition>) -> TenantView {
        TenantView {
            name: name.into(),
            key: "k".into(),
            owner: owner.into(),
            labels: BTreeMap::new(),
            version: "1.37".into(),
            kubernetes_version: Some("v1.37.1".into()),
            plan: "default".into(),
            phase: Phase::Provisioning,
            conditions,
            endpoint: None,
            generation: 1,
            observed_generation: 1,
            created_at: at(0),
            usage: None,
            upgrade: None,
            maintenance_window: None,
            fleet_upgrades: crate::api::FleetUpgrades::Include,
            auto_update: None,
            auto_update_effective: crate::api::AutoUpdate::Off,
        }
    }

    #[test]
    fn fleet_progress_shows_waves_counts_and_eta_and_the_table_fits() {
        use crate::api::{FleetEntryState, FleetProgress, FleetState, FleetTenantView};
        let f = FleetUpgradeView {
            id: 7,
            target: "1.37".into(),
            state: FleetState::Running,
            selector: Default::default(),
            chain: false,
            canary: 1,
            max_parallel: 10,
            failure_budget: 0,
            soak_seconds: 60,
            respect_maintenance_windows: true,
            current_wave: 1,
            waves: 3,
            soak_until: None,
            reason: None,
            created_by: "admin".into(),
            created_at: at(0),
            finished_at: None,
            progress: FleetProgress {
                total: 7,
                pending: 4,
                running: 2,
                succeeded: 1,
                failed: 0,
                skipped: 0,
                eta_seconds: Some(200),
            },
        };
        assert_eq!(
            fleet_progress(&f),
            "Running wave 2/3  done 1/7 (failed 0, skipped 0)  running 2  remaining 6  eta 3m20s"
        );
        let t = FleetTenantView {
            name: "a".repeat(40),
            owner: "team-a".into(),
            wave: 2,
            from: "1.36".into(),
            target: "1.37".into(),
            state: FleetEntryState::Failed,
            upgrade_id: Some(3),
            upgrade_state: None,
            forced: None,
            reason: Some("hop 1.36 -> 1.37 not healthy after 300s: ".repeat(3)),
            started_at: None,
            finished_at: None,
        };
        let d = FleetUpgradeDetail {
            upgrade: f.clone(),
            tenants: vec![t.clone()],
            failures: vec![t],
        };
        let out = fleet_detail(&d, at(100), 80);
        assert!(max_line(&out) <= 100, "{out}");
        assert!(max_line(&fleets_table(&[f], at(100), 80)) <= 80);
    }

    fn max_line(s: &str) -> usize {
        s.lines().map(|l| l.chars().count()).max().unwrap_or(0)
    }

    #[test]
    fn a_table_of_the_longest_names_fits_80_columns() {
        let long = "a".repeat(40);
        let items = vec![
            tenant(&long, &"o".repeat(40), vec![]),
            tenant("short", "team-a", vec![]),
        ];
        let out = tenants_table(&items, at(90_000), 80);
        assert!(max_line(&out) <= 80, "{out}");
        // Short cells survive; the long ones are cut visibly, the name last.
        assert!(out.contains("short"), "{out}");
        assert!(out.contains(&"a".repeat(30)), "{out}");
        assert!(out.contains('~'), "{out}");
        assert!(out.lines().next().unwrap().starts_with("NAME"));
        // Columns line up: every row's PHASE starts where the header's does.
        let col = out.lines().next().unwrap().find("PHASE").unwrap();
        for l in out.lines().skip(1) {
            assert_eq!(&l[col..col + 5], "Provi", "{out}");
        }
    }

    #[test]
    fn narrow_terminals_and_wide_messages_still_fit() {
        let mut t = tenant(
            "team-a",
            "team-a",
            vec![cond("EtcdReady", "False", &"x".repeat(300))],
        );
        t.labels.insert("team".into(), "a".repeat(63));
        t.labels.insert("b".repeat(200), "x".into());
        t.endpoint = Some(format!("https://{}.example.com:6443", "e".repeat(80)));
        for width in [40, 60, 80, 120] {
            let out = tenant_detail(&t, at(10), width);
            assert!(max_line(&out) <= width, "{width}: {out}");
        }
    }

    #[test]
    fn a_tenant_shows_its_auto_update_setting_and_a_rollbacks_restore() {
        use crate::api::{AutoUpdate, RestoreState, UpgradeState, UpgradeView};
        let mut t = tenant("a", "o", vec![]);
        t.auto_update_effective = AutoUpdate::Patch;
        let auto = |t: &TenantView| {
            tenant_detail(t, at(10), 80)
                .lines()
                .find(|l| l.starts_with("Auto:"))
                .map(|l| l["Auto:".len()..].trim().to_owned())
        };
        assert_eq!(auto(&t).as_deref(), Some("patch (the plan's)"));
        t.auto_update = Some(AutoUpdate::Patch);
        assert_eq!(auto(&t).as_deref(), Some("patch"));
        t.upgrade = Some(UpgradeView {
            id: 3,
            from: "1.36".into(),
            target: "1.37".into(),
            hop_from: "1.36".into(),
            hop_to: "1.37".into(),
            hop_from_release: Some("v1.36.4".into()),
            hop_to_release: Some("v1.37.1".into()),
            state: UpgradeState::RolledBack,
            reason: Some("hop 1.36 -> 1.37 not healthy after 30s".into()),
            restore_id: Some(5),
            restore_state: Some(RestoreState::Succeeded),
            requested_by: "admin".into(),
            started_at: at(0),
            finished_at: Some(at(5)),
        });
        let out = tenant_detail(&t, at(10), 80);
        assert!(out.contains("Restore:  5 Succeeded"), "{out}");
    }

    #[test]
    fn quantities_print_as_kubernetes_writes_them() {
        assert_eq!(cpu(2000), "2");
        assert_eq!(cpu(250), "250m");
        assert_eq!(cpu(0), "0");
        assert_eq!(bytes(512), "512");
        assert_eq!(bytes(128 << 20), "128Mi");
        assert_eq!(bytes(3 << 29), "1.5Gi");
        assert_eq!(bytes(1 << 60), "1Ei");
        assert_eq!(bytes(u64::MAX), "16.0Ei");
    }

    fn used() -> Usage {
        Usage {
            pods: 3,
            requests_cpu: 300,
            requests_memory: 384 << 20,
            limits_cpu: 3000,
            limits_memory: 3 << 29,
            services: 1,
            persistent_volume_claims: 1,
            requests_storage: 1 << 30,
            namespaces: 0,
        }
    }

    #[test]
    fn a_tenant_shows_its_latest_usage_against_its_limits() {
        let mut t = tenant("a", "o", vec![cond("EtcdReady", "True", "")]);
        assert!(tenant_detail(&t, at(10), 80).contains("Usage: not sampled yet"));
        t.usage = Some(crate::api::TenantUsage {
            sampled_at: at(0),
            used: used(),
            limits: Hard {
                pods: Some(100),
                requests_cpu: Some(20_000),
                ..Default::default()
            },
        });
        let out = tenant_detail(&t, at(40), 80);
        assert!(
            out.contains("sampled 40s ago (2027-01-15T08:00:00Z)"),
            "{out}"
        );
        let line = |name: &str| {
            out.lines()
                .find(|l| l.starts_with(&format!("{name} ")))
                .map(|l| l.split_whitespace().collect::<Vec<_>>())
                .unwrap_or_else(|| panic!("no {name} row: {out}"))
        };
        assert_eq!(line("pods"), ["pods", "3", "100"]);
        assert_eq!(line("requests.cpu"), ["requests.cpu", "300m", "20"]);
        assert_eq!(
            line("limits.memory"),
            ["limits.memory", "1.5Gi", "unlimited"]
        );
        assert!(out.find("Usage:") < out.find("Conditions:"));
    }

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

    #[test]
    fn a_table_without_rows_is_its_header() {
        assert_eq!(table(&["A", "BB"], &[], 80), "A  BB\n");
    }

    #[test]
    fn ages_read_like_kubectl() {
        assert_eq!(age(at(0), at(59)), "59s");
        assert_eq!(age(at(0), at(300)), "5m");
        assert_eq!(age(at(0), at(3 * 3600)), "3h");
        assert_eq!(age(at(0), at(3 * 86_400)), "3d");
        assert_eq!(age(at(10), at(0)), "0s");
    }

    #[test]
    fn progress_reports_each_step_once_in_order() {
        let mut p = Progress::default();
        let mut t = tenant(
            "a",
            "o",
            vec![
                cond("NamespaceReady", "True", ""),
                cond("EtcdReady", "False", "1 of 1 members not ready"),
                cond("Ready", "False", ""),
            ],
        );
        let first = p.update(&t, Duration::from_secs(1));
        assert_eq!(first.len(), 2, "{first:?}");
        assert!(first[0].ends_with("a is Provisioning"));
        assert!(first[1].ends_with("[1/2] NamespaceReady"));
        assert_eq!(
            Progress::waiting_on(&t).as_deref(),
            Some("waiting for EtcdReady: 1 of 1 members not ready")
        );
        assert!(p.update(&t, Duration::from_secs(2)).is_empty());
        t.conditions[1].status = ConditionStatus::True;
        t.phase = Phase::Ready;
        let last = p.update(&t, Duration::from_secs(3));
        assert_eq!(last.len(), 2, "{last:?}");
        assert!(last[0].ends_with("a is Ready"));
        assert!(last[1].ends_with("[2/2] EtcdReady"));
        assert_eq!(steps(&t), "2/2");
    }

    #[test]
    fn structured_output_round_trips() {
        let items = vec![tenant("a", "o", vec![cond("EtcdReady", "True", "")])];
        for f in [Format::Json, Format::Yaml] {
            let s = structured(&items, f);
            let back: Vec<TenantView> = match f {
                Format::Json => serde_json::from_str(&s).unwrap(),
                _ => serde_yaml::from_str(&s).unwrap(),
            };
            assert_eq!(back[0].name, "a");
            assert_eq!(back[0].conditions, items[0].conditions);
        }
    }
}
