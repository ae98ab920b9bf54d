//! Gossip packet encryption: the keys (`vigil keygen`), the keyring every member holds, and the
//! envelope every packet travels in. An envelope is `version (1 byte) | body`: version 0 is clear
//! text (no keyring), version 1 is `nonce (12) | ChaCha20-Poly1305 ciphertext + tag (16)` with
//! the version byte as associated data. A node with a keyring seals with its primary key and
//! opens with any key of its ring (so a cluster can rotate keys without a gap: install a new key
//! everywhere, make it primary everywhere, remove the old one); it accepts only sealed packets,
//! and a node without one only clear packets. Anything else is dropped and counted.
//!
//! Keys are 16, 24 or 32 bytes, as Consul's (`consul keygen` made 16-byte keys before 1.10). A
//! 32-byte key is the cipher's key as it is; a shorter one is stretched to 32 bytes with
//! HKDF-SHA256, so every length seals with the same cipher and keeps its full strength.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use chacha20poly1305::aead::{Aead, AeadCore, KeyInit, OsRng, Payload, rand_core::RngCore};
use chacha20poly1305::{ChaCha20Poly1305, Nonce};

/// Length of a gossip key `vigil keygen` makes, and of the cipher's key.
pub const KEY_LEN: usize = 32;
/// The lengths a gossip key may have (Consul's: AES-128, -192 and -256 keys).
pub const KEY_LENS: [usize; 3] = [16, 24, 32];
/// HKDF salt that stretches a 16- or 24-byte key to the cipher's 32.
const STRETCH_SALT: &[u8] = b"vigil gossip key";
const NONCE_LEN: usize = 12;
const TAG_LEN: usize = 16;

/// Envelope version of a clear-text packet.
pub const VERSION_CLEAR: u8 = 0;
/// Envelope version of a ChaCha20-Poly1305 sealed packet.
pub const VERSION_SEALED: u8 = 1;

/// The most bytes an envelope adds around a foca packet; foca's `max_packet_size` is the UDP
/// budget minus this.
pub const MAX_OVERHEAD: usize = 1 + NONCE_LEN + TAG_LEN;

/// A gossip key that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("the gossip key is not valid base64 ({0}); generate one with `vigil keygen`")]
    NotBase64(#[from] base64::DecodeError),
    #[error(
        "the gossip key must decode to 16, 24 or 32 bytes, got {len}; generate one with `vigil keygen`"
    )]
    WrongLength { len: usize },
}

/// A keyring operation a member refuses; the texts are memberlist's, which Consul relays.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RingError {
    #[error("key size must be 16, 24 or 32 bytes")]
    KeySize,
    #[error("Requested key is not in the keyring")]
    NotInRing,
    #[error("Removing the primary key is not allowed")]
    RemovePrimary,
}

/// Why a received packet was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    #[error("empty packet")]
    Empty,
    #[error("unknown envelope version {0}")]
    UnknownVersion(u8),
    #[error("clear-text packet but this node requires encryption")]
    NotEncrypted,
    #[error("encrypted packet but this node has no gossip key")]
    NoKey,
    #[error("encrypted packet too short")]
    Truncated,
    #[error("packet failed authentication (no key of this node's keyring opens it, or corrupted)")]
    Authentication,
}

/// One gossip key, ready to seal and open packets.
#[derive(Clone)]
pub struct Key {
    /// As given: 16, 24 or 32 bytes.
    bytes: Vec<u8>,
    cipher: ChaCha20Poly1305,
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Key(<redacted>)")
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Key) -> bool {
        self.bytes == other.bytes
    }
}

impl Eq for Key {}

/// A new random gossip key, base64-encoded (what `vigil keygen` prints).
pub fn generate_key() -> String {
    let mut key = [0u8; KEY_LEN];
    OsRng.fill_bytes(&mut key);
    BASE64.encode(key)
}

impl Key {
    /// Parses a base64 key (surrounding whitespace ignored); it must decode to 16, 24 or 32
    /// bytes.
    pub fn from_base64(encoded: &str) -> Result<Key, KeyError> {
        let bytes = BASE64.decode(encoded.trim())?;
        Key::from_slice(&bytes).ok_or(KeyError::WrongLength { len: bytes.len() })
    }

    /// A key from raw bytes; `None` unless one of [`KEY_LENS`] long.
    pub fn from_slice(bytes: &[u8]) -> Option<Key> {
        if !KEY_LENS.contains(&bytes.len()) {
            return None;
        }
        let mut cipher_key = [0u8; KEY_LEN];
        if bytes.len() == KEY_LEN {
            cipher_key.copy_from_slice(bytes);
        } else {
            ring::hkdf::Salt::new(ring::hkdf::HKDF_SHA256, STRETCH_SALT)
                .extract(bytes)
                .expand(&[], ring::hkdf::HKDF_SHA256)
                .and_then(|okm| okm.fill(&mut cipher_key))
                .expect("HKDF-SHA256 gives 32 bytes");
        }
        Some(Key {
            bytes: bytes.to_vec(),
            cipher: ChaCha20Poly1305::new(chacha20poly1305::Key::from_slice(&cipher_key)),
        })
    }

    /// The key as given (what `vigil keygen` prints, and the keyring API lists).
    pub fn to_base64(&self) -> String {
        BASE64.encode(&self.bytes)
    }

    /// `VERSION_SEALED | nonce | ciphertext+tag`, with a fresh random nonce.
    pub fn seal(&self, plaintext: &[u8]) -> Vec<u8> {
        let nonce = ChaCha20Poly1305::generate_nonce(&mut OsRng);
        let aad = [VERSION_SEALED];
        let ciphertext = self
            .cipher
            .encrypt(
                &nonce,
                Payload {
                    msg: plaintext,
                    aad: &aad,
                },
            )
            .expect("ChaCha20-Poly1305 encryption cannot fail for packet-sized inputs");
        let mut packet = Vec::with_capacity(1 + NONCE_LEN + ciphertext.len());
        packet.push(VERSION_SEALED);
        packet.extend_from_slice(&nonce);
        packet.extend_from_slice(&ciphertext);
        packet
    }

    /// The plaintext of a packet made by [`Key::seal`] with the same key.
    pub fn open(&self, packet: &[u8]) -> Result<Vec<u8>, OpenError> {
        let (nonce, ciphertext) = sealed_parts(packet)?;
        self.cipher
            .decrypt(
                Nonce::from_slice(nonce),
                Payload {
                    msg: ciphertext,
                    aad: &packet[..1],
                },
            )
            .map_err(|_| OpenError::Authentication)
    }
}

/// The nonce and ciphertext of a sealed packet.
fn sealed_parts(packet: &[u8]) -> Result<(&[u8], &[u8]), OpenError> {
    match packet.first() {
        None => return Err(OpenError::Empty),
        Some(&VERSION_SEALED) => {}
        Some(&VERSION_CLEAR) => return Err(OpenError::NotEncrypted),
        Some(&other) => return Err(OpenError::UnknownVersion(other)),
    }
    if packet.len() < 1 + NONCE_LEN + TAG_LEN {
        return Err(OpenError::Truncated);
    }
    Ok(packet[1..].split_at(NONCE_LEN))
}

/// A member's gossip keys: the primary (first) seals what it sends; every key opens what it
/// receives. Never empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keyring {
    keys: Vec<Key>,
}

impl Keyring {
    /// A ring holding only `primary`.
    pub fn new(primary: Key) -> Keyring {
        Keyring {
            keys: vec![primary],
        }
    }

    /// A ring of `keys`, the first one primary (as a keyring file lists them); `None` when
    /// empty. Repeats are dropped.
    pub fn from_keys(keys: Vec<Key>) -> Option<Keyring> {
        let mut ring = Keyring::new(keys.first()?.clone());
        for key in keys {
            ring.install(key);
        }
        Some(ring)
    }

    pub fn primary(&self) -> &Key {
        &self.keys[0]
    }

    /// Every key, the primary first.
    pub fn keys(&self) -> &[Key] {
        &self.keys
    }

    pub fn contains(&self, key: &Key) -> bool {
        self.keys.contains(key)
    }

    /// Adds `key` (for opening only); false when it was there already.
    pub fn install(&mut self, key: Key) -> bool {
        if self.contains(&key) {
            return false;
        }
        self.keys.push(key);
        true
    }

    /// Makes the installed key `key` the primary; false when it was already.
    pub fn use_key(&mut self, key: &Key) -> Result<bool, RingError> {
        let at = self
            .keys
            .iter()
            .position(|k| k == key)
            .ok_or(RingError::NotInRing)?;
        self.keys[..=at].rotate_right(1);
        Ok(at != 0)
    }

    /// Drops `key` (a key not in the ring is no error, as in memberlist); the primary cannot
    /// go. False when it was not there.
    pub fn remove(&mut self, key: &Key) -> Result<bool, RingError> {
        if self.primary() == key {
            return Err(RingError::RemovePrimary);
        }
        let before = self.keys.len();
        self.keys.retain(|k| k != key);
        Ok(self.keys.len() != before)
    }

    /// Seals with the primary key.
    pub fn seal(&self, plaintext: &[u8]) -> Vec<u8> {
        self.primary().seal(plaintext)
    }

    /// Opens with whichever key of the ring sealed the packet.
    pub fn open(&self, packet: &[u8]) -> Result<Vec<u8>, OpenError> {
        sealed_parts(packet)?;
        self.keys
            .iter()
            .find_map(|k| k.open(packet).ok())
            .ok_or(OpenError::Authentication)
    }
}

/// Seals outgoing and opens incoming packets with the node's keyring (or in the clear without
/// one), and counts the packets it had to drop.
#[derive(Debug, Default)]
pub struct Envelope {
    keyring: Option<Keyring>,
    /// Packets dropped because they did not open: wrong key, clear text on an encrypted cluster,
    /// garbage. Exposed so operators (and tests) can see a key mismatch.
    failures: u64,
}

impl Envelope {
    pub fn new(keyring: Option<Keyring>) -> Envelope {
        Envelope {
            keyring,
            failures: 0,
        }
    }

    pub fn seal(&self, plaintext: &[u8]) -> Vec<u8> {
        match &self.keyring {
            Some(keyring) => keyring.seal(plaintext),
            None => {
                let mut packet = Vec::with_capacity(1 + plaintext.len());
                packet.push(VERSION_CLEAR);
                packet.extend_from_slice(plaintext);
                packet
            }
        }
    }

    /// The plaintext inside `packet`; a failure is counted before it is returned.
    pub fn open(&mut self, packet: &[u8]) -> Result<Vec<u8>, OpenError> {
        let opened = match (&self.keyring, packet.first()) {
            (Some(keyring), _) => keyring.open(packet),
            (None, None) => Err(OpenError::Empty),
            (None, Some(&VERSION_CLEAR)) => Ok(packet[1..].to_vec()),
            (None, Some(&VERSION_SEALED)) => Err(OpenError::NoKey),
            (None, Some(&other)) => Err(OpenError::UnknownVersion(other)),
        };
        if opened.is_err() {
            self.failures += 1;
        }
        opened
    }

    /// The keyring, `None` when packets go in the clear.
    pub fn keyring(&self) -> Option<&Keyring> {
        self.keyring.as_ref()
    }

    /// The keyring to change, `None` when packets go in the clear.
    pub fn keyring_mut(&mut self) -> Option<&mut Keyring> {
        self.keyring.as_mut()
    }

    /// How many received packets were dropped because they did not open.
    pub fn failures(&self) -> u64 {
        self.failures
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> Key {
        Key::from_base64(&generate_key()).unwrap()
    }

    fn keyring() -> Keyring {
        Keyring::new(key())
    }

    #[test]
    fn generated_keys_are_32_random_bytes() {
        let a = generate_key();
        let b = generate_key();
        assert_ne!(a, b);
        assert_eq!(BASE64.decode(&a).unwrap().len(), KEY_LEN);
    }

    #[test]
    fn sealed_packets_round_trip() {
        let keyring = keyring();
        let packet = keyring.seal(b"swim ping");
        assert_eq!(packet[0], VERSION_SEALED);
        assert_eq!(packet.len(), b"swim ping".len() + MAX_OVERHEAD);
        assert_eq!(keyring.open(&packet).unwrap(), b"swim ping");
        // A fresh nonce each time: the same plaintext never seals to the same bytes.
        assert_ne!(keyring.seal(b"swim ping"), packet);
    }

    #[test]
    fn wrong_key_fails_and_is_counted() {
        let sender = Envelope::new(Some(keyring()));
        let mut receiver = Envelope::new(Some(keyring()));
        let packet = sender.seal(b"hello");
        assert_eq!(receiver.open(&packet), Err(OpenError::Authentication));
        assert_eq!(receiver.failures(), 1);
        let mut sender = sender;
        assert_eq!(sender.open(&packet).unwrap(), b"hello");
        assert_eq!(sender.failures(), 0);
    }

    #[test]
    fn tampering_is_detected() {
        let mut env = Envelope::new(Some(keyring()));
        let mut packet = env.seal(b"hello");
        let last = packet.len() - 1;
        packet[last] ^= 1;
        assert_eq!(env.open(&packet), Err(OpenError::Authentication));
        // The version byte is authenticated too.
        let mut packet = env.seal(b"hello");
        packet[0] = 2;
        assert_eq!(env.open(&packet), Err(OpenError::UnknownVersion(2)));
        assert_eq!(env.open(&[VERSION_SEALED, 1, 2]), Err(OpenError::Truncated));
        assert_eq!(env.failures(), 3);
    }

    /// memberlist's `TestKeyring_*` with 16- and 24-byte keys: each seals and opens, prints as
    /// given, and is its own key (a key and its stretched form never open each other's
    /// packets).
    #[test]
    fn keys_of_16_and_24_bytes_seal_and_open() {
        let mut keys = Vec::new();
        for len in KEY_LENS {
            let raw: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let key = Key::from_slice(&raw).expect("a valid length");
            assert_eq!(key.to_base64(), BASE64.encode(&raw));
            assert_eq!(key.open(&key.seal(b"ping")).unwrap(), b"ping");
            keys.push(key);
        }
        let packet = keys[0].seal(b"ping");
        assert_eq!(keys[1].open(&packet), Err(OpenError::Authentication));
        assert_eq!(keys[2].open(&packet), Err(OpenError::Authentication));
        // Two members given the same 16-byte key talk.
        let again = Key::from_base64(&keys[0].to_base64()).unwrap();
        assert_eq!(again.open(&packet).unwrap(), b"ping");
    }

    #[test]
    fn clear_and_sealed_do_not_mix() {
        let mut clear = Envelope::new(None);
        let mut sealed = Envelope::new(Some(keyring()));
        let clear_packet = clear.seal(b"hi");
        assert_eq!(clear_packet, [VERSION_CLEAR, b'h', b'i']);
        assert_eq!(clear.open(&clear_packet).unwrap(), b"hi");
        assert_eq!(sealed.open(&clear_packet), Err(OpenError::NotEncrypted));
        assert_eq!(clear.open(&sealed.seal(b"hi")), Err(OpenError::NoKey));
        assert_eq!(clear.open(&[]), Err(OpenError::Empty));
        assert_eq!(clear.failures(), 2);
        assert_eq!(sealed.failures(), 1);
    }

    #[test]
    fn bad_keys_are_rejected_with_a_clear_error() {
        let short = BASE64.encode([0u8; 20]);
        let err = Key::from_base64(&short).unwrap_err();
        assert!(matches!(err, KeyError::WrongLength { len: 20 }), "{err}");
        assert!(err.to_string().contains("16, 24 or 32 bytes"), "{err}");

        let long = BASE64.encode([0u8; 33]);
        assert!(matches!(
            Key::from_base64(&long),
            Err(KeyError::WrongLength { len: 33 })
        ));
        assert!(matches!(
            Key::from_base64("not base64!"),
            Err(KeyError::NotBase64(_))
        ));
        assert!(matches!(
            Key::from_base64(""),
            Err(KeyError::WrongLength { len: 0 })
        ));
        // Whitespace around a pasted key is fine.
        let key = generate_key();
        assert!(Key::from_base64(&format!(" {key}\n")).is_ok());
    }

    #[test]
    fn a_ring_seals_with_its_primary_and_opens_with_any_key() {
        let (old, new) = (key(), key());
        let mut ring = Keyring::new(old.clone());
        let from_old = old.seal(b"old");
        let from_new = new.seal(b"new");
        assert_eq!(ring.open(&from_old).unwrap(), b"old");
        assert_eq!(ring.open(&from_new), Err(OpenError::Authentication));

        // Installed: opens both, still seals with the old one.
        assert!(ring.install(new.clone()));
        assert!(
            !ring.install(new.clone()),
            "installing twice changes nothing"
        );
        assert_eq!(ring.open(&from_new).unwrap(), b"new");
        assert_eq!(old.open(&ring.seal(b"x")).unwrap(), b"x");

        // Primary: seals with the new one; the old one cannot go while it is primary.
        assert_eq!(ring.use_key(&new), Ok(true));
        assert_eq!(ring.use_key(&new), Ok(false));
        assert_eq!(new.open(&ring.seal(b"y")).unwrap(), b"y");
        assert_eq!(ring.remove(&new), Err(RingError::RemovePrimary));
        assert_eq!(ring.keys(), [new.clone(), old.clone()]);

        // Removed: packets of the old key no longer open; removing again is no error.
        assert_eq!(ring.remove(&old), Ok(true));
        assert_eq!(ring.remove(&old), Ok(false));
        assert_eq!(ring.open(&from_old), Err(OpenError::Authentication));
        assert_eq!(ring.use_key(&old), Err(RingError::NotInRing));
        assert_eq!(
            RingError::NotInRing.to_string(),
            "Requested key is not in the keyring"
        );
        assert_eq!(
            RingError::RemovePrimary.to_string(),
            "Removing the primary key is not allowed"
        );
        assert_eq!(
            Keyring::from_keys(vec![new.clone(), old.clone(), new.clone()])
                .unwrap()
                .keys(),
            [new, old]
        );
        assert!(Keyring::from_keys(Vec::new()).is_none());
    }
}
