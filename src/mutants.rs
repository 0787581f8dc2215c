//! Deliberately broken variants of the driver, for the chaos run's checker (issue 16): a
//! checker that never fails proves nothing. They exist only in a build with the
//! `chaos-mutants` cargo feature (`npm run build:chaos-mutants`, written to
//! `target/chaos-mutants/`, never to the package), and even there only when
//! `DOKEBI_LOCK_REDIS_CHAOS_MUTANT` names one. The shipped addon has none of this code:
//! without the feature, [`active`] is the constant `None` (docs/decisions/0057).

use std::sync::LazyLock;

use crate::scripts::{LuaScript, ACQUIRE, RELEASE, RELEASE_KEYED};

/// One deliberate defect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mutant {
    /// Release deletes the key without comparing the owner token.
    ReleaseWithoutOwnerCheck,
    /// `minReplicas` is accepted but WAIT is never sent (every write counts as replicated).
    SkipWait,
    /// A missing fence counter restarts from 1 instead of TIME ms × 1000.
    CounterRestarts,
}

impl Mutant {
    /// The names `DOKEBI_LOCK_REDIS_CHAOS_MUTANT` takes (read only by the mutant build).
    #[cfg_attr(not(feature = "chaos-mutants"), allow(dead_code))]
    fn from_name(name: &str) -> Option<Self> {
        match name {
            "release-without-owner-check" => Some(Self::ReleaseWithoutOwnerCheck),
            "skip-wait" => Some(Self::SkipWait),
            "counter-restarts" => Some(Self::CounterRestarts),
            _ => None,
        }
    }
}

/// The mutant this process runs, read once from the environment. An unknown name panics at
/// the first use: a mutant run that silently ran the real driver would "pass".
#[cfg(feature = "chaos-mutants")]
fn active() -> Option<Mutant> {
    static ACTIVE: LazyLock<Option<Mutant>> =
        LazyLock::new(|| {
            let name = crate::switches::chaos_mutant()?;
            Some(Mutant::from_name(&name).unwrap_or_else(|| {
                panic!("DOKEBI_LOCK_REDIS_CHAOS_MUTANT: unknown mutant {name:?}")
            }))
        });
    *ACTIVE
}

/// Without the `chaos-mutants` feature there is no mutant, whatever the environment says.
#[cfg(not(feature = "chaos-mutants"))]
const fn active() -> Option<Mutant> {
    None
}

/// The script this process runs in place of `real`: `real`, unless the active mutant
/// patches it (the production files' one hook into this module, with [`skips_wait`]).
pub(crate) fn script(real: &'static LuaScript) -> &'static LuaScript {
    static COUNTER_RESTARTS: LazyLock<LuaScript> = LazyLock::new(|| patched(&ACQUIRE, COUNTER));
    static WITHOUT_OWNER_CHECK: LazyLock<[LuaScript; 2]> =
        LazyLock::new(|| [patched(&RELEASE, OWNER_CHECK), patched(&RELEASE_KEYED, OWNER_CHECK)]);
    match active() {
        Some(Mutant::CounterRestarts) if std::ptr::eq(real, &*ACQUIRE) => &COUNTER_RESTARTS,
        Some(Mutant::ReleaseWithoutOwnerCheck) if std::ptr::eq(real, &*RELEASE) => {
            &WITHOUT_OWNER_CHECK[0]
        }
        Some(Mutant::ReleaseWithoutOwnerCheck) if std::ptr::eq(real, &*RELEASE_KEYED) => {
            &WITHOUT_OWNER_CHECK[1]
        }
        _ => real,
    }
}

/// `minReplicas` is accepted but WAIT is never sent (`skip-wait`).
pub(crate) fn skips_wait() -> bool {
    active() == Some(Mutant::SkipWait)
}

/// A line of a real script (which must be there) and what a mutant puts in its place.
type Patch = (&'static str, &'static str);

/// A missing fence counter restarts from 1.
const COUNTER: Patch = ("if fence == 1 then", "if false then");
/// Release deletes whatever holds the key.
const OWNER_CHECK: Patch =
    ("if redis.call('GET', KEYS[1]) ~= ARGV[1] then", "if redis.call('EXISTS', KEYS[1]) == 0 then");

/// `real` with one line patched: keeps each mutant one defect away from what ships.
fn patched(real: &LuaScript, (marker, replacement): Patch) -> LuaScript {
    assert!(real.source.contains(marker), "chaos mutant: the script no longer has {marker:?}");
    let source = real.source.replacen(marker, replacement, 1);
    LuaScript::new(real.name, Box::leak(source.into_boxed_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutant_names_are_the_documented_ones() {
        assert_eq!(
            Mutant::from_name("release-without-owner-check"),
            Some(Mutant::ReleaseWithoutOwnerCheck)
        );
        assert_eq!(Mutant::from_name("skip-wait"), Some(Mutant::SkipWait));
        assert_eq!(Mutant::from_name("counter-restarts"), Some(Mutant::CounterRestarts));
        assert_eq!(Mutant::from_name("none"), None);
    }

    #[test]
    fn the_mutant_patches_still_find_their_lines_in_the_real_scripts() {
        // A script edit that moved a marker would make the mutant build panic at its first
        // use; this says so in `cargo test` instead.
        patched(&ACQUIRE, COUNTER);
        patched(&RELEASE, OWNER_CHECK);
        patched(&RELEASE_KEYED, OWNER_CHECK);
    }

    #[cfg(not(feature = "chaos-mutants"))]
    #[test]
    fn a_build_without_the_feature_has_no_mutant_whatever_the_environment_says() {
        std::env::set_var("DOKEBI_LOCK_REDIS_CHAOS_MUTANT", "skip-wait");
        assert_eq!(active(), None);
    }
}
