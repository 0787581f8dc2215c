//! The three Lua scripts and the validation of their replies.

use std::borrow::Cow;
use std::sync::LazyLock;

use redis::{Script, Value};
use smallvec::{smallvec, SmallVec};

use crate::connection::ScriptCall;
use crate::keys::{self, KeyChannels, KeyNames};
use crate::mutants;
use crate::options::NotificationMode;

/// One script: its source for EVAL and its SHA-1 for EVALSHA (computed by redis-rs).
pub struct LuaScript {
    pub name: &'static str,
    pub source: &'static str,
    script: Script,
}

impl LuaScript {
    pub(crate) fn new(name: &'static str, source: &'static str) -> Self {
        Self { name, source, script: Script::new(source) }
    }
    pub fn sha(&self) -> &str {
        self.script.get_hash()
    }
}

pub(crate) static ACQUIRE: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new("acquire", ACQUIRE_SOURCE));
pub(crate) static RELEASE: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new("release", RELEASE_SOURCE));
/// Release for `notifications: 'per-key'` and `'both'` (release.lua stays the default's).
pub(crate) static RELEASE_KEYED: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new("release_keyed", RELEASE_KEYED_SOURCE));
pub(crate) static RENEW: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new("renew", RENEW_SOURCE));
/// Rewrites a lease that is still ours before a WAIT in a Cluster (decision 0142).
pub(crate) static CONFIRM: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new("confirm", CONFIRM_SOURCE));

/// The acquire script this process runs: [`ACQUIRE`], unless a chaos mutant replaces it
/// (only in a `chaos-mutants` build, see [`crate::mutants`]).
pub(crate) fn acquire() -> &'static LuaScript {
    mutants::script(&ACQUIRE)
}

/// The release script this process runs: [`RELEASE`], or [`RELEASE_KEYED`] for per-key
/// notifications, unless a chaos mutant replaces them.
fn release(keyed: bool) -> &'static LuaScript {
    mutants::script(if keyed { &RELEASE_KEYED } else { &RELEASE })
}

pub(crate) const ACQUIRE_SOURCE: &str = include_str!("scripts/acquire.lua");
pub(crate) const RELEASE_SOURCE: &str = include_str!("scripts/release.lua");
pub(crate) const RENEW_SOURCE: &str = include_str!("scripts/renew.lua");
pub(crate) const CONFIRM_SOURCE: &str = include_str!("scripts/confirm.lua");
/// The release script of per-key notifications.
pub const RELEASE_KEYED_SOURCE: &str = include_str!("scripts/release_keyed.lua");

/// Where a release announces itself, per `notifications` (decision 0060).
pub(crate) struct ReleaseChannels {
    mode: NotificationMode,
    /// `<namespace>:lock-released`.
    namespace: String,
    /// `<namespace>:lock-released:{<hash>}`.
    key_channels: KeyChannels,
    /// SPUBLISH (Cluster), falling back to PUBLISH where the server lacks it.
    sharded: bool,
}

impl ReleaseChannels {
    pub(crate) fn new(namespace: &str, mode: NotificationMode, cluster: bool) -> Self {
        Self {
            mode,
            namespace: keys::released_channel(namespace),
            key_channels: KeyChannels::new(namespace),
            sharded: cluster,
        }
    }

    /// The release script for `keys` and `token`. The namespace default sends exactly what
    /// the TypeScript driver sends.
    pub(crate) fn call<'a>(&'a self, keys: &'a KeyNames, token: &'a str) -> ScriptCall<'a> {
        if self.mode == NotificationMode::Namespace {
            return ScriptCall {
                script: release(false),
                keys: smallvec![&*keys.lock],
                args: smallvec![token.into(), self.namespace.as_str().into(), (&*keys.hash).into()],
            };
        }
        let mut args: SmallVec<_> = smallvec![
            token.into(),
            self.key_channels.channel(&keys.hash).into(),
            (&*keys.hash).into(),
            if self.sharded { "1" } else { "0" }.into(),
        ];
        if self.mode == NotificationMode::Both {
            args.push(self.namespace.as_str().into());
        }
        ScriptCall { script: release(true), keys: smallvec![&*keys.lock], args }
    }
}

/// ARGV of the acquire script after the token: leaseMs, and fenceTtlMs when given. Without
/// a `fenceTtlMs` the arguments are the same two as before the option existed. Written once
/// per driver, since the options do not change.
pub(crate) struct AcquireArgs {
    lease_ms: String,
    fence_ttl_ms: Option<String>,
}

impl AcquireArgs {
    pub(crate) fn new(lease_ms: u32, fence_ttl_ms: Option<u64>) -> Self {
        Self { lease_ms: lease_ms.to_string(), fence_ttl_ms: fence_ttl_ms.map(|t| t.to_string()) }
    }

    /// The whole ARGV for `token`.
    pub(crate) fn with_token<'a>(&'a self, token: &'a str) -> SmallVec<[Cow<'a, str>; 5]> {
        let mut args: SmallVec<_> = smallvec![token.into(), self.lease_ms.as_str().into()];
        args.extend(self.fence_ttl_ms.as_deref().map(Cow::from));
        args
    }
}

/// What an acquire reply means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AcquireReply {
    /// Ours, with this fence (a positive decimal string, compared as a big integer).
    Acquired(String),
    /// Held by another token; the holder's PTTL, or `None` from a pre-0.1.4 script.
    Busy(Option<i64>),
}

/// Anything but a positive decimal string, an integer of at least -2, or nil is not a
/// reply our script gives: the caller treats it as OUTCOME_UNKNOWN.
pub(crate) fn parse_acquire(reply: &Value) -> Option<AcquireReply> {
    match reply {
        Value::BulkString(bytes) => positive_decimal(bytes).map(AcquireReply::Acquired),
        Value::SimpleString(s) => positive_decimal(s.as_bytes()).map(AcquireReply::Acquired),
        Value::Int(pttl) if *pttl >= -2 => Some(AcquireReply::Busy(Some(*pttl))),
        Value::Nil => Some(AcquireReply::Busy(None)),
        _ => None,
    }
}

fn positive_decimal(bytes: &[u8]) -> Option<String> {
    let valid = !bytes.is_empty()
        && bytes.len() <= 20
        && bytes[0] != b'0'
        && bytes.iter().all(u8::is_ascii_digit);
    valid.then(|| String::from_utf8(bytes.to_vec()).ok()).flatten()
}

/// What a release reply means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReleaseReply {
    /// The key was no longer ours.
    NotOurs,
    /// This call deleted the key; `listeners` subscriber connections heard the notification.
    Deleted { listeners: u64 },
}

/// Release answers 0 (not ours) or 1 + the listeners of its notification.
pub(crate) fn parse_release(reply: &Value) -> Option<ReleaseReply> {
    match reply {
        Value::Int(0) => Some(ReleaseReply::NotOurs),
        Value::Int(n) if *n >= 1 => Some(ReleaseReply::Deleted { listeners: (*n - 1) as u64 }),
        _ => None,
    }
}

/// Renew answers 1 (done) or 0 (not ours); anything else is unexpected.
pub(crate) fn parse_flag(reply: &Value) -> Option<bool> {
    match reply {
        Value::Int(1) => Some(true),
        Value::Int(0) => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn acquire_reply_accepts_only_what_the_script_sends() {
        assert_eq!(
            parse_acquire(&bulk("1764672000123001")),
            Some(AcquireReply::Acquired("1764672000123001".into()))
        );
        assert_eq!(
            parse_acquire(&bulk("18446744073709551615")),
            Some(AcquireReply::Acquired("18446744073709551615".into()))
        );
        assert_eq!(parse_acquire(&Value::Int(1234)), Some(AcquireReply::Busy(Some(1234))));
        assert_eq!(parse_acquire(&Value::Int(-1)), Some(AcquireReply::Busy(Some(-1))));
        assert_eq!(parse_acquire(&Value::Int(-2)), Some(AcquireReply::Busy(Some(-2))));
        assert_eq!(parse_acquire(&Value::Nil), Some(AcquireReply::Busy(None)));
        for bad in [
            bulk("0"),
            bulk("-5"),
            bulk("1.5e15"),
            bulk("01"),
            bulk(""),
            bulk("12a"),
            Value::Int(-3),
            Value::Okay,
            Value::Array(vec![]),
        ] {
            assert_eq!(parse_acquire(&bad), None, "{bad:?}");
        }
    }

    #[test]
    fn flags_are_one_or_zero() {
        assert_eq!(parse_flag(&Value::Int(1)), Some(true));
        assert_eq!(parse_flag(&Value::Int(0)), Some(false));
        assert_eq!(parse_flag(&Value::Int(2)), None);
        assert_eq!(parse_flag(&Value::Nil), None);
    }

    #[test]
    fn release_replies_say_whether_it_deleted_and_who_listened() {
        assert_eq!(parse_release(&Value::Int(0)), Some(ReleaseReply::NotOurs));
        assert_eq!(parse_release(&Value::Int(1)), Some(ReleaseReply::Deleted { listeners: 0 }));
        assert_eq!(parse_release(&Value::Int(5)), Some(ReleaseReply::Deleted { listeners: 4 }));
        for bad in [Value::Int(-1), Value::Nil, Value::Okay, bulk("1")] {
            assert_eq!(parse_release(&bad), None, "{bad:?}");
        }
    }

    #[test]
    fn scripts_have_distinct_sha1_hashes() {
        assert_eq!(ACQUIRE.sha().len(), 40);
        assert_ne!(ACQUIRE.sha(), RELEASE.sha());
        assert_ne!(RELEASE.sha(), RENEW.sha());
        assert_ne!(RELEASE.sha(), RELEASE_KEYED.sha());
    }

    #[test]
    fn the_namespace_default_releases_as_the_typescript_driver_and_per_key_on_the_keys_channel() {
        let k = KeyNames::new("svc", "job:1");
        let channels = |mode| ReleaseChannels::new("svc", mode, mode != NotificationMode::PerKey);
        let namespace = channels(NotificationMode::Namespace);
        let ns = namespace.call(&k, "tok");
        assert_eq!(ns.script.sha(), RELEASE.sha());
        assert_eq!(ns.args[..], ["tok", "svc:lock-released", &*k.hash]);
        let channel = format!("svc:lock-released:{{{}}}", k.hash);
        let keyed = channels(NotificationMode::PerKey);
        let per_key = keyed.call(&k, "tok");
        assert_eq!(per_key.script.sha(), RELEASE_KEYED.sha());
        assert_eq!(per_key.args[..], ["tok", &*channel, &*k.hash, "0"]);
        let both = channels(NotificationMode::Both);
        assert_eq!(
            both.call(&k, "tok").args[..],
            ["tok", &*channel, &*k.hash, "1", "svc:lock-released"]
        );
    }
}
