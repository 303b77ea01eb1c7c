//! `vcp tenant audit NAME`: a tenant apiserver's audit log, filtered and paged.

use crate::Result;
use crate::client::output::{self, Format, table};
use crate::client::{Client, OutputArgs, instant, pages, segment};
use crate::tenant_audit::api::MAX_EVENTS_PAGE;
use crate::tenant_audit::types::{AuditEventPage, AuditEventView};
use time::OffsetDateTime;

#[derive(Debug, clap::Args)]
pub struct TenantAuditArgs {
    /// Tenant name.
    pub name: String,
    /// Only requests by this user, or made as this user (sudo).
    #[arg(long, env = "VCP_TENANT_AUDIT_USER")]
    pub user: Option<String>,
    /// Only this verb (get, list, create, update, patch, delete, watch, ...).
    #[arg(long, env = "VCP_TENANT_AUDIT_VERB")]
    pub verb: Option<String>,
    /// Only this resource: `secrets` (any group) or `deployments.apps`.
    #[arg(long, env = "VCP_TENANT_AUDIT_RESOURCE")]
    pub resource: Option<String>,
    /// Requests at or after: an RFC 3339 time (2026-01-01T00:00:00Z) or an age (90m, 12h, 30d).
    #[arg(long, env = "VCP_TENANT_AUDIT_SINCE")]
    pub since: Option<String>,
    /// Requests before: an RFC 3339 time or an age.
    #[arg(long, env = "VCP_TENANT_AUDIT_UNTIL")]
    pub until: Option<String>,
    /// Most events printed, oldest first; 0 for all of them.
    #[arg(long, env = "VCP_TENANT_AUDIT_LIMIT", default_value_t = 1000)]
    pub limit: usize,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// The events `a` asks for, oldest first, following `next_cursor` page by page.
pub async fn audit_events(
    client: &Client,
    a: &TenantAuditArgs,
    now: OffsetDateTime,
) -> Result<AuditEventPage> {
    let mut fixed = Vec::new();
    for (k, v) in [
        ("user", a.user.clone()),
        ("verb", a.verb.clone()),
        ("resource", a.resource.clone()),
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
    let path = format!("/v1/tenants/{}/audit-events", segment(&a.name));
    let (items, next_cursor) = pages(
        a.limit,
        MAX_EVENTS_PAGE as usize,
        |cursor: Option<String>, page_size| {
            let mut query = fixed.clone();
            if let Some(c) = cursor {
                query.push(format!("cursor={}", segment(&c)));
            }
            query.push(format!("limit={page_size}"));
            let url = format!("{path}?{}", query.join("&"));
            async move {
                let page: AuditEventPage = client.get(&url).await?;
                Ok((page.items, page.next_cursor))
            }
        },
    )
    .await?;
    Ok(AuditEventPage { items, next_cursor })
}

/// Prints the events as `a.output` says.
pub fn print_events(page: &AuditEventPage, a: &TenantAuditArgs, width: usize) -> Result<()> {
    match a.output.output {
        Format::Table => {
            crate::client::print(&events_table(&page.items, width))?;
            if page.next_cursor.is_some() {
                eprintln!(
                    "(more events follow: raise --limit, or 0 for all, or narrow the filters)"
                );
            }
            Ok(())
        }
        f => crate::client::print(&output::structured(page, f)),
    }
}

/// Who a row names: the user, `as <impersonated>` under sudo, the admin of a break-glass.
fn who(e: &AuditEventView) -> String {
    let mut s = e.user.clone();
    if let Some(i) = &e.impersonated_user {
        s.push_str(&format!(" as {i}"));
    }
    if let Some(b) = &e.break_glass_by {
        s.push_str(&format!(" (break-glass by {b})"));
    }
    s
}

/// Events, oldest first: when, who, the verb, the object and the answer's code.
pub fn events_table(items: &[AuditEventView], width: usize) -> String {
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|e| {
            let resource = match (&e.resource, &e.api_group) {
                (Some(r), Some(g)) => format!("{r}.{g}"),
                (Some(r), None) => r.clone(),
                (None, _) => e.request_uri.clone(),
            };
            let resource = match &e.subresource {
                Some(s) => format!("{resource}/{s}"),
                None => resource,
            };
            let object = match (&e.namespace, &e.name) {
                (Some(ns), Some(n)) => format!("{ns}/{n}"),
                (None, Some(n)) => n.clone(),
                (Some(ns), None) => format!("{ns}/"),
                (None, None) => "-".into(),
            };
            vec![
                e.time
                    .format(&time::format_description::well_known::Rfc3339)
                    .unwrap_or_default(),
                who(e),
                e.verb.clone(),
                resource,
                object,
                e.response_code.map_or("-".into(), |c| c.to_string()),
            ]
        })
        .collect();
    table(
        &["TIME", "USER", "VERB", "RESOURCE", "OBJECT", "CODE"],
        &rows,
        width,
    )
}
