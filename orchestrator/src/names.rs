//! Tenant names and the keys made from them (pure).
//!
//! A tenant's *name* is what people type; its *key* is what the host cluster sees. The key is
//! the name's letters and digits plus six random characters, so a tenant deleted and created
//! again under the same name never meets its predecessor's leftovers on the host. Keys are
//! [`TenantKey`]s, checked by the one rule in `vcp_core::naming` that the syncer checks too
//! (`[a-z][a-z0-9]{0,19}`, no `-`, which keeps `<key>-<namespace>` injective); host names are
//! derived from them there. Names are the orchestrator's alone: the syncer never sees one.

use std::fmt;
use vcp_core::naming::TenantKey;

/// Longest tenant name: short enough for `vcp-<key>` and for kubeconfig context names.
pub const MAX_NAME_LEN: usize = 40;
/// Letters of the name kept in the key.
const KEY_NAME_PART: usize = 14;
/// Random characters appended to the key.
pub const KEY_SUFFIX_LEN: usize = 6;

/// Why a tenant name is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("must not be empty")]
    Empty,
    #[error("must be at most {MAX_NAME_LEN} characters")]
    TooLong,
    #[error("must start with a lowercase letter")]
    BadStart,
    #[error("must end with a lowercase letter or digit")]
    BadEnd,
    #[error("may contain only lowercase letters, digits and '-'")]
    BadChar,
}

/// A validated tenant name: `[a-z]([a-z0-9-]*[a-z0-9])?`, at most [`MAX_NAME_LEN`] long.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TenantName(String);

impl TenantName {
    pub fn parse(s: &str) -> Result<TenantName, NameError> {
        let first = s.chars().next().ok_or(NameError::Empty)?;
        if s.len() > MAX_NAME_LEN {
            return Err(NameError::TooLong);
        }
        if !first.is_ascii_lowercase() {
            return Err(NameError::BadStart);
        }
        if !s
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        {
            return Err(NameError::BadChar);
        }
        if s.ends_with('-') {
            return Err(NameError::BadEnd);
        }
        Ok(TenantName(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The host key for this name with the given random bytes (one character per byte).
    pub fn key(&self, random: [u8; KEY_SUFFIX_LEN]) -> TenantKey {
        const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
        let mut key: String = self
            .0
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .take(KEY_NAME_PART)
            .collect();
        // 36 does not divide 256, so a few characters are slightly likelier; six of them still
        // give about 2^31 keys per name, and uniqueness is enforced by the inventory anyway.
        key.extend(
            random
                .iter()
                .map(|b| ALPHABET[usize::from(*b) % ALPHABET.len()] as char),
        );
        // A name starts with a letter and keeps at most KEY_NAME_PART of its letters and
        // digits, and the suffix adds six more: always a valid key.
        TenantKey::new(&key).expect("a key made from a valid name is valid")
    }
}

impl fmt::Display for TenantName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vcp_core::naming::control_plane_namespace;

    #[test]
    fn valid_names_parse_and_invalid_ones_say_why() {
        for ok in ["a", "demo", "team-a", "a1", "x-1-y"] {
            assert!(TenantName::parse(ok).is_ok(), "{ok}");
        }
        assert_eq!(TenantName::parse(""), Err(NameError::Empty));
        assert_eq!(TenantName::parse("1a"), Err(NameError::BadStart));
        assert_eq!(TenantName::parse("-a"), Err(NameError::BadStart));
        assert_eq!(TenantName::parse("a-"), Err(NameError::BadEnd));
        assert_eq!(TenantName::parse("Demo"), Err(NameError::BadStart));
        assert_eq!(TenantName::parse("de_mo"), Err(NameError::BadChar));
        assert_eq!(TenantName::parse("de.mo"), Err(NameError::BadChar));
        assert_eq!(
            TenantName::parse(&"a".repeat(MAX_NAME_LEN + 1)),
            Err(NameError::TooLong)
        );
        assert!(TenantName::parse(&"a".repeat(MAX_NAME_LEN)).is_ok());
    }

    #[test]
    fn keys_follow_the_syncer_rule_and_differ_by_suffix() {
        let long = TenantName::parse("a-very-long-team-name-with-many-parts").unwrap();
        let k1 = long.key([0, 1, 2, 3, 4, 255]);
        let k2 = long.key([0, 1, 2, 3, 4, 254]);
        assert_ne!(k1, k2);
        for k in [&k1, &k2, &TenantName::parse("a").unwrap().key([9; 6])] {
            assert!(k.len() <= 20, "{k}");
            assert!(k.starts_with(|c: char| c.is_ascii_lowercase()), "{k}");
            assert!(
                k.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()),
                "{k}"
            );
        }
        assert_eq!(
            TenantName::parse("team-a").unwrap().key([0; 6]),
            "teamaaaaaaa"
        );
    }

    #[test]
    fn control_plane_namespace_cannot_meet_a_translated_namespace() {
        // Translated namespaces are `<key>-<ns>`; a key has at least 7 characters and no '-',
        // so its 4th character is never the '-' of `vcp-`.
        let k = TenantName::parse("v").unwrap().key([21, 2, 15, 0, 0, 0]);
        assert!(k.len() > KEY_SUFFIX_LEN);
        assert!(TenantKey::new(&k).is_ok());
        assert_ne!(&k[3..4], "-");
        assert_eq!(
            control_plane_namespace(&TenantKey::new("demoabc123").unwrap()),
            "vcp-demoabc123"
        );
    }
}
