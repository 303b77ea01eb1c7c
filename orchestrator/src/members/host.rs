//! The host side of an etcd's growth: the etcd step of a tenant with an etcd of its own reads
//! the StatefulSet and the next member's Jobs, and does what [`crate::lifecycle::members`]
//! says.

use crate::host::Provisioner;
use crate::inventory::Tenant;
use crate::lifecycle::members::{self, Growth, JobSeen};
use crate::lifecycle::steps::StepResult;
use crate::render::{Component, Input, JobKind, Run};
use crate::snapshots::JobState;
use crate::{Error, Result};
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, DeleteParams};
use serde_json::{Value, json};
use vcp_core::naming::control_plane_namespace;

/// What the StatefulSet says of its members.
fn seen(s: &StatefulSet) -> members::Members {
    let replicas = s
        .spec
        .replicas
        .and_then(|r| u8::try_from(r).ok())
        .unwrap_or(1);
    let partition = s
        .spec
        .update_strategy
        .as_ref()
        .and_then(|u| u.rolling_update.as_ref())
        .and_then(|r| r.partition)
        .and_then(|p| u8::try_from(p).ok())
        .unwrap_or(0);
    let annotation = s
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(members::ANNOTATION_MEMBERS));
    members::members(replicas, partition, annotation.map(String::as_str))
}

impl Provisioner {
    /// The etcd step of a tenant with an etcd of its own: the plan's StatefulSet, or, while
    /// fewer members vote than the plan has, the next step of their growth.
    pub(crate) async fn own_etcd(&self, t: &Tenant, input: &Input<'_>) -> Result<StepResult> {
        let target = input.plan.etcd_replicas;
        let ns = control_plane_namespace(&t.key);
        let growing = if self.config.simulate || input.run != Run::Up {
            None
        } else {
            Api::<StatefulSet>::namespaced(self.host.clone(), &ns)
                .get_opt("etcd")
                .await
                .map_err(|e| Error::kube("read StatefulSet etcd", e))?
                .filter(|s| {
                    let seen = seen(s);
                    seen.voting != target || seen.partition > 0
                })
        };
        let Some(set) = growing else {
            return self.etcd_as_planned(input).await;
        };
        let uid = set.metadata.uid.clone().unwrap_or_default();
        let seen = seen(&set);
        let i = seen.voting;
        let (add, promote) = (members::add_job(&uid, i), members::promote_job(&uid, i));
        let step = members::next(
            target,
            seen,
            &self.job_seen(&ns, &add).await?,
            &self.job_seen(&ns, &promote).await?,
        );
        tracing::info!(tenant = %t.name, ?step, "growing the tenant's etcd");
        let n = i + 1;
        Ok(match &step {
            Growth::Done => self.etcd_as_planned(input).await?,
            Growth::Settle => {
                if self.apiserver_dials_every_member(input).await? {
                    self.etcd_as_planned(input).await?
                } else {
                    // Ready as the members stand, so the apiserver step rolls it.
                    let status = set.status.clone().unwrap_or_default();
                    let want = set.spec.replicas.unwrap_or(1);
                    if status.ready_replicas.unwrap_or(0) >= want {
                        StepResult::Ready
                    } else {
                        StepResult::Waiting(format!(
                            "{}/{want} etcd members ready",
                            status.ready_replicas.unwrap_or(0)
                        ))
                    }
                }
            }
            Growth::Add(_) => {
                self.member_job(input, &add, "add", seen.voting).await?;
                StepResult::Waiting(format!("adding etcd member {n} of {target} as a learner"))
            }
            Growth::Promote(_) => {
                self.member_job(input, &promote, "promote", seen.voting)
                    .await?;
                StepResult::Waiting(format!("promoting etcd member {n} of {target}"))
            }
            Growth::Start(_) | Growth::Promoted(_) => {
                let shape = members::shape(&step).unwrap_or_else(|| unreachable!());
                let objects = self.config.renderer.render_with(
                    Component::Etcd,
                    input,
                    json!({"etcd_growth": shape}),
                )?;
                crate::host::ssa::apply_all(&self.host, &objects).await?;
                StepResult::Waiting(match step {
                    Growth::Start(_) => format!("starting etcd member {n} of {target}"),
                    _ => format!("etcd member {n} of {target} votes"),
                })
            }
            Growth::Wait(m) => StepResult::Waiting(m.clone()),
            Growth::Retry { job, why } => {
                for name in [&add, &promote] {
                    self.delete_member_job(&ns, name).await?;
                }
                StepResult::Error(format!("{job} failed, trying again: {why}"))
            }
            Growth::Shrink { plan, voting } => StepResult::Fatal(format!(
                "the plan runs {plan} etcd members where {voting} vote in the tenant's etcd: removing members is not supported"
            )),
        })
    }

    /// The StatefulSet as the plan renders it, applied behind nothing (etcd comes first).
    async fn etcd_as_planned(&self, input: &Input<'_>) -> Result<StepResult> {
        let objects = self.config.renderer.render(Component::Etcd, input)?;
        crate::host::ssa::apply_all(&self.host, &objects).await?;
        Ok(crate::host::workload_ready(&self.host, &objects)
            .await?
            .unwrap_or(StepResult::Waiting("not applied".into())))
    }

    /// Whether the apiserver's Deployment dials the members the plan renders, rolled out.
    async fn apiserver_dials_every_member(&self, input: &Input<'_>) -> Result<bool> {
        let objects = self.config.renderer.render(Component::Apiserver, input)?;
        let Some(planned) = objects
            .iter()
            .find(|o| o.kind() == "Deployment" && o.name() == "kube-apiserver")
        else {
            return Ok(true);
        };
        let servers = |d: &Value| -> Option<String> {
            d["spec"]["template"]["spec"]["containers"]
                .as_array()?
                .iter()
                .filter_map(|c| c["args"].as_array())
                .flatten()
                .filter_map(Value::as_str)
                .find(|a| a.starts_with("--etcd-servers="))
                .map(str::to_owned)
        };
        let ns = control_plane_namespace(input.key);
        let Some(live) = Api::<Deployment>::namespaced(self.host.clone(), &ns)
            .get_opt("kube-apiserver")
            .await
            .map_err(|e| Error::kube("read deployment kube-apiserver", e))?
        else {
            return Ok(true);
        };
        let live = serde_json::to_value(&live)
            .map_err(|e| Error::Config(format!("deployment kube-apiserver: {e}")))?;
        if servers(&live) != servers(&planned.0) {
            return Ok(false);
        }
        Ok(
            crate::host::workload_ready(&self.host, std::slice::from_ref(planned)).await?
                == Some(StepResult::Ready),
        )
    }

    async fn job_seen(&self, ns: &str, name: &str) -> Result<JobSeen> {
        Ok(match self.job_state(ns, name).await? {
            JobState::Absent => JobSeen::Absent,
            JobState::Running => JobSeen::Running,
            JobState::Succeeded(_) => JobSeen::Succeeded,
            JobState::Failed(why) => JobSeen::Failed(why),
        })
    }

    /// Job `name`: `vcp tool etcd-member <step>` for member `i`, through the members that vote.
    async fn member_job(&self, input: &Input<'_>, name: &str, step: &str, i: u8) -> Result<()> {
        let ns = control_plane_namespace(input.key);
        let voting: Vec<String> = (0..i)
            .map(|m| format!("https://etcd-{m}.etcd.{ns}.svc:2379"))
            .collect();
        let objects = self.config.renderer.render_job(
            JobKind::Member,
            input,
            json!({
                "job": name,
                "voting_servers": voting.join(","),
                "peer_url": format!("https://etcd-{i}.etcd.{ns}.svc:2380"),
                "step": step,
            }),
        )?;
        crate::host::ssa::apply_all(&self.host, &objects).await
    }

    async fn delete_member_job(&self, ns: &str, name: &str) -> Result<()> {
        let jobs: Api<Job> = Api::namespaced(self.host.clone(), ns);
        match jobs.delete(name, &DeleteParams::background()).await {
            Ok(_) => Ok(()),
            Err(e) if crate::host::not_found(&e) => Ok(()),
            Err(e) => Err(Error::kube(format!("delete job {name}"), e)),
        }
    }
}
