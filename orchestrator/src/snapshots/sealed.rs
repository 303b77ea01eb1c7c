//! The encrypted form of a snapshot file as it is kept off the host (pure: bytes in, bytes
//! out): `vcp-backup-v1`, a chunked AEAD stream, so files of any size are sealed and opened
//! while they stream, with memory bounded by one chunk.
//!
//! Data flow: the snapshot Job's upload container feeds the file through a [`Sealer`] and sends
//! what it yields to object storage; the restore Job's fetch container feeds the object through
//! an [`Opener`] onto the snapshot claim. Layout:
//!
//! ```text
//! header  = "vcpbkp1\n" (8) | key id (u64, big-endian) | nonce prefix (15 random bytes)
//! chunk i = XChaCha20-Poly1305(key, nonce = prefix | i (u64, big-endian) | last (0 or 1),
//!                              aad = header, plaintext of CHUNK bytes (the last: 0..=CHUNK))
//! ```
//!
//! This is the STREAM construction (Hoang, Reyhanitabar, Rogaway, Vizár), as age uses it: the
//! counter in the nonce makes a reordered or repeated chunk fail its tag, the last-chunk flag
//! makes a stream cut at a chunk boundary fail (its new last chunk was sealed as not last) and
//! so does anything appended after the real last chunk, and the header as associated data of
//! every chunk makes a changed key id or prefix fail. One key seals many files, so each file's
//! nonces start from a fresh random 120-bit prefix (no two files share a nonce in practice:
//! a collision is expected after about 2^60 files). The key id names which of the tenant's
//! backup keys sealed it, so a key added later never stops older backups from opening.

use crate::{Error, Result};
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};

/// The format's magic bytes, first in every sealed file.
pub const MAGIC: &[u8; 8] = b"vcpbkp1\n";
/// Plaintext bytes per chunk (every chunk but the last is exactly this long).
pub const CHUNK: usize = 64 * 1024;
/// Bytes Poly1305 adds to each chunk.
pub const TAG: usize = 16;
/// Length of the random nonce prefix.
pub const PREFIX: usize = 15;
/// Length of the header.
pub const HEADER: usize = MAGIC.len() + 8 + PREFIX;
/// Length of a backup key.
pub const KEY_LEN: usize = 32;

fn fail(m: impl Into<String>) -> Error {
    Error::Backup(m.into())
}

fn nonce(prefix: &[u8; PREFIX], counter: u64, last: bool) -> XNonce {
    let mut n = [0u8; 24];
    n[..PREFIX].copy_from_slice(prefix);
    n[PREFIX..PREFIX + 8].copy_from_slice(&counter.to_be_bytes());
    n[23] = u8::from(last);
    XNonce::from(n)
}

/// The size of the sealed form of `plain` bytes.
pub fn sealed_len(plain: u64) -> u64 {
    let chunks = plain.div_ceil(CHUNK as u64).max(1);
    HEADER as u64 + plain + chunks * TAG as u64
}

/// The key id a sealed file names in its header; `None` if it is not one.
pub fn key_id(header: &[u8]) -> Option<u64> {
    if header.len() < HEADER || &header[..MAGIC.len()] != MAGIC {
        return None;
    }
    let id: [u8; 8] = header[MAGIC.len()..MAGIC.len() + 8].try_into().ok()?;
    Some(u64::from_be_bytes(id))
}

/// Seals a stream: [`Sealer::push`] what comes, [`Sealer::finish`] at its end; the output,
/// header first, is what is stored.
pub struct Sealer {
    cipher: XChaCha20Poly1305,
    header: Vec<u8>,
    prefix: [u8; PREFIX],
    counter: u64,
    held: Vec<u8>,
    started: bool,
}

impl Sealer {
    /// A sealer with `key` (named `key_id` in the header) and a nonce prefix that must be
    /// random and never reused with this key ([`Sealer::random`] draws one).
    pub fn new(key: &[u8; KEY_LEN], key_id: u64, prefix: [u8; PREFIX]) -> Sealer {
        let mut header = MAGIC.to_vec();
        header.extend_from_slice(&key_id.to_be_bytes());
        header.extend_from_slice(&prefix);
        Sealer {
            cipher: XChaCha20Poly1305::new(key.into()),
            header,
            prefix,
            counter: 0,
            held: Vec::with_capacity(CHUNK + 1),
            started: false,
        }
    }

    /// A sealer with a fresh random nonce prefix.
    pub fn random(key: &[u8; KEY_LEN], key_id: u64) -> Sealer {
        Sealer::new(key, key_id, vcp_pki::random_bytes::<PREFIX>())
    }

    fn seal_chunk(&mut self, plain: &[u8], last: bool, out: &mut Vec<u8>) {
        let n = nonce(&self.prefix, self.counter, last);
        let sealed = self
            .cipher
            .encrypt(
                &n,
                Payload {
                    msg: plain,
                    aad: &self.header,
                },
            )
            .expect("sealing one chunk in memory cannot fail");
        out.extend_from_slice(&sealed);
        self.counter += 1;
    }

    fn start(&mut self, out: &mut Vec<u8>) {
        if !self.started {
            out.extend_from_slice(&self.header);
            self.started = true;
        }
    }

    /// Takes more plaintext; returns the sealed bytes ready so far. A full chunk is held until
    /// more data shows it is not the last.
    pub fn push(&mut self, mut data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        self.start(&mut out);
        while !data.is_empty() {
            if self.held.len() == CHUNK {
                let chunk = std::mem::take(&mut self.held);
                self.seal_chunk(&chunk, false, &mut out);
                self.held = chunk;
                self.held.clear();
            }
            let take = (CHUNK - self.held.len()).min(data.len());
            self.held.extend_from_slice(&data[..take]);
            data = &data[take..];
        }
        out
    }

    /// Ends the stream: the last chunk (possibly empty).
    pub fn finish(mut self) -> Vec<u8> {
        let mut out = Vec::new();
        self.start(&mut out);
        let chunk = std::mem::take(&mut self.held);
        self.seal_chunk(&chunk, true, &mut out);
        out
    }
}

/// Opens a stream [`Sealer`] made: [`Opener::push`] what comes, [`Opener::finish`] at its
/// end. Nothing it yields is released before its chunk's tag checked out; a stream that is
/// cut, reordered, extended, changed or sealed with another key fails.
pub struct Opener {
    key: [u8; KEY_LEN],
    key_id: u64,
    cipher: Option<(XChaCha20Poly1305, Vec<u8>, [u8; PREFIX])>,
    counter: u64,
    held: Vec<u8>,
}

impl Opener {
    /// An opener with the tenant's backup key `key_id`.
    pub fn new(key: &[u8; KEY_LEN], key_id: u64) -> Opener {
        Opener {
            key: *key,
            key_id,
            cipher: None,
            counter: 0,
            held: Vec::new(),
        }
    }

    fn open_chunk(&mut self, len: usize, last: bool) -> Result<Vec<u8>> {
        let (cipher, header, prefix) = self.cipher.as_ref().expect("the header was read");
        let n = nonce(prefix, self.counter, last);
        let plain = cipher
            .decrypt(
                &n,
                Payload {
                    msg: &self.held[..len],
                    aad: header,
                },
            )
            .map_err(|_| {
                fail(format!(
                    "chunk {} does not open with backup key {}: the object was changed, cut, \
                     reordered or sealed with another key",
                    self.counter, self.key_id
                ))
            })?;
        self.held.drain(..len);
        self.counter += 1;
        Ok(plain)
    }

    /// Takes more of the sealed stream; returns the plaintext of every chunk known to be whole
    /// and not the last.
    pub fn push(&mut self, data: &[u8]) -> Result<Vec<u8>> {
        self.held.extend_from_slice(data);
        if self.cipher.is_none() {
            if self.held.len() < HEADER {
                return Ok(Vec::new());
            }
            let header: Vec<u8> = self.held.drain(..HEADER).collect();
            let id = key_id(&header).ok_or_else(|| fail("not a vcp-backup-v1 object"))?;
            if id != self.key_id {
                return Err(fail(format!(
                    "the object was sealed with backup key {id}, not {}",
                    self.key_id
                )));
            }
            let prefix: [u8; PREFIX] = header[HEADER - PREFIX..].try_into().expect("15 bytes");
            self.cipher = Some((XChaCha20Poly1305::new(&self.key.into()), header, prefix));
        }
        let mut out = Vec::new();
        // A whole chunk is the last only if nothing follows it.
        while self.held.len() > CHUNK + TAG {
            out.extend(self.open_chunk(CHUNK + TAG, false)?);
        }
        Ok(out)
    }

    /// Ends the stream: opens the last chunk, which must be there.
    pub fn finish(mut self) -> Result<Vec<u8>> {
        if self.cipher.is_none() {
            return Err(fail("the object ends before its header"));
        }
        if self.held.len() < TAG {
            return Err(fail(format!(
                "the object ends {} bytes into chunk {}: it was cut",
                self.held.len(),
                self.counter
            )));
        }
        let len = self.held.len();
        self.open_chunk(len, true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const KEY: [u8; 32] = [7; 32];

    fn seal(data: &[u8], cuts: &[usize]) -> Vec<u8> {
        let mut s = Sealer::new(&KEY, 3, [9; PREFIX]);
        let mut out = Vec::new();
        let mut rest = data;
        for &c in cuts {
            let c = c.min(rest.len());
            out.extend(s.push(&rest[..c]));
            rest = &rest[c..];
        }
        out.extend(s.push(rest));
        out.extend(s.finish());
        out
    }

    fn open_with(key: &[u8; 32], id: u64, sealed: &[u8], cuts: &[usize]) -> Result<Vec<u8>> {
        let mut o = Opener::new(key, id);
        let mut out = Vec::new();
        let mut rest = sealed;
        for &c in cuts {
            let c = c.min(rest.len());
            out.extend(o.push(&rest[..c])?);
            rest = &rest[c..];
        }
        out.extend(o.push(rest)?);
        out.extend(o.finish()?);
        Ok(out)
    }

    fn open(sealed: &[u8]) -> Result<Vec<u8>> {
        open_with(&KEY, 3, sealed, &[])
    }

    /// Plaintexts of zero to four chunks, lengths near the chunk boundaries included.
    fn plaintext() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..300),
            (0usize..4, 0usize..3).prop_map(|(n, d)| {
                let len = (n * CHUNK + d).saturating_sub(1);
                (0..len).map(|i| (i % 251) as u8).collect()
            }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn what_is_sealed_opens_to_itself_however_the_stream_is_cut(
            data in plaintext(),
            cuts in proptest::collection::vec(1usize..100_000, 0..6),
            ocuts in proptest::collection::vec(1usize..100_000, 0..6),
        ) {
            let sealed = seal(&data, &cuts);
            prop_assert_eq!(sealed.len() as u64, sealed_len(data.len() as u64));
            prop_assert_eq!(key_id(&sealed), Some(3));
            prop_assert_eq!(open_with(&KEY, 3, &sealed, &ocuts).unwrap(), data.clone());
            // However the sender cut it, the sealed bytes are the same.
            prop_assert_eq!(sealed, seal(&data, &[]));
        }

        #[test]
        fn a_cut_stream_is_refused(data in plaintext(), keep in 0.0f64..1.0) {
            let sealed = seal(&data, &[]);
            let len = ((sealed.len() as f64) * keep) as usize;
            prop_assume!(len < sealed.len());
            prop_assert!(open(&sealed[..len]).is_err());
        }

        #[test]
        fn a_changed_byte_is_refused(data in plaintext(), at in any::<proptest::sample::Index>(), bit in 0u8..8) {
            let mut sealed = seal(&data, &[]);
            let i = at.index(sealed.len());
            sealed[i] ^= 1 << bit;
            prop_assert!(open(&sealed).is_err());
        }

        #[test]
        fn another_key_is_refused(data in plaintext(), other in any::<[u8; 32]>()) {
            prop_assume!(other != KEY);
            let sealed = seal(&data, &[]);
            prop_assert!(open_with(&other, 3, &sealed, &[]).is_err());
            // The right key under another id is refused before any chunk is tried.
            let e = open_with(&KEY, 4, &sealed, &[]).unwrap_err().to_string();
            prop_assert!(e.contains("backup key 3, not 4"), "{}", e);
        }
    }

    #[test]
    fn reordered_repeated_or_appended_chunks_are_refused() {
        let data: Vec<u8> = (0..CHUNK * 3 + 10).map(|i| (i % 253) as u8).collect();
        let sealed = seal(&data, &[]);
        let c = CHUNK + TAG;
        let chunks: Vec<&[u8]> = sealed[HEADER..].chunks(c).collect();
        assert_eq!(chunks.len(), 4);
        let join = |order: &[usize]| {
            let mut s = sealed[..HEADER].to_vec();
            for &i in order {
                s.extend_from_slice(chunks[i]);
            }
            s
        };
        assert_eq!(open(&join(&[0, 1, 2, 3])).unwrap(), data);
        for order in [
            &[1, 0, 2, 3][..],
            &[0, 2, 1, 3],
            &[0, 1, 1, 2, 3],
            &[0, 1, 2],
            &[0, 1, 2, 3, 3],
            &[0, 1, 3],
        ] {
            assert!(open(&join(order)).is_err(), "{order:?} opened");
        }
        // A whole file sealed with the same key and prefix appended: refused.
        let mut twice = sealed.clone();
        twice.extend_from_slice(&sealed[HEADER..]);
        assert!(open(&twice).is_err());
        // A header alone, or less.
        assert!(open(&sealed[..HEADER]).is_err());
        assert!(open(&sealed[..3]).is_err());
        assert!(open(b"plain etcd snapshot bytes, not sealed at all").is_err());
    }

    #[test]
    fn two_sealings_of_one_file_share_no_bytes_after_the_key_id() {
        let data = vec![0u8; 1000];
        let (mut a, mut b) = (Sealer::random(&KEY, 1), Sealer::random(&KEY, 1));
        let (mut x, mut y) = (a.push(&data), b.push(&data));
        x.extend(a.finish());
        y.extend(b.finish());
        assert_eq!(x[..16], y[..16]);
        assert_ne!(x[16..HEADER], y[16..HEADER], "fresh prefixes");
        assert_ne!(x[HEADER..], y[HEADER..]);
        assert!(!x.windows(32).any(|w| w == [0u8; 32]), "no plaintext shows");
    }
}
