//! Device labels: who this device is, which pool it belongs to, and the pool's
//! configuration (the vdev tree), so that any one device can tell how to assemble
//! the whole pool.
//!
//! The config area of a label (128 KiB) is a 64-byte header followed by the
//! configuration as a JSON document (self-describing, so later versions can add
//! fields; it changes only when the pool's shape changes):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | magic "IRONLABL" |
//! | 8 | 4 | format version |
//! | 12 | 4 | config length in bytes |
//! | 16 | 8 | pool guid |
//! | 24 | 8 | guid of this leaf device |
//! | 32 | 8 | config txg (the txg that wrote this config) |
//! | 40 | 8 | reserved |
//! | 48 | 16 | XXH3-128 of bytes 0..48 followed by the config bytes |
//! | 64 | n | config (JSON, UTF-8) |

use serde::{Deserialize, Serialize};

use super::checksum::embedded;
use super::{
    get_u32, get_u64, invalid, put_u32, put_u64, FormatError, FORMAT_VERSION, LABEL_CONFIG_BYTES,
};

pub const LABEL_MAGIC: u64 = u64::from_le_bytes(*b"IRONLABL");
const HEADER_BYTES: usize = 64;
/// Largest config document that fits in a label.
pub const CONFIG_BYTES_MAX: usize = LABEL_CONFIG_BYTES as usize - HEADER_BYTES;

/// The kind of a top-level vdev. RAID-Z kinds carry their parity in the name
/// (as `zpool create` spells them), so a config can never hold a parity that
/// disagrees with its kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TopVdevKind {
    /// A single device (pools of several are striped).
    Disk,
    /// Two or three devices holding identical copies.
    Mirror,
    /// A RAID-Z group with one parity column per row (survives one failure).
    Raidz1,
    /// A RAID-Z group with two parity columns per row (P and Q).
    Raidz2,
    /// A RAID-Z group with three parity columns per row (P, Q and R).
    Raidz3,
    /// A top-level vdev that was removed (format 4): it has no devices and
    /// no space; its blocks were copied to the other vdevs and are found
    /// through its mapping (`format::remap`). It keeps its id, because
    /// block pointers name vdevs by id.
    Indirect,
}

/// Most children of a mirror: more copies buy little and cost every write.
pub const MIRROR_CHILDREN_MAX: usize = 3;
/// Most children of one RAID-Z group: OpenZFS's limit, which keeps data column
/// indices below 255, the period of the Q coefficients.
pub const RAIDZ_CHILDREN_MAX: usize = 255;

impl TopVdevKind {
    /// The RAID-Z kind with `parity` parity columns, if there is one.
    pub fn raidz(parity: u32) -> Option<TopVdevKind> {
        match parity {
            1 => Some(TopVdevKind::Raidz1),
            2 => Some(TopVdevKind::Raidz2),
            3 => Some(TopVdevKind::Raidz3),
            _ => None,
        }
    }

    /// Parity columns of a RAID-Z kind; 0 for disks and mirrors.
    pub fn parity(self) -> u32 {
        match self {
            TopVdevKind::Disk | TopVdevKind::Mirror | TopVdevKind::Indirect => 0,
            TopVdevKind::Raidz1 => 1,
            TopVdevKind::Raidz2 => 2,
            TopVdevKind::Raidz3 => 3,
        }
    }

    /// True for the RAID-Z kinds.
    pub fn is_raidz(self) -> bool {
        self.parity() > 0
    }

    /// How many children a vdev of this kind may have: the format's rule,
    /// checked at create and on every decoded config.
    pub fn children_range(self) -> std::ops::RangeInclusive<usize> {
        match self {
            TopVdevKind::Disk => 1..=1,
            TopVdevKind::Indirect => 0..=0,
            TopVdevKind::Mirror => 2..=MIRROR_CHILDREN_MAX,
            raidz => raidz.parity() as usize + 1..=RAIDZ_CHILDREN_MAX,
        }
    }

    /// How many children may be lost with every block still readable.
    pub fn redundancy(self, children: usize) -> usize {
        match self {
            TopVdevKind::Disk | TopVdevKind::Indirect => 0,
            TopVdevKind::Mirror => children.saturating_sub(1),
            raidz => raidz.parity() as usize,
        }
    }

    /// The name `status` shows for top-level vdev `id` (`mirror-0`, `raidz2-1`).
    pub fn vdev_name(self, id: u32) -> String {
        let kind = match self {
            TopVdevKind::Disk => "disk",
            TopVdevKind::Mirror => "mirror",
            TopVdevKind::Raidz1 => "raidz1",
            TopVdevKind::Raidz2 => "raidz2",
            TopVdevKind::Raidz3 => "raidz3",
            TopVdevKind::Indirect => "indirect",
        };
        format!("{kind}-{id}")
    }
}

/// Whether a pool is in use by an engine or cleanly exported.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PoolState {
    Active,
    Exported,
}

/// One leaf device in the configuration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeafConfig {
    pub guid: u64,
    /// The path the device had when last configured (a hint for import; devices
    /// are matched by guid, not path).
    pub path: String,
    /// Size of the device when it was added.
    pub device_size_bytes: u64,
    /// Taken offline by the operator: stays offline across export and import
    /// until `ironpool online`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub offline: bool,
    /// The device's dirty time log: inclusive ranges `[first, last]` of txgs in
    /// which it missed writes (it was missing, offline or failing, or it is a
    /// replacement), oldest first. A resilver rewrites the blocks born in them
    /// and then drops them. `last` is `u64::MAX` while the device is still
    /// away (every txg from `first` on is missed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dtl: Vec<[u64; 2]>,
}

fn is_false(value: &bool) -> bool {
    !*value
}

impl LeafConfig {
    /// A healthy leaf that missed nothing.
    pub fn new(guid: u64, path: String, device_size_bytes: u64) -> LeafConfig {
        LeafConfig {
            guid,
            path,
            device_size_bytes,
            offline: false,
            dtl: Vec::new(),
        }
    }
}

/// A top-level vdev: the unit of allocation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopVdevConfig {
    pub id: u32,
    pub guid: u64,
    pub kind: TopVdevKind,
    pub ashift: u8,
    /// Allocatable bytes (the smallest child's data area, metaslab aligned).
    pub asize_bytes: u64,
    pub metaslab_shift: u8,
    pub children: Vec<LeafConfig>,
    /// A log device (a disk or a mirror): it holds intent-log blocks only
    /// and is not part of the pool's space.
    #[serde(default, skip_serializing_if = "is_false")]
    pub log: bool,
}

/// A hot spare: a device outside the vdev tree, kept ready to take the
/// place of a leaf that fails. It carries a label of the pool (so import
/// finds it) but no uberblocks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpareConfig {
    /// Its identity; while it stands in for a leaf, also that leaf's guid
    /// in the tree.
    pub guid: u64,
    /// The path it had when last configured (a hint, as a leaf's).
    pub path: String,
    /// Its size when it was added.
    pub device_size_bytes: u64,
    /// Set while it stands in the place of a leaf that failed: that leaf,
    /// until the operator makes the spare permanent (`detach` of the leaf
    /// it replaced) or replaces it (`replace`, which gives it back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replacing: Option<ReplacedLeaf>,
}

/// The leaf an active spare took the place of.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplacedLeaf {
    pub guid: u64,
    pub path: String,
}

/// The pool's configuration, as stored in every label.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolConfig {
    pub name: String,
    pub pool_guid: u64,
    pub version: u32,
    pub config_txg: u64,
    pub state: PoolState,
    pub hostname: String,
    pub vdevs: Vec<TopVdevConfig>,
    /// Hot spares, available or in use (absent in configs without any).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub spares: Vec<SpareConfig>,
}

impl PoolConfig {
    /// Wrapping sum of every leaf's guid: an uberblock carries it so that import
    /// can tell whether the devices it found are the ones the txg was written with.
    pub fn guid_sum(&self) -> u64 {
        self.vdevs
            .iter()
            .flat_map(|top| top.children.iter())
            .fold(0u64, |sum, leaf| sum.wrapping_add(leaf.guid))
    }

    /// The top-level vdev holding the leaf `guid`, and the leaf's index in it.
    pub fn find_leaf(&self, guid: u64) -> Option<(&TopVdevConfig, usize)> {
        self.vdevs.iter().find_map(|top| {
            top.children
                .iter()
                .position(|leaf| leaf.guid == guid)
                .map(|index| (top, index))
        })
    }

    /// Checks the document's internal consistency.
    pub fn validate(&self) -> Result<(), FormatError> {
        const WHAT: &str = "pool config";
        if self
            .vdevs
            .iter()
            .all(|top| top.log || top.kind == TopVdevKind::Indirect)
        {
            return Err(invalid(WHAT, "no data vdevs"));
        }
        for (index, top) in self.vdevs.iter().enumerate() {
            if top.id as usize != index {
                return Err(invalid(WHAT, format!("vdev {index} has id {}", top.id)));
            }
            if top.log && (top.kind.is_raidz() || top.kind == TopVdevKind::Indirect) {
                return Err(invalid(
                    WHAT,
                    format!("log vdev {} is {:?}", top.id, top.kind),
                ));
            }
            if !top.kind.children_range().contains(&top.children.len()) {
                return Err(invalid(
                    WHAT,
                    format!(
                        "{:?} vdev {} has {} children",
                        top.kind,
                        top.id,
                        top.children.len()
                    ),
                ));
            }
            for leaf in &top.children {
                let ordered = leaf.dtl.iter().all(|[first, last]| first <= last)
                    && leaf.dtl.windows(2).all(|pair| pair[0][1] < pair[1][0]);
                if !ordered {
                    return Err(invalid(
                        WHAT,
                        format!("leaf {:#x} has a dirty time log out of order", leaf.guid),
                    ));
                }
            }
            if !(super::ASHIFT_MIN..=super::ASHIFT_MAX).contains(&top.ashift) {
                return Err(invalid(WHAT, format!("ashift {}", top.ashift)));
            }
            if !(20..=40).contains(&top.metaslab_shift)
                || top.asize_bytes % (1u64 << top.metaslab_shift) != 0
                || top.asize_bytes == 0
            {
                return Err(invalid(
                    WHAT,
                    format!(
                        "metaslab shift {} for {} bytes",
                        top.metaslab_shift, top.asize_bytes
                    ),
                ));
            }
        }
        for (index, spare) in self.spares.iter().enumerate() {
            if self.spares[..index]
                .iter()
                .any(|other| other.guid == spare.guid)
            {
                return Err(invalid(
                    WHAT,
                    format!("spare {:#x} listed twice", spare.guid),
                ));
            }
            let in_tree = self.find_leaf(spare.guid).is_some();
            if in_tree != spare.replacing.is_some() {
                return Err(invalid(
                    WHAT,
                    format!(
                        "spare {:#x} is {} the vdev tree but {}",
                        spare.guid,
                        if in_tree { "in" } else { "not in" },
                        if spare.replacing.is_some() {
                            "marked in use"
                        } else {
                            "marked available"
                        }
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The size device `guid` (a leaf of the tree or a spare) had when it
    /// was added: where its end labels are.
    pub fn device_size_of(&self, guid: u64) -> Option<u64> {
        match self.find_leaf(guid) {
            Some((top, index)) => Some(top.children[index].device_size_bytes),
            None => self.spare(guid).map(|spare| spare.device_size_bytes),
        }
    }

    /// The spare with guid `guid`.
    pub fn spare(&self, guid: u64) -> Option<&SpareConfig> {
        self.spares.iter().find(|spare| spare.guid == guid)
    }
}

/// A decoded label config area.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Label {
    pub pool_guid: u64,
    pub leaf_guid: u64,
    pub config_txg: u64,
    pub config: PoolConfig,
}

impl Label {
    /// The label of device `leaf_guid` (a leaf of `config`'s tree or one
    /// of its spares) carrying `config`.
    pub fn of(config: &PoolConfig, leaf_guid: u64) -> Label {
        Label {
            pool_guid: config.pool_guid,
            leaf_guid,
            config_txg: config.config_txg,
            config: config.clone(),
        }
    }

    /// Encodes the config area (exactly `LABEL_CONFIG_BYTES`).
    pub fn encode(&self) -> Result<Vec<u8>, FormatError> {
        let document = serde_json::to_vec(&self.config)
            .map_err(|error| invalid("pool config", error.to_string()))?;
        if document.len() > CONFIG_BYTES_MAX {
            return Err(invalid(
                "pool config",
                format!(
                    "{} bytes, at most {CONFIG_BYTES_MAX} fit in a label",
                    document.len()
                ),
            ));
        }
        let mut out = vec![0u8; LABEL_CONFIG_BYTES as usize];
        put_u64(&mut out, 0, LABEL_MAGIC);
        put_u32(&mut out, 8, FORMAT_VERSION);
        put_u32(&mut out, 12, document.len() as u32);
        put_u64(&mut out, 16, self.pool_guid);
        put_u64(&mut out, 24, self.leaf_guid);
        put_u64(&mut out, 32, self.config_txg);
        out[HEADER_BYTES..HEADER_BYTES + document.len()].copy_from_slice(&document);
        let checksum = label_checksum(&out[..48], &document);
        out[48..64].copy_from_slice(&checksum);
        Ok(out)
    }

    pub fn decode(bytes: &[u8]) -> Result<Label, FormatError> {
        const WHAT: &str = "label";
        if bytes.len() < HEADER_BYTES {
            return Err(invalid(WHAT, "truncated"));
        }
        if get_u64(bytes, 0) != LABEL_MAGIC {
            return Err(FormatError::BadMagic(WHAT));
        }
        let length = get_u32(bytes, 12) as usize;
        if length > CONFIG_BYTES_MAX || HEADER_BYTES + length > bytes.len() {
            return Err(invalid(WHAT, format!("config length {length}")));
        }
        let document = &bytes[HEADER_BYTES..HEADER_BYTES + length];
        if label_checksum(&bytes[..48], document)[..] != bytes[48..64] {
            return Err(FormatError::ChecksumMismatch(WHAT));
        }
        let version = get_u32(bytes, 8);
        if !super::format_version_readable(version) {
            return Err(FormatError::UnsupportedVersion {
                what: WHAT,
                found: version,
            });
        }
        let config: PoolConfig = serde_json::from_slice(document)
            .map_err(|error| invalid("pool config", error.to_string()))?;
        config.validate()?;
        let label = Label {
            pool_guid: get_u64(bytes, 16),
            leaf_guid: get_u64(bytes, 24),
            config_txg: get_u64(bytes, 32),
            config,
        };
        if label.pool_guid != label.config.pool_guid {
            return Err(invalid(WHAT, "header and config disagree on the pool guid"));
        }
        if label.config.device_size_of(label.leaf_guid).is_none() {
            return Err(invalid(WHAT, "this device's guid is not in the config"));
        }
        Ok(label)
    }
}

fn label_checksum(header: &[u8], document: &[u8]) -> [u8; 16] {
    let mut bytes = Vec::with_capacity(header.len() + document.len());
    bytes.extend_from_slice(header);
    bytes.extend_from_slice(document);
    embedded(&bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sample_config() -> PoolConfig {
        PoolConfig {
            name: "tank".into(),
            pool_guid: 77,
            version: FORMAT_VERSION,
            config_txg: 1,
            state: PoolState::Active,
            hostname: "host".into(),
            spares: Vec::new(),
            vdevs: vec![TopVdevConfig {
                id: 0,
                guid: 5,
                kind: TopVdevKind::Mirror,
                ashift: 12,
                asize_bytes: 64 << 24,
                metaslab_shift: 24,
                log: false,
                children: vec![
                    LeafConfig::new(10, "/a".into(), 2 << 30),
                    LeafConfig::new(11, "/b".into(), 2 << 30),
                ],
            }],
        }
    }

    #[test]
    fn round_trips_and_detects_damage() {
        let label = Label {
            pool_guid: 77,
            leaf_guid: 11,
            config_txg: 1,
            config: sample_config(),
        };
        let bytes = label.encode().unwrap();
        assert_eq!(bytes.len(), LABEL_CONFIG_BYTES as usize);
        assert_eq!(Label::decode(&bytes).unwrap(), label);
        let mut damaged = bytes.clone();
        damaged[70] ^= 1;
        assert_eq!(
            Label::decode(&damaged),
            Err(FormatError::ChecksumMismatch("label"))
        );
        let mut damaged = bytes.clone();
        damaged[20] ^= 1;
        assert!(Label::decode(&damaged).is_err());
        assert_eq!(
            Label::decode(&vec![0u8; 4096]),
            Err(FormatError::BadMagic("label"))
        );
        assert_eq!(sample_config().guid_sum(), 21);
    }

    #[test]
    fn raidz_kinds_carry_their_parity_and_child_counts() {
        let mut config = sample_config();
        config.vdevs[0].kind = TopVdevKind::Raidz2;
        assert!(
            config.validate().is_err(),
            "raidz2 needs at least 3 children"
        );
        config.vdevs[0]
            .children
            .push(LeafConfig::new(12, "/c".into(), 2 << 30));
        config.vdevs[0].children[2].dtl = vec![[4, 9], [12, u64::MAX]];
        config.vdevs[0].children[1].offline = true;
        config.validate().unwrap();
        let label = Label {
            pool_guid: 77,
            leaf_guid: 12,
            config_txg: 1,
            config: config.clone(),
        };
        let decoded = Label::decode(&label.encode().unwrap()).unwrap();
        assert_eq!(decoded.config, config);
        let text = serde_json::to_string(&config).unwrap();
        assert!(
            text.contains("\"kind\":\"raidz2\"") && text.contains("\"offline\":true"),
            "{text}"
        );
        assert_eq!(TopVdevKind::Raidz2.parity(), 2);
        assert_eq!(TopVdevKind::raidz(3), Some(TopVdevKind::Raidz3));
        assert_eq!(TopVdevKind::Raidz3.redundancy(9), 3);
        assert_eq!(TopVdevKind::Mirror.redundancy(3), 2);
        config.vdevs[0].children[2].dtl = vec![[4, 9], [9, 12]];
        assert!(config.validate().is_err(), "overlapping ranges are refused");
        // A healthy leaf writes no new fields: older readers see the same document.
        let plain = serde_json::to_string(&LeafConfig::new(1, "/x".into(), 4096)).unwrap();
        assert_eq!(
            plain,
            "{\"guid\":1,\"path\":\"/x\",\"device_size_bytes\":4096}"
        );
    }

    #[test]
    fn spares_label_their_devices_and_keep_their_place_rule() {
        let mut config = sample_config();
        let plain = serde_json::to_string(&config).unwrap();
        assert!(!plain.contains("spares"), "no spares, no field: {plain}");
        config.spares.push(SpareConfig {
            guid: 20,
            path: "/s".into(),
            device_size_bytes: 3 << 30,
            replacing: None,
        });
        config.validate().unwrap();
        // A spare's own label decodes, with its size for the end labels.
        let label = Label {
            pool_guid: 77,
            leaf_guid: 20,
            config_txg: 1,
            config: config.clone(),
        };
        assert_eq!(Label::decode(&label.encode().unwrap()).unwrap(), label);
        assert_eq!(config.device_size_of(20), Some(3 << 30));
        assert_eq!(config.guid_sum(), 21, "an available spare is not summed");
        // In use: it must be the leaf it stands as.
        config.spares[0].replacing = Some(ReplacedLeaf {
            guid: 11,
            path: "/b".into(),
        });
        assert!(config.validate().is_err(), "in use but not in the tree");
        config.vdevs[0].children[1] = LeafConfig::new(20, "/s".into(), 3 << 30);
        config.validate().unwrap();
        config.spares[0].replacing = None;
        assert!(config.validate().is_err(), "available but in the tree");
        config.spares[0].replacing = Some(ReplacedLeaf {
            guid: 11,
            path: "/b".into(),
        });
        config.spares.push(config.spares[0].clone());
        assert!(config.validate().is_err(), "listed twice");
    }

    #[test]
    fn rejects_a_device_not_in_its_config() {
        let label = Label {
            pool_guid: 77,
            leaf_guid: 12,
            config_txg: 1,
            config: sample_config(),
        };
        assert!(Label::decode(&label.encode().unwrap()).is_err());
    }

    #[test]
    fn decode_never_panics_on_garbage() {
        let mut rng = crate::rt::sim::Rng::new(1);
        for _ in 0..200 {
            let mut bytes = vec![0u8; 256];
            rng.fill(&mut bytes);
            bytes[..8].copy_from_slice(&LABEL_MAGIC.to_le_bytes());
            let _ = Label::decode(&bytes);
        }
    }
}
