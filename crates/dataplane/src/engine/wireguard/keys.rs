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

/// This node's static private key.
#[derive(Clone)]
pub struct PrivateKey(x25519::StaticSecret);

impl PrivateKey {
    /// A new key from the operating system's random source, clamped as `wg genkey` does.
    pub fn generate() -> PrivateKey {
        let mut bytes = Zeroizing::new([0u8; KEY_LEN]);
        getrandom::fill(&mut bytes[..]).expect("the operating system's random source works");
        bytes[0] &= 248;
        bytes[31] &= 127;
        bytes[31] |= 64;
        PrivateKey(x25519::StaticSecret::from(*bytes))
    }

    pub fn from_base64(text: &str) -> Result<PrivateKey, KeyError> {
        Ok(PrivateKey(x25519::StaticSecret::from(*decode(text)?)))
    }

    /// The key's text form, for the key file only.
    pub fn to_base64(&self) -> Zeroizing<String> {
        let bytes = Zeroizing::new(self.0.to_bytes());
        Zeroizing::new(BASE64_STANDARD.encode(&bytes[..]))
    }

    pub fn public_key(&self) -> PublicKey {
        PublicKey(x25519::PublicKey::from(&self.0).to_bytes())
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
        Ok(PublicKey(*decode(text)?))
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
