//! Gossip packet encryption: the cluster key (`vigil keygen`), and the envelope every SWIM packet
//! travels in. An envelope is `version (1 byte) | body`: version 0 is clear text (no key
//! configured), version 1 is `nonce (12) | ChaCha20-Poly1305 ciphertext + tag (16)` with the
//! version byte as associated data. A node with a key accepts only sealed packets and a node
//! without one only clear packets; anything else is dropped and counted.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use chacha20poly1305::aead::{Aead, AeadCore, KeyInit, OsRng, Payload, rand_core::RngCore};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};

/// Length of a gossip key in bytes.
pub const KEY_LEN: usize = 32;
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
        "the gossip key must decode to exactly {KEY_LEN} bytes, got {len}; generate one with `vigil keygen`"
    )]
    WrongLength { len: usize },
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
    #[error("packet failed authentication (different gossip key, or corrupted)")]
    Authentication,
}

/// The cluster's gossip key, ready to seal and open packets.
#[derive(Clone)]
pub struct Keyring {
    cipher: ChaCha20Poly1305,
}

impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Keyring(<redacted>)")
    }
}

/// A new random gossip key, base64-encoded (what `vigil keygen` prints).
pub fn generate_key() -> String {
    let mut key = [0u8; KEY_LEN];
    OsRng.fill_bytes(&mut key);
    BASE64.encode(key)
}

impl Keyring {
    /// Parses a base64 key (surrounding whitespace ignored); it must decode to exactly 32 bytes.
    pub fn from_base64(encoded: &str) -> Result<Keyring, KeyError> {
        let bytes = BASE64.decode(encoded.trim())?;
        let key: [u8; KEY_LEN] = bytes
            .as_slice()
            .try_into()
            .map_err(|_| KeyError::WrongLength { len: bytes.len() })?;
        Ok(Keyring::from_bytes(&key))
    }

    pub fn from_bytes(key: &[u8; KEY_LEN]) -> Keyring {
        Keyring {
            cipher: ChaCha20Poly1305::new(Key::from_slice(key)),
        }
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

    /// The plaintext of a packet made by [`Keyring::seal`] with the same key.
    pub fn open(&self, packet: &[u8]) -> Result<Vec<u8>, OpenError> {
        match packet.first() {
            None => return Err(OpenError::Empty),
            Some(&VERSION_SEALED) => {}
            Some(&VERSION_CLEAR) => return Err(OpenError::NotEncrypted),
            Some(&other) => return Err(OpenError::UnknownVersion(other)),
        }
        if packet.len() < 1 + NONCE_LEN + TAG_LEN {
            return Err(OpenError::Truncated);
        }
        let (nonce, ciphertext) = packet[1..].split_at(NONCE_LEN);
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

/// Seals outgoing and opens incoming packets with the node's key (or in the clear without one),
/// and counts the packets it had to drop.
#[derive(Debug)]
pub struct Envelope {
    keyring: Option<Keyring>,
    /// Packets dropped because they did not open: wrong key, clear text on an encrypted cluster,
    /// garbage. Exposed so operators (and tests) can see a key mismatch.
    failures: AtomicU64,
}

impl Envelope {
    pub fn new(keyring: Option<Keyring>) -> Envelope {
        Envelope {
            keyring,
            failures: AtomicU64::new(0),
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

    /// The foca packet inside `packet`; a failure is counted before it is returned.
    pub fn open(&self, packet: &[u8]) -> Result<Vec<u8>, OpenError> {
        let opened = match (&self.keyring, packet.first()) {
            (Some(keyring), _) => keyring.open(packet),
            (None, None) => Err(OpenError::Empty),
            (None, Some(&VERSION_CLEAR)) => Ok(packet[1..].to_vec()),
            (None, Some(&VERSION_SEALED)) => Err(OpenError::NoKey),
            (None, Some(&other)) => Err(OpenError::UnknownVersion(other)),
        };
        if opened.is_err() {
            self.failures.fetch_add(1, Ordering::Relaxed);
        }
        opened
    }

    /// Whether packets are sealed (a key is configured).
    pub fn is_encrypted(&self) -> bool {
        self.keyring.is_some()
    }

    /// How many received packets were dropped because they did not open.
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keyring() -> Keyring {
        Keyring::from_base64(&generate_key()).unwrap()
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
        let receiver = Envelope::new(Some(keyring()));
        let packet = sender.seal(b"hello");
        assert_eq!(receiver.open(&packet), Err(OpenError::Authentication));
        assert_eq!(receiver.failures(), 1);
        assert_eq!(sender.open(&packet).unwrap(), b"hello");
        assert_eq!(sender.failures(), 0);
    }

    #[test]
    fn tampering_is_detected() {
        let env = Envelope::new(Some(keyring()));
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

    #[test]
    fn clear_and_sealed_do_not_mix() {
        let clear = Envelope::new(None);
        let sealed = Envelope::new(Some(keyring()));
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
        let short = BASE64.encode([0u8; 16]);
        let err = Keyring::from_base64(&short).unwrap_err();
        assert!(matches!(err, KeyError::WrongLength { len: 16 }), "{err}");
        assert!(err.to_string().contains("exactly 32 bytes"), "{err}");

        let long = BASE64.encode([0u8; 33]);
        assert!(matches!(
            Keyring::from_base64(&long),
            Err(KeyError::WrongLength { len: 33 })
        ));
        assert!(matches!(
            Keyring::from_base64("not base64!"),
            Err(KeyError::NotBase64(_))
        ));
        assert!(matches!(
            Keyring::from_base64(""),
            Err(KeyError::WrongLength { len: 0 })
        ));
        // Whitespace around a pasted key is fine.
        let key = generate_key();
        assert!(Keyring::from_base64(&format!(" {key}\n")).is_ok());
    }
}
