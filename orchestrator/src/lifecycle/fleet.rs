//! Fleet upgrades, planned (pure): which tenants a fleet upgrade moves, in which wave, and
//! what it does next.
//!
//! Data flow: `POST /v1/upgrades` hands the request and every live tenant to [`plan`], which
//! checks the target against the skew rules, picks the tenants (the selector, minus those that
//! opted out, plus every tenant whose version is `expired`, moved one minor only), and orders
//! them into waves ([`wave_of`]: a canary wave, then waves doubling in size). The inventory
//! stores the plan (`fleet_upgrades`, `fleet_upgrade_tenants`). From then on a fleet worker
//! in `vcp serve` ([`crate::upgrades::runner`]) claims the fleet upgrade, reads its entries with the
//! state of each tenant's own upgrade, and asks [`step`] what to do: which entries finished
//! (their tenant upgrade succeeded or was rolled back), which tenants to start now (the
//! current wave's, at most `max_parallel` moving at once, each inside its maintenance
//! window), and where the fleet upgrade goes (soak after a wave, the next wave, stopped by
//! the failure budget, done). Starting a tenant is the same inventory path a
//! `PATCH /v1/tenants/{name}` takes; the reconcile workers roll it as any other upgrade.
//!
//! Everything [`step`] decides is a function of stored state and `now`, so a replica killed
//! between two steps leaves nothing another replica cannot recompute.

use crate::lifecycle::skew::{self, Allow, SkewError};
use crate::render::catalog::{Catalog, Class, minor_number};
use crate::window::MaintenanceWindow;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use time::OffsetDateTime;
use vcp_core::lifecycle::{FleetEntryState, FleetState, FleetUpgrades, UpgradeState};

/// How much bigger each wave after the canary is than the one before.
pub const WAVE_GROWTH: u64 = 2;
/// Limits of a fleet upgrade request (the API states them in its document).
pub const MAX_CANARY: u32 = 1000;
pub const MAX_PARALLEL: u32 = 1000;
pub const MAX_FAILURE_BUDGET: u32 = 100_000;
pub const MAX_SOAK_SECONDS: u32 = 7 * 86_400;

// ---------------------------------------------------------------------------------------
// Selection

/// Which tenants a fleet upgrade is for; every given part must match (none: every tenant).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector {
    /// Label selector: every pair must be among the tenant's labels (a key given twice
    /// with two values matches nothing).
    pub labels: Vec<(String, String)>,
    /// Only tenants of these names: every tenant of a name, whoever owns it (names are
    /// unique per owner only, and fleet upgrades are an admin's, across owners).
    pub names: Option<BTreeSet<String>>,
    /// Only tenants on this minor.
    pub version: Option<String>,
}

impl Selector {
    fn matches(&self, t: &Candidate) -> bool {
        self.labels.iter().all(|(k, v)| t.labels.get(k) == Some(v))
            && self.names.as_ref().is_none_or(|n| n.contains(&t.name))
            && self.version.as_ref().is_none_or(|v| *v == t.version)
    }
}

/// The pattern of a label selector (JSON Schema, ECMA-262): `key=value` pairs separated by
/// commas, keys and values as tenant labels have them, no spaces. [`parse_label_selector`]
/// takes exactly these (a unit test compares them).
pub const LABEL_SELECTOR_PATTERN: &str = "^[A-Za-z0-9._/-]{1,253}=[A-Za-z0-9._/-]{0,63}(,[A-Za-z0-9._/-]{1,253}=[A-Za-z0-9._/-]{0,63})*$";

/// A label selector `k=v,k2=v2` (equality only: vcp's labels are for picking tenants, and
/// set-based selectors are not needed for that yet).
pub fn parse_label_selector(s: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for part in s.split(',') {
        let Some((k, v)) = part.split_once('=') else {
            return Err(format!("{part:?} is not key=value"));
        };
        if !crate::names::is_label_key(k) || !crate::names::is_label_value(v) {
            return Err(format!(
                "{part:?}: keys of 1 to {} and values of up to {} characters of [A-Za-z0-9-_./]",
                crate::names::MAX_LABEL_KEY_LEN,
                crate::names::MAX_LABEL_VALUE_LEN
            ));
        }
        out.push((k.to_owned(), v.to_owned()));
    }
    Ok(out)
}

/// A live tenant as [`plan`] sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub id: i64,
    pub name: String,
    pub version: String,
    pub labels: BTreeMap<String, String>,
    pub fleet_upgrades: FleetUpgrades,
}

/// What a fleet upgrade request asks for, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// A catalog minor.
    pub target: String,
    pub selector: Selector,
    /// Tenants more than one minor below the target go through every minor between.
    pub chain: bool,
    pub allow_preview: bool,
    pub canary: u32,
}

/// One tenant of a planned fleet upgrade.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned {
    pub tenant_id: i64,
    pub name: String,
    pub wave: u32,
    pub from: String,
    pub target: String,
    pub chain: bool,
    /// Why it is in although no selector picked it (or it opted out): an expired version.
    pub forced: Option<String>,
    /// Why it will not be started (the skew rules refuse its hop); `None`: it will be.
    pub skip: Option<String>,
}

/// Why a fleet upgrade request is refused; each names the request field at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("{0}")]
    Target(SkewError),
    #[error("tenants on {from}: {error}")]
    FromVersion { from: String, error: SkewError },
    #[error("tenant {name:?}: {error}")]
    Named { name: String, error: SkewError },
    #[error("no tenant named {0:?}")]
    UnknownName(String),
    #[error(
        "no tenant to upgrade: none selected runs a version below {0} (and none runs an expired version)"
    )]
    Nothing(String),
}

impl PlanError {
    /// Whether the refusal is about a tenant name that does not exist (answered 404; the
    /// others conflict with the tenants or the catalog the server has, 409).
    pub fn unknown_name(&self) -> bool {
        matches!(self, PlanError::UnknownName(_))
    }

    /// The request field at fault.
    pub fn field(&self) -> &'static str {
        match self {
            PlanError::Target(_) => "target",
            PlanError::FromVersion { .. } => "selector.version",
            PlanError::Named { error, .. } => match error {
                SkewError::MinorSkip { .. } => "chain",
                _ => "selector.names",
            },
            PlanError::UnknownName(_) => "selector.names",
            PlanError::Nothing(_) => "selector",
        }
    }
}

/// The wave of the `i`-th startable tenant (from 0): the canary wave holds `canary`, and each
/// wave after holds [`WAVE_GROWTH`] times the one before (1, 2, 4, 8, ... for a canary of 1).
pub fn wave_of(i: usize, canary: u32) -> u32 {
    let canary = u64::from(canary.max(1));
    let (mut wave, mut size, mut end) = (0u32, canary, canary);
    while (i as u64) >= end {
        wave += 1;
        size = size.saturating_mul(WAVE_GROWTH);
        end = end.saturating_add(size);
    }
    wave
}

/// The next minor of a catalog minor (`1.35` -> `1.36`).
fn next_minor(minor: &str) -> Option<String> {
    minor_number(minor).map(|m| format!("1.{}", m + 1))
}

/// Plans a fleet upgrade over `tenants` (live ones): the tenants, their targets and their
/// waves, in a deterministic order (by name), or why the request is refused.
pub fn plan(
    catalog: &Catalog,
    req: &Request,
    tenants: &[Candidate],
) -> Result<Vec<Planned>, PlanError> {
    let allow = Allow {
        chain: req.chain,
        preview: req.allow_preview,
    };
    let target = catalog
        .get(&req.target)
        .ok_or_else(|| PlanError::Target(SkewError::MissingHop(req.target.clone())))?;
    match target.class {
        Class::Expired => {
            return Err(PlanError::Target(SkewError::ExpiredTarget(
                req.target.clone(),
            )));
        }
        Class::Preview if !req.allow_preview => {
            return Err(PlanError::Target(SkewError::PreviewTarget(
                req.target.clone(),
            )));
        }
        _ => {}
    }
    if let Some(from) = &req.selector.version {
        skew::plan_hops(catalog, from, &req.target, allow).map_err(|error| {
            PlanError::FromVersion {
                from: from.clone(),
                error,
            }
        })?;
    }
    if let Some(names) = &req.selector.names
        && let Some(missing) = names
            .iter()
            .find(|n| !tenants.iter().any(|t| t.name == **n))
    {
        return Err(PlanError::UnknownName(missing.clone()));
    }
    let target_n = minor_number(&req.target).unwrap_or(0);
    let mut sorted: Vec<&Candidate> = tenants.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name).then(a.id.cmp(&b.id)));
    let mut out = Vec::new();
    for t in sorted {
        let named = req
            .selector
            .names
            .as_ref()
            .is_some_and(|n| n.contains(&t.name));
        let selected = req.selector.matches(t);
        let opted_in = t.fleet_upgrades == FleetUpgrades::Include;
        let expired = catalog
            .get(&t.version)
            .is_some_and(|v| v.class == Class::Expired);
        let entry =
            |target: String, chain: bool, forced: Option<String>, skip: Option<String>| Planned {
                tenant_id: t.id,
                name: t.name.clone(),
                wave: 0,
                from: t.version.clone(),
                target,
                chain,
                forced,
                skip,
            };
        if expired {
            // One minor per fleet run, whatever was asked: the owner did not choose this
            // upgrade, so it is the smallest move off the expired version.
            let next = next_minor(&t.version).unwrap_or_default();
            let why = match (selected, opted_in) {
                (true, true) => format!(
                    "version {} is expired: moved one minor, to {next}",
                    t.version
                ),
                (_, false) => format!(
                    "version {} is expired: moved one minor, to {next}, although the tenant opted out of fleet upgrades",
                    t.version
                ),
                (false, true) => format!(
                    "version {} is expired: moved one minor, to {next}; expired versions are moved by every fleet upgrade",
                    t.version
                ),
            };
            let skip = skew::plan_hops(catalog, &t.version, &next, Allow::default())
                .err()
                .map(|e| e.to_string());
            out.push(entry(next, false, Some(why), skip));
            continue;
        }
        if !selected {
            continue;
        }
        let below = minor_number(&t.version).is_some_and(|n| n < target_n);
        if named && (!below || !opted_in) {
            if !opted_in {
                out.push(entry(
                    req.target.clone(),
                    req.chain,
                    None,
                    Some("the tenant opted out of fleet upgrades".into()),
                ));
                continue;
            }
            let error = skew::plan_hops(catalog, &t.version, &req.target, allow)
                .err()
                .unwrap_or_else(|| SkewError::Unchanged(req.target.clone()));
            return Err(PlanError::Named {
                name: t.name.clone(),
                error,
            });
        }
        if !below || !opted_in {
            continue;
        }
        match skew::plan_hops(catalog, &t.version, &req.target, allow) {
            Ok(_) => out.push(entry(req.target.clone(), req.chain, None, None)),
            Err(error) if named => {
                return Err(PlanError::Named {
                    name: t.name.clone(),
                    error,
                });
            }
            Err(e) => out.push(entry(
                req.target.clone(),
                req.chain,
                None,
                Some(e.to_string()),
            )),
        }
    }
    if out.iter().all(|p| p.skip.is_some()) && !out.iter().any(|p| p.forced.is_some()) {
        return Err(PlanError::Nothing(req.target.clone()));
    }
    for (i, p) in out.iter_mut().filter(|p| p.skip.is_none()).enumerate() {
        p.wave = wave_of(i, req.canary);
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// Stepping

/// How a fleet upgrade moves through its waves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pace {
    /// At most this many of its tenants moving at once.
    pub max_parallel: u32,
    /// A wave with more failed tenants than this stops the fleet upgrade.
    pub failure_budget: u32,
    /// Wait this long after a wave before the next one starts.
    pub soak: Duration,
    /// Start a tenant only inside its maintenance window.
    pub respect_windows: bool,
}

/// Where a fleet upgrade is, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Progress {
    pub state: FleetState,
    pub current_wave: u32,
    pub soak_until: Option<OffsetDateTime>,
    pub reason: Option<String>,
}

/// One tenant of a fleet upgrade, as [`step`] needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub tenant_id: i64,
    pub wave: u32,
    pub state: FleetEntryState,
    /// The window that applies to the tenant (its own, else its plan's), if any.
    pub window: Option<MaintenanceWindow>,
    /// Its own upgrade's state and reason, once started.
    pub upgrade: Option<(UpgradeState, Option<String>)>,
}

/// What one step of a fleet upgrade does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// Entries that are done now: their new state and the reason.
    pub finished: Vec<(i64, FleetEntryState, Option<String>)>,
    /// Tenants to start now, in order.
    pub start: Vec<i64>,
    /// Pending entries held back, and why (their maintenance window is closed, and when it
    /// opens): what an admin sees as the entry's reason while it waits.
    pub waiting: Vec<(i64, String)>,
    /// Where the fleet upgrade is after the step.
    pub progress: Progress,
    /// Look again no later than this (a soak ends, a window opens); `None`: when something
    /// changes, or at the runner's poll.
    pub wake_at: Option<OffsetDateTime>,
}

/// One step of a fleet upgrade: see the module documentation.
pub fn step(p: &Progress, pace: &Pace, entries: &[Entry], now: OffsetDateTime) -> Step {
    let mut out = Step {
        finished: Vec::new(),
        start: Vec::new(),
        waiting: Vec::new(),
        progress: p.clone(),
        wake_at: None,
    };
    let mut state: BTreeMap<i64, FleetEntryState> =
        entries.iter().map(|e| (e.tenant_id, e.state)).collect();
    // Tenant upgrades that ended since the last step, whatever the fleet's own state: a
    // paused or stopped fleet upgrade still reports how its started tenants ended.
    for e in entries {
        if e.state != FleetEntryState::Running {
            continue;
        }
        let Some((s, reason)) = &e.upgrade else {
            continue;
        };
        let done = match s {
            UpgradeState::Succeeded => Some((FleetEntryState::Succeeded, None)),
            UpgradeState::RolledBack => Some((
                FleetEntryState::Failed,
                Some(reason.clone().unwrap_or_else(|| "rolled back".into())),
            )),
            _ => None,
        };
        if let Some((to, why)) = done {
            state.insert(e.tenant_id, to);
            out.finished.push((e.tenant_id, to, why));
        }
    }
    if p.state != FleetState::Running {
        return out;
    }
    let of_wave = |w: u32| entries.iter().filter(move |e| e.wave == w);
    let mut wave = p.current_wave;
    let failed = of_wave(wave)
        .filter(|e| state[&e.tenant_id] == FleetEntryState::Failed)
        .count();
    if failed > pace.failure_budget as usize {
        let why = format!(
            "wave {wave}: {failed} tenants failed, more than the failure budget of {}",
            pace.failure_budget
        );
        skip_pending(
            &mut out,
            &state,
            entries,
            &format!("the fleet upgrade stopped: {why}"),
        );
        out.progress.state = FleetState::Failed;
        out.progress.reason = Some(why);
        out.progress.soak_until = None;
        return out;
    }
    if let Some(until) = p.soak_until {
        if now < until {
            out.wake_at = Some(until);
            return out;
        }
        out.progress.soak_until = None;
        wave = next_wave(entries, wave).unwrap_or(wave);
        out.progress.current_wave = wave;
    }
    // A wave whose tenants are all done hands over to the next (after the soak).
    while of_wave(wave).all(|e| state[&e.tenant_id].finished()) {
        let Some(next) = next_wave(entries, wave) else {
            out.progress.state = FleetState::Succeeded;
            return out;
        };
        if !pace.soak.is_zero() {
            let until = now + pace.soak;
            out.progress.soak_until = Some(until);
            out.wake_at = Some(until);
            return out;
        }
        wave = next;
        out.progress.current_wave = wave;
    }
    let running = state
        .values()
        .filter(|s| **s == FleetEntryState::Running)
        .count();
    let mut free = (pace.max_parallel as usize).saturating_sub(running);
    for e in of_wave(wave) {
        if free == 0 {
            break;
        }
        if state[&e.tenant_id] != FleetEntryState::Pending {
            continue;
        }
        if pace.respect_windows
            && let Some(w) = &e.window
            && !w.contains(now)
        {
            let open = w.next_open(now);
            out.wake_at = Some(out.wake_at.map_or(open, |t| t.min(open)));
            out.waiting.push((e.tenant_id, waiting_reason(w, open)));
            continue;
        }
        out.start.push(e.tenant_id);
        free -= 1;
    }
    out
}

/// Why a pending entry waits for its window.
pub fn waiting_reason(w: &MaintenanceWindow, open: OffsetDateTime) -> String {
    let at = open
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| open.to_string());
    format!("waits for its maintenance window ({w}), which opens at {at}")
}

/// The lowest wave above `wave` that has entries.
fn next_wave(entries: &[Entry], wave: u32) -> Option<u32> {
    entries.iter().map(|e| e.wave).filter(|w| *w > wave).min()
}

fn skip_pending(
    out: &mut Step,
    state: &BTreeMap<i64, FleetEntryState>,
    entries: &[Entry],
    why: &str,
) {
    for e in entries {
        if state[&e.tenant_id] == FleetEntryState::Pending {
            out.finished
                .push((e.tenant_id, FleetEntryState::Skipped, Some(why.to_owned())));
        }
    }
}

/// Counts of a fleet upgrade's entries by state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub pending: u32,
    pub running: u32,
    pub succeeded: u32,
    pub failed: u32,
    pub skipped: u32,
}

/// A rough time left: the tenants not done yet, moved `max_parallel` at a time at `mean`, the
/// mean duration of those done so far. `None` before any is done.
pub fn eta(remaining: u32, max_parallel: u32, mean: Option<Duration>) -> Option<Duration> {
    Some(mean? * remaining.div_ceil(max_parallel.max(1)))
}

#[cfg(test)]
mod tests;
