//! WireGuard keys: this node's private key, the peers' public keys and the network's preshared
//! key, in WireGuard's text form (base64 of 32 bytes, as `wg` and flannel write them).
//!
//! Private and preshared keys never print: their `Debug` says only what they are, they have no
//! `Display`, and their bytes are wiped when dropped. Public keys are not secret (every node
//! publishes its own in its lease) and print as base64.

use base64::prelude::{Engine as _, BASE64_STANDARD};
use boringtun::x25519;
use std::fmt;
use std::str::FromStr;
use zeroize::Zeroizing;

/// Every WireGuard key is 32 bytes.
pub const KEY_LEN: usize = 32;

/// Why a text is not a WireGuard key. Never contains the text itself: it may be a secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("not base64")]
    NotBase64,
    #[error("{0} bytes long, a WireGuard key has 32")]
    Length(usize),
    /// A public key that is a point of small order: Diffie-Hellman with it gives the same few
    /// values whatever the private key, so a handshake would have no secret in it.
    #[error("all zero or another point of small order, with which no handshake is secret")]
    SmallOrder,
}

fn decode(text: &str) -> Result<Zeroizing<[u8; KEY_LEN]>, KeyError> {
    let bytes = Zeroizing::new(
        BASE64_STANDARD
            .decode(text)
            .map_err(|_| KeyError::NotBase64)?,
    );
    let key: [u8; KEY_LEN] = bytes
        .as_slice()
        .try_into()
        .map_err(|_| KeyError::Length(bytes.len()))?;
    Ok(Zeroizing::new(key))
}

/// This node's static private key, with its public key worked out once: every tunnel made
/// needs it, and working it out is a scalar multiplication.
#[derive(Clone)]
pub struct PrivateKey(x25519::StaticSecret, PublicKey);

impl PrivateKey {
    /// A new key from the operating system's random source, clamped as `wg genkey` does.
    pub fn generate() -> PrivateKey {
        let mut bytes = Zeroizing::new([0u8; KEY_LEN]);
        getrandom::fill(&mut bytes[..]).expect("the operating system's random source works");
        bytes[0] &= 248;
        bytes[31] &= 127;
        bytes[31] |= 64;
        PrivateKey::from_secret(x25519::StaticSecret::from(*bytes))
    }

    pub fn from_base64(text: &str) -> Result<PrivateKey, KeyError> {
        Ok(PrivateKey::from_secret(x25519::StaticSecret::from(
            *decode(text)?,
        )))
    }

    fn from_secret(secret: x25519::StaticSecret) -> PrivateKey {
        let public = PublicKey(x25519::PublicKey::from(&secret).to_bytes());
        PrivateKey(secret, public)
    }

    /// The key's text form, for the key file only.
    pub fn to_base64(&self) -> Zeroizing<String> {
        let bytes = Zeroizing::new(self.0.to_bytes());
        Zeroizing::new(BASE64_STANDARD.encode(&bytes[..]))
    }

    pub fn public_key(&self) -> PublicKey {
        self.1
    }

    /// The raw key, for the kernel's WireGuard (which takes it over netlink).
    pub fn to_bytes(&self) -> Zeroizing<[u8; KEY_LEN]> {
        Zeroizing::new(self.0.to_bytes())
    }

    pub(crate) fn secret(&self) -> &x25519::StaticSecret {
        &self.0
    }
}

impl fmt::Debug for PrivateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PrivateKey(..)")
    }
}

/// A node's public key: what its lease publishes and what names it in a handshake.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PublicKey(pub [u8; KEY_LEN]);

impl FromStr for PublicKey {
    type Err = KeyError;

    fn from_str(text: &str) -> Result<PublicKey, KeyError> {
        let key = PublicKey(*decode(text)?);
        if key.has_small_order() {
            return Err(KeyError::SmallOrder);
        }
        Ok(key)
    }
}

/// The Curve25519 points of small order, as libsodium lists them (`crypto_scalarmult` refuses
/// them): 0, 1, two points of order 8, and p-1, p, p+1 written without reduction.
const SMALL_ORDER: [[u8; KEY_LEN]; 7] = [
    [0; 32],
    one(),
    [
        0xe0, 0xeb, 0x7a, 0x7c, 0x3b, 0x41, 0xb8, 0xae, 0x16, 0x56, 0xe3, 0xfa, 0xf1, 0x9f, 0xc4,
        0x6a, 0xda, 0x09, 0x8d, 0xeb, 0x9c, 0x32, 0xb1, 0xfd, 0x86, 0x62, 0x05, 0x16, 0x5f, 0x49,
        0xb8, 0x00,
    ],
    [
        0x5f, 0x9c, 0x95, 0xbc, 0xa3, 0x50, 0x8c, 0x24, 0xb1, 0xd0, 0xb1, 0x55, 0x9c, 0x83, 0xef,
        0x5b, 0x04, 0x44, 0x5c, 0xc4, 0x58, 0x1c, 0x8e, 0x86, 0xd8, 0x22, 0x4e, 0xdd, 0xd0, 0x9f,
        0x11, 0x57,
    ],
    p_plus(0xec),
    p_plus(0xed),
    p_plus(0xee),
];

/// 1, little-endian.
const fn one() -> [u8; KEY_LEN] {
    let mut key = [0; KEY_LEN];
    key[0] = 1;
    key
}

/// 2^255 - 19 + `low` - 0xed, little-endian.
const fn p_plus(low: u8) -> [u8; KEY_LEN] {
    let mut key = [0xff; KEY_LEN];
    key[0] = low;
    key[31] = 0x7f;
    key
}

impl PublicKey {
    /// Whether Diffie-Hellman with this key gives an all-zero secret. X25519 ignores the top
    /// bit of a point, so it is ignored here too.
    pub fn has_small_order(&self) -> bool {
        SMALL_ORDER
            .iter()
            .any(|bad| bad[..31] == self.0[..31] && bad[31] == self.0[31] & 0x7f)
    }
}

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&BASE64_STANDARD.encode(self.0))
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({self})")
    }
}

/// The network's optional preshared key (flannel's `PSK`), mixed into every handshake.
#[derive(Clone, PartialEq, Eq)]
pub struct PresharedKey(Zeroizing<[u8; KEY_LEN]>);

impl PresharedKey {
    pub fn from_base64(text: &str) -> Result<PresharedKey, KeyError> {
        decode(text).map(PresharedKey)
    }

    pub fn bytes(&self) -> &[u8; KEY_LEN] {
        &self.0
    }
}

impl fmt::Debug for PresharedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PresharedKey(..)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key pair, checked with `wg pubkey`.
    const PRIVATE: &str = "yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk=";
    const PUBLIC: &str = "HIgo9xNzJMWLKASShiTqIybxZ0U3wGLiUeJ1PKf8ykw=";

    #[test]
    fn public_key_of_a_known_private_key() {
        let key = PrivateKey::from_base64(PRIVATE).unwrap();
        assert_eq!(key.public_key().to_string(), PUBLIC);
        assert_eq!(*key.to_base64(), PRIVATE);
        assert_eq!(PUBLIC.parse::<PublicKey>().unwrap(), key.public_key());
    }

    #[test]
    fn generated_keys_are_clamped_and_distinct() {
        let (a, b) = (PrivateKey::generate(), PrivateKey::generate());
        assert_ne!(a.public_key(), b.public_key());
        let bytes = a.to_bytes();
        assert_eq!((bytes[0] & 7, bytes[31] & 0xc0), (0, 0x40));
    }

    #[test]
    fn bad_keys_are_refused_without_echoing_them() {
        assert_eq!("not base64!".parse::<PublicKey>(), Err(KeyError::NotBase64));
        assert_eq!("AAAA".parse::<PublicKey>(), Err(KeyError::Length(3)));
        assert!(PresharedKey::from_base64(&PUBLIC[1..]).is_err());
    }

    #[test]
    fn small_order_keys_are_refused_and_are_exactly_those_without_a_secret() {
        let ours = PrivateKey::generate();
        for bad in SMALL_ORDER {
            for top in [0, 0x80] {
                let mut key = bad;
                key[31] |= top;
                let text = BASE64_STANDARD.encode(key);
                assert_eq!(text.parse::<PublicKey>(), Err(KeyError::SmallOrder));
                let shared = ours.secret().diffie_hellman(&x25519::PublicKey::from(key));
                assert!(!shared.was_contributory(), "{text} gives a secret");
            }
        }
        let zero = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";
        assert_eq!(zero.parse::<PublicKey>(), Err(KeyError::SmallOrder));
        assert!(PUBLIC.parse::<PublicKey>().is_ok());
    }

    #[test]
    fn secrets_do_not_print() {
        let key = PrivateKey::from_base64(PRIVATE).unwrap();
        let psk = PresharedKey::from_base64(PUBLIC).unwrap();
        let shown = format!("{key:?} {psk:?}");
        assert!(
            !shown.contains(PRIVATE) && !shown.contains(PUBLIC),
            "{shown}"
        );
    }
}
