//! The tenant reconciler: inventory + render + pki -> host cluster.
//!
//! [`Provisioner::pass`] runs one idempotent pass over a claimed tenant: bring-up
//! ([`steps::Step`] order, gated on readiness) or tear-down, chosen by the tenant's
//! [`Desired`] state, and returns the outcome the worker writes back (the workers of
//! `vcp serve`, in [`crate::serve`], claim due tenants from the inventory and wake on
//! `NOTIFY vcp_tenants`). This module owns the host: besides provisioning, it is what the API
//! calls to sign kubeconfigs with a tenant's CA ([`Provisioner::sign_kubeconfig`]).
//!
//! This file holds the pass and the bring-up; each part of it has a file: `certs` (the PKI in
//! Secrets), `expose` (the apiserver's Service and endpoint), `tenant_api` (readiness,
//! bootstrap and upgrade gates on the tenant's own apiserver), `rotations`, `snapshots` (Jobs
//! and the restore pass), `teardown`, `kubeconfig` (signing user kubeconfigs), `host`
//! (server-side apply) and `wake` (host watches that make a tenant due).

mod certs;
mod expose;
mod outcome;
mod restore;
mod sleep;
mod teardown;
mod tenant_api;
pub mod wake;

pub use expose::{endpoint, url};

use crate::host::{Provisioner, ssa as host, workload_ready};
use crate::inventory::Tenant;
use crate::lifecycle::{steps, upgrade};
use crate::pki::rotation::{Phase as RotationPhase, Target};
use crate::render::{Component, Input, Object};
use crate::rotations::store::RotationRow;
use crate::snapshots::store::NewRestore;
use crate::{Error, Result, render};
pub use outcome::Outcome;
use serde_json::json;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use steps::{Action, Step, StepResult};
use time::OffsetDateTime;
use vcp_core::lifecycle::{
    ConditionReason, ConditionStatus, ConditionType, Desired, Phase, SnapshotState, UpgradeState,
};
use vcp_core::naming::control_plane_namespace;

/// What a pass did: the outcome the worker records, and the variant of the error that stopped
/// the pass, if one did ([`Error::variant`]; for `vcp_reconcile_errors_total{error}`).
#[derive(Debug)]
pub struct Pass {
    pub outcome: Outcome,
    pub error: Option<&'static str>,
    /// Time the pass spent on each part of a bring-up (see [`BringUp`]); empty otherwise.
    pub work: Vec<(&'static str, Duration)>,
}

/// What a bring-up walk found: each step's result (in step order), when it was known, and
/// how long the pass worked on each part (`namespace`, `expose`, `pki`, `etcd`, `apiserver`,
/// `bootstrap`, `controller_manager`, `dns`, `syncer`: render, apply and readiness reads).
#[derive(Debug, Default)]
pub struct BringUp {
    pub results: Vec<(Step, StepResult)>,
    pub seen: BTreeMap<Step, OffsetDateTime>,
    pub work: Vec<(&'static str, Duration)>,
}

impl BringUp {
    /// Records a step's result as of now; whether it is ready.
    fn push(&mut self, step: Step, r: StepResult) -> bool {
        let ready = r == StepResult::Ready;
        self.results.push((step, r));
        self.results.sort_by_key(|(s, _)| *s);
        self.seen.insert(step, OffsetDateTime::now_utc());
        ready
    }

    fn work(&mut self, part: &'static str, since: Instant) {
        self.work.push((part, since.elapsed()));
    }
}

/// Label selecting a tenant's control-plane objects.
/// What a pass writes back for tenant `t` from the step machine's verdict: the tenant's
/// generation is the one the pass saw; no upgrade transition and no restore unless the caller
/// adds its own.
fn outcome(v: steps::Verdict, t: &Tenant, endpoint: Option<String>) -> Outcome {
    Outcome {
        phase: v.phase,
        conditions: v.conditions,
        endpoint,
        observed_generation: t.generation,
        requeue_after: v.requeue_after,
        upgrade: None,
        restore: None,
    }
}

impl Provisioner {
    /// One pass over a claimed tenant.
    #[tracing::instrument(skip_all, fields(tenant = %t.name, key = %t.key, desired = %t.desired,
        generation = t.generation))]
    pub async fn pass(&self, t: &Tenant, actor: &str, now: OffsetDateTime) -> Pass {
        match t.desired {
            Desired::Absent => {
                let (r, error) = match self.tear_down(t).await {
                    Ok(r) => (r, None),
                    Err(e) => (StepResult::Error(e.public()), Some(e.variant())),
                };
                let v = steps::tear_down(&r, &t.conditions.0, now);
                Pass {
                    outcome: outcome(v, t, t.endpoint.clone()),
                    error,
                    work: Vec::new(),
                }
            }
            Desired::Present => self.present(t, actor, now).await,
        }
    }

    /// A pass over a tenant that should exist: its restore or its bring-up, then its pending
    /// snapshots and its upgrade.
    async fn present(&self, t: &Tenant, actor: &str, now: OffsetDateTime) -> Pass {
        let mut endpoint = t.endpoint.clone();
        let mut error = None;
        let loaded = async {
            let upgrade = self.inventory.active_upgrade(t.id).await?;
            let restore = self.inventory.active_restore(t.id).await?;
            let pending = self.inventory.pending_snapshots(t.id).await?;
            let rotation = self.inventory.active_rotation(t.id).await?;
            Ok::<_, Error>((upgrade, restore, pending, rotation))
        };
        let (upgrade, restore, pending, rotation) = match loaded.await {
            Ok(x) => x,
            Err(e) => {
                // Without knowing what moves the tenant, do nothing this pass.
                let v = steps::bring_up(
                    &[(Step::Namespace, StepResult::Error(e.public()))],
                    &t.conditions.0,
                    now,
                );
                return Pass {
                    outcome: Outcome {
                        phase: t.phase,
                        conditions: v.conditions,
                        endpoint,
                        observed_generation: t.observed_generation,
                        requeue_after: v.requeue_after,
                        upgrade: None,
                        restore: None,
                    },
                    error: Some(e.variant()),
                    work: Vec::new(),
                };
            }
        };
        let prev = &t.conditions.0;
        if let Some(r) = restore.as_ref().filter(|r| !r.restored) {
            return self.restore_pass(t, r, now).await;
        }
        // Asleep unless an upgrade or a rotation needs the control plane: those wake it for
        // their passes, and it goes back to sleep once they are done.
        if t.sleep == vcp_core::lifecycle::Sleep::Asleep && upgrade.is_none() && rotation.is_none()
        {
            return self.sleep_pass(t, now).await;
        }
        // A tenant from before encryption at rest gets its first key through a rotation
        // (every replica reads it before any writes with it; its plaintext is rewritten).
        // A restored clone rotates away from the key it shares with its source the same way.
        let rotation = match rotation {
            Some(r) => Some(r),
            None => match self.start_first_key(t, actor).await {
                Ok(Some(r)) => Some(r),
                Ok(None) => match self.start_own_key(t, actor).await {
                    Ok(r) => r,
                    Err(e) => {
                        error = Some(e.variant());
                        tracing::warn!(error = %e.public(), "starting the clone's own key failed");
                        None
                    }
                },
                Err(e) => {
                    error = Some(e.variant());
                    tracing::warn!(error = %e.public(), "starting the first encryption key failed");
                    None
                }
            },
        };
        let mut generation = None;
        let BringUp {
            results,
            seen,
            work,
        } = self
            .bring_up(
                t,
                rotation.as_ref(),
                actor,
                &mut endpoint,
                &mut generation,
                &mut error,
            )
            .await;
        let mut v = steps::bring_up_seen(&results, &seen, prev, now);
        // The latest backup's outcome stands until the next one finishes.
        v.conditions.extend(
            prev.iter()
                .filter(|c| c.type_ == ConditionType::BackedUp)
                .cloned(),
        );
        let all_ready = results.len() == Step::ALL.len()
            && results.iter().all(|(_, r)| *r == StepResult::Ready);
        // A clone is up, still empty: its seed is restored before it is ever Ready.
        if all_ready && restore.is_none() && t.seed_snapshot_id.is_some() {
            match self.inventory.start_seed_restore(t, actor).await {
                Ok(Some(r)) => {
                    steps::set_condition(
                        &mut v,
                        ConditionType::Restored,
                        ConditionStatus::False,
                        ConditionReason::Waiting,
                        &format!(
                            "restoring snapshot {}, which the tenant was cloned from",
                            r.snapshot_number
                        ),
                        prev,
                        now,
                    );
                    v.phase = Phase::Restoring;
                    v.requeue_after = std::time::Duration::ZERO;
                    return Pass {
                        outcome: outcome(v, t, endpoint),
                        error,
                        work,
                    };
                }
                Ok(None) => {}
                Err(e) => {
                    error = Some(e.variant());
                    tracing::warn!(error = %e.public(), "starting the clone's restore failed");
                    v.phase = Phase::Provisioning;
                    v.requeue_after = v.requeue_after.min(steps::REQUEUE_ERROR);
                    return Pass {
                        outcome: outcome(v, t, endpoint),
                        error,
                        work,
                    };
                }
            }
        }
        if let (Some(r), Some(g)) = (&rotation, &generation) {
            // An encryption key's `serve`: every encrypted object is written again with the
            // new key (every replica encrypts with it since `sign`), before `retire` drops
            // the old one.
            let rewritten = match r.parsed() {
                Some((Target::EncryptionKey, RotationPhase::Serve)) if all_ready => {
                    let resources = self
                        .config
                        .plans
                        .get(&t.plan)
                        .map(|p| p.encryption.resources.clone())
                        .unwrap_or_default();
                    match self
                        .rewrite_encrypted(t, endpoint.as_deref(), &resources)
                        .await
                    {
                        Ok(_) => true,
                        Err(e) => {
                            error = Some(e.variant());
                            tracing::warn!(error = %e.public(), "rewriting encrypted objects failed");
                            false
                        }
                    }
                }
                Some((Target::EncryptionKey, RotationPhase::Serve)) => false,
                _ => true,
            };
            match self
                .advance_rotation(t, r, all_ready, rewritten, g, actor, now)
                .await
            {
                Ok(_) => {}
                Err(e) => {
                    error = Some(e.variant());
                    tracing::warn!(error = %e.public(), "moving the rotation on failed");
                }
            }
            // Phases take seconds to roll out: look again soon, not at the idle requeue.
            v.requeue_after = v.requeue_after.min(steps::REQUEUE_WAITING);
        }

        // Snapshots are taken from a control plane that is up.
        let mut taken = BTreeMap::new();
        let version = self.version_of(t);
        if all_ready && let Some(input) = self.job_input(t, version.as_ref()) {
            for s in &pending {
                match self.take_snapshot(t, &input, s, false).await {
                    Ok(state) => {
                        self.backed_up(t, s, state, &mut v, prev, now).await;
                        taken.insert(s.id, state);
                    }
                    Err(e) => {
                        error = Some(e.variant());
                        tracing::warn!(snapshot = s.id, error = %e.public(), "snapshot step failed");
                    }
                }
            }
        }

        let restore = restore.and_then(|r| {
            use ConditionReason as R;
            use ConditionStatus as S;
            let (status, reason, msg, done) = if all_ready {
                (
                    S::True,
                    R::Ready,
                    "restored".to_owned(),
                    Some(NewRestore::Succeeded),
                )
            } else {
                (
                    S::False,
                    R::Waiting,
                    "snapshot restored; starting the control plane".to_owned(),
                    None,
                )
            };
            steps::set_condition(
                &mut v,
                ConditionType::Restored,
                status,
                reason,
                &msg,
                prev,
                now,
            );
            if done.is_none() {
                v.phase = Phase::Restoring;
            }
            done.map(|d| (r.id, d))
        });

        let upgrade = match upgrade {
            None => None,
            Some(u) => {
                let snap = match u.snapshot_id {
                    None => None,
                    Some(id) => match self.inventory.snapshot(t.id, id).await {
                        Ok(s) => s,
                        Err(e) => {
                            error = Some(e.variant());
                            None
                        }
                    },
                };
                let mut a = u.active(snap.as_ref());
                // What this pass itself found out about the hop's snapshot.
                if let (Some(id), Some(upgrade::HopSnapshot::Pending)) =
                    (u.snapshot_id, &a.snapshot)
                {
                    match taken.get(&id) {
                        Some(SnapshotState::Succeeded) => {
                            a.snapshot = Some(upgrade::HopSnapshot::Taken(id))
                        }
                        Some(SnapshotState::Failed) => {
                            let why = self
                                .inventory
                                .snapshot(t.id, id)
                                .await
                                .ok()
                                .flatten()
                                .and_then(|s| s.reason)
                                .unwrap_or_default();
                            a.snapshot = Some(upgrade::HopSnapshot::Failed(why));
                        }
                        _ => {}
                    }
                }
                let gate = if all_ready && a.state == UpgradeState::Running {
                    Some(self.upgrade_gate(t, &a, endpoint.as_deref()).await)
                } else {
                    None
                };
                let tr = upgrade::advance(
                    &a,
                    &self.config.catalog,
                    &results,
                    gate.as_ref(),
                    now,
                    self.config.hop_timeout,
                );
                upgrade::verdict(&mut v, &tr, prev, now);
                Some((a.id, tr))
            }
        };
        if !pending.is_empty() && all_ready {
            // Look again soon: a snapshot Job takes seconds.
            v.requeue_after = v.requeue_after.min(steps::REQUEUE_WAITING);
        }
        Pass {
            outcome: Outcome {
                upgrade,
                restore,
                ..outcome(v, t, endpoint)
            },
            error,
            work,
        }
    }

    /// Sets `BackedUp` from a snapshot this pass saw finish: an owner sees a failed backup
    /// (its store unreachable, its credentials refused) on the tenant, not only in its list.
    async fn backed_up(
        &self,
        t: &Tenant,
        s: &crate::snapshots::store::SnapshotRow,
        state: SnapshotState,
        v: &mut steps::Verdict,
        prev: &[vcp_core::lifecycle::Condition],
        now: OffsetDateTime,
    ) {
        let (status, reason, message) = match state {
            SnapshotState::Pending => return,
            SnapshotState::Succeeded => (
                ConditionStatus::True,
                ConditionReason::Ready,
                format!("snapshot {} taken", s.number),
            ),
            SnapshotState::Failed => {
                let why = match self.inventory.snapshot(t.id, s.id).await {
                    Ok(row) => row.and_then(|r| r.reason).unwrap_or_default(),
                    Err(e) => e.public(),
                };
                (
                    ConditionStatus::False,
                    ConditionReason::Failed,
                    format!("snapshot {} failed: {why}", s.number),
                )
            }
        };
        steps::set_condition(
            v,
            ConditionType::BackedUp,
            status,
            reason,
            &message,
            prev,
            now,
        );
    }

    /// Walks the steps (the graph in [`steps`]): the namespace, the exposure and the
    /// certificates in turn, then each component as [`steps::action`] allows; `error` gets the
    /// variant of the error that stopped a step, if one did.
    async fn bring_up(
        &self,
        t: &Tenant,
        rotation: Option<&RotationRow>,
        actor: &str,
        endpoint: &mut Option<String>,
        generation: &mut Option<String>,
        error: &mut Option<&'static str>,
    ) -> BringUp {
        let mut out = BringUp::default();
        let cfg = &self.config;
        let Some(version) = self.version_of(t) else {
            out.push(
                Step::Namespace,
                StepResult::Fatal(format!(
                    "version {} is not in this replica's catalog",
                    t.version
                )),
            );
            return out;
        };
        let version = &version;
        let Some(plan) = cfg.plans.get(&t.plan) else {
            out.push(
                Step::Namespace,
                StepResult::Fatal(format!("plan {:?} is not configured", t.plan)),
            );
            return out;
        };
        // What an error makes of a step; `render_fatal`: a template that does not render
        // cannot succeed by retrying (the steps that apply components).
        let mut failed = |e: Error, render_fatal: bool| {
            *error = Some(e.variant());
            match e {
                Error::Render(e) if render_fatal => StepResult::Fatal(e.to_string()),
                e => StepResult::Error(e.public()),
            }
        };
        let ns = control_plane_namespace(&t.key);
        let clock = Instant::now();
        let r = self.ensure_namespace(t, &ns).await;
        out.work("namespace", clock);
        if !out.push(Step::Namespace, r.unwrap_or_else(|e| failed(e, true))) {
            return out;
        }
        // Repairs what a revocation's own write missed (a replica killed between the inventory
        // and the host); it blocks nothing else.
        if let Err(e) = self.write_revocations(t).await {
            tracing::warn!(error = %e.public(), "writing the revoked kubeconfigs failed");
            let _ = failed(e, false);
        }
        let clock = Instant::now();
        let exposed = self.expose(t, version, plan).await;
        out.work("expose", clock);
        let external = match exposed {
            Ok(Some((url, host))) => {
                *endpoint = Some(url);
                out.push(Step::Exposed, StepResult::Ready);
                host
            }
            Ok(None) => {
                out.push(
                    Step::Exposed,
                    StepResult::Waiting("waiting for the apiserver Service's address".into()),
                );
                return out;
            }
            Err(e) => {
                out.push(Step::Exposed, failed(e, false));
                return out;
            }
        };
        let clock = Instant::now();
        // The keys (certificates, the apiserver's encryption configuration, and its audit
        // webhook's token) are one step.
        let pki = async {
            let mut rollout = self.ensure_pki(t, &ns, plan, &external, rotation).await?;
            let encryption = self
                .ensure_encryption(t, &ns, plan, rotation, actor)
                .await?;
            rollout.insert(ROLLOUT_ENCRYPTION.to_owned(), encryption);
            let audit = self.ensure_audit(t, &ns, plan).await?;
            rollout.insert(ROLLOUT_AUDIT.to_owned(), audit);
            Ok::<_, Error>(rollout)
        }
        .await;
        out.work("pki", clock);
        let rollout = match pki {
            Ok(r) => {
                *generation = r.get(ROLLOUT_TOKENS).cloned();
                out.push(Step::Certificates, StepResult::Ready);
                r
            }
            Err(e) => {
                out.push(Step::Certificates, failed(e, false));
                return out;
            }
        };
        let input = self.input(t, version, plan, rollout);

        // etcd is applied on every pass; the apiserver with it while it does not exist yet,
        // otherwise behind an etcd that is rolled out (steps::action).
        let clock = Instant::now();
        let etcd = match cfg.settings.placement(plan, &t.key) {
            // On a shared datastore the step is the tenant's user there.
            Some(p) => self
                .tenant_on_datastore(t, &p)
                .await
                .unwrap_or_else(|e| failed(e, false)),
            // Its own etcd: as its plan says, or members added one at a time until it is.
            None => self
                .own_etcd(t, &input)
                .await
                .unwrap_or_else(|e| failed(e, true)),
        };
        out.work("etcd", clock);
        let etcd_ready = etcd == StepResult::Ready;
        out.push(Step::Etcd, etcd);
        let clock = Instant::now();
        let api = self
            .component(Component::Apiserver, &input, etcd_ready, true)
            .await;
        let (api_applied, api) = match api {
            Ok((action, Some(rollout))) => {
                let readyz = self.readyz(&ns, endpoint.as_deref()).await;
                let (mut result, answers) = steps::apiserver(rollout, &readyz);
                // Ready also takes revocations enforced: the authorizer beside the apiserver
                // answering it.
                if result == StepResult::Ready {
                    result = self
                        .revocations_answered(&ns, endpoint.as_deref())
                        .await
                        .unwrap_or_else(|e| failed(e, false));
                }
                (action == Action::Apply, Some((result, answers)))
            }
            Ok((_, None)) => (false, None),
            Err(e) => (false, Some((failed(e, true), false))),
        };
        out.work("apiserver", clock);
        let Some((api, answers)) = api else {
            return out;
        };
        // Its clients are changed only behind an apiserver this pass applied and found ready
        // (skew during upgrades), and created as soon as one answers.
        let api_ready = api_applied && api == StepResult::Ready;
        out.push(Step::Apiserver, api);
        if !answers {
            return out;
        }
        let clock = Instant::now();
        let boot = self
            .bootstrap(&ns, endpoint.as_deref())
            .await
            .unwrap_or_else(|e| failed(e, true));
        out.work("bootstrap", clock);
        if !out.push(Step::Bootstrapped, boot) {
            return out;
        }
        // Sudo roles follow the live sudo kubeconfigs: those of revoked or expired ones go, and
        // so do those bound to a user name (written before sudo was bound to serials). It
        // blocks no step: a failure is logged and retried by the next pass.
        if !self.config.simulate
            && let Err(e) = self.reconcile_sudo(t, endpoint.as_deref()).await
        {
            tracing::warn!(error = %e.public(), "reconciling the sudo roles failed");
        }

        // The apiserver's clients: none depends on another, so they start and roll together.
        let timed = |c: Component| {
            let input = &input;
            async move {
                let clock = Instant::now();
                let r = self.component(c, input, api_ready, true).await;
                (r, clock.elapsed())
            }
        };
        // The controller-manager is ready once its aggregation controller has filled the
        // roles vcp binds users to: before that `view` and `edit` grant nothing, and a user's
        // first call with a fresh kubeconfig would be refused.
        let cm = async {
            let (r, took) = timed(Component::ControllerManager).await;
            let r = match r {
                Ok((a, Some(StepResult::Ready))) => self
                    .tenant_settled(&ns, endpoint.as_deref())
                    .await
                    .map(|r| (a, Some(r))),
                other => other,
            };
            (r, took)
        };
        let (cm, dns, syncer) =
            tokio::join!(cm, timed(Component::Coredns), timed(Component::Syncer));
        for (step, name, (r, took)) in [
            (Step::ControllerManager, "controller_manager", cm),
            (Step::Dns, "dns", dns),
            (Step::Syncer, "syncer", syncer),
        ] {
            out.work.push((name, took));
            match r {
                Ok((_, Some(r))) => {
                    out.push(step, r);
                }
                Ok((_, None)) => {}
                Err(e) => {
                    out.push(step, failed(e, true));
                }
            }
        }
        out
    }

    /// One component as [`steps::action`] decides: rendered, read on the host (its workload),
    /// applied if it may be, and its readiness (`None`: not there and left alone).
    async fn component(
        &self,
        c: Component,
        input: &Input<'_>,
        after_ready: bool,
        can_start: bool,
    ) -> Result<(Action, Option<StepResult>)> {
        let objects = self.config.renderer.render(c, input)?;
        let before = workload_ready(&self.host, &objects).await?;
        match steps::action(before.is_some(), after_ready, can_start) {
            Action::Apply => {
                host::apply_all(&self.host, &objects).await?;
                Ok((Action::Apply, workload_ready(&self.host, &objects).await?))
            }
            Action::Check => Ok((Action::Check, before)),
            Action::Skip => Ok((Action::Skip, None)),
        }
    }

    async fn ensure_namespace(&self, t: &Tenant, ns: &str) -> Result<StepResult> {
        let obj = Object(json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": ns,
                "labels": {
                    render::LABEL_CONTROL_PLANE_OF: t.key,
                    render::LABEL_MANAGED_BY: "vcp",
                },
                "annotations": {"vcp.dev/tenant-name": t.name},
            },
        }));
        let applied = host::apply(&self.host, &obj, false).await?;
        if applied.metadata.deletion_timestamp.is_some() {
            return Ok(StepResult::Waiting(format!(
                "namespace {ns} is still terminating"
            )));
        }
        // vcp's Secrets access in this namespace, and in no other (render::host_rbac).
        host::apply(
            &self.host,
            &render::host_rbac::own_binding(
                ns,
                &self.config.host_user,
                &self.config.settings.host_roles_prefix,
            ),
            false,
        )
        .await?;
        Ok(StepResult::Ready)
    }
}

/// The rollout entry that carries the token generation, which the syncer gets as an argument.
pub const ROLLOUT_TOKENS: &str = "tokens";

/// The rollout entry that carries the digest of the apiserver's encryption configuration.
pub const ROLLOUT_ENCRYPTION: &str = "encryption";

/// The rollout entry that carries the digest of the apiserver's audit policy and webhook.
pub const ROLLOUT_AUDIT: &str = "audit";
