//! OpenZFS pool kstats: `/proc/spl/kstat/zfs/POOL/iostats`.
//!
//! OpenZFS 2.3 added Direct I/O and counts it there (`direct_read_count`,
//! `direct_write_count`); I/O that went through the ARC instead counts in
//! `arc_read_count`/`arc_write_count`. Earlier releases accept O_DIRECT and
//! ignore it, and have no such counters. The file is a kstat table:
//!
//! ```text
//! 29 1 0x01 10 2720 5493167894 1281543474866
//! name                            type data
//! direct_write_count              4    1234
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// Where OpenZFS on Linux publishes kstats.
pub const DEFAULT_KSTAT_DIR: &str = "/proc/spl/kstat/zfs";

/// The named counters of one kstat file.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KstatSnapshot {
    /// Counter values by name.
    pub values: BTreeMap<String, u64>,
}

impl KstatSnapshot {
    /// A counter, if present.
    pub fn get(&self, name: &str) -> Option<u64> {
        self.values.get(name).copied()
    }
}

/// Direct-I/O counters between two snapshots.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ZfsDirectDelta {
    /// Reads that bypassed the ARC.
    pub direct_reads: u64,
    /// Writes that bypassed the ARC.
    pub direct_writes: u64,
}

/// The iostats file of `pool` under `kstat_dir`.
pub fn iostats_path(kstat_dir: &Path, pool: &str) -> PathBuf {
    kstat_dir.join(pool).join("iostats")
}

/// Parses a kstat table: every line `name type value` whose value is a
/// number; the header lines do not match and are skipped.
pub fn parse(text: &str) -> KstatSnapshot {
    let mut values = BTreeMap::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if let [name, kind, value] = fields.as_slice() {
            if let (Ok(_), Ok(value)) = (kind.parse::<u32>(), value.parse::<u64>()) {
                values.insert((*name).to_string(), value);
            }
        }
    }
    KstatSnapshot { values }
}

/// Reads a kstat file; `Ok(None)` when it does not exist (no ZFS, or a ZFS
/// without pool iostats, i.e. before 2.3).
pub fn read(path: &Path) -> Result<Option<KstatSnapshot>> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(parse(&text))),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(error).with_context(|| format!("reading ZFS kstat {}", path.display())),
    }
}

/// Direct-I/O counts between two snapshots; `None` when the counters are
/// absent (a ZFS without Direct I/O).
pub fn direct_delta(before: &KstatSnapshot, after: &KstatSnapshot) -> Option<ZfsDirectDelta> {
    let delta = |name: &str| Some(after.get(name)?.saturating_sub(before.get(name)?));
    Some(ZfsDirectDelta {
        direct_reads: delta("direct_read_count")?,
        direct_writes: delta("direct_write_count")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kstat_table() {
        let text = "29 1 0x01 10 2720 5493167894 1281543474866\n\
                    name                            type data\n\
                    arc_write_count                 4    12\n\
                    direct_read_count               4    5\n\
                    direct_write_count              4    1234\n";
        let snapshot = parse(text);
        assert_eq!(snapshot.get("direct_write_count"), Some(1234));
        assert_eq!(snapshot.get("arc_write_count"), Some(12));
        assert_eq!(snapshot.values.len(), 3);
        let mut later = snapshot.clone();
        later.values.insert("direct_write_count".into(), 2234);
        assert_eq!(
            direct_delta(&snapshot, &later),
            Some(ZfsDirectDelta {
                direct_reads: 0,
                direct_writes: 1000
            })
        );
        assert_eq!(direct_delta(&snapshot, &KstatSnapshot::default()), None);
    }
}
