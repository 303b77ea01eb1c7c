//! Logical snapshots (pure): a tenant's keys and values under its prefix, not a store's file.
//! What a tenant on a shared datastore has in place of an etcd snapshot, since its user may not
//! (and should not) snapshot the store of every tenant; and what moves a tenant between a
//! dedicated etcd and a shared datastore.
//!
//! The file (`vcp-logical-v1`): a header line, then one line per key, each a JSON object.
//! Keys are stored *relative to the tenant's prefix*, so a snapshot restores under any prefix:
//! the same tenant's, a new tenant's, or a dedicated etcd's `/registry/`.
//!
//! ```text
//! {"format":"vcp-logical-v1","revision":1234,"keys":2}
//! {"k":"<base64 of the key after the prefix>","v":"<base64 of the value>"}
//! {"k":"...","v":"...","ttl":3540}
//! ```
//!
//! A key that was attached to a lease (the apiserver's Events, and leases it gives other
//! short-lived keys) carries the seconds its lease had left; a restore attaches it to a new
//! lease of about that length ([`lease_ttl`]), so restored Events still expire.
//!
//! The inventory records the file's SHA-256 like any snapshot's, and a restore checks it before
//! it deletes anything; [`Reader`] also refuses a file whose key count or lines do not match its
//! header (a truncated upload).

use base64::Engine as _;
use serde::{Deserialize, Serialize};

/// The format's name in the header.
pub const FORMAT: &str = "vcp-logical-v1";

/// The first line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Header {
    pub format: String,
    /// The store's revision the keys were read at (one consistent read, paged).
    pub revision: i64,
    /// How many key lines follow.
    pub keys: u64,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    k: String,
    v: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ttl: Option<i64>,
}

/// Why a file is not a logical snapshot.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LogicalError {
    #[error("line {line}: {message}")]
    Line { line: u64, message: String },
    #[error("not a {FORMAT} snapshot: {0}")]
    Header(String),
    #[error("the header promises {promised} keys, the file holds {found}")]
    Count { promised: u64, found: u64 },
}

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD
}

/// The header line (with its newline).
pub fn header_line(revision: i64, keys: u64) -> String {
    let h = Header {
        format: FORMAT.into(),
        revision,
        keys,
    };
    format!("{}\n", serde_json::to_string(&h).expect("a header encodes"))
}

/// One key's line (with its newline); `rest`: the key after the tenant's prefix; `ttl`: the
/// seconds its lease had left, if it had one.
pub fn key_line(rest: &[u8], value: &[u8], ttl: Option<i64>) -> String {
    let l = Line {
        k: b64().encode(rest),
        v: b64().encode(value),
        ttl,
    };
    format!("{}\n", serde_json::to_string(&l).expect("a line encodes"))
}

/// Reads a file's lines in order: the header first, then `(rest, value)` per key, checking the
/// count at the end.
#[derive(Debug, Default)]
pub struct Reader {
    header: Option<Header>,
    line: u64,
    found: u64,
}

impl Reader {
    /// Takes one line (without its newline); the header is returned once, keys after it.
    pub fn line(&mut self, text: &str) -> Result<Item, LogicalError> {
        self.line += 1;
        let bad = |message: String| LogicalError::Line {
            line: self.line,
            message,
        };
        if self.header.is_none() {
            let h: Header =
                serde_json::from_str(text).map_err(|e| LogicalError::Header(e.to_string()))?;
            if h.format != FORMAT {
                return Err(LogicalError::Header(format!("format {:?}", h.format)));
            }
            self.header = Some(h.clone());
            return Ok(Item::Header(h));
        }
        let l: Line = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        let rest = b64().decode(&l.k).map_err(|e| bad(format!("key: {e}")))?;
        let value = b64().decode(&l.v).map_err(|e| bad(format!("value: {e}")))?;
        if rest.is_empty() {
            return Err(bad("an empty key".into()));
        }
        if l.ttl.is_some_and(|t| t < 0) {
            return Err(bad("a negative ttl".into()));
        }
        self.found += 1;
        Ok(Item::Key(Entry {
            rest,
            value,
            ttl: l.ttl,
        }))
    }

    /// The end of the file: its header said as many keys as it held.
    pub fn finish(self) -> Result<Header, LogicalError> {
        let h = self
            .header
            .ok_or_else(|| LogicalError::Header("the file is empty".into()))?;
        if h.keys != self.found {
            return Err(LogicalError::Count {
                promised: h.keys,
                found: self.found,
            });
        }
        Ok(h)
    }
}

/// One line of a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    Header(Header),
    Key(Entry),
}

/// One key of a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The key after the prefix.
    pub rest: Vec<u8>,
    pub value: Vec<u8>,
    /// The seconds its lease had left, if it had one.
    pub ttl: Option<i64>,
}

/// The lease a restored key with `ttl` seconds left is attached to: whole minutes, rounded up
/// (at least one), so a restore grants one lease per minute of remaining life, not one per key.
pub fn lease_ttl(ttl: i64) -> i64 {
    (ttl.max(1) + 59) / 60 * 60
}

/// The most puts in one transaction (etcd's `--max-txn-ops` default is 128).
pub const BATCH_OPS: usize = 100;
/// The most bytes of keys and values in one transaction (under etcd's 1.5 MiB request limit).
pub const BATCH_BYTES: usize = 1 << 20;

/// Cuts keys of the given sizes into transactions: consecutive runs of at most [`BATCH_OPS`]
/// keys and [`BATCH_BYTES`] bytes (a key larger than that alone in its own). The lengths of the
/// runs, in order.
pub fn batches(sizes: impl IntoIterator<Item = usize>) -> Vec<usize> {
    let mut out = Vec::new();
    let (mut n, mut bytes) = (0usize, 0usize);
    for size in sizes {
        if n > 0 && (n == BATCH_OPS || bytes + size > BATCH_BYTES) {
            out.push(n);
            (n, bytes) = (0, 0);
        }
        n += 1;
        bytes += size;
    }
    if n > 0 {
        out.push(n);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A key after the prefix, its value and its lease's time left.
    type Kv = (Vec<u8>, Vec<u8>, Option<i64>);

    fn read_all(text: &str) -> Result<(Header, Vec<Kv>), LogicalError> {
        let mut r = Reader::default();
        let mut keys = Vec::new();
        for l in text.lines() {
            if let Item::Key(e) = r.line(l)? {
                keys.push((e.rest, e.value, e.ttl));
            }
        }
        Ok((r.finish()?, keys))
    }

    proptest! {
        #[test]
        fn what_is_written_reads_back(
            revision in 1i64..i64::MAX,
            kvs in proptest::collection::vec(
                (
                    proptest::collection::vec(any::<u8>(), 1..40),
                    proptest::collection::vec(any::<u8>(), 0..200),
                    proptest::option::of(0i64..100_000),
                ),
                0..20,
            ),
        ) {
            let mut text = header_line(revision, kvs.len() as u64);
            for (k, v, ttl) in &kvs {
                text.push_str(&key_line(k, v, *ttl));
            }
            let (h, back) = read_all(&text).unwrap();
            prop_assert_eq!(h.revision, revision);
            prop_assert_eq!(back, kvs);
        }
    }

    #[test]
    fn a_truncated_or_foreign_file_is_refused() {
        let mut text = header_line(7, 2);
        text.push_str(&key_line(b"pods/a", b"x", None));
        assert_eq!(
            read_all(&text).unwrap_err(),
            LogicalError::Count {
                promised: 2,
                found: 1
            }
        );
        text.push_str(&key_line(b"pods/b", b"y", Some(30)));
        assert!(read_all(&text).is_ok());
        text.push_str("{\"k\":\"!!\",\"v\":\"\"}\n");
        assert!(matches!(
            read_all(&text),
            Err(LogicalError::Line { line: 4, .. })
        ));
        assert!(matches!(read_all(""), Err(LogicalError::Header(_))));
        assert!(matches!(
            read_all("{\"format\":\"other\",\"revision\":1,\"keys\":0}"),
            Err(LogicalError::Header(_))
        ));
        let mut bad = header_line(7, 1);
        bad.push_str("{\"k\":\"YQ==\",\"v\":\"\",\"ttl\":-1}\n");
        assert!(matches!(
            read_all(&bad),
            Err(LogicalError::Line { line: 2, .. })
        ));
        // An etcd snapshot file is not one.
        assert!(matches!(
            read_all("\u{0}\u{1}bolt"),
            Err(LogicalError::Header(_))
        ));
    }

    #[test]
    fn leases_are_granted_per_minute_left() {
        assert_eq!(lease_ttl(0), 60);
        assert_eq!(lease_ttl(1), 60);
        assert_eq!(lease_ttl(60), 60);
        assert_eq!(lease_ttl(61), 120);
        assert_eq!(lease_ttl(3599), 3600);
    }

    proptest! {
        #[test]
        fn batches_keep_every_key_in_order_within_both_limits(
            sizes in proptest::collection::vec(0usize..(BATCH_BYTES + 10), 0..400),
        ) {
            let runs = batches(sizes.iter().copied());
            prop_assert_eq!(runs.iter().sum::<usize>(), sizes.len());
            let mut at = 0;
            for n in runs {
                prop_assert!((1..=BATCH_OPS).contains(&n));
                let bytes: usize = sizes[at..at + n].iter().sum();
                prop_assert!(n == 1 || bytes <= BATCH_BYTES, "{} keys, {} bytes", n, bytes);
                at += n;
            }
        }
    }
}
