//! Quotas and reservations: OpenZFS's `quota`, `refquota`, `reservation`
//! and `refreservation` on volumes and filesystems.
//!
//! - `refquota` bounds what the dataset refers to (`referenced`);
//!   `quota` bounds what it and its snapshots use (`used`). A write that
//!   would take the dataset past either fails before it touches anything:
//!   `EDQUOT` for a file, `ENOSPC` for a volume (NBD has no other error
//!   for it), and nothing acknowledged before is lost.
//! - `reservation` guarantees the dataset space for what it uses,
//!   `refreservation` for what it refers to: the part not yet used is taken
//!   out of what every other dataset may write.
//!
//! How the figures are kept, as OpenZFS keeps them (`dsl_dir_tempreserve_space`):
//! each dataset remembers its figures as last computed, exactly, and adds
//! the space of every write admitted since (an upper bound: an overwrite
//! counts whole, the block it replaces is freed only later). Only when that
//! bound would cross a quota are the figures computed again: what the tree
//! refers to now, what its snapshots alone hold (their dead lists), and the
//! blocks written but not yet linked into the tree (held in memory). The
//! check is therefore exact at the limit and costs nothing away from it.
//! Reservations use the figures of each reserving dataset as of its last
//! computation, refreshed after every txg: a dataset that frees space under
//! its reservation gives it back to the others by the next txg.
//!
//! For a clone, `used` counts only the blocks born after its origin, as
//! OpenZFS counts them.
//!
//! In a tree of datasets, as in OpenZFS, a filesystem's `quota` and
//! `reservation` cover it and every dataset below it: a write to
//! `tank/home/alice` is checked against the quota of `tank/home` too (the
//! sum of the figures of the subtree's datasets), and what `tank/home`
//! reserved is not held back from the datasets below it. `refquota` and
//! `refreservation` stay the dataset's own.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use crate::pool::PoolError;
use crate::rt::sync::Semaphore;

/// A quota's or a reservation's value as stored: its bytes, or `none`
/// (also for 0), from `value` as given to property `name`.
pub fn limit_value(name: &str, value: &str) -> Result<String, PoolError> {
    if value == "none" {
        return Ok("none".into());
    }
    if value == "auto" {
        // A volume's `auto` is its size, resolved before this (volumes
        // only: a filesystem has no size to reserve).
        return Err(PoolError::InvalidArgument(format!(
            "{name}=auto: only a volume's refreservation can be auto (its size and indirect blocks); give a size or none"
        )));
    }
    let bytes = crate::units::parse_size(value).map_err(|error| {
        PoolError::InvalidArgument(format!("{name} '{value}': {error}; or none"))
    })?;
    Ok(match bytes {
        0 => "none".into(),
        bytes => bytes.to_string(),
    })
}

/// A dataset's space limits (0: none), from its own properties (they are
/// not inherited, as in OpenZFS).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpaceLimits {
    pub quota: u64,
    pub refquota: u64,
    pub reservation: u64,
    pub refreservation: u64,
}

impl SpaceLimits {
    /// Whether a write must be checked against a quota.
    pub fn has_quota(&self) -> bool {
        self.quota != 0 || self.refquota != 0
    }

    /// Whether the dataset holds space back from the others.
    pub fn has_reservation(&self) -> bool {
        self.reservation != 0 || self.refreservation != 0
    }

    /// Whether the dataset's figures are kept fresh after each txg (for
    /// its reservation, or its quota).
    pub fn is_limited(&self) -> bool {
        self.has_reservation() || self.has_quota()
    }

    /// Space held back for the dataset and not used by it, given its
    /// figures.
    pub fn unused_reservation(&self, used: u64, referenced: u64) -> u64 {
        self.reservation
            .saturating_sub(used)
            .max(self.refreservation.saturating_sub(referenced))
    }
}

/// A dataset's space as last computed, and what writes admitted since may
/// add.
#[derive(Clone, Copy, Debug, Default)]
pub(in crate::pool) struct Usage {
    /// Whether the figures were ever computed (since open).
    pub(in crate::pool) known: bool,
    /// `used`: what it refers to and what its snapshots alone hold, with
    /// the blocks held in memory for it when computed.
    pub(in crate::pool) used: u64,
    /// `referenced`, with the blocks held in memory for it when computed.
    pub(in crate::pool) referenced: u64,
    /// The part of `used` its snapshots alone held: kept for when the dead
    /// lists move under a computation.
    pub(in crate::pool) snapshots: u64,
    /// Bytes of writes admitted since.
    pub(in crate::pool) since: u64,
}

/// The space figures one dataset keeps for its quota and reservation
/// checks.
pub struct UsageEstimate {
    pub(in crate::pool) usage: Cell<Usage>,
    /// Bytes of writes admitted whose blocks are neither linked nor held
    /// yet ([`Admitted`]): a computation counts them, as it cannot see
    /// them in the tree or in memory.
    pub(in crate::pool) in_flight: Cell<u64>,
    /// One computation at a time: each takes out of `since` what was
    /// there when it started, and one ending after a later one would take
    /// it twice.
    pub(in crate::pool) computing: Rc<Semaphore>,
    /// Its reservation's part it does not use, as last counted
    /// ([`Pool::recount_reservations`]).
    pub(in crate::pool) unused_reserved: Cell<u64>,
    /// Metadata admitted by changes of names and attributes, by the txg
    /// they went into: it takes its space when that txg is built, so a
    /// computation before then counts it (without it, a loop of `touch`
    /// passed a quota by what one txg's creates add). One entry per txg
    /// not yet durable.
    pub(in crate::pool) metadata: RefCell<std::collections::BTreeMap<u64, u64>>,
}

impl Default for UsageEstimate {
    fn default() -> UsageEstimate {
        UsageEstimate {
            usage: Cell::default(),
            in_flight: Cell::new(0),
            computing: Semaphore::new(1),
            unused_reserved: Cell::new(0),
            metadata: RefCell::default(),
        }
    }
}

/// A write admitted to its dataset ([`crate::pool::Pool::admit_to_dataset`]), kept by
/// the write until its blocks are linked into the tree or held in memory.
#[must_use]
pub struct Admitted<'a> {
    pub(in crate::pool) estimate: Option<&'a UsageEstimate>,
    pub(in crate::pool) bytes: u64,
}

impl Admitted<'_> {
    /// The space admitted (allocated size): what its file's owners'
    /// quotas count too.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        if let Some(estimate) = self.estimate {
            estimate
                .in_flight
                .set(estimate.in_flight.get().saturating_sub(self.bytes));
        }
    }
}

impl UsageEstimate {
    /// `used` and `referenced` at most, now.
    pub(in crate::pool) fn bound(&self) -> (u64, u64) {
        let usage = self.usage.get();
        (
            usage.used.saturating_add(usage.since),
            usage.referenced.saturating_add(usage.since),
        )
    }

    /// Counts a write of `bytes` admitted, in flight until the guard goes.
    pub(in crate::pool) fn admitted(&self, bytes: u64) -> Admitted<'_> {
        let mut usage = self.usage.get();
        usage.since = usage.since.saturating_add(bytes);
        self.usage.set(usage);
        self.in_flight
            .set(self.in_flight.get().saturating_add(bytes));
        Admitted {
            estimate: Some(self),
            bytes,
        }
    }

    /// Figures as last computed (used, referenced), if ever.
    pub fn last(&self) -> Option<(u64, u64)> {
        let usage = self.usage.get();
        usage.known.then_some((usage.used, usage.referenced))
    }
}

/// The ways a write exceeds a limit.
pub(in crate::pool) fn exceeded(
    name: &str,
    limits: &SpaceLimits,
    (used, referenced): (u64, u64),
    bytes: u64,
) -> Option<String> {
    if limits.refquota != 0 && referenced.saturating_add(bytes) > limits.refquota {
        return Some(format!(
            "{name}: a write of {bytes} bytes would pass its refquota of {} ({referenced} referenced)",
            limits.refquota
        ));
    }
    if limits.quota != 0 && used.saturating_add(bytes) > limits.quota {
        return Some(format!(
            "{name}: a write of {bytes} bytes would pass its quota of {} ({used} used)",
            limits.quota
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_bound_writes_and_hold_space_back() {
        let limits = SpaceLimits {
            quota: 100,
            refquota: 60,
            reservation: 80,
            refreservation: 0,
        };
        assert!(exceeded("t", &limits, (50, 50), 10).is_none());
        assert!(exceeded("t", &limits, (50, 50), 11)
            .unwrap()
            .contains("refquota"));
        assert!(exceeded("t", &limits, (95, 10), 6)
            .unwrap()
            .contains("quota of 100"));
        assert_eq!(limits.unused_reservation(30, 30), 50);
        assert_eq!(limits.unused_reservation(90, 30), 0);
        let refres = SpaceLimits {
            refreservation: 40,
            ..SpaceLimits::default()
        };
        assert_eq!(refres.unused_reservation(100, 10), 30);
        assert!(!SpaceLimits::default().has_quota());
        assert!(!SpaceLimits::default().has_reservation());
    }

    #[test]
    fn the_bound_counts_writes_admitted_since() {
        let estimate = UsageEstimate::default();
        assert_eq!(estimate.last(), None);
        estimate.usage.set(Usage {
            known: true,
            used: 10,
            referenced: 7,
            snapshots: 3,
            since: 0,
        });
        let admitted = estimate.admitted(5);
        assert_eq!(estimate.bound(), (15, 12));
        assert_eq!(estimate.last(), Some((10, 7)));
        assert_eq!(estimate.in_flight.get(), 5);
        drop(admitted);
        assert_eq!(estimate.in_flight.get(), 0);
        // Linked since: the bound still counts it until computed again.
        assert_eq!(estimate.bound(), (15, 12));
    }
}
