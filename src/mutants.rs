//! Deliberately broken variants of the driver, for the chaos run's checker (issue 16): a
//! checker that never fails proves nothing. They exist only in a build with the
//! `chaos-mutants` cargo feature (`npm run build:chaos-mutants`, written to
//! `target/chaos-mutants/`, never to the package), and even there only when
//! `DOKEBI_LOCK_REDIS_CHAOS_MUTANT` names one. The shipped addon has none of this code:
//! without the feature, [`active`] is the constant `None` (docs/decisions/0057).

/// One deliberate defect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mutant {
    /// Release deletes the key without comparing the owner token.
    ReleaseWithoutOwnerCheck,
    /// `minReplicas` is accepted but WAIT is never sent (every write counts as replicated).
    SkipWait,
    /// A missing fence counter restarts from 1 instead of TIME ms × 1000.
    CounterRestarts,
}

impl Mutant {
    /// The names `DOKEBI_LOCK_REDIS_CHAOS_MUTANT` takes.
    pub fn from_name(name: &str) -> Option<Self> {
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
pub fn active() -> Option<Mutant> {
    static ACTIVE: std::sync::LazyLock<Option<Mutant>> =
        std::sync::LazyLock::new(|| {
            let name = crate::switches::chaos_mutant()?;
            Some(Mutant::from_name(&name).unwrap_or_else(|| {
                panic!("DOKEBI_LOCK_REDIS_CHAOS_MUTANT: unknown mutant {name:?}")
            }))
        });
    *ACTIVE
}

/// Without the `chaos-mutants` feature there is no mutant, whatever the environment says.
#[cfg(not(feature = "chaos-mutants"))]
pub const fn active() -> Option<Mutant> {
    None
}

/// The Lua of a mutated script: `source` with `marker` (a line that must be there) replaced.
/// Patching the real script keeps each mutant one defect away from what ships.
pub fn patch(source: &str, marker: &str, replacement: &str) -> String {
    assert!(source.contains(marker), "chaos mutant: the script no longer has {marker:?}");
    source.replacen(marker, replacement, 1)
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

    #[cfg(not(feature = "chaos-mutants"))]
    #[test]
    fn a_build_without_the_feature_has_no_mutant_whatever_the_environment_says() {
        std::env::set_var("DOKEBI_LOCK_REDIS_CHAOS_MUTANT", "skip-wait");
        assert_eq!(active(), None);
    }
}
