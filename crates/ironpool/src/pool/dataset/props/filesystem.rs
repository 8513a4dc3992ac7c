//! A filesystem's own properties (`recordsize`, `mountpoint` and the
//! rest a volume does not have): defaults and checks.

use std::collections::BTreeMap;

use crate::pool::PoolError;

/// Record size (`recordsize`): the block size of files larger than one
/// block. 128 KiB by default, as OpenZFS; 4 KiB to 1 MiB.
pub const RECORD_BYTES_DEFAULT: u32 = 128 * 1024;
pub const RECORD_BYTES_MIN: u32 = 4096;
pub const RECORD_BYTES_MAX: u32 = 1 << 20;

/// The record size a filesystem's properties give.
pub fn record_bytes(properties: &BTreeMap<String, String>) -> u32 {
    properties
        .get("recordsize")
        .and_then(|value| value.parse().ok())
        .unwrap_or(RECORD_BYTES_DEFAULT)
}

/// Where filesystem `short` of pool `pool` mounts: its `mountpoint`
/// property, by default `/POOL/NAME` (as OpenZFS); None for `none` and
/// `legacy` (not mounted by the server).
pub fn mountpoint(
    pool: &str,
    short: &str,
    properties: &BTreeMap<String, String>,
) -> Option<String> {
    match properties.get("mountpoint").map(String::as_str) {
        Some("none" | "legacy") => None,
        Some(path) => Some(path.to_string()),
        None => Some(default_mountpoint(pool, short)),
    }
}

/// Where a filesystem mounts without a `mountpoint` property (OpenZFS's
/// rule).
pub fn default_mountpoint(pool: &str, short: &str) -> String {
    format!("/{pool}/{short}")
}

/// A filesystem's own properties (not inherited from the pool).
pub const OWN_PROPERTIES: [&str; 6] = [
    "recordsize",
    "mountpoint",
    "atime",
    "xattr",
    "acltype",
    "writebackcache",
];

/// The value of own property `name` of filesystem `short` of pool `pool`
/// when it is not set.
pub fn own_property_default(pool: &str, short: &str, name: &str) -> String {
    match name {
        "recordsize" => RECORD_BYTES_DEFAULT.to_string(),
        "mountpoint" => default_mountpoint(pool, short),
        "acltype" | "writebackcache" => "off".to_string(),
        _ => "on".to_string(),
    }
}

/// Checks a filesystem-only property; returns the value as stored, or None
/// for a property that is not a filesystem's own.
pub fn validate_own_property(name: &str, value: &str) -> Result<Option<String>, PoolError> {
    let invalid = |why: String| Err(PoolError::InvalidArgument(why));
    match name {
        "recordsize" => {
            let bytes = crate::units::parse_size(value).map_err(PoolError::InvalidArgument)?;
            if !bytes.is_power_of_two()
                || bytes < RECORD_BYTES_MIN as u64
                || bytes > RECORD_BYTES_MAX as u64
            {
                return invalid(format!(
                    "recordsize {value}: a power of two from {RECORD_BYTES_MIN} to {RECORD_BYTES_MAX}"
                ));
            }
            Ok(Some(bytes.to_string()))
        }
        "mountpoint" => {
            if value != "none" && value != "legacy" && !value.starts_with('/') {
                return invalid(format!(
                    "mountpoint '{value}': an absolute path, none or legacy"
                ));
            }
            Ok(Some(value.to_string()))
        }
        "atime" | "xattr" | "writebackcache" => match value {
            "on" | "off" => Ok(Some(value.to_string())),
            _ => invalid(format!("{name} '{value}': use on or off")),
        },
        // OpenZFS's names: `posixacl` is `posix`, `noacl` is `off`.
        "acltype" => match value {
            "posix" | "posixacl" => Ok(Some("posix".to_string())),
            "off" | "noacl" => Ok(Some("off".to_string())),
            _ => invalid(format!(
                "acltype '{value}': use posix or off (NFSv4 ACLs are not kept)"
            )),
        },
        _ => Ok(None),
    }
}
