//! `vcp audit`: the audit trail, filtered and paged.

use crate::Result;
use crate::audit::types::{AuditEntryView, AuditPage};
use crate::client::output::{self, Format, table};
use crate::client::{Client, Connection, OutputArgs, instant, now, pages, print, segment};
use time::OffsetDateTime;

#[derive(Debug, clap::Args)]
pub struct AuditArgs {
    /// Only entries of tenants with this name.
    #[arg(long, env = "VCP_AUDIT_TENANT")]
    pub tenant: Option<String>,
    /// Only changes made by this actor (a token's name, or `reconciler/<replica>`, ...).
    #[arg(long, env = "VCP_AUDIT_ACTOR")]
    pub actor: Option<String>,
    /// Only this action (tenant.create), or every action under a prefix ending in a dot
    /// (tenant.).
    #[arg(long, env = "VCP_AUDIT_ACTION")]
    pub action: Option<String>,
    /// Entries at or after: an RFC 3339 time (2026-01-01T00:00:00Z) or an age (90m, 12h, 30d).
    #[arg(long, env = "VCP_AUDIT_SINCE")]
    pub since: Option<String>,
    /// Entries before: an RFC 3339 time or an age.
    #[arg(long, env = "VCP_AUDIT_UNTIL")]
    pub until: Option<String>,
    /// Most entries printed, oldest first; 0 for all of them.
    #[arg(long, env = "VCP_AUDIT_LIMIT", default_value_t = 1000)]
    pub limit: usize,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// The entries `a` asks for, oldest first, following `next_after` page by page.
async fn audit_entries(client: &Client, a: &AuditArgs, now: OffsetDateTime) -> Result<AuditPage> {
    let mut fixed = Vec::new();
    for (k, v) in [
        ("tenant", a.tenant.clone()),
        ("actor", a.actor.clone()),
        ("action", a.action.clone()),
        (
            "since",
            a.since
                .as_deref()
                .map(|v| instant("--since", v, now))
                .transpose()?,
        ),
        (
            "until",
            a.until
                .as_deref()
                .map(|v| instant("--until", v, now))
                .transpose()?,
        ),
    ] {
        if let Some(v) = v {
            fixed.push(format!("{k}={}", segment(&v)));
        }
    }
    let (items, next_after) = pages(
        a.limit,
        super::api::MAX_AUDIT_PAGE as usize,
        |after: Option<i64>, page_size| {
            let mut query = fixed.clone();
            query.push(format!("after={}", after.unwrap_or(0)));
            query.push(format!("limit={page_size}"));
            async move {
                let page: AuditPage = client
                    .get(&format!("/v1/audit?{}", query.join("&")))
                    .await?;
                Ok((page.items, page.next_after))
            }
        },
    )
    .await?;
    Ok(AuditPage { items, next_after })
}

pub async fn audit(conn: &Connection, a: AuditArgs) -> Result<()> {
    let client = Client::new(conn)?;
    let page = audit_entries(&client, &a, now()).await?;
    match a.output.output {
        Format::Table => {
            print(&audit_table(&page.items, output::terminal_width()))?;
            if page.next_after.is_some() {
                eprintln!(
                    "(more entries follow: raise --limit, or 0 for all, or narrow the filters)"
                );
            }
            Ok(())
        }
        f => print(&output::structured(&page, f)),
    }
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
