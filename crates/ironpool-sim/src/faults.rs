//! The fault model: which faults a run may inject, and the budget that keeps
//! every block recoverable.
//!
//! Faults fall in two families:
//! - **Harmless to any correct engine by construction**: latency spikes,
//!   reordered completions, and crashes (lost and torn unflushed writes on every
//!   device). The txg protocol (data, flush, uberblock, flush) is what makes a
//!   crash recoverable; these hit every device, good or bad.
//! - **Damage** (EIO and bit flips on reads, EIO, ENOSPC, bit flips and
//!   misdirection on writes, bit rot at rest, a device vanishing): injected only
//!   on devices in the *bad set*. A group (top-level vdev) may have at most
//!   `tolerated_bad` bad devices at once, so every block always has a good copy on
//!   a device that never lied. A device leaves the bad set only after a heal
//!   proved it whole again (its faults off, a scrub, a commit, then a second scrub
//!   that finds no bad copy and a label probe that sees the newest uberblock).
//!   Any read error, wrong data or scrub error is then an engine bug.

use std::fmt;

/// A kind of fault the simulator can inject.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum FaultKind {
    /// Some I/Os take a long extra delay.
    Latency,
    /// Latency drawn over a wide range, so completions overtake each other.
    Reorder,
    /// Reads fail with EIO (bad devices).
    ReadError,
    /// Reads return a flipped bit; the media is intact (bad devices).
    ReadCorrupt,
    /// Writes fail with EIO (bad devices).
    WriteError,
    /// Writes are stored with a flipped bit (bad devices).
    WriteCorrupt,
    /// Writes land at a wrong nearby offset (bad devices).
    Misdirect,
    /// Bits flip at rest in written sectors (bad devices).
    Rot,
    /// Writes fail with ENOSPC (bad devices).
    NoSpace,
    /// A device disappears and comes back later (bad devices).
    Vanish,
    /// Power loss: unflushed writes lost or torn on every device, then import.
    Crash,
}

impl FaultKind {
    pub const ALL: [FaultKind; 11] = [
        FaultKind::Latency,
        FaultKind::Reorder,
        FaultKind::ReadError,
        FaultKind::ReadCorrupt,
        FaultKind::WriteError,
        FaultKind::WriteCorrupt,
        FaultKind::Misdirect,
        FaultKind::Rot,
        FaultKind::NoSpace,
        FaultKind::Vanish,
        FaultKind::Crash,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Latency => "latency",
            FaultKind::Reorder => "reorder",
            FaultKind::ReadError => "read-error",
            FaultKind::ReadCorrupt => "read-corrupt",
            FaultKind::WriteError => "write-error",
            FaultKind::WriteCorrupt => "write-corrupt",
            FaultKind::Misdirect => "misdirect",
            FaultKind::Rot => "rot",
            FaultKind::NoSpace => "nospace",
            FaultKind::Vanish => "vanish",
            FaultKind::Crash => "crash",
        }
    }

    /// True for the kinds that damage a device (bad-set faults).
    pub fn is_damage(self) -> bool {
        !matches!(
            self,
            FaultKind::Latency | FaultKind::Reorder | FaultKind::Crash
        )
    }
}

/// The set of enabled fault kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FaultSet(u32);

impl FaultSet {
    pub fn none() -> FaultSet {
        FaultSet(0)
    }

    pub fn all() -> FaultSet {
        FaultKind::ALL
            .iter()
            .fold(FaultSet(0), |set, kind| set.with(*kind))
    }

    pub fn with(self, kind: FaultKind) -> FaultSet {
        FaultSet(self.0 | 1 << kind as u32)
    }

    pub fn has(self, kind: FaultKind) -> bool {
        self.0 & (1 << kind as u32) != 0
    }

    /// True when some damage kind is enabled (a bad set is worth having).
    pub fn any_damage(self) -> bool {
        FaultKind::ALL
            .iter()
            .any(|kind| kind.is_damage() && self.has(*kind))
    }

    /// Parses `none`, `all`, or a comma-separated list of kind names.
    pub fn parse(text: &str) -> Result<FaultSet, String> {
        match text {
            "none" | "" => return Ok(FaultSet::none()),
            "all" => return Ok(FaultSet::all()),
            _ => {}
        }
        let mut set = FaultSet::none();
        for name in text.split(',') {
            let name = name.trim();
            let kind = FaultKind::ALL
                .iter()
                .find(|kind| kind.name() == name)
                .ok_or_else(|| {
                    let known: Vec<&str> = FaultKind::ALL.iter().map(|kind| kind.name()).collect();
                    format!(
                        "unknown fault '{name}' (none, all, or a list of: {})",
                        known.join(", ")
                    )
                })?;
            set = set.with(*kind);
        }
        Ok(set)
    }
}

impl fmt::Display for FaultSet {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        if *self == FaultSet::all() {
            return write!(formatter, "all");
        }
        let names: Vec<&str> = FaultKind::ALL
            .iter()
            .filter(|kind| self.has(**kind))
            .map(|kind| kind.name())
            .collect();
        if names.is_empty() {
            write!(formatter, "none")
        } else {
            write!(formatter, "{}", names.join(","))
        }
    }
}

/// Why a device is in the bad set (what it may be doing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BadState {
    /// Faults switched on (some subset of the enabled damage kinds).
    Faulty,
    /// Vanished: every I/O fails.
    Vanished,
    /// Back from vanishing, or faults switched off: stale or damaged until healed.
    Stale,
}

/// The bad set: per device, None (good: never faults) or why it is bad.
pub struct Budget {
    pub groups: Vec<usize>,
    pub tolerated: Vec<usize>,
    pub bad: Vec<Option<BadState>>,
}

impl Budget {
    pub fn new(device_groups: Vec<usize>, tolerated: Vec<usize>) -> Budget {
        let count = device_groups.len();
        Budget {
            groups: device_groups,
            tolerated,
            bad: vec![None; count],
        }
    }

    /// Devices of `group` in the bad set now.
    pub fn bad_in_group(&self, group: usize) -> usize {
        self.groups
            .iter()
            .zip(&self.bad)
            .filter(|(device_group, state)| **device_group == group && state.is_some())
            .count()
    }

    /// Devices that may turn bad now without exceeding their group's redundancy.
    pub fn may_turn_bad(&self) -> Vec<usize> {
        (0..self.bad.len())
            .filter(|device| {
                self.bad[*device].is_none()
                    && self.bad_in_group(self.groups[*device])
                        < self.tolerated[self.groups[*device]]
            })
            .collect()
    }

    pub fn mark(&mut self, device: usize, state: BadState) {
        if self.bad[device].is_none() {
            let group = self.groups[device];
            assert!(
                self.bad_in_group(group) < self.tolerated[group],
                "fault budget exceeded: group {group} already has {} bad devices",
                self.bad_in_group(group)
            );
        }
        self.bad[device] = Some(state);
    }

    pub fn devices_in(&self, state: BadState) -> Vec<usize> {
        (0..self.bad.len())
            .filter(|device| self.bad[*device] == Some(state))
            .collect()
    }
}
