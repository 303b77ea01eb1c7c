//! Just enough SPDY/3.1 to end an `exec` or `attach` stream with a reason (pure).
//!
//! The tenant apiserver speaks SPDY to a kubelet for `exec` and `attach` (it translates
//! kubectl's WebSocket to SPDY itself), and the endpoint passes those bytes on to the host
//! unchanged. When the stream must end early (the syncer is stopping, or the host connection
//! broke), closing the connection is not enough: the client reads a stream whose error channel
//! closed empty as a command that succeeded, and kubectl exits 0. A kubelet says why a command
//! failed with a `Status` on the stream whose `streamtype` header is `error`, so that is what
//! the endpoint writes.
//!
//! Data flow: [`Tracker::client`] reads the frames the tenant side sends (to the host) and
//! learns which stream is the error stream from the `SYN_STREAM` headers, which are
//! zlib-compressed with one context per direction and SPDY/3's fixed dictionary, so every header
//! block of that direction is inflated in order. [`Tracker::server`] reads the frames the host
//! sends back, in whole frames, so the endpoint writes to the tenant only on frame boundaries
//! and can add a frame of its own; it also notes whether the host already wrote on the error
//! stream (a finished command's status), in which case nothing is added: the client reads the
//! whole error stream as one `Status`, and a second one would garble the first. Nothing here
//! does I/O.

use flate2::{Decompress, FlushDecompress};

/// The SPDY version a control frame must carry; any other means the bytes are not SPDY/3.1
/// after all, and the tracker stops looking.
const VERSION: u16 = 3;
const SYN_STREAM: u16 = 1;
const SYN_REPLY: u16 = 2;
const RST_STREAM: u16 = 3;
const HEADERS: u16 = 8;
const FLAG_FIN: u8 = 0x01;

/// The header names of SPDY/3's zlib dictionary (draft 3, section 2.6.10.1), each written with
/// a 4-byte length before it.
const DICTIONARY_WORDS: [&str; 65] = [
    "options",
    "head",
    "post",
    "put",
    "delete",
    "trace",
    "accept",
    "accept-charset",
    "accept-encoding",
    "accept-language",
    "accept-ranges",
    "age",
    "allow",
    "authorization",
    "cache-control",
    "connection",
    "content-base",
    "content-encoding",
    "content-language",
    "content-length",
    "content-location",
    "content-md5",
    "content-range",
    "content-type",
    "date",
    "etag",
    "expect",
    "expires",
    "from",
    "host",
    "if-match",
    "if-modified-since",
    "if-none-match",
    "if-range",
    "if-unmodified-since",
    "last-modified",
    "location",
    "max-forwards",
    "pragma",
    "proxy-authenticate",
    "proxy-authorization",
    "range",
    "referer",
    "retry-after",
    "server",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "user-agent",
    "vary",
    "via",
    "warning",
    "www-authenticate",
    "method",
    "get",
    "status",
    "200 OK",
    "version",
    "HTTP/1.1",
    "url",
    "public",
    "set-cookie",
    "keep-alive",
    "origin",
];

/// The dictionary's tail: status codes and common values, run together without lengths.
const DICTIONARY_TAIL: &str = concat!(
    "100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505",
    "203 Non-Authoritative Information204 No Content301 Moved Permanently400 Bad Request",
    "401 Unauthorized403 Forbidden404 Not Found500 Internal Server Error501 Not Implemented",
    "503 Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 Mon, ",
    "Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,image/png,image/jpg,image/gif,",
    "application/xml,application/xhtml+xml,text/plain,text/javascript,publicprivatemax-age=",
    "gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0.",
);

/// SPDY/3's header compression dictionary.
pub fn dictionary() -> Vec<u8> {
    let mut d = Vec::with_capacity(1423);
    for w in DICTIONARY_WORDS {
        d.extend_from_slice(&(w.len() as u32).to_be_bytes());
        d.extend_from_slice(w.as_bytes());
    }
    d.extend_from_slice(DICTIONARY_TAIL.as_bytes());
    d
}

/// One frame's header, as read off the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Head {
    Control {
        version: u16,
        kind: u16,
        flags: u8,
        len: usize,
    },
    Data {
        stream: u32,
        flags: u8,
        len: usize,
    },
}

impl Head {
    fn parse(b: &[u8; 8]) -> Self {
        let first = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        let flags = b[4];
        let len = u32::from_be_bytes([0, b[5], b[6], b[7]]) as usize;
        if first & 0x8000_0000 != 0 {
            Head::Control {
                version: ((first >> 16) & 0x7fff) as u16,
                kind: (first & 0xffff) as u16,
                flags,
                len,
            }
        } else {
            Head::Data {
                stream: first & 0x7fff_ffff,
                flags,
                len,
            }
        }
    }

    fn len(self) -> usize {
        match self {
            Head::Control { len, .. } | Head::Data { len, .. } => len,
        }
    }
}

/// A data frame on `stream` carrying `payload`, the last of its stream when `fin`.
pub fn data_frame(stream: u32, fin: bool, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(8 + payload.len());
    f.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    f.push(if fin { FLAG_FIN } else { 0 });
    f.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    f.extend_from_slice(payload);
    f
}

/// The `Status` a kubelet would write on the error stream for a call that failed for `message`.
pub fn failure_status(message: &str) -> Vec<u8> {
    crate::answer::status(503, "ServiceUnavailable", message)
        .to_string()
        .into_bytes()
}

/// What the endpoint knows of one SPDY connection, from both directions.
pub struct Tracker {
    /// Bytes of the client's direction not yet a whole frame.
    client_buf: Vec<u8>,
    /// Bytes of the server's direction not yet a whole frame.
    server_buf: Vec<u8>,
    /// The client direction's header decompressor (one zlib stream for the connection).
    inflate: Decompress,
    dictionary: Vec<u8>,
    /// The error stream's id, once its `SYN_STREAM` went by.
    error_stream: Option<u32>,
    /// The host wrote on the error stream, finished it or reset it: it has said its piece.
    error_used: bool,
    /// The bytes did not parse as SPDY: pass them on, add nothing.
    lost: bool,
}

impl Default for Tracker {
    fn default() -> Self {
        Self {
            client_buf: Vec::new(),
            server_buf: Vec::new(),
            inflate: Decompress::new(true),
            dictionary: dictionary(),
            error_stream: None,
            error_used: false,
            lost: false,
        }
    }
}

/// Splits the whole frames off the front of `buf`, in order, leaving a partial one behind;
/// `None` when a control frame is not SPDY/3's.
fn whole_frames(buf: &mut Vec<u8>) -> Option<Vec<(Head, Vec<u8>)>> {
    let mut frames = Vec::new();
    let mut at = 0;
    while buf.len() - at >= 8 {
        let head = Head::parse(buf[at..at + 8].try_into().expect("8 bytes"));
        if matches!(head, Head::Control { version, .. } if version != VERSION) {
            return None;
        }
        if buf.len() - at < 8 + head.len() {
            break;
        }
        frames.push((head, buf[at..at + 8 + head.len()].to_vec()));
        at += 8 + head.len();
    }
    buf.drain(..at);
    Some(frames)
}

/// The name/value pairs of an inflated SPDY/3 header block.
fn header_pairs(block: &[u8]) -> Option<Vec<(String, String)>> {
    fn u32_at(b: &[u8], at: usize) -> Option<usize> {
        Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?) as usize)
    }
    let count = u32_at(block, 0)?;
    let mut at = 4;
    let mut pairs = Vec::with_capacity(count.min(64));
    for _ in 0..count {
        let n = u32_at(block, at)?;
        let name = block.get(at + 4..at + 4 + n)?;
        at += 4 + n;
        let v = u32_at(block, at)?;
        let value = block.get(at + 4..at + 4 + v)?;
        at += 4 + v;
        pairs.push((
            String::from_utf8_lossy(name).into_owned(),
            String::from_utf8_lossy(value).into_owned(),
        ));
    }
    Some(pairs)
}

impl Tracker {
    /// Inflates one compressed header block of the client's direction. Each block ends with a
    /// sync flush, so once all of it is in and the output had room, all of it is out.
    fn inflate(&mut self, block: &[u8]) -> Option<Vec<u8>> {
        let mut out = Vec::with_capacity(block.len() * 4 + 256);
        let mut used = 0;
        loop {
            if out.capacity() - out.len() < 256 {
                out.reserve(out.capacity());
            }
            let (before, produced) = (self.inflate.total_in(), out.len());
            let result =
                self.inflate
                    .decompress_vec(&block[used..], &mut out, FlushDecompress::Sync);
            let taken = (self.inflate.total_in() - before) as usize;
            used += taken;
            match result {
                Ok(_) if used == block.len() && out.len() < out.capacity() => return Some(out),
                Ok(_) if taken == 0 && out.len() == produced => return None,
                Ok(_) => {}
                Err(e) if e.needs_dictionary().is_some() => {
                    self.inflate.set_dictionary(&self.dictionary).ok()?;
                }
                Err(_) => return None,
            }
        }
    }

    /// Reads bytes the client sent towards the host (passed on unchanged by the caller).
    pub fn client(&mut self, bytes: &[u8]) {
        if self.lost {
            return;
        }
        self.client_buf.extend_from_slice(bytes);
        let Some(frames) = whole_frames(&mut self.client_buf) else {
            self.lost = true;
            return;
        };
        for (head, frame) in frames {
            let Head::Control { kind, .. } = head else {
                continue;
            };
            // Every header block of this direction goes through the one decompressor, in order,
            // whether or not its headers matter here.
            let (skip, stream) = match kind {
                SYN_STREAM => (18, frame.get(8..12)),
                SYN_REPLY | HEADERS => (12, frame.get(8..12)),
                _ => continue,
            };
            let (Some(block), Some(stream)) = (frame.get(skip..), stream) else {
                self.lost = true;
                return;
            };
            let stream = u32::from_be_bytes(stream.try_into().expect("4 bytes")) & 0x7fff_ffff;
            let Some(pairs) = self.inflate(block).as_deref().and_then(header_pairs) else {
                self.lost = true;
                return;
            };
            if kind == SYN_STREAM
                && pairs
                    .iter()
                    .any(|(k, v)| k.eq_ignore_ascii_case("streamtype") && v == "error")
            {
                self.error_stream = Some(stream);
            }
        }
    }

    /// Reads bytes the host sent towards the client and returns those that complete whole
    /// frames, to be written on; the rest waits for the next call.
    pub fn server(&mut self, bytes: &[u8]) -> Vec<u8> {
        if self.lost {
            return bytes.to_vec();
        }
        self.server_buf.extend_from_slice(bytes);
        let Some(frames) = whole_frames(&mut self.server_buf) else {
            self.lost = true;
            return std::mem::take(&mut self.server_buf);
        };
        let mut out = Vec::new();
        for (head, frame) in frames {
            match head {
                Head::Data { stream, flags, len }
                    if Some(stream) == self.error_stream && (len > 0 || flags & FLAG_FIN != 0) =>
                {
                    self.error_used = true;
                }
                Head::Control {
                    kind: RST_STREAM, ..
                } if frame
                    .get(8..12)
                    .map(|s| u32::from_be_bytes(s.try_into().expect("4 bytes")) & 0x7fff_ffff)
                    == self.error_stream =>
                {
                    self.error_used = true
                }
                _ => {}
            }
            out.extend_from_slice(&frame);
        }
        out
    }

    /// The frame that ends the call with `message` as its error, when that can still be said:
    /// the error stream is known, the host has not written on it, and the bytes were SPDY.
    /// After it nothing more may be written.
    pub fn ending(&self, message: &str) -> Option<Vec<u8>> {
        if self.lost || self.error_used {
            return None;
        }
        let stream = self.error_stream?;
        Some(data_frame(stream, true, &failure_status(message)))
    }

    /// Bytes of the host's direction held back (an incomplete frame), for a connection that
    /// ends without anything added.
    pub fn held(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.server_buf)
    }
}

/// A SPDY client's framing, for tests here and of the endpoint's stream pump.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;
    use flate2::{Compress, Compression, FlushCompress};

    /// A client's side of a connection: its header compressor, as spdystream keeps it.
    pub(crate) struct Client {
        deflate: Compress,
        primed: bool,
    }

    impl Client {
        pub(crate) fn new() -> Self {
            Self {
                deflate: Compress::new(Compression::default(), true),
                primed: false,
            }
        }

        fn block(&mut self, pairs: &[(&str, &str)]) -> Vec<u8> {
            if !self.primed {
                self.deflate.set_dictionary(&dictionary()).unwrap();
                self.primed = true;
            }
            let mut raw = (pairs.len() as u32).to_be_bytes().to_vec();
            for (k, v) in pairs {
                for s in [k, v] {
                    raw.extend_from_slice(&(s.len() as u32).to_be_bytes());
                    raw.extend_from_slice(s.as_bytes());
                }
            }
            let mut out = Vec::with_capacity(raw.len() + 128);
            let before = self.deflate.total_in();
            self.deflate
                .compress_vec(&raw, &mut out, FlushCompress::Sync)
                .unwrap();
            assert_eq!(self.deflate.total_in() - before, raw.len() as u64);
            out
        }

        pub(crate) fn syn_stream(&mut self, stream: u32, kind: &str) -> Vec<u8> {
            let block = self.block(&[("streamtype", kind), ("port", "")]);
            let mut f = vec![0x80, 0x03, 0x00, SYN_STREAM as u8, 0];
            f.extend_from_slice(&((10 + block.len()) as u32).to_be_bytes()[1..]);
            f.extend_from_slice(&stream.to_be_bytes());
            f.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
            f.extend_from_slice(&block);
            f
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::Client;
    use super::*;

    #[test]
    fn the_dictionary_is_spdy3s() {
        let d = dictionary();
        assert_eq!(d.len(), 1423);
        assert_eq!(&d[..11], b"\0\0\0\x07options");
        assert!(d.ends_with(b",*,enq=0."));
    }

    #[test]
    fn the_error_stream_is_found_among_streams_in_any_split() {
        let mut c = Client::new();
        let mut wire = Vec::new();
        wire.extend(c.syn_stream(1, "stdin"));
        wire.extend(data_frame(1, false, b"typed"));
        wire.extend(c.syn_stream(3, "error"));
        wire.extend(c.syn_stream(5, "stdout"));
        for split in [1, 3, 7, 8, 9, 40, wire.len()] {
            let mut t = Tracker::default();
            for chunk in wire.chunks(split) {
                t.client(chunk);
            }
            assert_eq!(t.error_stream, Some(3), "split {split}");
            let end = t.ending("bye").expect("the error stream is known");
            assert_eq!(&end[..4], &3u32.to_be_bytes());
            assert_eq!(end[4], FLAG_FIN);
            let status: serde_json::Value = serde_json::from_slice(&end[8..]).unwrap();
            assert_eq!(status["status"], "Failure");
            assert_eq!(status["message"], "bye");
            assert_eq!(
                u32::from_be_bytes([0, end[5], end[6], end[7]]) as usize,
                end.len() - 8
            );
        }
    }

    #[test]
    fn host_frames_pass_whole_and_a_status_from_the_host_is_never_followed_by_ours() {
        let mut c = Client::new();
        let mut t = Tracker::default();
        t.client(&c.syn_stream(1, "error"));
        t.client(&c.syn_stream(3, "stdout"));
        let out = data_frame(3, false, b"hello");
        // Half a frame is held back; the rest completes it.
        assert!(t.server(&out[..6]).is_empty());
        assert_eq!(t.server(&out[6..]), out);
        assert!(
            t.ending("x").is_some(),
            "stdout data says nothing of the error stream"
        );
        // The host's own status (a command that ended) must stay the only one.
        let status = data_frame(1, true, br#"{"status":"Success"}"#);
        assert_eq!(t.server(&status), status);
        assert_eq!(t.ending("x"), None);
    }

    #[test]
    fn a_reset_error_stream_or_bytes_that_are_not_spdy_add_nothing() {
        let mut c = Client::new();
        let mut t = Tracker::default();
        t.client(&c.syn_stream(1, "error"));
        let mut rst = vec![0x80, 0x03, 0x00, RST_STREAM as u8, 0, 0, 0, 8];
        rst.extend_from_slice(&1u32.to_be_bytes());
        rst.extend_from_slice(&5u32.to_be_bytes());
        assert_eq!(t.server(&rst), rst);
        assert_eq!(t.ending("x"), None);

        let mut t = Tracker::default();
        t.client(&[
            0x80, 0x03, 0x00, 0x01, 0, 0, 0, 12, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 2,
        ]);
        assert!(t.lost, "a header block that is not zlib");
        assert_eq!(t.server(b"abc"), b"abc", "passed on as it is");
        assert_eq!(t.ending("x"), None);

        let mut t = Tracker::default();
        t.client(&[0x80, 0x02, 0x00, 0x01, 0, 0, 0, 0]);
        assert!(t.lost, "a control frame of SPDY/2");
    }

    #[test]
    fn no_error_stream_seen_means_nothing_to_add() {
        let mut c = Client::new();
        let mut t = Tracker::default();
        t.client(&c.syn_stream(1, "data"));
        assert_eq!(t.ending("x"), None);
    }
}
