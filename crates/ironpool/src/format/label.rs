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
use super::{get_u32, get_u64, invalid, put_u32, put_u64, FormatError, FORMAT_VERSION, LABEL_CONFIG_BYTES};

pub const LABEL_MAGIC: u64 = u64::from_le_bytes(*b"IRONLABL");
const HEADER_BYTES: usize = 64;
/// Largest config document that fits in a label.
pub const CONFIG_BYTES_MAX: usize = LABEL_CONFIG_BYTES as usize - HEADER_BYTES;

/// The kind of a top-level vdev.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TopVdevKind {
    /// A single device (pools of several are striped).
    Disk,
    /// Two or three devices holding identical copies.
    Mirror,
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
}

impl PoolConfig {
    /// Wrapping sum of every leaf's guid: an uberblock carries it so that import
    /// can tell whether the devices it found are the ones the txg was written with.
    pub fn guid_sum(&self) -> u64 {
        self.vdevs.iter().flat_map(|top| top.children.iter()).fold(0u64, |sum, leaf| sum.wrapping_add(leaf.guid))
    }

    /// The top-level vdev holding the leaf `guid`, and the leaf's index in it.
    pub fn find_leaf(&self, guid: u64) -> Option<(&TopVdevConfig, usize)> {
        self.vdevs.iter().find_map(|top| top.children.iter().position(|leaf| leaf.guid == guid).map(|index| (top, index)))
    }

    /// Checks the document's internal consistency.
    pub fn validate(&self) -> Result<(), FormatError> {
        const WHAT: &str = "pool config";
        if self.vdevs.is_empty() {
            return Err(invalid(WHAT, "no vdevs"));
        }
        for (index, top) in self.vdevs.iter().enumerate() {
            if top.id as usize != index {
                return Err(invalid(WHAT, format!("vdev {index} has id {}", top.id)));
            }
            let children_ok = match top.kind {
                TopVdevKind::Disk => top.children.len() == 1,
                TopVdevKind::Mirror => (2..=3).contains(&top.children.len()),
            };
            if !children_ok {
                return Err(invalid(WHAT, format!("{:?} vdev {} has {} children", top.kind, top.id, top.children.len())));
            }
            if !(super::ASHIFT_MIN..=super::ASHIFT_MAX).contains(&top.ashift) {
                return Err(invalid(WHAT, format!("ashift {}", top.ashift)));
            }
            if !(20..=40).contains(&top.metaslab_shift) || top.asize_bytes % (1u64 << top.metaslab_shift) != 0 || top.asize_bytes == 0 {
                return Err(invalid(WHAT, format!("metaslab shift {} for {} bytes", top.metaslab_shift, top.asize_bytes)));
            }
        }
        Ok(())
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
    /// Encodes the config area (exactly `LABEL_CONFIG_BYTES`).
    pub fn encode(&self) -> Result<Vec<u8>, FormatError> {
        let document = serde_json::to_vec(&self.config).map_err(|error| invalid("pool config", error.to_string()))?;
        if document.len() > CONFIG_BYTES_MAX {
            return Err(invalid("pool config", format!("{} bytes, at most {CONFIG_BYTES_MAX} fit in a label", document.len())));
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
        if version != FORMAT_VERSION {
            return Err(FormatError::UnsupportedVersion { what: WHAT, found: version });
        }
        let config: PoolConfig = serde_json::from_slice(document).map_err(|error| invalid("pool config", error.to_string()))?;
        config.validate()?;
        let label = Label { pool_guid: get_u64(bytes, 16), leaf_guid: get_u64(bytes, 24), config_txg: get_u64(bytes, 32), config };
        if label.pool_guid != label.config.pool_guid {
            return Err(invalid(WHAT, "header and config disagree on the pool guid"));
        }
        if label.config.find_leaf(label.leaf_guid).is_none() {
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
            vdevs: vec![TopVdevConfig {
                id: 0,
                guid: 5,
                kind: TopVdevKind::Mirror,
                ashift: 12,
                asize_bytes: 64 << 24,
                metaslab_shift: 24,
                children: vec![
                    LeafConfig { guid: 10, path: "/a".into(), device_size_bytes: 2 << 30 },
                    LeafConfig { guid: 11, path: "/b".into(), device_size_bytes: 2 << 30 },
                ],
            }],
        }
    }

    #[test]
    fn round_trips_and_detects_damage() {
        let label = Label { pool_guid: 77, leaf_guid: 11, config_txg: 1, config: sample_config() };
        let bytes = label.encode().unwrap();
        assert_eq!(bytes.len(), LABEL_CONFIG_BYTES as usize);
        assert_eq!(Label::decode(&bytes).unwrap(), label);
        let mut damaged = bytes.clone();
        damaged[70] ^= 1;
        assert_eq!(Label::decode(&damaged), Err(FormatError::ChecksumMismatch("label")));
        let mut damaged = bytes.clone();
        damaged[20] ^= 1;
        assert!(Label::decode(&damaged).is_err());
        assert_eq!(Label::decode(&vec![0u8; 4096]), Err(FormatError::BadMagic("label")));
        assert_eq!(sample_config().guid_sum(), 21);
    }

    #[test]
    fn rejects_a_device_not_in_its_config() {
        let label = Label { pool_guid: 77, leaf_guid: 12, config_txg: 1, config: sample_config() };
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
