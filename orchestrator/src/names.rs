//! Tenant names and the keys made from them, and the rules of the other
//! strings the API takes: token names, kubeconfig users and groups, labels (pure).
//!
//! Each rule is a plain function the server calls and a pattern the OpenAPI document states
//! (ECMA-262, as JSON Schema reads it, plus a length). The patterns live next to the functions,
//! and a property test holds each pair to the same answer on generated strings, so the
//! document cannot promise what the server refuses or refuse what it accepts.
//!
//! A tenant's *name* is what people type; its *key* is what the host cluster sees. The key is
//! the name's letters and digits plus six random characters, so a tenant deleted and created
//! again under the same name never meets its predecessor's leftovers on the host. Keys are
//! [`TenantKey`]s, checked by the one rule in `vcp_core::naming` that the syncer checks too
//! (`[a-z][a-z0-9]{0,19}`, no `-`, which keeps `<key>-<namespace>` injective); host names are
//! derived from them there. Names are the orchestrator's alone: the syncer never sees one.

use std::fmt;
use std::time::Duration;
use vcp_core::naming::TenantKey;

/// Longest tenant name: short enough for `vcp-<key>` and for kubeconfig context names.
pub const MAX_NAME_LEN: usize = 40;
/// [`TenantName::parse`]'s rule (with a length of 1 to [`MAX_NAME_LEN`]); token names follow it too.
pub const NAME_PATTERN: &str = "^[a-z]([a-z0-9-]*[a-z0-9])?$";
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

/// Longest kubeconfig user or group.
pub const MAX_SUBJECT_LEN: usize = 128;
/// Most groups one kubeconfig carries.
pub const MAX_GROUPS: usize = 16;
/// [`is_subject`]'s rule (with a length of 1 to [`MAX_SUBJECT_LEN`]).
pub const SUBJECT_PATTERN: &str = "^(?!system:|vcp:)[!-~]+$";

/// A kubeconfig user or group (certificate CN or O): 1 to [`MAX_SUBJECT_LEN`] printable ASCII
/// characters without spaces (they go into certificates, the inventory and terminal tables),
/// not starting with `system:` or `vcp:`, which Kubernetes and vcp reserve for their own
/// identities: a kubeconfig must not impersonate a node, a controller or vcp's components.
pub fn is_subject(s: &str) -> bool {
    (1..=MAX_SUBJECT_LEN).contains(&s.len())
        && s.chars().all(|c| c.is_ascii_graphic())
        && !s.starts_with("system:")
        && !s.starts_with("vcp:")
}

/// Most labels on one tenant.
pub const MAX_LABELS: usize = 64;
/// Longest label key.
pub const MAX_LABEL_KEY_LEN: usize = 253;
/// Longest label value.
pub const MAX_LABEL_VALUE_LEN: usize = 63;
/// [`is_label_key`]'s rule (with a length of 1 to [`MAX_LABEL_KEY_LEN`]).
pub const LABEL_KEY_PATTERN: &str = "^[A-Za-z0-9._/-]+$";
/// [`is_label_value`]'s rule (with a length of at most [`MAX_LABEL_VALUE_LEN`]).
pub const LABEL_VALUE_PATTERN: &str = "^[A-Za-z0-9._/-]*$";

fn label_chars(s: &str) -> bool {
    s.chars()
        .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
}

/// A tenant label key: 1 to [`MAX_LABEL_KEY_LEN`] characters of `[A-Za-z0-9-_./]`.
pub fn is_label_key(s: &str) -> bool {
    (1..=MAX_LABEL_KEY_LEN).contains(&s.len()) && label_chars(s)
}

/// A tenant label value: at most [`MAX_LABEL_VALUE_LEN`] characters of `[A-Za-z0-9-_./]`.
pub fn is_label_value(s: &str) -> bool {
    s.len() <= MAX_LABEL_VALUE_LEN && label_chars(s)
}

/// [`parse_ttl`]'s rule.
pub const TTL_PATTERN: &str = "^[0-9]*[1-9][0-9]*[smhd]?$";

/// Parses a positive duration: digits and a unit, `s` (or none), `m`, `h` or `d` (`90m`, `12h`,
/// `30d`, `45`). A number too large for any clock saturates instead of failing: every caller
/// caps what it gets, and a huge TTL means "as long as allowed" like any other over the cap.
pub fn parse_ttl(s: &str) -> Option<Duration> {
    parse_duration(s).filter(|d| !d.is_zero())
}

/// [`parse_duration`]'s rule.
pub const DURATION_PATTERN: &str = "^[0-9]+[smhd]?$";

/// [`parse_ttl`], but zero (`0`, `0s`, `00m`) is a duration too.
pub fn parse_duration(s: &str) -> Option<Duration> {
    let (n, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let unit: u64 = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return None,
    };
    if n.is_empty() {
        return None;
    }
    // Only digits, so parsing fails only by overflowing.
    let n: u64 = n.parse().unwrap_or(u64::MAX);
    Some(Duration::from_secs(n.saturating_mul(unit)))
}

/// A domain tenants' host names end in (`--expose-domain`): lowercase DNS labels joined by
/// dots, short enough that `<key>.<domain>` (a key is at most 20 characters) stays within a
/// DNS name's 253.
pub fn is_tenant_domain(s: &str) -> bool {
    s.len() <= 253 - 21 && s.split('.').all(is_dns_label)
}

/// A DNS label: 1 to 63 lowercase letters, digits and `-`, not starting or ending with `-`.
pub fn is_dns_label(l: &str) -> bool {
    (1..=63).contains(&l.len())
        && l.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !l.starts_with('-')
        && !l.ends_with('-')
}

#[cfg(test)]
mod tests {
    #[test]
    fn tenant_domains_are_lowercase_dns_names_with_room_for_a_key() {
        for ok in ["tenants.example.net", "vcp.test", "a", "x-1.y2"] {
            assert!(super::is_tenant_domain(ok), "{ok}");
        }
        let long = ["a"; 117].join(".");
        for bad in [
            "",
            ".example",
            "example.",
            "a..b",
            "Tenants.example",
            "-a.example",
            "a-.example",
            "a_b.example",
            "*.example",
            long.as_str(),
        ] {
            assert!(!super::is_tenant_domain(bad), "{bad:?}");
        }
    }

    use super::*;
    use proptest::prelude::*;
    use vcp_core::naming::control_plane_namespace;

    /// What the OpenAPI document says of `s`: JSON Schema's `pattern` (ECMA-262, unanchored
    /// unless the pattern anchors itself) and lengths in code points.
    fn schema_takes(pattern: &str, min: usize, max: usize, s: &str) -> bool {
        let re = fancy_regex::Regex::new(pattern).expect("the pattern compiles");
        (min..=max).contains(&s.chars().count()) && re.is_match(s).expect("the pattern runs")
    }

    /// Strings near every rule above: mostly the characters the rules allow, the ones they
    /// refuse (upper case, `:`, spaces, control, non-ASCII), the reserved prefixes, and runs
    /// of one character across each length limit.
    fn near_the_rules() -> impl Strategy<Value = String> {
        let ch = prop_oneof![
            6 => proptest::char::range('a', 'z'),
            3 => proptest::char::range('0', '9'),
            2 => Just('-'),
            1 => proptest::char::range('A', 'Z'),
            1 => prop::sample::select(vec!['s', 'm', 'h', 'd']),
            2 => prop::sample::select(vec![
                '_', '.', '/', ':', '!', '~', '"', ' ', '\n', '\t', '\0', '\u{7f}', 'é',
                'ß', '\u{1F600}',
            ]),
        ];
        let limits: Vec<usize> = [
            MAX_NAME_LEN,
            MAX_SUBJECT_LEN,
            MAX_LABEL_KEY_LEN,
            MAX_LABEL_VALUE_LEN,
        ]
        .into_iter()
        .flat_map(|n| [n - 1, n, n + 1])
        .chain([0, 1, 2])
        .collect();
        let prefix = prop::sample::select(vec![
            "", "", "", "", "system:", "vcp:", "system", "vcp", "s", "v", "0", "-",
        ]);
        prop_oneof![
            (prefix.clone(), prop::collection::vec(ch.clone(), 0..48))
                .prop_map(|(p, v)| format!("{p}{}", v.into_iter().collect::<String>())),
            (prefix, prop::collection::vec(ch.clone(), 0..300))
                .prop_map(|(p, v)| format!("{p}{}", v.into_iter().collect::<String>())),
            (ch, prop::sample::select(limits)).prop_map(|(c, n)| c.to_string().repeat(n)),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]

        #[test]
        fn the_documented_patterns_take_exactly_what_the_server_takes(s in near_the_rules()) {
            prop_assert_eq!(
                TenantName::parse(&s).is_ok(),
                schema_takes(NAME_PATTERN, 1, MAX_NAME_LEN, &s),
                "name {:?}", s
            );
            prop_assert_eq!(
                is_subject(&s),
                schema_takes(SUBJECT_PATTERN, 1, MAX_SUBJECT_LEN, &s),
                "subject {:?}", s
            );
            let (min, max) = vcp_core::revocation::SERIAL_LEN;
            prop_assert_eq!(
                vcp_core::revocation::is_serial(&s),
                schema_takes(vcp_core::revocation::SERIAL_PATTERN, min, max, &s),
                "serial {:?}", s
            );
            prop_assert_eq!(
                is_label_key(&s),
                schema_takes(LABEL_KEY_PATTERN, 1, MAX_LABEL_KEY_LEN, &s),
                "label key {:?}", s
            );
            prop_assert_eq!(
                is_label_value(&s),
                schema_takes(LABEL_VALUE_PATTERN, 0, MAX_LABEL_VALUE_LEN, &s),
                "label value {:?}", s
            );
            prop_assert_eq!(
                parse_ttl(&s).is_some(),
                schema_takes(TTL_PATTERN, 0, usize::MAX, &s),
                "ttl {:?}", s
            );
            prop_assert_eq!(
                parse_duration(&s).is_some(),
                schema_takes(DURATION_PATTERN, 0, usize::MAX, &s),
                "duration {:?}", s
            );
        }
    }

    #[test]
    fn the_generated_strings_reach_both_sides_of_every_rule() {
        // A property that only ever saw refused strings would prove nothing.
        use proptest::strategy::ValueTree;
        let mut runner = proptest::test_runner::TestRunner::deterministic();
        let strings: Vec<String> = (0..4096)
            .map(|_| near_the_rules().new_tree(&mut runner).unwrap().current())
            .collect();
        type Rule = fn(&str) -> bool;
        let rules: [(&str, Rule); 5] = [
            ("name", |s| TenantName::parse(s).is_ok()),
            ("subject", is_subject),
            ("label key", is_label_key),
            ("label value", is_label_value),
            ("ttl", |s| parse_ttl(s).is_some()),
        ];
        for (what, rule) in rules {
            let taken = strings.iter().filter(|s| rule(s)).count();
            assert!(
                (100..4000).contains(&taken),
                "{what}: {taken} of 4096 taken"
            );
        }
        // And each length limit from both sides, with characters the rule allows.
        for (max, rule) in [
            (MAX_NAME_LEN, rules[0].1),
            (MAX_SUBJECT_LEN, rules[1].1),
            (MAX_LABEL_KEY_LEN, rules[2].1),
            (MAX_LABEL_VALUE_LEN, rules[3].1),
        ] {
            assert!(strings.iter().any(|s| s.len() == max && rule(s)), "{max}");
            let over = |s: &String| s.len() == max + 1 && s.get(1..).is_some_and(rule);
            assert!(strings.iter().any(over), "{}", max + 1);
        }
    }

    #[test]
    fn subjects_refuse_reserved_prefixes_spaces_and_control() {
        for ok in [
            "alice",
            "a",
            "system",
            "systems:x",
            "x:system:",
            "vcp",
            "Vcp:x",
            "~!",
        ] {
            assert!(is_subject(ok), "{ok}");
        }
        for bad in [
            "",
            "system:admin",
            "vcp:coredns",
            "a b",
            "a\u{0}b",
            "é",
            "line\nbreak",
            &"u".repeat(MAX_SUBJECT_LEN + 1),
        ] {
            assert!(!is_subject(bad), "{bad:?}");
        }
        assert!(is_subject(&"u".repeat(MAX_SUBJECT_LEN)));
    }

    #[test]
    fn ttls_parse_in_common_units_and_saturate() {
        assert_eq!(parse_ttl("90m"), Some(Duration::from_secs(5400)));
        assert_eq!(parse_ttl("12h"), Some(Duration::from_secs(43_200)));
        assert_eq!(parse_ttl("30d"), Some(Duration::from_secs(2_592_000)));
        assert_eq!(parse_ttl("45"), Some(Duration::from_secs(45)));
        assert_eq!(parse_ttl("045s"), Some(Duration::from_secs(45)));
        for huge in [
            "99999999999999999999d",
            "213503982334602d",
            &"9".repeat(400),
        ] {
            assert_eq!(
                parse_ttl(huge),
                Some(Duration::from_secs(u64::MAX)),
                "{huge}"
            );
        }
        for bad in [
            "", "0h", "000", "h", "1w", "-1h", "1.5h", "1hh", " 1h", "1h ",
        ] {
            assert_eq!(parse_ttl(bad), None, "{bad}");
        }
    }

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
