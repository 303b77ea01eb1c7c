//! Reading the server name out of the first bytes of a TLS connection, without taking part in
//! TLS (pure: bytes in, a verdict out).
//!
//! Data flow: the proxy appends each read to one buffer and calls [`parse`] on the whole of it
//! until the answer is no longer [`ClientHello::NeedMore`]. [`parse`] walks the TLS records at
//! the start of the buffer (RFC 8446 §5.1: type, legacy version, length), joins their payloads
//! into the first handshake message, and once that message is complete reads the ClientHello
//! (RFC 8446 §4.1.2: legacy version, random, session id, cipher suites, compression methods,
//! extensions) for the `server_name` extension (RFC 6066 §3, type 0) and its `host_name` entry.
//! Bytes after the ClientHello (a change_cipher_spec record, early data) are left alone: the
//! proxy forwards the whole buffer.
//!
//! Why it is defensive the way it is:
//! - Each call starts over from the first byte, so the function stays pure. What makes that
//!   cheap is that an incomplete message is only measured (record headers and the 4-byte
//!   handshake header), never copied, and the number of records is capped ([`MAX_RECORDS`]).
//! - The message is refused as soon as its header declares more than [`MAX_HANDSHAKE`] bytes,
//!   so the buffer the proxy holds per connection is bounded whatever a client sends.
//! - Anything the backend could read differently from us is refused rather than guessed: two
//!   `server_name` extensions, two host names, a name type we cannot skip, bytes after the
//!   extensions. The name must be an LDH host name (letters, digits, hyphens; RFC 6066 forbids
//!   a trailing dot), returned lowercased, since DNS names compare case-insensitively.

use std::borrow::Cow;

/// The largest ClientHello taken, with its 4-byte handshake header. Browsers send about 2 KiB
/// (a post-quantum key share included); a hello beyond this is not one a kube client sends.
pub const MAX_HANDSHAKE: usize = 16 * 1024;
/// The most TLS records a ClientHello may be split over. A hello within [`MAX_HANDSHAKE`]
/// fits in two; clients that fragment it to dodge inspection use a handful. The cap bounds the
/// work of each [`parse`] call on a buffer of tiny records.
pub const MAX_RECORDS: usize = 64;
/// The longest host name (RFC 1035, as text without the trailing dot).
pub const MAX_NAME: usize = 253;
/// How much of a refused name goes into a log line (see [`sanitize`]).
pub const LOG_NAME_MAX: usize = 64;

/// RFC 8446 §5.1: a record's payload is at most 2^14 bytes.
const MAX_RECORD_PAYLOAD: usize = 1 << 14;
const RECORD_HEADER: usize = 5;
const HANDSHAKE_HEADER: usize = 4;
const CONTENT_HANDSHAKE: u8 = 22;
const CLIENT_HELLO: u8 = 1;
const EXT_SERVER_NAME: u16 = 0;
const NAME_TYPE_HOST_NAME: u8 = 0;

/// What the start of a TLS stream says so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientHello {
    /// Not enough bytes yet to say anything more; read more and ask again.
    NeedMore,
    /// A complete ClientHello naming this host (lowercase ASCII, a valid DNS name).
    ServerName(String),
    /// A complete ClientHello without a server name (a client dialling an IP address).
    NoServerName,
}

/// Why the start of a stream is not a ClientHello the gateway can route.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    #[error("not a tls handshake record (content type {0})")]
    NotHandshake(u8),
    #[error("unsupported tls record version {0:#06x}")]
    RecordVersion(u16),
    #[error("tls record of {0} bytes (must be 1 to 16384)")]
    RecordLength(usize),
    #[error("first handshake message is not a client hello (type {0})")]
    NotClientHello(u8),
    #[error("client hello of {0} bytes is larger than {MAX_HANDSHAKE}")]
    TooBig(usize),
    #[error("client hello split over more than {MAX_RECORDS} records")]
    TooFragmented,
    #[error("malformed client hello: {0}")]
    Malformed(&'static str),
    #[error("invalid server name {name:?}: {reason}")]
    ServerName { reason: &'static str, name: String },
}

/// Reads the server name from `input`, the first bytes a client sent.
pub fn parse(input: &[u8]) -> Result<ClientHello, Invalid> {
    let Some(len) = measure(input)? else {
        return Ok(ClientHello::NeedMore);
    };
    let message = gather(input, len);
    client_hello(&message[HANDSHAKE_HEADER..])
}

/// A name fit for a log line: printable ASCII kept, anything else as `?`, at most
/// [`LOG_NAME_MAX`] characters.
pub fn sanitize(raw: &[u8]) -> String {
    raw.iter()
        .take(LOG_NAME_MAX)
        .map(|&b| if b.is_ascii_graphic() { b as char } else { '?' })
        .collect()
}

/// Walks the records at the start of `input`: the length of the first handshake message with
/// its header once all of it is there, `None` while bytes are missing.
fn measure(input: &[u8]) -> Result<Option<usize>, Invalid> {
    let mut rest = input;
    let mut records = 0;
    let mut header = [0u8; HANDSHAKE_HEADER];
    let mut have = 0;
    let mut needed = None;
    loop {
        if let Some(n) = needed
            && have >= n
        {
            return Ok(Some(n));
        }
        // Each header field is checked as soon as its bytes are in: a client that is not
        // speaking TLS is refused on its first byte, not after the timeout.
        let Some(&content_type) = rest.first() else {
            return Ok(None);
        };
        if content_type != CONTENT_HANDSHAKE {
            return Err(Invalid::NotHandshake(content_type));
        }
        if let [_, major, minor, ..] = *rest
            && major != 3
        {
            return Err(Invalid::RecordVersion(u16::from_be_bytes([major, minor])));
        }
        let [_, _, _, l0, l1, ..] = *rest else {
            return Ok(None);
        };
        let len = usize::from(u16::from_be_bytes([l0, l1]));
        // RFC 8446 §5.1: handshake fragments are never empty.
        if len == 0 || len > MAX_RECORD_PAYLOAD {
            return Err(Invalid::RecordLength(len));
        }
        records += 1;
        if records > MAX_RECORDS {
            return Err(Invalid::TooFragmented);
        }
        let body = &rest[RECORD_HEADER..];
        let fragment = &body[..len.min(body.len())];
        if have < HANDSHAKE_HEADER {
            let take = (HANDSHAKE_HEADER - have).min(fragment.len());
            header[have..have + take].copy_from_slice(&fragment[..take]);
        }
        have += fragment.len();
        if have > 0 && header[0] != CLIENT_HELLO {
            return Err(Invalid::NotClientHello(header[0]));
        }
        if needed.is_none() && have >= HANDSHAKE_HEADER {
            let n = HANDSHAKE_HEADER + u24(&header[1..]);
            if n > MAX_HANDSHAKE {
                return Err(Invalid::TooBig(n));
            }
            needed = Some(n);
        }
        if fragment.len() < len {
            // The last record is still arriving.
            return Ok(needed.filter(|&n| have >= n));
        }
        rest = &body[len..];
    }
}

/// The first `len` bytes of the handshake stream in `input`, which [`measure`] found complete:
/// borrowed when one record holds them (the usual case), joined otherwise.
fn gather(input: &[u8], len: usize) -> Cow<'_, [u8]> {
    let mut fragments = Records(input);
    let first = fragments.next().unwrap_or_default();
    if first.len() >= len {
        return Cow::Borrowed(&first[..len]);
    }
    let mut joined = Vec::with_capacity(len);
    joined.extend_from_slice(first);
    for f in fragments {
        let take = (len - joined.len()).min(f.len());
        joined.extend_from_slice(&f[..take]);
        if joined.len() == len {
            break;
        }
    }
    Cow::Owned(joined)
}

/// The payloads of the records in a buffer [`measure`] already checked.
struct Records<'a>(&'a [u8]);

impl<'a> Iterator for Records<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let [_, _, _, l0, l1, ..] = *self.0 else {
            return None;
        };
        let len = usize::from(u16::from_be_bytes([l0, l1]));
        let body = &self.0[RECORD_HEADER..];
        let fragment = &body[..len.min(body.len())];
        self.0 = &body[fragment.len()..];
        Some(fragment)
    }
}

fn u24(b: &[u8]) -> usize {
    (usize::from(b[0]) << 16) | (usize::from(b[1]) << 8) | usize::from(b[2])
}

/// Reads a ClientHello body (after the handshake header).
fn client_hello(body: &[u8]) -> Result<ClientHello, Invalid> {
    let mut r = Reader(body);
    let [major, _] = r.array::<2>("legacy version")?;
    if major != 3 {
        return Err(Invalid::Malformed("legacy version is not 3.x"));
    }
    r.take(32, "random")?;
    if r.vec8("session id")?.len() > 32 {
        return Err(Invalid::Malformed("session id longer than 32 bytes"));
    }
    let suites = r.vec16("cipher suites")?;
    if suites.is_empty() || suites.len() % 2 != 0 {
        return Err(Invalid::Malformed("cipher suites"));
    }
    if r.vec8("compression methods")?.is_empty() {
        return Err(Invalid::Malformed("no compression method"));
    }
    // Before TLS 1.2 (RFC 5246 §7.4.1.2) the extensions may be absent altogether.
    if r.0.is_empty() {
        return Ok(ClientHello::NoServerName);
    }
    let mut extensions = Reader(r.vec16("extensions")?);
    if !r.0.is_empty() {
        return Err(Invalid::Malformed("bytes after the extensions"));
    }
    let mut name = None;
    while !extensions.0.is_empty() {
        let [t0, t1] = extensions.array::<2>("extension type")?;
        let data = extensions.vec16("extension")?;
        if u16::from_be_bytes([t0, t1]) == EXT_SERVER_NAME {
            if name.is_some() {
                return Err(Invalid::Malformed("two server_name extensions"));
            }
            name = Some(server_name(data)?);
        }
    }
    Ok(name.map_or(ClientHello::NoServerName, ClientHello::ServerName))
}

/// Reads a `server_name` extension's data (RFC 6066 §3): its one host name.
fn server_name(data: &[u8]) -> Result<String, Invalid> {
    let mut r = Reader(data);
    let mut list = Reader(r.vec16("server name list")?);
    if !r.0.is_empty() {
        return Err(Invalid::Malformed("bytes after the server name list"));
    }
    let mut host = None;
    while !list.0.is_empty() {
        // An entry of another type has no length we could skip it by (RFC 6066 §3).
        if list.array::<1>("server name type")? != [NAME_TYPE_HOST_NAME] {
            return Err(Invalid::Malformed("unknown server name type"));
        }
        let name = list.vec16("host name")?;
        if host.replace(name).is_some() {
            return Err(Invalid::Malformed("two host names"));
        }
    }
    let host = host.ok_or(Invalid::Malformed("empty server name list"))?;
    host_name(host)
}

/// Checks a host name (LDH labels of 1 to 63 characters, at most [`MAX_NAME`] in all, no
/// trailing dot) and lowercases it.
fn host_name(raw: &[u8]) -> Result<String, Invalid> {
    let refuse = |reason| {
        Err(Invalid::ServerName {
            reason,
            name: sanitize(raw),
        })
    };
    if raw.is_empty() {
        return refuse("empty");
    }
    if raw.len() > MAX_NAME {
        return refuse("longer than 253 characters");
    }
    if raw.ends_with(b".") {
        return refuse("trailing dot");
    }
    for label in raw.split(|&b| b == b'.') {
        if label.is_empty() {
            return refuse("empty label");
        }
        if label.len() > 63 {
            return refuse("label longer than 63 characters");
        }
        if !label
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || *b == b'-')
        {
            return refuse("not a letter, digit or hyphen");
        }
        if label.starts_with(b"-") || label.ends_with(b"-") {
            return refuse("label starts or ends with a hyphen");
        }
    }
    Ok(raw.iter().map(|b| b.to_ascii_lowercase() as char).collect())
}

/// A cursor over a length-prefixed structure; every read says what it was reading, which is
/// the reason given when the bytes run out.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], Invalid> {
        if self.0.len() < n {
            return Err(Invalid::Malformed(what));
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], Invalid> {
        let mut out = [0; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    fn vec8(&mut self, what: &'static str) -> Result<&'a [u8], Invalid> {
        let [n] = self.array::<1>(what)?;
        self.take(usize::from(n), what)
    }

    fn vec16(&mut self, what: &'static str) -> Result<&'a [u8], Invalid> {
        let n = u16::from_be_bytes(self.array::<2>(what)?);
        self.take(usize::from(n), what)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rustls::pki_types::ServerName;
    use std::sync::Arc;

    /// The first flight of a real rustls client (ring provider) for `name`.
    fn rustls_hello(name: ServerName<'static>) -> Vec<u8> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("ring supports the default versions")
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        let mut conn = rustls::ClientConnection::new(Arc::new(config), name).expect("a client");
        let mut out = Vec::new();
        while conn.wants_write() {
            conn.write_tls(&mut out).expect("writes to a Vec");
        }
        out
    }

    fn hello_for(name: &str) -> Vec<u8> {
        rustls_hello(ServerName::try_from(name.to_owned()).expect("a DNS name"))
    }

    /// The handshake bytes of a flight rustls wrote as one record.
    fn handshake_of(flight: &[u8]) -> &[u8] {
        assert_eq!(flight[0], CONTENT_HANDSHAKE);
        let len = usize::from(u16::from_be_bytes([flight[3], flight[4]]));
        assert_eq!(flight.len(), RECORD_HEADER + len, "rustls sent one record");
        &flight[RECORD_HEADER..]
    }

    fn record(content_type: u8, payload: &[u8]) -> Vec<u8> {
        let mut r = vec![content_type, 3, 1];
        r.extend_from_slice(&u16::try_from(payload.len()).unwrap().to_be_bytes());
        r.extend_from_slice(payload);
        r
    }

    /// `handshake` as records, cut at the (sorted, distinct, inner) offsets `cuts`.
    fn records(handshake: &[u8], cuts: &[usize]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut start = 0;
        for &end in cuts.iter().chain([handshake.len()].iter()) {
            out.extend(record(CONTENT_HANDSHAKE, &handshake[start..end]));
            start = end;
        }
        out
    }

    fn vec16(data: &[u8]) -> Vec<u8> {
        let mut v = u16::try_from(data.len()).unwrap().to_be_bytes().to_vec();
        v.extend_from_slice(data);
        v
    }

    fn extension(ty: u16, data: &[u8]) -> Vec<u8> {
        let mut e = ty.to_be_bytes().to_vec();
        e.extend(vec16(data));
        e
    }

    /// A `server_name` extension with these (type, name) entries.
    fn sni(entries: &[(u8, &[u8])]) -> Vec<u8> {
        let mut list = Vec::new();
        for (ty, name) in entries {
            list.push(*ty);
            list.extend(vec16(name));
        }
        extension(EXT_SERVER_NAME, &vec16(&list))
    }

    /// A hand-made ClientHello body: TLS 1.2, an empty session id, one suite, null
    /// compression, then `extensions` (the block's length added), if any.
    fn body(extensions: Option<&[u8]>) -> Vec<u8> {
        let mut b = vec![3, 3];
        b.extend([7; 32]);
        b.push(0);
        b.extend(vec16(&[0x13, 0x01]));
        b.extend([1, 0]);
        if let Some(e) = extensions {
            b.extend(vec16(e));
        }
        b
    }

    /// Offsets in [`body`]: the session id's length, the suites' length, the extensions'.
    const SESSION_ID_LEN: usize = 34;
    const SUITES_LEN: usize = 35;
    const EXTENSIONS_LEN: usize = 41;

    fn handshake(body: &[u8]) -> Vec<u8> {
        let len = u32::try_from(body.len()).unwrap().to_be_bytes();
        let mut h = vec![CLIENT_HELLO, len[1], len[2], len[3]];
        h.extend_from_slice(body);
        h
    }

    fn wire(body: &[u8]) -> Vec<u8> {
        record(CONTENT_HANDSHAKE, &handshake(body))
    }

    fn name_of(name: &str) -> Result<ClientHello, Invalid> {
        Ok(ClientHello::ServerName(name.to_owned()))
    }

    #[test]
    fn a_real_client_hello_yields_its_server_name_lowercased() {
        assert_eq!(
            parse(&hello_for("a.example.test")),
            name_of("a.example.test")
        );
        assert_eq!(
            parse(&hello_for("Team-A.Example.TEST")),
            name_of("team-a.example.test")
        );
    }

    #[test]
    fn a_hand_made_hello_yields_its_server_name() {
        let b = body(Some(&sni(&[(0, b"a.example.test")])));
        assert_eq!(parse(&wire(&b)), name_of("a.example.test"));
    }

    #[test]
    fn a_client_dialling_an_ip_address_sends_no_server_name() {
        let ip = ServerName::IpAddress(std::net::Ipv4Addr::LOCALHOST.into());
        assert_eq!(parse(&rustls_hello(ip)), Ok(ClientHello::NoServerName));
        assert_eq!(parse(&wire(&body(None))), Ok(ClientHello::NoServerName));
        let other = extension(10, &[0, 2, 0, 29]);
        assert_eq!(
            parse(&wire(&body(Some(&other)))),
            Ok(ClientHello::NoServerName)
        );
    }

    #[test]
    fn what_follows_the_hello_is_left_alone() {
        let mut flight = hello_for("a.example.test");
        // Middlebox compatibility's change_cipher_spec, then early data and garbage.
        flight.extend(record(20, &[1]));
        flight.extend(record(23, b"early"));
        flight.extend(b"\xff\xff");
        assert_eq!(parse(&flight), name_of("a.example.test"));
    }

    #[test]
    fn other_protocols_are_refused_on_their_first_byte() {
        assert_eq!(parse(b"G"), Err(Invalid::NotHandshake(b'G')));
        assert_eq!(
            parse(b"GET / HTTP/1.1\r\n"),
            Err(Invalid::NotHandshake(b'G'))
        );
        assert_eq!(parse(&record(23, b"data")), Err(Invalid::NotHandshake(23)));
        // SSL 2.0's hello: the high bit of a two-byte length.
        assert_eq!(parse(&[0x80, 0x2e, 0x01]), Err(Invalid::NotHandshake(0x80)));
        assert_eq!(parse(&[22, 2, 0]), Err(Invalid::RecordVersion(0x0200)));
    }

    #[test]
    fn empty_and_oversized_records_are_refused() {
        assert_eq!(parse(&[22, 3, 1, 0, 0]), Err(Invalid::RecordLength(0)));
        assert_eq!(
            parse(&[22, 3, 1, 0x40, 1]),
            Err(Invalid::RecordLength(16385))
        );
    }

    #[test]
    fn a_first_message_other_than_a_client_hello_is_refused() {
        let mut server_hello = handshake(&body(None));
        server_hello[0] = 2;
        let w = record(CONTENT_HANDSHAKE, &server_hello);
        assert_eq!(parse(&w[..6]), Err(Invalid::NotClientHello(2)));
    }

    #[test]
    fn a_hello_declared_over_the_cap_is_refused_before_it_arrives() {
        let declared = [CLIENT_HELLO, 0, 0x4e, 0x20]; // 20,000 bytes
        let w = record(CONTENT_HANDSHAKE, &declared);
        assert_eq!(parse(&w), Err(Invalid::TooBig(20_004)));
        // At the cap exactly, it waits for the rest.
        let at_cap = u32::try_from(MAX_HANDSHAKE - HANDSHAKE_HEADER)
            .unwrap()
            .to_be_bytes();
        let w = record(
            CONTENT_HANDSHAKE,
            &[CLIENT_HELLO, at_cap[1], at_cap[2], at_cap[3]],
        );
        assert_eq!(parse(&w), Ok(ClientHello::NeedMore));
    }

    #[test]
    fn a_hello_in_too_many_records_is_refused() {
        let flight = hello_for("a.example.test");
        let h = handshake_of(&flight);
        let cuts: Vec<usize> = (1..MAX_RECORDS).collect();
        assert_eq!(parse(&records(h, &cuts)), name_of("a.example.test"));
        let cuts: Vec<usize> = (1..=MAX_RECORDS).collect();
        assert_eq!(parse(&records(h, &cuts)), Err(Invalid::TooFragmented));
    }

    #[test]
    fn bad_host_names_are_refused_with_the_reason() {
        let reason = |name: &[u8]| match parse(&wire(&body(Some(&sni(&[(0, name)]))))) {
            Err(Invalid::ServerName {
                reason,
                name: logged,
            }) => {
                assert!(logged.len() <= LOG_NAME_MAX, "{logged}");
                reason
            }
            other => panic!("{:?}: {other:?}", String::from_utf8_lossy(name)),
        };
        let long = format!("{}.example.test", "a".repeat(300 - 13));
        assert_eq!(long.len(), 300);
        assert_eq!(reason(long.as_bytes()), "longer than 253 characters");
        let label = format!("{}.example.test", "a".repeat(64));
        assert_eq!(reason(label.as_bytes()), "label longer than 63 characters");
        assert_eq!(reason(b""), "empty");
        assert_eq!(reason(b"a.example.test."), "trailing dot");
        assert_eq!(reason(b"a..test"), "empty label");
        assert_eq!(reason(b"a_b.example.test"), "not a letter, digit or hyphen");
        assert_eq!(reason(b"a\0.example.test"), "not a letter, digit or hyphen");
        assert_eq!(
            reason("\u{e9}.test".as_bytes()),
            "not a letter, digit or hyphen"
        );
        assert_eq!(
            reason(b"-a.example.test"),
            "label starts or ends with a hyphen"
        );
        // At the limits, accepted.
        let max = format!("{0}.{0}.{0}.{1}", "a".repeat(63), "b".repeat(61));
        assert_eq!(max.len(), MAX_NAME);
        assert_eq!(
            parse(&wire(&body(Some(&sni(&[(0, max.as_bytes())]))))),
            name_of(&max)
        );
    }

    #[test]
    fn ambiguous_server_names_are_refused() {
        let two_ext = [sni(&[(0, b"a.test")]), sni(&[(0, b"b.test")])].concat();
        let two_names = sni(&[(0, b"a.test"), (0, b"b.test")]);
        let unknown_type = sni(&[(1, b"a.test")]);
        let empty_list = extension(EXT_SERVER_NAME, &vec16(&[]));
        let empty_ext = extension(EXT_SERVER_NAME, &[]);
        for (ext, want) in [
            (two_ext, "two server_name extensions"),
            (two_names, "two host names"),
            (unknown_type, "unknown server name type"),
            (empty_list, "empty server name list"),
            (empty_ext, "server name list"),
        ] {
            assert_eq!(
                parse(&wire(&body(Some(&ext)))),
                Err(Invalid::Malformed(want))
            );
        }
    }

    #[test]
    fn corrupted_length_fields_are_refused() {
        let ext = sni(&[(0, b"a.example.test")]);
        let good = body(Some(&ext));
        let corrupt = |at: usize, delta: i16| {
            let mut b = good.clone();
            let v = u16::from_be_bytes([b[at], b[at + 1]]).wrapping_add_signed(delta);
            b[at..at + 2].copy_from_slice(&v.to_be_bytes());
            parse(&wire(&b))
        };
        let malformed = |r: Result<ClientHello, Invalid>| matches!(r, Err(Invalid::Malformed(_)));
        // Offsets inside the extensions: type (2), length (2), list length (2), name type
        // (1), name length (2).
        let ext_len = EXTENSIONS_LEN + 2 + 2;
        let list_len = ext_len + 2;
        let name_len = list_len + 3;
        for at in [SUITES_LEN, EXTENSIONS_LEN, ext_len, list_len, name_len] {
            for delta in [-1, 1, 100] {
                assert!(
                    malformed(corrupt(at, delta)),
                    "length at {at} off by {delta}"
                );
            }
        }
        let mut b = good.clone();
        b[SESSION_ID_LEN] = 33;
        b.splice(SESSION_ID_LEN + 1..SESSION_ID_LEN + 1, [0; 33]);
        let too_long = Invalid::Malformed("session id longer than 32 bytes");
        assert_eq!(parse(&wire(&b)), Err(too_long));
        let mut b = good.clone();
        b[SESSION_ID_LEN] = 200;
        assert_eq!(parse(&wire(&b)), Err(Invalid::Malformed("session id")));
        let mut b = good.clone();
        b[SUITES_LEN + 1] = 3;
        b.insert(SUITES_LEN + 2, 0);
        assert_eq!(parse(&wire(&b)), Err(Invalid::Malformed("cipher suites")));
        let mut b = good.clone();
        b.push(0);
        assert_eq!(
            parse(&wire(&b)),
            Err(Invalid::Malformed("bytes after the extensions"))
        );
        let mut b = good.clone();
        b[0] = 2;
        assert_eq!(
            parse(&wire(&b)),
            Err(Invalid::Malformed("legacy version is not 3.x"))
        );
        // A handshake length shorter than the hello ends it early: what is left is cut off.
        let mut w = wire(&good);
        w[8] -= 1;
        assert!(malformed(parse(&w)), "{:?}", parse(&w));
        // A longer one waits for the next record.
        let mut w = wire(&good);
        w[8] += 1;
        assert_eq!(parse(&w), Ok(ClientHello::NeedMore));
    }

    #[test]
    fn sanitized_names_are_printable_and_short() {
        assert_eq!(sanitize(b"a\nb\x1b[31m c"), "a?b?[31m?c");
        assert_eq!(sanitize(&[b'x'; 300]).len(), LOG_NAME_MAX);
    }

    /// Valid LDH names rustls takes as DNS names: the last label starts with a letter, so it
    /// never reads as an IP address.
    fn dns_name() -> impl Strategy<Value = String> {
        let label = "[a-zA-Z0-9]([a-zA-Z0-9-]{0,20}[a-zA-Z0-9])?";
        (
            proptest::collection::vec(label, 0..4),
            "[a-zA-Z]([a-zA-Z0-9-]{0,10}[a-zA-Z0-9])?",
        )
            .prop_map(|(mut labels, last)| {
                labels.push(last);
                labels.join(".")
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn a_real_hello_yields_its_name_only_once_complete(
            name in dns_name(),
            cuts in proptest::collection::btree_set(1usize..10_000, 0..8),
        ) {
            let flight = hello_for(&name);
            let want = name_of(&name.to_ascii_lowercase());
            prop_assert_eq!(parse(&flight), want.clone());
            for n in 0..flight.len() {
                prop_assert_eq!(parse(&flight[..n]), Ok(ClientHello::NeedMore), "prefix {}", n);
            }
            // The same handshake over several records, read in every possible split.
            let h = handshake_of(&flight);
            let cuts: Vec<usize> = cuts.into_iter().map(|c| c % h.len()).filter(|&c| c > 0)
                .collect::<std::collections::BTreeSet<_>>().into_iter().collect();
            let split = records(h, &cuts);
            prop_assert_eq!(parse(&split), want);
            for n in 0..split.len() {
                prop_assert_eq!(parse(&split[..n]), Ok(ClientHello::NeedMore), "prefix {}", n);
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = parse(&bytes);
            // And past the record header, into the hello's fields.
            let mut w = vec![CONTENT_HANDSHAKE, 3, 1, 0, 0, CLIENT_HELLO, 0, 0, 0];
            w[3..5].copy_from_slice(&u16::try_from(bytes.len() + 4).unwrap().to_be_bytes());
            w[6..9].copy_from_slice(&u32::try_from(bytes.len()).unwrap().to_be_bytes()[1..]);
            w.extend(&bytes);
            let _ = parse(&w);
        }

        #[test]
        fn a_mangled_hello_never_panics_nor_yields_an_invalid_name(
            name in dns_name(),
            flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6),
        ) {
            let mut flight = hello_for(&name);
            for (at, b) in flips {
                let n = flight.len();
                flight[at % n] = b;
            }
            if let Ok(ClientHello::ServerName(got)) = parse(&flight) {
                prop_assert_eq!(host_name(got.as_bytes()), Ok(got.clone()));
            }
        }
    }
}
