//! Automatic patch updates: which tenants move to a newer release of their minor now, and to
//! which (pure), and the worker of `vcp serve` that starts them ([`run`]).
//!
//! A tenant opts in with `auto_update: patch` (its own setting, else its plan's, else off).
//! [`decide`] moves it only when all of these hold, and says which failed otherwise:
//! - it is `Ready` and nothing else moves it (no upgrade, no restore);
//! - its maintenance window (its own, else its plan's) is open now; with neither, any time
//!   (as for fleet upgrades);
//! - its minor's catalog entry lists a newer release (a higher patch number) than the one it
//!   runs whose class is `supported` or `deprecated`: a `preview` patch is being tried out and
//!   waits for someone to ask for it, an `expired` one is never a target (the rule
//!   `no-expired-target`);
//! - that release has not been rolled back on this tenant before (a patch that failed its
//!   gates once is not retried every window; a newer one is);
//! - the skew rules allow the hop (etcd moves one minor at most).
//!
//! The target is the newest such release. The update is an ordinary upgrade of the tenant,
//! one hop inside its minor (`hop_from` = `hop_to`, from one release to another): etcd
//! snapshot, roll, gates, rollback, all as in `super::advance`.
//!
//! Data flow of [`run`]: every replica sweeps every `interval`: reads the Ready tenants that
//! may have opted in with the releases their patch updates rolled back, asks [`decide`], and
//! starts each chosen update in its own transaction (`Inventory::start_patch_update`), which
//! re-checks in one conditional statement that the tenant is still Ready, on the same
//! release, with no upgrade or restore moving it. Two replicas sweeping at once both decide,
//! but only one start can pass that check (the other matches no row), so no tenant is updated
//! twice; a replica killed mid-sweep leaves started updates (committed) or nothing.

use crate::Result;
use crate::host::Config;
use crate::inventory::Inventory;
use crate::lifecycle::skew;
use crate::metrics::Metrics;
use crate::render::catalog::{Catalog, Class, patch_number};
use crate::window::MaintenanceWindow;
use std::sync::Arc;
use std::time::Duration;
use time::OffsetDateTime;
use vcp_core::lifecycle::{AutoUpdate, Phase};

/// The setting in effect: the tenant's own, else its plan's, else off.
pub fn effective(own: Option<AutoUpdate>, plan: Option<AutoUpdate>) -> AutoUpdate {
    own.or(plan).unwrap_or(AutoUpdate::Off)
}

/// What [`decide`] needs to know of one tenant.
#[derive(Debug, Clone)]
pub struct Candidate<'a> {
    /// Its minor (`tenants.version`).
    pub minor: &'a str,
    /// The release it runs; `None`: the catalog's release of its minor.
    pub release: Option<&'a str>,
    /// The setting in effect ([`effective`]).
    pub auto_update: AutoUpdate,
    /// Its window in effect (its own, else its plan's); `None`: any time.
    pub window: Option<&'a MaintenanceWindow>,
    pub phase: Phase,
    /// An upgrade or a restore moves it.
    pub busy: bool,
    /// Releases its patch updates were rolled back from.
    pub rolled_back: &'a [String],
}

/// Why a tenant is not updated now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hold {
    /// Neither the tenant nor its plan asked for patch updates.
    Off,
    NotReady(Phase),
    Busy,
    OutsideWindow,
    /// Its minor is not in this replica's catalog.
    UnknownMinor,
    /// It runs the newest release it may move to.
    UpToDate,
    /// The newest release was rolled back on this tenant before.
    RolledBackBefore(String),
    /// The skew rules refuse the hop.
    Skew(String),
}

/// The newest release of `minor` a patch update may move to: the highest patch number among
/// its releases whose class is `supported` or `deprecated`.
pub fn newest_patch<'c>(catalog: &'c Catalog, minor: &str) -> Option<&'c str> {
    let v = catalog.get(minor)?;
    v.releases()
        .filter(|(_, class)| matches!(class, Class::Supported | Class::Deprecated))
        .filter_map(|(r, _)| Some((patch_number(r)?, r)))
        .max()
        .map(|(_, r)| r)
}

/// Whether and where a tenant's patch update starts now: the release to move it to.
pub fn decide(c: &Candidate, catalog: &Catalog, now: OffsetDateTime) -> Result<String, Hold> {
    if c.auto_update != AutoUpdate::Patch {
        return Err(Hold::Off);
    }
    if c.phase != Phase::Ready {
        return Err(Hold::NotReady(c.phase));
    }
    if c.busy {
        return Err(Hold::Busy);
    }
    if c.window.is_some_and(|w| !w.contains(now)) {
        return Err(Hold::OutsideWindow);
    }
    let v = catalog.get(c.minor).ok_or(Hold::UnknownMinor)?;
    let current = c.release.unwrap_or(&v.kubernetes);
    let target = newest_patch(catalog, c.minor).ok_or(Hold::UpToDate)?;
    // A release the tenant runs that the catalog no longer lists still has its number.
    if patch_number(target) <= patch_number(current) {
        return Err(Hold::UpToDate);
    }
    if c.rolled_back.iter().any(|r| r == target) {
        return Err(Hold::RolledBackBefore(target.to_owned()));
    }
    let (Some(from), Some(to)) = (
        catalog.at_release(c.minor, Some(current)),
        catalog.at_release(c.minor, Some(target)),
    ) else {
        return Err(Hold::UnknownMinor);
    };
    skew::check_hop(&from, &to).map_err(|e| Hold::Skew(e.to_string()))?;
    Ok(target.to_owned())
}

/// Sweeps for patch updates every `interval` until the process ends.
pub async fn run(
    inv: Inventory,
    config: Arc<Config>,
    id: String,
    interval: Duration,
    metrics: Arc<Metrics>,
) {
    let actor = format!("auto-update/{id}");
    loop {
        match sweep(&inv, &config, &actor, OffsetDateTime::now_utc()).await {
            Ok(n) => {
                metrics.patch_sweep(n, None);
                if n > 0 {
                    tracing::info!(worker = %id, started = n, "patch updates started");
                }
            }
            Err(e) => {
                metrics.patch_sweep(0, Some(e.variant()));
                tracing::warn!(worker = %id, error = %e.public(), "patch update sweep failed")
            }
        }
        tokio::time::sleep(interval).await;
    }
}

/// One sweep: starts every patch update [`decide`] allows now; how many started.
#[tracing::instrument(skip_all)]
pub async fn sweep(
    inv: &Inventory,
    config: &Config,
    actor: &str,
    now: OffsetDateTime,
) -> Result<usize> {
    let mut started = 0;
    for (t, rolled_back) in inv.patch_update_candidates().await? {
        let plan = config.plans.get(&t.plan);
        let window = t
            .maintenance_window
            .as_ref()
            .map(|w| &w.0)
            .or_else(|| plan.and_then(|p| p.maintenance_window.as_ref()));
        let c = Candidate {
            minor: &t.version,
            release: t.release.as_deref(),
            auto_update: effective(t.auto_update, plan.and_then(|p| p.auto_update)),
            window,
            phase: t.phase,
            // The candidates query leaves out tenants an upgrade or restore moves.
            busy: false,
            rolled_back: &rolled_back,
        };
        let to = match decide(&c, &config.catalog, now) {
            Ok(to) => to,
            Err(Hold::Off | Hold::UpToDate | Hold::OutsideWindow) => continue,
            Err(why) => {
                tracing::debug!(tenant = %t.name, reason = ?why, "no patch update");
                continue;
            }
        };
        let from = t
            .release
            .clone()
            .or_else(|| config.catalog.get(&t.version).map(|v| v.kubernetes.clone()))
            .unwrap_or_default();
        let requested_by = format!(
            "auto-update: patch {from} -> {to} ({})",
            match window {
                Some(w) => format!("in the maintenance window {w}"),
                None => "no maintenance window: any time".to_owned(),
            }
        );
        if let Some(up) = inv
            .start_patch_update(&t, &to, &requested_by, actor)
            .await?
        {
            started += 1;
            tracing::info!(tenant = %t.name, upgrade = up, from = %from, to = %to, "patch update started");
        }
    }
    Ok(started)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::window::Day;
    use proptest::prelude::*;

    fn at(s: &str) -> OffsetDateTime {
        OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).unwrap()
    }

    /// The built-in catalog with these extra releases of 1.37 (`(release, class)`).
    fn catalog(patches: &[(&str, Option<&str>)]) -> Catalog {
        let ok = include_str!("../../../templates/versions.yaml");
        if patches.is_empty() {
            return Catalog::parse(ok).unwrap();
        }
        let mut list = String::from("controller_manager_flags: []\n    patches:\n");
        for (r, class) in patches {
            list.push_str(&format!("      - kubernetes: {r}\n"));
            if let Some(c) = class {
                list.push_str(&format!("        class: {c}\n"));
            }
        }
        Catalog::parse(&ok.replacen("controller_manager_flags: []", list.trim_end(), 1)).unwrap()
    }

    fn candidate<'a>(release: &'a str, window: Option<&'a MaintenanceWindow>) -> Candidate<'a> {
        Candidate {
            minor: "1.37",
            release: Some(release),
            auto_update: AutoUpdate::Patch,
            window,
            phase: Phase::Ready,
            busy: false,
            rolled_back: &[],
        }
    }

    // A Saturday.
    const SAT_0300: &str = "2026-01-03T03:00:00Z";

    #[test]
    fn an_opted_in_tenant_moves_to_the_newest_patch_of_its_minor() {
        let c = catalog(&[("v1.37.0", None), ("v1.37.3", None), ("v1.37.2", None)]);
        let now = at(SAT_0300);
        assert_eq!(
            decide(&candidate("v1.37.0", None), &c, now),
            Ok("v1.37.3".into())
        );
        assert_eq!(
            decide(&candidate("v1.37.1", None), &c, now),
            Ok("v1.37.3".into())
        );
        assert_eq!(
            decide(&candidate("v1.37.3", None), &c, now),
            Err(Hold::UpToDate)
        );
        // A tenant with no release recorded runs the minor's own.
        let mut legacy = candidate("", None);
        legacy.release = None;
        assert_eq!(decide(&legacy, &c, now), Ok("v1.37.3".into()));
        // Nothing newer in the built-in catalog.
        assert_eq!(
            decide(&candidate("v1.37.1", None), &catalog(&[]), now),
            Err(Hold::UpToDate)
        );
        // A release newer than any listed (the catalog dropped it) is never moved down.
        assert_eq!(
            decide(&candidate("v1.37.9", None), &c, now),
            Err(Hold::UpToDate)
        );
    }

    #[test]
    fn preview_and_expired_patches_are_never_targets() {
        let c = catalog(&[("v1.37.2", Some("preview")), ("v1.37.3", Some("expired"))]);
        let now = at(SAT_0300);
        assert_eq!(
            decide(&candidate("v1.37.1", None), &c, now),
            Err(Hold::UpToDate)
        );
        let c = catalog(&[
            ("v1.37.0", None),
            ("v1.37.2", Some("deprecated")),
            ("v1.37.3", Some("preview")),
        ]);
        assert_eq!(
            decide(&candidate("v1.37.0", None), &c, now),
            Ok("v1.37.2".into())
        );
        assert_eq!(newest_patch(&c, "1.37"), Some("v1.37.2"));
        assert_eq!(newest_patch(&c, "1.36"), Some("v1.36.4"));
        assert_eq!(newest_patch(&c, "1.12"), None);
    }

    #[test]
    fn only_opted_in_ready_idle_tenants_inside_their_window_move() {
        let c = catalog(&[("v1.37.2", None)]);
        let sat = MaintenanceWindow::new([Day::Sat], "02:00", 120).unwrap();
        let now = at(SAT_0300);
        assert_eq!(
            decide(&candidate("v1.37.1", Some(&sat)), &c, now),
            Ok("v1.37.2".into())
        );
        assert_eq!(
            decide(
                &candidate("v1.37.1", Some(&sat)),
                &c,
                at("2026-01-03T04:00:00Z")
            ),
            Err(Hold::OutsideWindow),
            "the window closed at 04:00"
        );
        assert_eq!(
            decide(
                &candidate("v1.37.1", Some(&sat)),
                &c,
                at("2026-01-04T03:00:00Z")
            ),
            Err(Hold::OutsideWindow),
            "a Sunday"
        );
        let mut off = candidate("v1.37.1", None);
        off.auto_update = AutoUpdate::Off;
        assert_eq!(decide(&off, &c, now), Err(Hold::Off));
        let mut upgrading = candidate("v1.37.1", None);
        upgrading.phase = Phase::Upgrading;
        assert_eq!(
            decide(&upgrading, &c, now),
            Err(Hold::NotReady(Phase::Upgrading))
        );
        let mut busy = candidate("v1.37.1", None);
        busy.busy = true;
        assert_eq!(decide(&busy, &c, now), Err(Hold::Busy));
        let failed = ["v1.37.2".to_owned()];
        let mut again = candidate("v1.37.1", None);
        again.rolled_back = &failed;
        assert_eq!(
            decide(&again, &c, now),
            Err(Hold::RolledBackBefore("v1.37.2".into()))
        );
        // A newer patch than the one that failed is tried.
        let c3 = catalog(&[("v1.37.2", None), ("v1.37.3", None)]);
        assert_eq!(decide(&again, &c3, now), Ok("v1.37.3".into()));
        let mut gone = candidate("v1.12.1", None);
        gone.minor = "1.12";
        assert_eq!(decide(&gone, &c, now), Err(Hold::UnknownMinor));
    }

    #[test]
    fn the_tenants_own_setting_wins_over_its_plans() {
        use AutoUpdate::{Off, Patch};
        assert_eq!(effective(None, None), Off);
        assert_eq!(effective(None, Some(Patch)), Patch);
        assert_eq!(effective(Some(Off), Some(Patch)), Off);
        assert_eq!(effective(Some(Patch), None), Patch);
    }

    const CLASSES: [&str; 4] = ["preview", "supported", "deprecated", "expired"];

    proptest! {
        /// Whatever the catalog lists and whatever the tenant's state, a started update stays
        /// in the tenant's minor, goes up, to a supported or deprecated release, and starts
        /// only for an opted-in, Ready, idle tenant inside its window.
        #[test]
        fn a_patch_update_only_ever_moves_up_inside_the_minor_to_an_allowed_release(
            patches in proptest::collection::btree_map(0u32..12, 0usize..4, 0..6),
            current in 0u32..12,
            opted in any::<bool>(),
            ready in any::<bool>(),
            busy in any::<bool>(),
            minute in 0i64..(7 * 24 * 60),
        ) {
            let list: Vec<(String, Option<&str>)> = patches
                .iter()
                .filter(|(p, _)| **p != 1)
                .map(|(p, c)| (format!("v1.37.{p}"), Some(CLASSES[*c])))
                .collect();
            let refs: Vec<(&str, Option<&str>)> =
                list.iter().map(|(r, c)| (r.as_str(), *c)).collect();
            let c = catalog(&refs);
            let release = format!("v1.37.{current}");
            let window = MaintenanceWindow::new([Day::Sat, Day::Sun], "02:00", 240).unwrap();
            let now = at("2026-01-05T00:00:00Z") + time::Duration::minutes(minute);
            let cand = Candidate {
                minor: "1.37",
                release: Some(&release),
                auto_update: if opted { AutoUpdate::Patch } else { AutoUpdate::Off },
                window: Some(&window),
                phase: if ready { Phase::Ready } else { Phase::Provisioning },
                busy,
                rolled_back: &[],
            };
            if let Ok(to) = decide(&cand, &c, now) {
                prop_assert!(opted && ready && !busy && window.contains(now));
                prop_assert!(to.starts_with("v1.37."));
                prop_assert!(patch_number(&to) > Some(current));
                let class = c.get("1.37").unwrap().releases().find(|(r, _)| *r == to).unwrap().1;
                prop_assert!(matches!(class, Class::Supported | Class::Deprecated));
                // The newest such release.
                prop_assert_eq!(Some(to.as_str()), newest_patch(&c, "1.37"));
            } else if opted && ready && !busy && window.contains(now) {
                // Held only because nothing allowed is newer.
                let newest = newest_patch(&c, "1.37").and_then(patch_number);
                prop_assert!(newest <= Some(current));
            }
        }
    }
}
