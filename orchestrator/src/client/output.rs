//! How the client commands print: tables that fit the terminal, JSON and YAML, ages and
//! quantities. Each feature's own tables are beside its command (`tenants`, `snapshots`, ...);
//! these are the pieces they share. Pure functions.

use serde::Serialize;
use std::fmt::Write as _;
use time::OffsetDateTime;

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
pub(crate) fn cut(s: &str, w: usize) -> String {
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

#[cfg(test)]
mod tests {
    use super::fixtures::at;
    use super::*;

    #[test]
    fn a_table_without_rows_is_its_header() {
        assert_eq!(table(&["A", "BB"], &[], 80), "A  BB\n");
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

    #[test]
    fn ages_read_like_kubectl() {
        assert_eq!(age(at(0), at(59)), "59s");
        assert_eq!(age(at(0), at(300)), "5m");
        assert_eq!(age(at(0), at(3 * 3600)), "3h");
        assert_eq!(age(at(0), at(3 * 86_400)), "3d");
        assert_eq!(age(at(10), at(0)), "0s");
    }
}

/// What the printers' tests share: a fixed clock and the widest line of an output.
#[cfg(test)]
pub(crate) mod fixtures {
    use time::OffsetDateTime;

    pub fn used() -> crate::api::Usage {
        crate::api::Usage {
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

    pub fn at(s: i64) -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(1_800_000_000 + s).unwrap()
    }

    pub fn max_line(s: &str) -> usize {
        s.lines().map(|l| l.chars().count()).max().unwrap_or(0)
    }
}
