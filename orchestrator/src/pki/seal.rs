//! Sealing the secrets the inventory keeps with the inventory key (pure: bytes in, bytes out).
//!
//! Each tenant's etcd encryption keys are the inventory's truth: a later backup of a tenant's
//! etcd, encrypted with them, must be readable after the host cluster is lost, so they cannot
//! live only in host Secrets. Postgres holds them sealed with the **inventory key** (a key
//! encryption key, `vcp serve --inventory-key`): XChaCha20-Poly1305, a fresh random 192-bit
//! nonce per seal (random nonces of that size never repeat in practice, so no counter is kept),
//! stored beside the ciphertext with the id of the inventory key that sealed it.
//!
//! The associated data names what a sealed value is for ([`associated_data`]: the tenant's id
//! and the key's name): a row copied onto another tenant, or renamed, no longer opens, so
//! someone who can write the inventory but does not hold the inventory key cannot make one
//! tenant's apiserver use another tenant's key. A changed bit anywhere fails the tag.

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use sha2::{Digest, Sha256};

/// Why a value could not be sealed or opened, or the inventory key not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    #[error(
        "--inventory-key must be the base64 of 32 random bytes (e.g. `head -c 32 /dev/urandom | base64`): {0}"
    )]
    BadInventoryKey(String),
    #[error(
        "{what} was sealed with inventory key {sealed_with}, and this replica has inventory key {have}"
    )]
    OtherKey {
        what: String,
        sealed_with: String,
        have: String,
    },
    #[error("{0} does not open with the inventory key: it was changed, or belongs elsewhere")]
    Tampered(String),
}

/// Length of the inventory key and of the keys it seals.
pub const KEY_LEN: usize = 32;

/// The inventory key (a key encryption key). Its `Debug` shows only its id.
#[derive(Clone)]
pub struct InventoryKey {
    key: [u8; KEY_LEN],
    id: String,
}

impl std::fmt::Debug for InventoryKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InventoryKey")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// A sealed value as the inventory stores it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sealed {
    /// The id of the inventory key that sealed it ([`InventoryKey::id`]).
    pub key_id: String,
    pub nonce: Vec<u8>,
    /// The ciphertext with its 16-byte tag.
    pub ciphertext: Vec<u8>,
}

/// The associated data of tenant `tenant_id`'s encryption key `name`: what the sealed bytes
/// are bound to. Length-prefixed parts, so no two (id, name) pairs give the same bytes.
pub fn associated_data(tenant_id: i64, name: &str) -> Vec<u8> {
    let mut aad = b"vcp/tenant-encryption-key/v1".to_vec();
    for part in [tenant_id.to_string().as_bytes(), name.as_bytes()] {
        aad.extend_from_slice(&(part.len() as u64).to_be_bytes());
        aad.extend_from_slice(part);
    }
    aad
}

impl InventoryKey {
    /// The key from its base64 text (standard alphabet, padding optional, surrounding blanks
    /// ignored).
    pub fn from_base64(text: &str) -> Result<InventoryKey, SealError> {
        use base64::Engine as _;
        let text = text.trim();
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text)
            .or_else(|_| base64::engine::general_purpose::STANDARD_NO_PAD.decode(text))
            .map_err(|e| SealError::BadInventoryKey(e.to_string()))?;
        let key: [u8; KEY_LEN] = bytes.as_slice().try_into().map_err(|_| {
            SealError::BadInventoryKey(format!("it decodes to {} bytes", bytes.len()))
        })?;
        Ok(InventoryKey::new(key))
    }

    pub fn new(key: [u8; KEY_LEN]) -> InventoryKey {
        // An id that tells keys apart without saying anything about them: 8 bytes of a
        // domain-separated SHA-256 of a 256-bit random key.
        let mut h = Sha256::new();
        h.update(b"vcp/inventory-key-id\0");
        h.update(key);
        let id = vcp_pki::hex(&h.finalize()[..8]);
        InventoryKey { key, id }
    }

    /// Names this key in the inventory (beside everything it sealed), in errors and in logs.
    pub fn id(&self) -> &str {
        &self.id
    }

    fn cipher(&self) -> XChaCha20Poly1305 {
        XChaCha20Poly1305::new(&self.key.into())
    }

    /// Seals `plaintext`, bound to `aad`.
    pub fn seal(&self, plaintext: &[u8], aad: &[u8]) -> Sealed {
        let nonce = vcp_pki::random_bytes::<24>();
        let ciphertext = self
            .cipher()
            .encrypt(
                &XNonce::from(nonce),
                Payload {
                    msg: plaintext,
                    aad,
                },
            )
            .expect("sealing a short value in memory cannot fail");
        Sealed {
            key_id: self.id.clone(),
            nonce: nonce.to_vec(),
            ciphertext,
        }
    }

    /// Opens what [`InventoryKey::seal`] sealed with the same `aad`; `what` names it in errors.
    pub fn open(&self, what: &str, sealed: &Sealed, aad: &[u8]) -> Result<Vec<u8>, SealError> {
        if sealed.key_id != self.id {
            return Err(SealError::OtherKey {
                what: what.to_owned(),
                sealed_with: sealed.key_id.clone(),
                have: self.id.clone(),
            });
        }
        let nonce: [u8; 24] = sealed
            .nonce
            .as_slice()
            .try_into()
            .map_err(|_| SealError::Tampered(what.to_owned()))?;
        self.cipher()
            .decrypt(
                &XNonce::from(nonce),
                Payload {
                    msg: &sealed.ciphertext,
                    aad,
                },
            )
            .map_err(|_| SealError::Tampered(what.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine as _;
    use proptest::prelude::*;

    fn kek(byte: u8) -> InventoryKey {
        InventoryKey::new([byte; KEY_LEN])
    }

    #[test]
    fn a_sealed_key_opens_with_the_same_inventory_key_and_binding() {
        let k = kek(7);
        let aad = associated_data(42, "key1");
        let s = k.seal(b"thirty-two bytes of data key....", &aad);
        assert_eq!(s.key_id, k.id());
        assert_eq!(s.nonce.len(), 24);
        assert_eq!(s.ciphertext.len(), 32 + 16, "the plaintext and its tag");
        assert!(!s.ciphertext.windows(8).any(|w| w == b"thirty-t"));
        assert_eq!(
            k.open("key1", &s, &aad).unwrap(),
            b"thirty-two bytes of data key...."
        );
        // Two seals of one value share nothing: nonces are fresh.
        let again = k.seal(b"thirty-two bytes of data key....", &aad);
        assert_ne!(again.nonce, s.nonce);
        assert_ne!(again.ciphertext, s.ciphertext);
    }

    #[test]
    fn a_changed_ciphertext_nonce_or_tag_is_refused() {
        let k = kek(1);
        let aad = associated_data(1, "key1");
        let s = k.seal(&[9; 32], &aad);
        for i in 0..s.ciphertext.len() {
            let mut bad = s.clone();
            bad.ciphertext[i] ^= 0x01;
            assert_eq!(
                k.open("key1", &bad, &aad),
                Err(SealError::Tampered("key1".into())),
                "byte {i} flipped"
            );
        }
        let mut bad = s.clone();
        bad.nonce[0] ^= 0x80;
        assert!(matches!(
            k.open("key1", &bad, &aad),
            Err(SealError::Tampered(_))
        ));
        let mut short = s.clone();
        short.nonce.pop();
        assert!(matches!(
            k.open("key1", &short, &aad),
            Err(SealError::Tampered(_))
        ));
        let mut cut = s;
        cut.ciphertext.truncate(10);
        assert!(matches!(
            k.open("key1", &cut, &aad),
            Err(SealError::Tampered(_))
        ));
    }

    #[test]
    fn a_row_moved_to_another_tenant_or_name_does_not_open() {
        let k = kek(3);
        let s = k.seal(&[5; 32], &associated_data(10, "key1"));
        assert!(k.open("key1", &s, &associated_data(11, "key1")).is_err());
        assert!(k.open("key2", &s, &associated_data(10, "key2")).is_err());
        // Parts cannot slide into each other: (1, "0key") is not (10, "key").
        assert_ne!(associated_data(1, "0key"), associated_data(10, "key"));
        assert!(k.open("key", &s, &associated_data(1, "0key1")).is_err());
    }

    #[test]
    fn another_inventory_key_is_named_not_tried() {
        let (a, b) = (kek(1), kek(2));
        assert_ne!(a.id(), b.id());
        let aad = associated_data(1, "key1");
        let s = a.seal(&[0; 32], &aad);
        let e = b.open("tenant 1's key1", &s, &aad).unwrap_err();
        assert_eq!(
            e,
            SealError::OtherKey {
                what: "tenant 1's key1".into(),
                sealed_with: a.id().into(),
                have: b.id().into()
            }
        );
        // A row whose key id was rewritten to the reader's still fails the tag.
        let forged = Sealed {
            key_id: b.id().into(),
            ..s
        };
        assert!(matches!(
            b.open("key1", &forged, &aad),
            Err(SealError::Tampered(_))
        ));
    }

    #[test]
    fn the_flag_takes_32_bytes_of_base64_and_says_how_to_make_one() {
        let b64 = base64::engine::general_purpose::STANDARD.encode([4u8; 32]);
        let k = InventoryKey::from_base64(&format!(" {b64}\n")).unwrap();
        assert_eq!(k.id(), kek(4).id());
        let no_pad = b64.trim_end_matches('=');
        assert_eq!(InventoryKey::from_base64(no_pad).unwrap().id(), kek(4).id());
        for bad in ["", "not base64!", "c2hvcnQ="] {
            let e = InventoryKey::from_base64(bad).unwrap_err().to_string();
            assert!(e.contains("head -c 32 /dev/urandom | base64"), "{bad}: {e}");
        }
        assert!(!format!("{k:?}").contains(&b64), "Debug shows the id only");
    }

    proptest! {
        /// Whatever the value and binding, sealing then opening gives it back, and any
        /// other binding is refused.
        #[test]
        fn seal_then_open_round_trips(value in proptest::collection::vec(any::<u8>(), 0..64),
                                      id in any::<i64>(), name in "[a-z0-9]{1,12}") {
            let k = kek(9);
            let aad = associated_data(id, &name);
            let s = k.seal(&value, &aad);
            prop_assert_eq!(k.open(&name, &s, &aad).unwrap(), value);
            prop_assert!(k.open(&name, &s, &associated_data(id.wrapping_add(1), &name)).is_err());
        }
    }
}
