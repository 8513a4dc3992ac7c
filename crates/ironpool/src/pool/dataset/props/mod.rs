//! Properties, in the manner of `zfs get/set`: settings a user changes on a
//! volume or on the pool (which volumes inherit), and read-only figures.
//!
//! A dataset's setting comes from the dataset itself (source `local`), else
//! from the nearest filesystem above it that sets it (`inherited from
//! POOL/A`), else from the pool (`inherited from POOL`), else the built-in
//! default (`default`); see [`inherited`].
//! Settings are stored as text in the pool directory (the volume's record, or the
//! pool's properties) so that new properties never need a format change; the
//! engine reads them through [`VolumeSettings`], recomputed whenever one changes.
//! This file holds the values' rules (what is valid, what inherits from
//! where); `filesystem.rs` a filesystem's own properties and `ids.rs` the
//! names of user, group and project quotas; the pool's `get`, `set` and
//! `inherit` are `pool::datasets::props`.
//!
//! | property | values | default | notes |
//! |---|---|---|---|
//! | compression | off, on (= lz4), lz4, zstd, zstd-1..19 | off | new writes only |
//! | checksum | xxh3, blake3, fletcher4 (on = xxh3) | xxh3 | new writes only |
//! | sync | standard, always, disabled | standard | see [`SyncMode`] |
//! | logbias | latency, throughput | latency | see [`LogBias`] |
//! | readonly | on, off | off | refuses writes at once |
//! | volsize | a size | (create) | volumes only; grows, never shrinks |
//! | volblocksize | 4K..128K | 16K | set at creation only |
//! | primarycache | all, metadata, none | all | what of the volume's reads the read cache keeps |
//! | direct | standard, always, disabled | standard | see [`DirectMode`] |
//! | autotrim | on, off | off | pool only: discard freed space (see `scan::trim`) |
//! | recordsize | 4K..1M | 128K | filesystems only: block size of files past one block; files that grow later |
//! | mountpoint | a path, none, legacy | /POOL/NAME | filesystems only: where `serve` mounts it; inherited with the rest of the name appended |
//! | atime | on, off | on | filesystems only: reads update access times (relatime's rule) |
//! | xattr | on, off | on | filesystems only: extended attributes |
//! | quota, refquota | none, a size | none | not inherited: bound what the dataset and its snapshots use, what it refers to (see `quota`) |
//! | reservation, refreservation | none, a size | none | not inherited: space held back for the dataset (see `quota`); a volume is made thick (`refreservation` = its size and indirect blocks, `auto`) unless created sparse (`-s`), and a thick volume's refreservation grows with its `volsize` |
//! | userquota@ID, groupquota@ID, projectquota@ID | none, a size | none | filesystems only: what a user's (group's, project's) objects may take (see `filesystem::id_space`) |
//! | `module:key` | any text up to 8 KiB | | user properties, inherited too |

use std::collections::BTreeMap;

use serde::Serialize;

use crate::block::compress::CompressionSetting;
use crate::format::ChecksumAlgo;
use crate::pool::dataset::quota::SpaceLimits;
use crate::pool::PoolError;

pub mod filesystem;
pub mod ids;

/// Longest user property value (names and values live in the directory, which
/// is bounded; ZFS allows 8 KiB too).
pub const USER_PROPERTY_VALUE_BYTES_MAX: usize = 8192;
/// Longest user property name.
pub const USER_PROPERTY_NAME_BYTES_MAX: usize = 256;

/// What FLUSH and FUA mean for a volume.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SyncMode {
    /// Writes are durable once the client flushes or asks for FUA.
    Standard,
    /// Every write is durable before it is acknowledged (as if each were FUA).
    Always,
    /// Flush and FUA return at once: data reaches the disk with the next txg
    /// commit (within the txg timeout). A crash can lose acknowledged writes of
    /// the last seconds, never the pool's consistency. For scratch data only.
    Disabled,
}

impl SyncMode {
    fn parse(text: &str) -> Option<SyncMode> {
        match text {
            "standard" => Some(SyncMode::Standard),
            "always" => Some(SyncMode::Always),
            "disabled" => Some(SyncMode::Disabled),
            _ => None,
        }
    }
}

/// How a FLUSH puts blocks held in memory into the intent log (OpenZFS's
/// `logbias`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogBias {
    /// Blocks of up to 32 KiB are copied into the log: one log write per
    /// FLUSH, and the block is written in place later (twice in all).
    Latency,
    /// Blocks are written in place first and the log records only where
    /// they are: two writes in a row per FLUSH, each byte written once.
    Throughput,
}

impl LogBias {
    fn parse(text: &str) -> Option<LogBias> {
        match text {
            "latency" => Some(LogBias::Latency),
            "throughput" => Some(LogBias::Throughput),
            _ => None,
        }
    }
}

/// What the read cache keeps of a dataset's reads (OpenZFS's
/// `primarycache`). The pool's metadata (block-pointer trees, the
/// directory) is cached whatever this says: without it every read would
/// walk its tree on the devices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PrimaryCache {
    /// Data and metadata.
    All,
    /// Metadata only: the dataset's data blocks are read from the devices
    /// each time (a cached copy already there is still served).
    Metadata,
    /// Nothing of the dataset's data.
    None,
}

impl PrimaryCache {
    fn parse(text: &str) -> Option<PrimaryCache> {
        match text {
            "all" => Some(PrimaryCache::All),
            "metadata" => Some(PrimaryCache::Metadata),
            "none" => Some(PrimaryCache::None),
            _ => None,
        }
    }
}

/// Direct I/O (OpenZFS 2.3's `direct`): whether reads and writes bypass the
/// read cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DirectMode {
    /// Requests that ask for direct I/O bypass the cache, others use it.
    /// NBD has no such request flag, so on a volume served over NBD this
    /// is `disabled`.
    Standard,
    /// Every data read and write bypasses the cache: reads go to the devices
    /// and keep nothing, writes never enter it. A block another dataset
    /// cached stays coherent (the cache holds only verified, current blocks).
    Always,
    /// Everything goes through the cache (as `primarycache` allows).
    Disabled,
}

impl DirectMode {
    fn parse(text: &str) -> Option<DirectMode> {
        match text {
            "standard" => Some(DirectMode::Standard),
            "always" => Some(DirectMode::Always),
            "disabled" => Some(DirectMode::Disabled),
            _ => None,
        }
    }
}

/// The settings the I/O path of a volume follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VolumeSettings {
    pub compression: CompressionSetting,
    pub checksum: ChecksumAlgo,
    pub sync: SyncMode,
    pub log_bias: LogBias,
    pub read_only: bool,
    pub primary_cache: PrimaryCache,
    pub direct: DirectMode,
    /// Its quotas and reservations (its own: never inherited).
    pub limits: SpaceLimits,
}

impl VolumeSettings {
    /// How a demand read of the volume's data uses the read cache.
    pub fn data_cache_use(&self) -> crate::cache::CacheUse {
        let direct = self.direct == DirectMode::Always;
        crate::cache::CacheUse::data(!direct, !direct && self.primary_cache == PrimaryCache::All)
    }
}

impl Default for VolumeSettings {
    fn default() -> VolumeSettings {
        VolumeSettings {
            compression: CompressionSetting::OFF,
            checksum: ChecksumAlgo::default(),
            sync: SyncMode::Standard,
            log_bias: LogBias::Latency,
            read_only: false,
            primary_cache: PrimaryCache::All,
            direct: DirectMode::Standard,
            limits: SpaceLimits::default(),
        }
    }
}

/// The space properties, none of them inherited (as in OpenZFS).
pub const SPACE_PROPERTIES: [&str; 4] = ["quota", "refquota", "reservation", "refreservation"];

/// The limits a dataset's `local` properties set (a value stored is bytes,
/// or `none`).
pub(crate) fn space_limits(local: &BTreeMap<String, String>) -> SpaceLimits {
    let bytes = |name: &str| {
        local
            .get(name)
            .and_then(|value| value.parse::<u64>().ok())
            .unwrap_or(0)
    };
    SpaceLimits {
        quota: bytes("quota"),
        refquota: bytes("refquota"),
        reservation: bytes("reservation"),
        refreservation: bytes("refreservation"),
    }
}

/// Checks a property assignment on a filesystem: its own properties, and
/// those volumes have but the volume-only ones.
pub fn validate_filesystem(name: &str, value: &str) -> Result<String, PoolError> {
    if let Some(value) = filesystem::validate_own_property(name, value)? {
        return Ok(value);
    }
    // A user's or group's quota, by numeric id (`set` also takes names).
    if let Some((_, _, id)) = ids::id_property(name) {
        return match ids::validate_id_quota(name, value)? {
            Some((stored, value)) if id.parse::<u32>().is_ok() && stored == name => Ok(value),
            _ => Err(PoolError::InvalidArgument(format!(
                "{name}: give the numeric id here, or set it by name once the filesystem exists"
            ))),
        };
    }
    match name {
        "volsize" | "volblocksize" => Err(PoolError::InvalidArgument(format!(
            "{name} is a volume property"
        ))),
        _ => validate(name, value, false),
    }
}

/// Inheritable settings with their defaults.
pub(in crate::pool) const INHERITABLE: [(&str, &str); 7] = [
    ("compression", "off"),
    ("checksum", "xxh3"),
    ("sync", "standard"),
    ("logbias", "latency"),
    ("readonly", "off"),
    ("primarycache", "all"),
    ("direct", "standard"),
];

/// True for a user property name (`module:key`).
pub fn is_user_property(name: &str) -> bool {
    name.contains(':')
        && name.len() <= USER_PROPERTY_NAME_BYTES_MAX
        && !name.starts_with(':')
        && name.chars().all(|character| {
            character.is_ascii_alphanumeric() || matches!(character, ':' | '-' | '_' | '.')
        })
}

/// Checks a property assignment and returns the value as stored (normalised).
/// `on_pool`: the target is the pool (volume-only properties are refused).
pub fn validate(name: &str, value: &str, on_pool: bool) -> Result<String, PoolError> {
    let invalid = |why: String| Err(PoolError::InvalidArgument(why));
    match name {
        "compression" => match CompressionSetting::parse(value) {
            Some(_) => Ok(if value == "on" { "lz4".into() } else { value.to_string() }),
            None => invalid(format!("compression '{value}': use off, on, lz4, zstd or zstd-1 .. zstd-{}", crate::block::compress::ZSTD_LEVEL_MAX)),
        },
        "checksum" => {
            let value = if value == "on" { "xxh3" } else { value };
            match ChecksumAlgo::parse(value) {
                Some(algo) => Ok(algo.name().to_string()),
                None => invalid(format!("checksum '{value}': use xxh3, blake3 or fletcher4")),
            }
        }
        "sync" => match SyncMode::parse(value) {
            Some(_) => Ok(value.to_string()),
            None => invalid(format!("sync '{value}': use standard, always or disabled")),
        },
        "logbias" => match LogBias::parse(value) {
            Some(_) => Ok(value.to_string()),
            None => invalid(format!("logbias '{value}': use latency or throughput")),
        },
        "readonly" => match value {
            "on" | "off" => Ok(value.to_string()),
            _ => invalid(format!("readonly '{value}': use on or off")),
        },
        "primarycache" => match PrimaryCache::parse(value) {
            Some(_) => Ok(value.to_string()),
            None => invalid(format!("primarycache '{value}': use all, metadata or none")),
        },
        "direct" => match DirectMode::parse(value) {
            Some(_) => Ok(value.to_string()),
            None => invalid(format!("direct '{value}': use standard, always or disabled")),
        },
        _ if ids::id_property(name).is_some() => {
            invalid(format!("{name} is a filesystem property"))
        }
        _ if SPACE_PROPERTIES.contains(&name) => {
            if on_pool {
                return invalid(format!("{name} is a property of volumes and filesystems"));
            }
            crate::pool::dataset::quota::limit_value(name, value)
        }
        "volsize" if !on_pool => {
            let bytes = crate::units::parse_size(value).map_err(PoolError::InvalidArgument)?;
            Ok(bytes.to_string())
        }
        "volsize" | "volblocksize" if on_pool => invalid(format!("{name} is a volume property")),
        "autotrim" if on_pool => match value {
            "on" | "off" => Ok(value.to_string()),
            _ => invalid(format!("autotrim '{value}': use on or off")),
        },
        "autotrim" => invalid("autotrim is a pool property (set autotrim=on|off POOL)".into()),
        "recordsize" | "mountpoint" | "atime" | "xattr" => {
            invalid(format!("{name} is a filesystem property"))
        }
        "volblocksize" => invalid("volblocksize is set when a volume is created (volume create POOL/NAME SIZE -o volblocksize=SIZE)".into()),
        "encryption" | "keyformat" | "pbkdf2iters" => invalid(format!(
            "{name} is set when a volume or filesystem is created (-o encryption=on -o keyformat=...), and changed with change-key"
        )),
        "keylocation" if on_pool => invalid("keylocation is a property of encrypted volumes and filesystems".into()),
        "keylocation" => {
            crate::pool::dataset::keys::check_keylocation(value)?;
            Ok(value.to_string())
        }
        "keystatus" => invalid("keystatus is read-only: load-key and unload-key change it".into()),
        "encryptionroot" => invalid("encryptionroot is read-only: the dataset whose key a dataset shares (a clone shares its origin's)".into()),
        _ if is_user_property(name) => {
            if value.len() > USER_PROPERTY_VALUE_BYTES_MAX {
                return invalid(format!("{name}: values are limited to {USER_PROPERTY_VALUE_BYTES_MAX} bytes"));
            }
            Ok(value.to_string())
        }
        _ if is_read_only(name) => invalid(format!("{name} is read-only")),
        _ => invalid(format!("unknown property '{name}' (user properties look like module:key)")),
    }
}

/// Read-only figures `get` reports.
fn is_read_only(name: &str) -> bool {
    matches!(
        name,
        "type"
            | "used"
            | "referenced"
            | "usedbydataset"
            | "usedbysnapshots"
            | "usedbyrefreservation"
            | "usedbychildren"
            | "written"
            | "logicalused"
            | "logicalreferenced"
            | "compressratio"
            | "origin"
            | "guid"
            | "createtxg"
            | "creation"
            | "userrefs"
            | "size"
            | "allocated"
            | "free"
            | "capacity"
            | "health"
            | "volblocksize"
            | "mounted"
            | "available"
    )
}

/// What a property target names.
pub(in crate::pool) enum Target {
    Pool,
    Volume(String),
    Filesystem(String),
}

/// Whether property `name` passes down the dataset tree when a dataset
/// does not set it: the inheritable settings, a filesystem's own
/// properties and user properties. Quotas, reservations and per-user
/// quotas belong to the dataset they are set on.
fn passes_down(name: &str) -> bool {
    INHERITABLE.iter().any(|(key, _)| *key == name)
        || filesystem::OWN_PROPERTIES.contains(&name)
        || is_user_property(name)
}

/// What dataset `short` inherits: each property that passes down and is
/// set on the pool or on a filesystem above it (the nearest wins), as
/// (value, the full name of the dataset it comes from). A `mountpoint`
/// path passes down with the rest of the name appended, as in OpenZFS:
/// `mountpoint=/srv` on `tank/a` puts `tank/a/b/c` at `/srv/b/c`.
pub fn inherited(
    directory: &crate::pool::dataset::directory::Directory,
    pool_name: &str,
    short: &str,
) -> BTreeMap<String, (String, String)> {
    let mut values = BTreeMap::new();
    for (name, value) in &directory.properties {
        if passes_down(name) {
            values.insert(name.clone(), (value.clone(), pool_name.to_string()));
        }
    }
    // Outermost first, so the nearest one set wins.
    let ancestors: Vec<&str> = crate::pool::dataset::directory::ancestors(short).collect();
    for ancestor in ancestors.into_iter().rev() {
        let Some(record) = directory.filesystems.get(ancestor) else {
            continue;
        };
        for (name, value) in &record.own_properties() {
            if !passes_down(name) {
                continue;
            }
            let value = match (name.as_str(), short.get(ancestor.len() + 1..)) {
                ("mountpoint", Some(rest)) if value.starts_with('/') => {
                    format!("{}/{rest}", value.trim_end_matches('/'))
                }
                _ => value.clone(),
            };
            values.insert(name.clone(), (value, format!("{pool_name}/{ancestor}")));
        }
    }
    values
}

/// The values of [`inherited`], without where they come from.
pub fn inherited_values(
    inherited: &BTreeMap<String, (String, String)>,
) -> BTreeMap<String, String> {
    inherited
        .iter()
        .map(|(name, (value, _))| (name.clone(), value.clone()))
        .collect()
}

/// A dataset's own property values with where each came from: set on it
/// (`local`) or received with it (`received`), the former winning.
pub(crate) struct Own<'a> {
    pub local: &'a BTreeMap<String, String>,
    pub received: &'a BTreeMap<String, String>,
}

impl Own<'_> {
    /// Property `name`'s own value and its source, if it has one.
    pub(in crate::pool) fn get(&self, name: &str) -> Option<(String, String)> {
        if let Some(value) = self.local.get(name) {
            return Some((value.clone(), "local".into()));
        }
        self.received
            .get(name)
            .map(|value| (value.clone(), "received".into()))
    }

    /// Every own property, with its value and source.
    pub(in crate::pool) fn all(&self) -> BTreeMap<String, (String, String)> {
        let mut all: BTreeMap<String, (String, String)> = self
            .received
            .iter()
            .map(|(name, value)| (name.clone(), (value.clone(), "received".into())))
            .collect();
        for (name, value) in self.local {
            all.insert(name.clone(), (value.clone(), "local".into()));
        }
        all
    }
}

/// An effective setting and where it came from: set on the dataset
/// (`local`), received with it (`received`), inherited (`inherited from
/// NAME`), or the default.
pub(in crate::pool) fn lookup(
    own: &Own,
    inherited: &BTreeMap<String, (String, String)>,
    name: &str,
) -> Option<(String, String)> {
    if let Some(found) = own.get(name) {
        return Some(found);
    }
    if let Some((value, from)) = inherited.get(name) {
        return Some((value.clone(), format!("inherited from {from}")));
    }
    INHERITABLE
        .iter()
        .find(|(key, _)| *key == name)
        .map(|(_, default)| (default.to_string(), "default".into()))
}

/// The settings of a dataset with these local properties that inherits
/// these (see [`inherited`]).
pub fn settings(
    local: &BTreeMap<String, String>,
    inherited: &BTreeMap<String, String>,
) -> VolumeSettings {
    let value = |name: &str| {
        local
            .get(name)
            .or_else(|| inherited.get(name))
            .cloned()
            .or_else(|| {
                INHERITABLE
                    .iter()
                    .find(|(key, _)| *key == name)
                    .map(|(_, default)| default.to_string())
            })
            .unwrap_or_default()
    };
    let defaults = VolumeSettings::default();
    VolumeSettings {
        compression: CompressionSetting::parse(&value("compression"))
            .unwrap_or(defaults.compression),
        checksum: ChecksumAlgo::parse(&value("checksum")).unwrap_or(defaults.checksum),
        sync: SyncMode::parse(&value("sync")).unwrap_or(defaults.sync),
        log_bias: LogBias::parse(&value("logbias")).unwrap_or(defaults.log_bias),
        read_only: value("readonly") == "on",
        primary_cache: PrimaryCache::parse(&value("primarycache"))
            .unwrap_or(defaults.primary_cache),
        direct: DirectMode::parse(&value("direct")).unwrap_or(defaults.direct),
        limits: space_limits(local),
    }
}

/// One row of `get`.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct PropertyValue {
    pub name: String,
    pub property: String,
    pub value: String,
    pub source: String,
}

/// The `get` row of a figure the pool computes (a size, a count, a state):
/// it is never set, so its source is `-`, as `zfs get` shows one.
pub(crate) fn fixed(name: &str, value: impl std::fmt::Display) -> (String, String, String) {
    (name.into(), value.to_string(), "-".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(key, value)| (key.to_string(), value.to_string()))
            .collect()
    }

    #[test]
    fn local_beats_pool_beats_default() {
        let pool = map(&[("compression", "zstd-5"), ("sync", "always")]);
        let local = map(&[("compression", "lz4")]);
        let settings = settings(&local, &pool);
        assert_eq!(
            settings.compression,
            CompressionSetting::parse("lz4").unwrap()
        );
        assert_eq!(settings.sync, SyncMode::Always);
        assert_eq!(settings.checksum, ChecksumAlgo::default());
        assert!(!settings.read_only);
        let nothing_received = BTreeMap::new();
        let own = Own {
            local: &local,
            received: &nothing_received,
        };
        let from_pool: BTreeMap<String, (String, String)> = pool
            .iter()
            .map(|(name, value)| (name.clone(), (value.clone(), "tank".to_string())))
            .collect();
        assert_eq!(
            lookup(&own, &from_pool, "sync").unwrap().1,
            "inherited from tank"
        );
        assert_eq!(lookup(&own, &from_pool, "compression").unwrap().1, "local");
        assert_eq!(
            lookup(&own, &from_pool, "readonly").unwrap(),
            ("off".into(), "default".into())
        );
    }

    #[test]
    fn the_nearest_ancestor_passes_its_settings_down() {
        use crate::pool::dataset::directory::Directory;
        use crate::pool::filesystem::FilesystemRecord;
        let record = |properties: BTreeMap<String, String>| FilesystemRecord {
            object: 9,
            created_txg: 1,
            guid: 1,
            properties,
            received: BTreeMap::new(),
            lineage: Default::default(),
            receive: None,
            intent_log: None,
            crypt: None,
            replayed_times: Vec::new(),
        };
        let mut directory = Directory {
            properties: map(&[
                ("compression", "zstd"),
                ("autotrim", "on"),
                ("org:x", "pool"),
            ]),
            ..Directory::default()
        };
        directory.filesystems.insert(
            "a".into(),
            record(map(&[
                ("compression", "lz4"),
                ("mountpoint", "/srv/"),
                ("quota", "1000000"),
                ("org:x", "a"),
            ])),
        );
        directory
            .filesystems
            .insert("a/b".into(), record(map(&[("atime", "off")])));
        let passed = inherited(&directory, "tank", "a/b/c");
        assert_eq!(passed["compression"], ("lz4".into(), "tank/a".into()));
        assert_eq!(passed["mountpoint"], ("/srv/b/c".into(), "tank/a".into()));
        assert_eq!(passed["atime"], ("off".into(), "tank/a/b".into()));
        assert_eq!(passed["org:x"], ("a".into(), "tank/a".into()));
        // A quota binds the dataset it is set on; autotrim is the pool's.
        assert!(!passed.contains_key("quota"));
        assert!(!passed.contains_key("autotrim"));
        let top = inherited(&directory, "tank", "d");
        assert_eq!(top["compression"], ("zstd".into(), "tank".into()));
        assert!(!top.contains_key("mountpoint"));
    }

    #[test]
    fn validation() {
        assert_eq!(validate("compression", "on", false).unwrap(), "lz4");
        assert_eq!(validate("checksum", "on", true).unwrap(), "xxh3");
        assert!(validate("compression", "gzip-9", false).is_err());
        assert!(validate("sync", "sometimes", false).is_err());
        assert!(validate("readonly", "yes", false).is_err());
        assert!(validate("volsize", "1G", true).is_err());
        assert_eq!(
            validate("volsize", "1G", false).unwrap(),
            (1u64 << 30).to_string()
        );
        assert!(validate("volblocksize", "8K", false).is_err());
        assert!(validate("used", "5", false)
            .unwrap_err()
            .to_string()
            .contains("read-only"));
        assert!(validate("colour", "blue", false)
            .unwrap_err()
            .to_string()
            .contains("unknown property"));
        assert_eq!(
            validate("com.example:owner", "ops team", false).unwrap(),
            "ops team"
        );
        assert!(validate(
            "com.example:owner",
            &"x".repeat(USER_PROPERTY_VALUE_BYTES_MAX + 1),
            false
        )
        .is_err());
        assert!(!is_user_property(":x"));
        assert!(!is_user_property("a b:c"));
    }
}
