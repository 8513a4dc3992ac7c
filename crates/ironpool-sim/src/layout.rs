//! Pool layouts the simulator builds, and the redundancy each one has.
//!
//! A layout is a list of groups (top-level vdevs); a group's `tolerated_bad`
//! is how many of its devices may hold bad data at once with every block still
//! recoverable. The fault budget (see `faults`) never exceeds it. Adding RAID-Z
//! once its vdev lands is one variant here: `Raidz { parity, width }` with
//! `tolerated_bad = parity`, `kind = TopVdevKind::Raidz..`.

use ironpool::format::label::TopVdevKind;

/// A pool shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Two single-disk top-level vdevs: no redundancy for data (metadata has
    /// ditto copies), so no device fault is ever injected on it, only crashes,
    /// latency and reordering.
    Stripe,
    /// Two two-way mirrors: one bad device per mirror at a time.
    Mirror,
    /// One three-way mirror: two bad devices at a time.
    Mirror3,
}

/// One top-level vdev of a layout.
#[derive(Clone, Copy, Debug)]
pub struct Group {
    pub kind: TopVdevKind,
    pub devices: usize,
    /// Devices that may be bad at once (redundancy).
    pub tolerated_bad: usize,
}

impl Layout {
    pub const ALL: [Layout; 3] = [Layout::Stripe, Layout::Mirror, Layout::Mirror3];

    pub fn parse(text: &str) -> Result<Layout, String> {
        match text {
            "stripe" => Ok(Layout::Stripe),
            "mirror" => Ok(Layout::Mirror),
            "mirror3" => Ok(Layout::Mirror3),
            other => Err(format!("unknown layout '{other}' (stripe, mirror, mirror3)")),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Layout::Stripe => "stripe",
            Layout::Mirror => "mirror",
            Layout::Mirror3 => "mirror3",
        }
    }

    pub fn groups(self) -> Vec<Group> {
        match self {
            Layout::Stripe => vec![Group { kind: TopVdevKind::Disk, devices: 1, tolerated_bad: 0 }; 2],
            Layout::Mirror => vec![Group { kind: TopVdevKind::Mirror, devices: 2, tolerated_bad: 1 }; 2],
            Layout::Mirror3 => vec![Group { kind: TopVdevKind::Mirror, devices: 3, tolerated_bad: 2 }],
        }
    }

    /// Group index of every device, in device order.
    pub fn device_groups(self) -> Vec<usize> {
        self.groups().iter().enumerate().flat_map(|(index, group)| std::iter::repeat_n(index, group.devices)).collect()
    }
}
