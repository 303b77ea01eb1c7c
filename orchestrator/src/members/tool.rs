//! `vcp tool etcd-member ...`: what the Jobs of an etcd's growth run, against its voting
//! members through etcd's JSON gateway.
//!
//! - `add` adds a member as a learner, known by its peer URL; a no-op when a member has that
//!   URL already (a Job killed after the add and run again).
//! - `promote` makes that learner a voting member, asking again every second while etcd says
//!   it has not caught up with the leader, for at most `--wait-seconds`; a no-op when it votes.

use crate::etcd::{EtcdConnection, Gateway};
use crate::{Error, Result};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The voting members, and the apiserver's etcd client certificate.
    #[command(flatten)]
    pub etcd: EtcdConnection,
    /// The member's peer URL (`https://etcd-<i>.etcd.<namespace>.svc:2380`).
    #[arg(long, env = "VCP_ETCD_MEMBER_PEER_URL")]
    pub peer_url: String,
    /// How long `promote` waits for the learner to catch up.
    #[arg(long, env = "VCP_ETCD_MEMBER_WAIT_SECONDS", default_value_t = 300)]
    pub wait_seconds: u64,
    #[command(subcommand)]
    pub step: Step,
}

#[derive(Debug, Clone, Copy, clap::Subcommand)]
pub enum Step {
    /// Add the member as a learner.
    Add,
    /// Promote the learner once it is in sync.
    Promote,
}

/// A member as `MemberList` answers it: (ID as etcd writes it, is a learner).
fn find(list: &Value, peer_url: &str) -> Option<(Value, bool)> {
    list["members"].as_array()?.iter().find_map(|m| {
        let urls = m["peerURLs"].as_array()?;
        urls.iter()
            .any(|u| u.as_str() == Some(peer_url))
            .then(|| (m["ID"].clone(), m["isLearner"].as_bool().unwrap_or(false)))
    })
}

/// Runs one step; prints what it did.
pub async fn run(a: Args) -> Result<()> {
    let etcd = a.etcd.gateway()?;
    let done = match a.step {
        Step::Add => add(&etcd, &a.peer_url).await?,
        Step::Promote => promote(&etcd, &a.peer_url, Duration::from_secs(a.wait_seconds)).await?,
    };
    println!("{done}");
    Ok(())
}

async fn members(etcd: &Gateway) -> Result<Value> {
    etcd.call(
        "/v3/cluster/member/list",
        json!({"linearizable": true}),
        None,
    )
    .await
}

/// Adds the member as a learner; what it found.
pub async fn add(etcd: &Gateway, peer_url: &str) -> Result<String> {
    if let Some((_, learner)) = find(&members(etcd).await?, peer_url) {
        let what = if learner { "a learner" } else { "a member" };
        return Ok(format!("{peer_url} is {what} already"));
    }
    let added = etcd
        .call(
            "/v3/cluster/member/add",
            json!({"peerURLs": [peer_url], "isLearner": true}),
            None,
        )
        .await?;
    Ok(format!(
        "{peer_url} added as a learner (member {})",
        added["member"]["ID"]
    ))
}

/// Promotes the learner once etcd takes it; what it found.
pub async fn promote(etcd: &Gateway, peer_url: &str, wait: Duration) -> Result<String> {
    let started = Instant::now();
    loop {
        let Some((id, learner)) = find(&members(etcd).await?, peer_url) else {
            return Err(Error::Etcd(format!(
                "{peer_url} is not a member: add it first"
            )));
        };
        if !learner {
            return Ok(format!("{peer_url} votes"));
        }
        match etcd
            .call("/v3/cluster/member/promote", json!({"ID": id}), None)
            .await
        {
            Ok(_) => return Ok(format!("{peer_url} promoted")),
            // etcd: "can only promote a learner member which is in sync with leader".
            Err(e) if e.to_string().contains("in sync") && started.elapsed() < wait => {
                tracing::info!(peer_url, "the learner has not caught up yet");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_is_found_by_its_peer_url_as_the_gateway_lists_it() {
        let list = json!({"members": [
            {"ID": "1111", "name": "etcd-0", "peerURLs": ["https://etcd-0.etcd.ns.svc:2380"]},
            {"ID": "2222", "peerURLs": ["https://etcd-1.etcd.ns.svc:2380"], "isLearner": true},
        ]});
        assert_eq!(
            find(&list, "https://etcd-0.etcd.ns.svc:2380"),
            Some((json!("1111"), false))
        );
        assert_eq!(
            find(&list, "https://etcd-1.etcd.ns.svc:2380"),
            Some((json!("2222"), true))
        );
        assert_eq!(find(&list, "https://etcd-2.etcd.ns.svc:2380"), None);
        assert_eq!(find(&json!({}), "x"), None);
    }
}
