//! The tenant reconciler: inventory + render + pki -> host cluster.
//!
//! [`Provisioner::pass`] runs one idempotent pass over a claimed tenant: bring-up
//! ([`steps::Step`] order, gated on readiness) or tear-down, chosen by the tenant's
//! [`Desired`] state, and returns the outcome the worker writes back (the workers of
//! `vcp serve`, in [`crate::serve`], claim due tenants from the inventory and wake on
//! `NOTIFY vcp_tenants`). This module owns the host: besides provisioning, it is what the API
//! calls to sign kubeconfigs with a tenant's CA ([`Provisioner::sign_kubeconfig`]).

pub mod host;
pub mod kubeconfig;
mod rotations;
mod snapshots;
pub mod wake;

use crate::inventory::rotations::RotationRow;
use crate::inventory::{Inventory, NewRestore, Outcome, RestoreRow, Tenant};
use crate::lifecycle::steps;
use crate::lifecycle::upgrade;
use crate::pki::rotation::{self, Target};
use crate::pki::{self, ApiNames, Ca, CertKey};
use crate::render::{self, Catalog, Component, Expose, Input, Object, Plan, Renderer, Settings};
use crate::{Error, Result};
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{
    ConfigMap, Namespace, PersistentVolume, PersistentVolumeClaim, Pod, Secret, Service,
};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use steps::{Action, Step, StepResult};
use time::OffsetDateTime;
use vcp_core::lifecycle::{
    ConditionReason, ConditionStatus, ConditionType, Desired, Phase, SnapshotState, UpgradeState,
};
use vcp_core::naming::{LABEL_TENANT, control_plane_namespace};

/// How the orchestrator reaches tenant apiservers (readiness, bootstrap, kubeconfigs it checks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TenantAccess {
    /// Through the Service's cluster DNS name (vcp runs inside the host cluster).
    Service,
    /// Through the exposed endpoint that kubeconfigs carry (vcp runs outside).
    Endpoint,
}

/// Everything a pass needs besides the tenant.
#[derive(Debug)]
pub struct Config {
    pub catalog: Catalog,
    pub plans: BTreeMap<String, Plan>,
    pub settings: Settings,
    pub renderer: Renderer,
    pub access: TenantAccess,
    /// Control-plane pods run on simulated nodes: Ready pods stand for a serving control
    /// plane and nothing talks to the tenant apiserver (benchmarks of vcp's own overhead).
    pub simulate: bool,
    /// How long one upgrade hop may take before it is rolled back.
    pub hop_timeout: Duration,
    /// vcp's own user on the host, bound to `vcp:tenant-namespace` in each namespace of a
    /// tenant vcp works in (render::host_rbac).
    pub host_user: String,
}

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

/// Runs passes.
#[derive(Clone)]
pub struct Provisioner {
    pub inventory: Inventory,
    pub host: Client,
    pub config: Arc<Config>,
}

impl std::fmt::Debug for Provisioner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Provisioner").finish_non_exhaustive()
    }
}

/// Label selecting a tenant's control-plane objects.
fn cp_selector(key: &str) -> String {
    format!("{}={key}", render::LABEL_CONTROL_PLANE_OF)
}

fn not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

fn conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

/// `https://host:port`, bracketing IPv6 literals.
fn url(host: &str, port: i32) -> String {
    match host.parse::<IpAddr>() {
        Ok(IpAddr::V6(_)) => format!("https://[{host}]:{port}"),
        _ => format!("https://{host}:{port}"),
    }
}

/// The first address of a CIDR (the tenant's own `kubernetes` Service IP).
pub fn first_service_ip(cidr: &str) -> Option<IpAddr> {
    let (base, _) = cidr.split_once('/')?;
    match base.parse::<IpAddr>().ok()? {
        IpAddr::V4(v4) => Some(IpAddr::V4((u32::from(v4) + 1).into())),
        IpAddr::V6(v6) => Some(IpAddr::V6((u128::from(v6) + 1).into())),
    }
}

fn secret_str(s: &Secret, k: &str) -> Option<String> {
    s.data
        .as_ref()?
        .get(k)
        .and_then(|b| String::from_utf8(b.0.clone()).ok())
}

impl Provisioner {
    fn input<'a>(
        &'a self,
        t: &'a Tenant,
        version: &'a render::Version,
        plan: &'a Plan,
        rollout: BTreeMap<String, String>,
    ) -> Input<'a> {
        Input {
            name: &t.name,
            key: &t.key,
            version,
            plan,
            settings: &self.config.settings,
            rollout,
            stopped: false,
        }
    }

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
                    outcome: Outcome {
                        phase: v.phase,
                        conditions: v.conditions,
                        endpoint: t.endpoint.clone(),
                        observed_generation: t.generation,
                        requeue_after: v.requeue_after,
                        upgrade: None,
                        restore: None,
                    },
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
        let mut generation = None;
        let BringUp {
            results,
            seen,
            work,
        } = self
            .bring_up(
                t,
                rotation.as_ref(),
                &mut endpoint,
                &mut generation,
                &mut error,
            )
            .await;
        let mut v = steps::bring_up_seen(&results, &seen, prev, now);
        let all_ready = results.len() == Step::ALL.len()
            && results.iter().all(|(_, r)| *r == StepResult::Ready);
        if let (Some(r), Some(g)) = (&rotation, &generation) {
            match self.advance_rotation(t, r, all_ready, g, actor, now).await {
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
                match self.take_snapshot(t, &input, s).await {
                    Ok(state) => {
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
                phase: v.phase,
                conditions: v.conditions,
                endpoint,
                observed_generation: t.generation,
                requeue_after: v.requeue_after,
                upgrade,
                restore,
            },
            error,
            work,
        }
    }

    /// The input of a Job's template: the tenant's version and plan (Jobs mount no
    /// certificates that roll); `None` if either is not configured (the bring-up says so).
    fn job_input<'a>(
        &'a self,
        t: &'a Tenant,
        version: Option<&'a render::Version>,
    ) -> Option<Input<'a>> {
        let version = version?;
        let plan = self.config.plans.get(&t.plan)?;
        Some(self.input(t, version, plan, BTreeMap::new()))
    }

    /// The catalog's entry for the tenant's minor as its release runs it; `None` if this
    /// replica's catalog does not have the minor.
    fn version_of(&self, t: &Tenant) -> Option<render::Version> {
        self.config
            .catalog
            .at_release(&t.version, t.release.as_deref())
    }

    /// A pass while a restore has members left to restore: the control plane stays stopped.
    async fn restore_pass(&self, t: &Tenant, r: &RestoreRow, now: OffsetDateTime) -> Pass {
        use ConditionReason as R;
        use ConditionStatus as S;
        let prev = &t.conditions.0;
        let mut v = steps::Verdict {
            phase: Phase::Restoring,
            conditions: prev.clone(),
            requeue_after: steps::REQUEUE_WAITING,
        };
        let mut error = None;
        let version = self.version_of(t);
        let result = match self.job_input(t, version.as_ref()) {
            None => Ok((
                Some(NewRestore::Failed(format!(
                    "version {} or plan {} is not configured",
                    t.version, t.plan
                ))),
                String::new(),
            )),
            Some(input) => self.restore_members(t, &input, r).await,
        };
        let restore = match result {
            Ok((done, msg)) => {
                match &done {
                    None => steps::set_condition(
                        &mut v,
                        ConditionType::Restored,
                        S::False,
                        R::Waiting,
                        &msg,
                        prev,
                        now,
                    ),
                    Some(NewRestore::Failed(why)) => {
                        steps::set_condition(
                            &mut v,
                            ConditionType::Restored,
                            S::False,
                            R::Failed,
                            why,
                            prev,
                            now,
                        );
                        // Started again on the data it has; the next pass brings it up.
                        v.phase = Phase::Provisioning;
                        v.requeue_after = Duration::ZERO;
                    }
                    Some(_) => {
                        steps::set_condition(
                            &mut v,
                            ConditionType::Restored,
                            S::False,
                            R::Waiting,
                            &msg,
                            prev,
                            now,
                        );
                        v.requeue_after = Duration::ZERO;
                    }
                }
                done.map(|d| (r.id, d))
            }
            Err(e) => {
                error = Some(e.variant());
                steps::set_condition(
                    &mut v,
                    ConditionType::Restored,
                    S::False,
                    R::Error,
                    &e.public(),
                    prev,
                    now,
                );
                v.requeue_after = steps::REQUEUE_ERROR;
                None
            }
        };
        Pass {
            outcome: Outcome {
                phase: v.phase,
                conditions: v.conditions,
                endpoint: t.endpoint.clone(),
                observed_generation: t.generation,
                requeue_after: v.requeue_after,
                upgrade: None,
                restore,
            },
            error,
            work: Vec::new(),
        }
    }

    /// Walks the steps (the graph in [`steps`]): the namespace, the exposure and the
    /// certificates in turn, then each component as [`steps::action`] allows; `error` gets the
    /// variant of the error that stopped a step, if one did.
    async fn bring_up(
        &self,
        t: &Tenant,
        rotation: Option<&RotationRow>,
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
        let pki = self.ensure_pki(t, &ns, plan, &external, rotation).await;
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
        let etcd = self
            .component(Component::Etcd, &input, true, true)
            .await
            .map(|(_, r)| r.unwrap_or(StepResult::Waiting("not applied".into())))
            .unwrap_or_else(|e| failed(e, true));
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
                    .roles_aggregated(&ns, endpoint.as_deref())
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

    /// Whether the tenant's aggregated roles that user groups are bound to (`view`, `edit`;
    /// see [`crate::access::LEVELS`]) have their rules, which the controller-manager fills.
    async fn roles_aggregated(&self, ns: &str, endpoint: Option<&str>) -> Result<StepResult> {
        if self.config.simulate {
            return Ok(StepResult::Ready);
        }
        let roles: Api<ClusterRole> = Api::all(self.tenant_client(ns, endpoint).await?);
        for name in ["view", "edit"] {
            let role = roles
                .get_opt(name)
                .await
                .map_err(|e| Error::kube(format!("read the tenant's {name} role"), e))?;
            if role.and_then(|r| r.rules).is_none_or(|r| r.is_empty()) {
                return Ok(StepResult::Waiting(format!(
                    "the controller-manager has not aggregated the {name} role yet"
                )));
            }
        }
        Ok(StepResult::Ready)
    }

    /// Whether the tenant apiserver gets answers from its revocation authorizer (the sidecar
    /// in its pod): a tenant is Ready only once it enforces revocations. Asked with a
    /// SubjectAccessReview for a made-up user carrying a revocation group (the webhook's
    /// matchConditions send it there); an authorizer the apiserver cannot reach shows as the
    /// review's evaluation error.
    /// In simulate mode nothing talks to the tenant (there is no apiserver to ask).
    async fn revocations_answered(&self, ns: &str, endpoint: Option<&str>) -> Result<StepResult> {
        use k8s_openapi::api::authorization::v1::SubjectAccessReview;
        if self.config.simulate {
            return Ok(StepResult::Ready);
        }
        let client = self.tenant_client(ns, endpoint).await?;
        let review: SubjectAccessReview = serde_json::from_value(json!({
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": "vcp:revocation-probe",
                "groups": [vcp_core::revocation::group_of("00")],
                "nonResourceAttributes": {"path": "/version", "verb": "get"},
            },
        }))
        .map_err(|e| Error::Config(format!("a SubjectAccessReview: {e}")))?;
        let answer = Api::<SubjectAccessReview>::all(client)
            .create(&kube::api::PostParams::default(), &review)
            .await
            .map_err(|e| {
                Error::kube(
                    "ask the tenant apiserver about its revocation authorizer",
                    e,
                )
            })?;
        Ok(match answer.status.and_then(|s| s.evaluation_error) {
            Some(e) if !e.is_empty() => StepResult::Waiting(format!(
                "the apiserver does not reach its revocation authorizer yet: {e}"
            )),
            _ => StepResult::Ready,
        })
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

    /// Applies the network policy and the apiserver Service; returns the endpoint URL and the
    /// host name or address to put in the serving certificate, once known.
    async fn expose(
        &self,
        t: &Tenant,
        version: &render::Version,
        plan: &Plan,
    ) -> Result<Option<(String, String)>> {
        let input = self.input(t, version, plan, BTreeMap::new());
        let r = &self.config.renderer;
        host::apply_all(&self.host, &r.render(Component::Network, &input)?).await?;
        let svc = r
            .render(Component::Apiserver, &input)?
            .into_iter()
            .find(|o| o.kind() == "Service")
            .ok_or(Error::Config(
                "the kube-apiserver template renders no Service".into(),
            ))?;
        host::apply(&self.host, &svc, false).await?;
        let ns = control_plane_namespace(&t.key);
        let live = Api::<Service>::namespaced(self.host.clone(), &ns)
            .get(svc.name())
            .await
            .map_err(|e| Error::kube("read the apiserver Service", e))?;
        Ok(endpoint(&self.config.settings.expose, &t.key, &live))
    }

    /// Makes sure every CA and leaf Secret exists, is current and is recorded; returns the
    /// per-component certificate digests that roll pods on renewal.
    async fn ensure_pki(
        &self,
        t: &Tenant,
        ns: &str,
        plan: &Plan,
        external: &str,
        rotation: Option<&RotationRow>,
    ) -> Result<BTreeMap<String, String>> {
        let secrets: Api<Secret> = Api::namespaced(self.host.clone(), ns);
        let now = OffsetDateTime::now_utc();
        // One list instead of a read per Secret: this runs on every pass.
        let stored: BTreeMap<String, Secret> = secrets
            .list(&ListParams::default().labels(&cp_selector(&t.key)))
            .await
            .map_err(|e| Error::kube("list the tenant's secrets", e))?
            .items
            .into_iter()
            .map(|s| (s.metadata.name.clone().unwrap_or_default(), s))
            .collect();
        let mut cas = BTreeMap::new();
        for (name, purpose) in pki::CAS {
            let ca_secret = match stored.get(name).filter(|s| cert_key_of(s).is_some()) {
                Some(s) => s.clone(),
                None => {
                    let ca = Ca::generate(&format!("{}-{purpose}", t.key), now, pki::CA_VALIDITY)?;
                    self.create_secret(&secrets, name, t, pair_data(ca.cert_key(), None), None)
                        .await?;
                    // Another replica may have won the race: use whatever is stored now.
                    secrets
                        .get(name)
                        .await
                        .map_err(|e| Error::kube(format!("read secret {name}"), e))?
                }
            };
            let target: Target = name
                .parse()
                .map_err(|e: String| Error::Config(format!("CA secret {name}: {e}")))?;
            let m = self
                .ca_material(t, &secrets, ca_secret, target, purpose, rotation, now)
                .await?;
            for (ca, which) in [
                (Some(&m.current), purpose.to_owned()),
                (m.next.as_ref(), format!("{purpose}-next")),
            ] {
                if let Some(ca) = ca {
                    let info = pki::inspect(&which, &ca.cert_key().cert_pem)?;
                    self.inventory
                        .record_certificate(t.id, &which, &info)
                        .await?;
                }
            }
            cas.insert(name, m);
        }
        let sa_secret = match stored.get("sa") {
            Some(s) => s.clone(),
            None => {
                let (key, public) = pki::service_account_key()?;
                let data = BTreeMap::from([
                    ("sa.key".to_owned(), ByteString(key.into_bytes())),
                    ("sa.pub".to_owned(), ByteString(public.into_bytes())),
                ]);
                self.create_secret(&secrets, "sa", t, data, None).await?;
                secrets
                    .get("sa")
                    .await
                    .map_err(|e| Error::kube("read secret sa", e))?
            }
        };
        let sa = self.sa_material(t, &secrets, sa_secret, rotation).await?;
        let names = ApiNames {
            namespace: ns.to_owned(),
            cluster_domain: self.config.settings.cluster_domain.clone(),
            kubernetes_service_ip: first_service_ip(&self.config.settings.service_cidr)
                .ok_or_else(|| Error::Config("service CIDR has no first address".into()))?,
            external: Some(external.to_owned()),
            etcd_replicas: plan.etcd_replicas,
        };
        let mut serials = BTreeMap::new();
        for leaf in pki::plan(&names) {
            let material = &cas[leaf.ca];
            // Users' kubeconfigs verify the apiserver's serving certificate with the CA they
            // were handed: it moves to a new cluster CA last (see pki::rotation).
            let ca = material.signer(leaf.name == "apiserver");
            let bundle = material.bundle();
            let signer = rotation::fingerprint(&ca.cert_key().cert_pem);
            let legacy_signer = rotation::fingerprint(&material.current.cert_key().cert_pem);
            let digest = leaf.spec.digest();
            let existing = stored.get(leaf.name).cloned();
            let current = existing.as_ref().and_then(|s| {
                let cert = secret_str(s, "tls.crt")?;
                let ann = s.metadata.annotations.as_ref()?;
                // Leaves from before rotations carry no signer: the CA in use signed them.
                let signed_by = ann.get(ANN_SIGNER).unwrap_or(&legacy_signer);
                let ok = ann.get(ANN_SPEC) == Some(&digest)
                    && *signed_by == signer
                    && secret_str(s, "ca.crt").as_deref() == Some(bundle.as_str())
                    && !pki::needs_renewal(&pki::inspect(leaf.name, &cert).ok()?, now);
                ok.then_some(cert)
            });
            let cert = match current {
                Some(c) => c,
                None => {
                    let pair = ca.issue(&leaf.spec, now, pki::LEAF_VALIDITY)?;
                    let data = pair_data(&pair, Some(&bundle));
                    let spec = [(ANN_SPEC, digest.as_str()), (ANN_SIGNER, signer.as_str())];
                    match existing {
                        None => {
                            self.create_secret(&secrets, leaf.name, t, data, Some(&spec))
                                .await?
                        }
                        Some(old) => {
                            // Replace with the version we read: a concurrent writer makes
                            // this a 409, and the next pass starts from what it wrote.
                            let mut s = secret(leaf.name, t, data, Some(&spec));
                            s.metadata.resource_version = old.metadata.resource_version;
                            secrets
                                .replace(leaf.name, &PostParams::default(), &s)
                                .await
                                .map_err(|e| {
                                    Error::kube(format!("renew secret {}", leaf.name), e)
                                })?;
                            tracing::info!(tenant = %t.name, certificate = leaf.name, "certificate reissued");
                        }
                    }
                    secret_str(
                        &secrets
                            .get(leaf.name)
                            .await
                            .map_err(|e| Error::kube(format!("read secret {}", leaf.name), e))?,
                        "tls.crt",
                    )
                    .unwrap_or_default()
                }
            };
            let info = pki::inspect(leaf.name, &cert)?;
            self.inventory
                .record_certificate(t.id, leaf.name, &info)
                .await?;
            serials.insert(leaf.name, info.serial);
        }
        // The service-account keys roll the apiserver and the controller-manager that read
        // them; the token generation reissues pods' tokens (and their CA bundle).
        serials.insert(
            "sa",
            rotation::fingerprint(&format!("{}{}", sa.trusted, sa.signing_public)),
        );
        let tokens =
            rotation::token_generation(&cas["ca"].bundle(), &sa.trusted, &sa.signing_public);
        let digest = |names: &[&str]| {
            let mut h = Sha256::new();
            for n in names {
                h.update(serials.get(n).map(String::as_str).unwrap_or_default());
                h.update([0]);
            }
            pki::hex(&h.finalize()[..8])
        };
        Ok(BTreeMap::from([
            ("etcd".to_owned(), digest(&["etcd"])),
            (
                "apiserver".to_owned(),
                digest(&[
                    "apiserver",
                    "apiserver-etcd-client",
                    "front-proxy-client",
                    "apiserver-kubelet-client",
                    "sa",
                ]),
            ),
            (
                "controller_manager".to_owned(),
                digest(&["controller-manager", "sa"]),
            ),
            ("coredns".to_owned(), digest(&["coredns"])),
            (
                "syncer".to_owned(),
                digest(&["syncer", "syncer-kubelet", "front-proxy-client"]),
            ),
            (ROLLOUT_TOKENS.to_owned(), tokens),
        ]))
    }
}

fn cert_key_of(s: &Secret) -> Option<CertKey> {
    Some(CertKey {
        cert_pem: secret_str(s, "tls.crt")?,
        key_pem: secret_str(s, "tls.key")?,
    })
}

impl Provisioner {
    async fn create_secret(
        &self,
        secrets: &Api<Secret>,
        name: &str,
        t: &Tenant,
        data: BTreeMap<String, ByteString>,
        annotations: Option<&[(&str, &str)]>,
    ) -> Result<()> {
        match secrets
            .create(&PostParams::default(), &secret(name, t, data, annotations))
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if conflict(&e) => Ok(()),
            Err(e) => Err(Error::kube(format!("create secret {name}"), e)),
        }
    }

    /// The tenant apiserver's `GET /readyz`, asked directly (not through its pods' probe).
    async fn readyz(&self, ns: &str, endpoint: Option<&str>) -> steps::Readyz {
        if self.config.simulate {
            return steps::Readyz::Simulated;
        }
        let answer = async {
            let client = self.tenant_client(ns, endpoint).await?;
            let req = http::Request::get("/readyz")
                .body(Vec::new())
                .map_err(|e| Error::Config(e.to_string()))?;
            client
                .request_text(req)
                .await
                .map_err(|e| Error::kube("ask the tenant apiserver /readyz", e))
        };
        match answer.await {
            Ok(body) => steps::Readyz::Answered(body),
            Err(Error::Kube { source, .. }) => steps::Readyz::Unreachable(source.to_string()),
            Err(e) => steps::Readyz::Unreachable(e.public()),
        }
    }

    /// A cluster-admin client of the tenant, as the orchestrator's own user.
    pub async fn tenant_client(&self, ns: &str, endpoint: Option<&str>) -> Result<Client> {
        let secrets: Api<Secret> = Api::namespaced(self.host.clone(), ns);
        let s = secrets
            .get("orchestrator")
            .await
            .map_err(|e| Error::kube("read the orchestrator's tenant certificate", e))?;
        let server = match (self.config.access, endpoint) {
            (TenantAccess::Endpoint, Some(e)) => e.to_owned(),
            _ => format!("https://kube-apiserver.{ns}.svc:6443"),
        };
        let kc = render::kubeconfig::embedded(
            "tenant",
            &server,
            &secret_str(&s, "ca.crt").unwrap_or_default(),
            "vcp",
            &secret_str(&s, "tls.crt").unwrap_or_default(),
            &secret_str(&s, "tls.key").unwrap_or_default(),
        );
        client_from_kubeconfig(&kc).await
    }

    /// An upgrade's own gate, checked once every step is ready on the hop's version: the
    /// tenant API answers a write (a canary ConfigMap in `default`, applied with this hop's
    /// stamp) and reads it back. (The syncer copies ConfigMaps only while a pod uses them, so
    /// the round trip through the syncer to the host needs a canary it always carries; not
    /// built yet.) In simulate mode nothing talks to the tenant.
    async fn upgrade_gate(
        &self,
        t: &Tenant,
        a: &upgrade::Active,
        endpoint: Option<&str>,
    ) -> StepResult {
        if self.config.simulate {
            return StepResult::Ready;
        }
        match self.canary(t, a, endpoint).await {
            Ok(r) => r,
            Err(e) => StepResult::Waiting(format!("canary: {}", e.public())),
        }
    }

    async fn canary(
        &self,
        t: &Tenant,
        a: &upgrade::Active,
        endpoint: Option<&str>,
    ) -> Result<StepResult> {
        use vcp_core::naming::{
            ANN_CANARY_SEEN, CANARY_KEY, CANARY_NAME, CANARY_NAMESPACE, host_namespace,
        };
        let stamp = format!("{}/{}", a.id, a.hop_to);
        let ns = control_plane_namespace(&t.key);
        let client = self.tenant_client(&ns, endpoint).await?;
        let tenant: Api<ConfigMap> = Api::namespaced(client, CANARY_NAMESPACE);
        let canary = json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": CANARY_NAME},
            "data": {CANARY_KEY: stamp},
        });
        tenant
            .patch(
                CANARY_NAME,
                &PatchParams::apply(host::FIELD_MANAGER).force(),
                &Patch::Apply(&canary),
            )
            .await
            .map_err(|e| Error::kube("write the upgrade canary", e))?;
        let read = tenant
            .get(CANARY_NAME)
            .await
            .map_err(|e| Error::kube("read the upgrade canary", e))?;
        let has = |cm: &ConfigMap| cm.data.as_ref().and_then(|d| d.get(CANARY_KEY)) == Some(&stamp);
        if !has(&read) {
            return Ok(StepResult::Waiting(
                "the tenant API lost the canary write".into(),
            ));
        }
        // The round trip: the syncer copied it to the host and marked the tenant object back.
        // Both are checked, since the tenant itself could write the mark.
        let host_ns = host_namespace(&t.key, CANARY_NAMESPACE);
        let on_host = Api::<ConfigMap>::namespaced(self.host.clone(), &host_ns)
            .get_opt(CANARY_NAME)
            .await
            .map_err(|e| Error::kube("read the upgrade canary's host copy", e))?;
        if !on_host.as_ref().is_some_and(has) {
            return Ok(StepResult::Waiting(
                "the canary is not on the host yet (syncer)".into(),
            ));
        }
        if kube::ResourceExt::annotations(&read).get(ANN_CANARY_SEEN) != Some(&stamp) {
            return Ok(StepResult::Waiting(
                "the canary is not back from the host yet (syncer)".into(),
            ));
        }
        Ok(StepResult::Ready)
    }

    async fn bootstrap(&self, ns: &str, endpoint: Option<&str>) -> Result<StepResult> {
        if self.config.simulate {
            return Ok(StepResult::Ready);
        }
        let client = self.tenant_client(ns, endpoint).await?;
        let pp = PatchParams::apply(host::FIELD_MANAGER).force();
        let crbs: Api<ClusterRoleBinding> = Api::all(client.clone());
        for (group, role) in crate::access::LEVELS {
            let name = crate::access::level_binding_name(group);
            let body = crate::access::level_binding(group, role);
            crbs.patch(&name, &pp, &Patch::Apply(&body))
                .await
                .map_err(|e| Error::kube(format!("bind group {group} in the tenant"), e))?;
        }
        let roles: Api<ClusterRole> = Api::all(client.clone());
        let role = json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "vcp:coredns", "labels": {render::LABEL_MANAGED_BY: "vcp"}},
            "rules": [
                {"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"], "verbs": ["list", "watch"]},
                {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
            ],
        });
        roles
            .patch("vcp:coredns", &pp, &Patch::Apply(&role))
            .await
            .map_err(|e| Error::kube("create the CoreDNS role in the tenant", e))?;
        let binding = json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "vcp:coredns", "labels": {render::LABEL_MANAGED_BY: "vcp"}},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "vcp:coredns"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": pki::COREDNS_USER}],
        });
        crbs.patch("vcp:coredns", &pp, &Patch::Apply(&binding))
            .await
            .map_err(|e| Error::kube("bind the CoreDNS role in the tenant", e))?;
        Ok(StepResult::Ready)
    }

    /// Removes everything vcp created for the tenant on the host. `Ready` when nothing is left.
    async fn tear_down(&self, t: &Tenant) -> Result<StepResult> {
        let ns = control_plane_namespace(&t.key);
        // The syncer goes first, so nothing recreates host objects while they are deleted.
        let deployments: Api<Deployment> = Api::namespaced(self.host.clone(), &ns);
        ignore_404(
            deployments
                .delete("vcp-syncer", &DeleteParams::foreground())
                .await,
        )
        .map_err(|e| Error::kube("delete the syncer", e))?;
        let pods: Api<Pod> = Api::namespaced(self.host.clone(), &ns);
        let syncers = pods
            .list(&ListParams::default().labels(&format!(
                "{},{}=vcp-syncer",
                cp_selector(&t.key),
                render::LABEL_COMPONENT
            )))
            .await
            .map_err(|e| Error::kube("list syncer pods", e))?;
        if !syncers.items.is_empty() {
            return Ok(StepResult::Waiting("waiting for the syncer to stop".into()));
        }
        let cluster_name = format!("vcp-syncer-{}", t.key);
        ignore_404(
            Api::<ClusterRoleBinding>::all(self.host.clone())
                .delete(&cluster_name, &DeleteParams::default())
                .await,
        )
        .map_err(|e| Error::kube("delete the syncer's cluster role binding", e))?;
        // Its namespaced role too: the bindings in its host namespaces go with the namespaces.
        for role in [
            cluster_name.clone(),
            format!("vcp-syncer-namespaced-{}", t.key),
        ] {
            ignore_404(
                Api::<ClusterRole>::all(self.host.clone())
                    .delete(&role, &DeleteParams::default())
                    .await,
            )
            .map_err(|e| Error::kube("delete the syncer's cluster roles", e))?;
        }
        // Its admission policy goes with it (binding first: a policy without one is inert).
        for (plural, what) in [
            (
                "validatingadmissionpolicybindings",
                "ValidatingAdmissionPolicyBinding",
            ),
            ("validatingadmissionpolicies", "ValidatingAdmissionPolicy"),
        ] {
            let gvk = kube::core::GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", what);
            let ar = kube::core::ApiResource::from_gvk_with_plural(&gvk, plural);
            ignore_404(
                Api::<kube::api::DynamicObject>::all_with(self.host.clone(), &ar)
                    .delete(&cluster_name, &DeleteParams::default())
                    .await,
            )
            .map_err(|e| Error::kube("delete the syncer's admission policy", e))?;
        }
        if t.retain_data {
            self.retain_etcd_volumes(&ns).await?;
        }
        let namespaces: Api<Namespace> = Api::all(self.host.clone());
        let mut left = Vec::new();
        for sel in [format!("{LABEL_TENANT}={}", t.key), cp_selector(&t.key)] {
            for n in namespaces
                .list(&ListParams::default().labels(&sel))
                .await
                .map_err(|e| Error::kube("list tenant namespaces", e))?
            {
                let name = n.metadata.name.clone().unwrap_or_default();
                if n.metadata.deletion_timestamp.is_none() {
                    ignore_404(namespaces.delete(&name, &DeleteParams::default()).await)
                        .map_err(|e| Error::kube(format!("delete namespace {name}"), e))?;
                }
                left.push(name);
            }
        }
        let pvs: Api<PersistentVolume> = Api::all(self.host.clone());
        for pv in pvs
            .list(&ListParams::default().labels(&format!("{LABEL_TENANT}={}", t.key)))
            .await
            .map_err(|e| Error::kube("list tenant volumes", e))?
        {
            let name = pv.metadata.name.clone().unwrap_or_default();
            ignore_404(pvs.delete(&name, &DeleteParams::default()).await)
                .map_err(|e| Error::kube(format!("delete volume {name}"), e))?;
            left.push(name);
        }
        if left.is_empty() {
            Ok(StepResult::Ready)
        } else {
            left.sort();
            Ok(StepResult::Waiting(format!(
                "{} left: {}",
                left.len(),
                left.join(", ")
            )))
        }
    }

    async fn retain_etcd_volumes(&self, ns: &str) -> Result<()> {
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(self.host.clone(), ns);
        let pvs: Api<PersistentVolume> = Api::all(self.host.clone());
        for pvc in pvcs
            .list(&ListParams::default())
            .await
            .map_err(|e| Error::kube("list etcd volume claims", e))?
        {
            if let Some(pv) = pvc.spec.and_then(|s| s.volume_name) {
                let patch = json!({"spec": {"persistentVolumeReclaimPolicy": "Retain"}});
                ignore_404(
                    pvs.patch(&pv, &PatchParams::default(), &Patch::Merge(&patch))
                        .await,
                )
                .map_err(|e| Error::kube(format!("retain volume {pv}"), e))?;
            }
        }
        Ok(())
    }
}

/// Where clients reach a tenant's apiserver, from its Service as the host reports it: the URL
/// for kubeconfigs and the host name or address the serving certificate must name. `None`
/// until the host has assigned it (a NodePort, a load balancer's address).
pub fn endpoint(expose: &Expose, key: &str, live: &Service) -> Option<(String, String)> {
    match expose {
        Expose::NodePort { address } => live
            .spec
            .as_ref()
            .and_then(|s| s.ports.as_ref())
            .and_then(|p| p.iter().find_map(|p| p.node_port))
            .map(|port| (url(address, port), address.clone())),
        Expose::LoadBalancer => live
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|lb| lb.ingress.as_ref())
            .and_then(|i| i.first())
            .and_then(|i| i.ip.clone().or(i.hostname.clone()))
            .map(|a| (url(&a, 6443), a)),
        Expose::Hostname { domain } => {
            let h = format!("{key}.{domain}");
            Some((format!("https://{h}"), h))
        }
    }
}

/// Annotation with the digest of the plan a leaf certificate was issued for.
const ANN_SPEC: &str = "vcp.dev/certificate-spec";
/// Annotation with the fingerprint of the CA that signed a leaf (see pki::rotation).
const ANN_SIGNER: &str = "vcp.dev/certificate-signer";
/// The rollout entry that carries the token generation, which the syncer gets as an argument.
pub const ROLLOUT_TOKENS: &str = "tokens";

fn pair_data(p: &CertKey, ca: Option<&str>) -> BTreeMap<String, ByteString> {
    let mut d = BTreeMap::from([
        (
            "tls.crt".to_owned(),
            ByteString(p.cert_pem.clone().into_bytes()),
        ),
        (
            "tls.key".to_owned(),
            ByteString(p.key_pem.clone().into_bytes()),
        ),
    ]);
    if let Some(ca) = ca {
        d.insert("ca.crt".to_owned(), ByteString(ca.as_bytes().to_vec()));
    }
    d
}

fn secret(
    name: &str,
    t: &Tenant,
    data: BTreeMap<String, ByteString>,
    annotations: Option<&[(&str, &str)]>,
) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(BTreeMap::from([
                (render::LABEL_CONTROL_PLANE_OF.to_owned(), t.key.to_string()),
                (render::LABEL_MANAGED_BY.to_owned(), "vcp".to_owned()),
            ])),
            annotations: annotations.map(|a| {
                a.iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect()
            }),
            ..ObjectMeta::default()
        },
        type_: Some(
            if data.contains_key("tls.crt") {
                "kubernetes.io/tls"
            } else {
                "Opaque"
            }
            .to_owned(),
        ),
        data: Some(data),
        ..Secret::default()
    }
}

fn ignore_404<T>(r: std::result::Result<T, kube::Error>) -> std::result::Result<(), kube::Error> {
    match r {
        Ok(_) => Ok(()),
        Err(e) if not_found(&e) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Whether the StatefulSets and Deployments among `objects` are fully rolled out and ready;
/// `None` if one of them does not exist.
async fn workload_ready(client: &Client, objects: &[Object]) -> Result<Option<StepResult>> {
    for o in objects {
        let Some(ns) = o.namespace() else { continue };
        let r = match o.kind() {
            "StatefulSet" => {
                let Some(s) = Api::<StatefulSet>::namespaced(client.clone(), ns)
                    .get_opt(o.name())
                    .await
                    .map_err(|e| Error::kube(format!("read statefulset {}", o.name()), e))?
                else {
                    return Ok(None);
                };
                let st = s.status.unwrap_or_default();
                steps::Rollout {
                    want: s.spec.replicas.unwrap_or(1),
                    ready: st.ready_replicas.unwrap_or(0),
                    updated: st.updated_replicas.unwrap_or(0),
                    total: st.replicas,
                    observed: st.observed_generation.unwrap_or(0),
                    generation: s.metadata.generation.unwrap_or(0),
                }
            }
            "Deployment" => {
                let Some(d) = Api::<Deployment>::namespaced(client.clone(), ns)
                    .get_opt(o.name())
                    .await
                    .map_err(|e| Error::kube(format!("read deployment {}", o.name()), e))?
                else {
                    return Ok(None);
                };
                let st = d.status.unwrap_or_default();
                steps::Rollout {
                    want: d.spec.replicas.unwrap_or(1),
                    ready: st.available_replicas.unwrap_or(0),
                    updated: st.updated_replicas.unwrap_or(0),
                    total: st.replicas.unwrap_or(0),
                    observed: st.observed_generation.unwrap_or(0),
                    generation: d.metadata.generation.unwrap_or(0),
                }
            }
            _ => continue,
        };
        if let Some(waiting) = r.waiting() {
            return Ok(Some(StepResult::Waiting(format!(
                "{} {}: {waiting}",
                o.kind(),
                o.name()
            ))));
        }
    }
    Ok(Some(StepResult::Ready))
}

/// A client from kubeconfig text.
pub async fn client_from_kubeconfig(yaml: &str) -> Result<Client> {
    let kc = kube::config::Kubeconfig::from_yaml(yaml).map_err(|e| Error::Config(e.to_string()))?;
    let mut config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(|e| Error::Config(e.to_string()))?;
    config.connect_timeout = Some(Duration::from_secs(5));
    config.read_timeout = Some(Duration::from_secs(30));
    Client::try_from(config).map_err(|e| Error::kube("build a tenant client", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(v: serde_json::Value) -> Service {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn endpoints_follow_the_exposure_and_wait_for_the_host() {
        let node_port = Expose::NodePort {
            address: "127.0.0.1".into(),
        };
        let pending = svc(json!({"spec": {"ports": [{"port": 6443}]}}));
        assert_eq!(endpoint(&node_port, "k", &pending), None);
        let assigned = svc(json!({"spec": {"ports": [{"port": 6443, "nodePort": 30123}]}}));
        assert_eq!(
            endpoint(&node_port, "k", &assigned),
            Some(("https://127.0.0.1:30123".into(), "127.0.0.1".into()))
        );
        let v6 = Expose::NodePort {
            address: "fd00::1".into(),
        };
        assert_eq!(
            endpoint(&v6, "k", &assigned).unwrap().0,
            "https://[fd00::1]:30123"
        );

        let lb = Expose::LoadBalancer;
        assert_eq!(endpoint(&lb, "k", &assigned), None, "no address yet");
        let with_ip =
            svc(json!({"status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.7"}]}}}));
        assert_eq!(
            endpoint(&lb, "k", &with_ip),
            Some(("https://203.0.113.7:6443".into(), "203.0.113.7".into()))
        );
        let with_name =
            svc(json!({"status": {"loadBalancer": {"ingress": [{"hostname": "lb.example.net"}]}}}));
        assert_eq!(endpoint(&lb, "k", &with_name).unwrap().1, "lb.example.net");

        let host = Expose::Hostname {
            domain: "tenants.example.net".into(),
        };
        assert_eq!(
            endpoint(&host, "demoab12cd", &pending),
            Some((
                "https://demoab12cd.tenants.example.net".into(),
                "demoab12cd.tenants.example.net".into()
            ))
        );
    }

    #[test]
    fn the_serving_certificate_names_an_external_host_or_address() {
        let names = |external: &str| ApiNames {
            namespace: "vcp-k".into(),
            cluster_domain: "cluster.local".into(),
            kubernetes_service_ip: [10, 96, 0, 1].into(),
            external: Some(external.into()),
            etcd_replicas: 1,
        };
        let api = |n: &ApiNames| {
            pki::plan(n)
                .into_iter()
                .find(|l| l.name == "apiserver")
                .unwrap()
                .spec
        };
        let by_name = api(&names("k.tenants.example.net"));
        assert!(
            by_name
                .dns_names
                .contains(&"k.tenants.example.net".to_owned())
        );
        let by_ip = api(&names("203.0.113.7"));
        assert!(by_ip.ips.contains(&"203.0.113.7".parse().unwrap()));
        assert!(!by_ip.dns_names.contains(&"203.0.113.7".to_owned()));
        assert_eq!(
            first_service_ip("10.96.0.0/16"),
            Some("10.96.0.1".parse().unwrap())
        );
        assert_eq!(
            first_service_ip("fd00:10:96::/112"),
            Some("fd00:10:96::1".parse().unwrap())
        );
        assert_eq!(first_service_ip("nonsense"), None);
    }
}
