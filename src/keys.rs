//! Lock keys: validation and the Redis key layout shared with every driver of a namespace.

use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::error::{LockError, LockErrorCode};

/// The Redis names of one lock key. The original key is not kept: it never reaches Redis,
/// logs or errors, only its SHA-256.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KeyNames {
    /// Lowercase hex SHA-256 of the key's UTF-8; also the release notification payload.
    /// Shared (not copied) with the key's wait line.
    pub hash: Arc<str>,
    /// `<namespace>:lock:{<hash>}`, holds the owner token with PX.
    pub lock: String,
    /// `<namespace>:lock-fence:{<hash>}`, the fencing counter; never expires.
    pub fence: String,
}

impl KeyNames {
    /// The names of `key` in `namespace`.
    pub fn new(namespace: &str, key: &str) -> Self {
        KeyLayout::new(namespace).names(key)
    }
}

/// A backend's key name prefixes, built once: naming a key runs on the JS thread for every
/// acquire (its wait line is keyed by the hash), so it is one digest, a hex encoding on the
/// stack and one allocation per name (docs/perf/README.md).
#[derive(Debug, Clone)]
pub(crate) struct KeyLayout {
    lock: String,
    fence: String,
}

impl KeyLayout {
    pub(crate) fn new(namespace: &str) -> Self {
        // The shared hash tag {…} puts both keys in one Cluster slot, so one script can touch both.
        Self { lock: format!("{namespace}:lock:{{"), fence: format!("{namespace}:lock-fence:{{") }
    }

    pub(crate) fn names(&self, key: &str) -> KeyNames {
        let mut hex = [0u8; 64];
        hex::encode_to_slice(Sha256::digest(key.as_bytes()), &mut hex)
            .expect("a SHA-256 is 32 bytes, 64 in hex");
        let hash = std::str::from_utf8(&hex).expect("hex is ASCII");
        let name = |prefix: &str| {
            let mut name = String::with_capacity(prefix.len() + hash.len() + 1);
            name.push_str(prefix);
            name.push_str(hash);
            name.push('}');
            name
        };
        KeyNames { lock: name(&self.lock), fence: name(&self.fence), hash: hash.into() }
    }
}

/// `<namespace>:lock-released`, where release publishes the key hash.
pub(crate) fn released_channel(namespace: &str) -> String {
    format!("{namespace}:lock-released")
}

/// `<namespace>:lock-released:{`: with a key's hash and `}`, the channel of that key alone
/// (`notifications: 'per-key'`). The lock key's hash tag, so in a Cluster the channel
/// lives in the key's slot (sharded pub/sub, decision 0060). Build channels with
/// [`KeyChannels`].
fn key_released_prefix(namespace: &str) -> String {
    format!("{namespace}:lock-released:{{")
}

/// The per-key release channels of one namespace, `<namespace>:lock-released:{<hash>}`:
/// the one place their names are built and read back.
#[derive(Debug, Clone)]
pub(crate) struct KeyChannels {
    prefix: String,
}

impl KeyChannels {
    pub(crate) fn new(namespace: &str) -> Self {
        Self { prefix: key_released_prefix(namespace) }
    }

    /// The channel of the key whose hash is `hash`.
    pub(crate) fn channel(&self, hash: &str) -> String {
        let mut channel = String::with_capacity(self.prefix.len() + hash.len() + 1);
        channel.push_str(&self.prefix);
        channel.push_str(hash);
        channel.push('}');
        channel
    }

    /// The key hash of one of these channels, or None for any other channel.
    pub(crate) fn hash_of<'a>(&self, channel: &'a str) -> Option<&'a str> {
        channel.strip_prefix(self.prefix.as_str())?.strip_suffix('}')
    }
}

/// Validates a key given as UTF-16 code units, before any conversion: a lone surrogate
/// would otherwise become U+FFFD and share a lock with a real U+FFFD.
pub(crate) fn validate_utf16(units: &[u16], max_key_bytes: u32) -> Result<String, LockError> {
    if units.is_empty() {
        return Err(LockError::new(LockErrorCode::InvalidKey, "the lock key must not be empty"));
    }
    let key = String::from_utf16(units).map_err(|_| {
        LockError::new(
            LockErrorCode::InvalidKey,
            "the lock key must be well-formed UTF-16 (it has a lone surrogate)",
        )
    })?;
    if key.len() > max_key_bytes as usize {
        return Err(LockError::new(
            LockErrorCode::InvalidKey,
            format!("the lock key must be at most maxKeyBytes ({max_key_bytes}) UTF-8 bytes"),
        ));
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_keys_channel_is_named_after_its_hash_and_read_back_to_it() {
        let channels = KeyChannels::new("svc");
        let names = KeyNames::new("svc", "job:1");
        let channel = channels.channel(&names.hash);
        assert_eq!(channel, format!("svc:lock-released:{{{}}}", names.hash));
        assert_eq!(channels.hash_of(&channel), Some(&*names.hash));
        assert_eq!(channels.hash_of("svc:lock-released"), None, "the namespace channel");
        assert_eq!(KeyChannels::new("other").hash_of(&channel), None, "another namespace");
    }

    fn utf16(s: &str) -> Vec<u16> {
        s.encode_utf16().collect()
    }

    #[test]
    fn layout_matches_the_contract() {
        let k = KeyNames::new("svc", "job:1");
        // sha256("job:1")
        assert_eq!(&*k.hash, hex::encode(Sha256::digest(b"job:1")));
        assert_eq!(k.hash.len(), 64);
        assert!(k.hash.chars().all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c)));
        assert_eq!(k.lock, format!("svc:lock:{{{}}}", k.hash));
        assert_eq!(k.fence, format!("svc:lock-fence:{{{}}}", k.hash));
        assert_eq!(released_channel("svc"), "svc:lock-released");
    }

    #[test]
    fn a_known_digest_is_lowercase_hex_of_the_utf8() {
        assert_eq!(
            &*KeyNames::new("n", "abc").hash,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn lone_surrogates_are_rejected_and_never_share_a_lock_with_replacement_char() {
        let lone = validate_utf16(&[0xD800], 1024).unwrap_err();
        assert_eq!(lone.code, LockErrorCode::InvalidKey);
        assert!(validate_utf16(&[0x61, 0xDC00], 1024).is_err());
        assert_eq!(validate_utf16(&utf16("\u{FFFD}"), 1024).unwrap(), "\u{FFFD}");
        // A proper surrogate pair is fine.
        assert_eq!(validate_utf16(&utf16("🔒"), 1024).unwrap(), "🔒");
    }

    #[test]
    fn size_is_counted_in_utf8_bytes() {
        assert!(validate_utf16(&utf16("é"), 2).is_ok());
        assert!(validate_utf16(&utf16("é"), 1).is_err());
        assert!(validate_utf16(&utf16(&"a".repeat(1024)), 1024).is_ok());
        let e = validate_utf16(&utf16(&"secret".repeat(200)), 1024).unwrap_err();
        assert!(!e.message.contains("secret"));
        assert_eq!(validate_utf16(&[], 1024).unwrap_err().code, LockErrorCode::InvalidKey);
    }
}
