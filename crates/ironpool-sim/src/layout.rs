//! Pool layouts the simulator builds, and the redundancy each one has.
//!
//! A layout is a list of groups (top-level vdevs); a group's `tolerated_bad`
//! is how many of its devices may hold bad data at once with every block still
//! recoverable. The fault budget (see `faults`) never exceeds it: for a mirror
//! it is the copies less one, for RAID-Z its parity.

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
    /// One RAID-Z1 group of four devices: one bad device at a time.
    Raidz1,
    /// One RAID-Z2 group of six devices: two bad devices at a time.
    Raidz2,
    /// One RAID-Z3 group of seven devices: three bad devices at a time.
    Raidz3,
    /// One two-way mirror and a log device: every intent-log block lands on
    /// the log device, so crashes hit log writes and flushes there and replay
    /// reads it. The log device is never damaged (a lost log device is a
    /// refused import, tested against the real binary).
    MirrorLog,
}

/// One top-level vdev of a layout.
#[derive(Clone, Copy, Debug)]
pub struct Group {
    pub kind: TopVdevKind,
    pub devices: usize,
    /// Devices that may be bad at once (redundancy).
    pub tolerated_bad: usize,
    /// A log vdev: it holds intent-log blocks only.
    pub log: bool,
}

impl Layout {
    pub const ALL: [Layout; 7] = [
        Layout::Stripe,
        Layout::Mirror,
        Layout::Mirror3,
        Layout::Raidz1,
        Layout::Raidz2,
        Layout::Raidz3,
        Layout::MirrorLog,
    ];

    pub fn parse(text: &str) -> Result<Layout, String> {
        match text {
            "stripe" => Ok(Layout::Stripe),
            "mirror" => Ok(Layout::Mirror),
            "mirror3" => Ok(Layout::Mirror3),
            "raidz1" => Ok(Layout::Raidz1),
            "raidz2" => Ok(Layout::Raidz2),
            "raidz3" => Ok(Layout::Raidz3),
            "mirror-log" => Ok(Layout::MirrorLog),
            other => Err(format!(
                "unknown layout '{other}' (stripe, mirror, mirror3, raidz1, raidz2, raidz3, mirror-log)"
            )),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Layout::Stripe => "stripe",
            Layout::Mirror => "mirror",
            Layout::Mirror3 => "mirror3",
            Layout::Raidz1 => "raidz1",
            Layout::Raidz2 => "raidz2",
            Layout::Raidz3 => "raidz3",
            Layout::MirrorLog => "mirror-log",
        }
    }

    pub fn groups(self) -> Vec<Group> {
        match self {
            Layout::Stripe => vec![
                Group {
                    kind: TopVdevKind::Disk,
                    devices: 1,
                    tolerated_bad: 0,
                    log: false,
                };
                2
            ],
            Layout::Mirror => vec![
                Group {
                    kind: TopVdevKind::Mirror,
                    devices: 2,
                    tolerated_bad: 1,
                    log: false,
                };
                2
            ],
            Layout::Mirror3 => vec![Group {
                kind: TopVdevKind::Mirror,
                devices: 3,
                tolerated_bad: 2,
                log: false,
            }],
            Layout::Raidz1 => vec![Group {
                kind: TopVdevKind::Raidz1,
                devices: 4,
                tolerated_bad: 1,
                log: false,
            }],
            Layout::Raidz2 => vec![Group {
                kind: TopVdevKind::Raidz2,
                devices: 6,
                tolerated_bad: 2,
                log: false,
            }],
            Layout::Raidz3 => vec![Group {
                kind: TopVdevKind::Raidz3,
                devices: 7,
                tolerated_bad: 3,
                log: false,
            }],
            Layout::MirrorLog => vec![
                Group {
                    kind: TopVdevKind::Mirror,
                    devices: 2,
                    tolerated_bad: 1,
                    log: false,
                },
                Group {
                    kind: TopVdevKind::Disk,
                    devices: 1,
                    tolerated_bad: 0,
                    log: true,
                },
            ],
        }
    }

    /// Group index of every device, in device order.
    pub fn device_groups(self) -> Vec<usize> {
        self.groups()
            .iter()
            .enumerate()
            .flat_map(|(index, group)| std::iter::repeat_n(index, group.devices))
            .collect()
    }
}
