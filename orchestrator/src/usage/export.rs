//! The fleet's usage export (`GET /v1/usage`), pure: the page cursor and the CSV text.
//!
//! Pages follow (time, tenant): a cursor is the last sample's time in Unix nanoseconds and its
//! tenant's row key (`<nanos>-<id>`), so samples taken at the same instant for many tenants
//! are neither skipped nor repeated across pages.

use crate::usage::types::FleetUsageItem;
use time::OffsetDateTime;
use vcp_core::quota::RESOURCES;

/// The cursor after a sample of tenant `tenant_id` at `at`.
pub fn cursor(at: OffsetDateTime, tenant_id: i64) -> String {
    format!("{}-{tenant_id}", at.unix_timestamp_nanos())
}

/// A cursor read back; `None` if it is not one.
pub fn parse_cursor(c: &str) -> Option<(OffsetDateTime, i64)> {
    let (nanos, id) = c.split_once('-')?;
    let all_digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !all_digits(nanos) || !all_digits(id) {
        return None;
    }
    let at = OffsetDateTime::from_unix_timestamp_nanos(nanos.parse().ok()?).ok()?;
    Some((at, id.parse().ok()?))
}

/// A CSV field, quoted when it must be (RFC 4180).
fn field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

/// The CSV text of samples: `sampled_at,owner,tenant,<each resource>`; CPU in millicores,
/// memory and storage in bytes, as the JSON form.
pub fn csv(items: &[FleetUsageItem]) -> String {
    let mut out = format!("sampled_at,owner,tenant,{}\n", RESOURCES.join(","));
    for i in items {
        let at = i
            .sampled_at
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default();
        out.push_str(&format!("{at},{},{}", field(&i.owner), field(&i.tenant)));
        for r in RESOURCES {
            out.push_str(&format!(",{}", i.used.get(r).unwrap_or(0)));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use vcp_policy::quota::Usage;

    proptest! {
        #[test]
        fn cursors_read_back(nanos in 0i128..253_402_300_799_000_000_000, id in 0i64..i64::MAX) {
            let at = OffsetDateTime::from_unix_timestamp_nanos(nanos).unwrap();
            prop_assert_eq!(parse_cursor(&cursor(at, id)), Some((at, id)));
        }
    }

    #[test]
    fn foreign_cursors_are_refused() {
        for bad in [
            "",
            "-",
            "1-",
            "-1",
            "a-1",
            "1-b",
            "1-2-3",
            "+1-2",
            "99999999999999999999999-1",
        ] {
            assert_eq!(parse_cursor(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn csv_has_a_header_and_one_line_per_sample_in_resource_order() {
        let at = OffsetDateTime::from_unix_timestamp(1_767_225_600).unwrap();
        let items = vec![FleetUsageItem {
            owner: "team,a".into(),
            tenant: "shop".into(),
            sampled_at: at,
            used: Usage {
                pods: 3,
                requests_cpu: 1500,
                namespaces: 2,
                ..Usage::default()
            },
        }];
        assert_eq!(
            csv(&items),
            "sampled_at,owner,tenant,pods,requests_cpu,requests_memory,limits_cpu,limits_memory,services,persistent_volume_claims,requests_storage,namespaces\n\
             2026-01-01T00:00:00Z,\"team,a\",shop,3,1500,0,0,0,0,0,0,2\n"
        );
    }
}
