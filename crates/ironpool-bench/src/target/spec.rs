//! Target specs as typed on the command line:
//!
//! | spec | target |
//! |---|---|
//! | `raw[:PATH]` | a raw file (created in `--out` without PATH) or block device |
//! | `raw-pair` | two raw files in `--out` written at once: a mirror's limit on one disk |
//! | `file:PATH` | a file on any filesystem |
//! | `dir:PATH` | a directory on any filesystem (the tool makes a file in it) |
//! | `ext4` | ext4 on a loop device (direct I/O on) over an image in `--out`: a filesystem's limit on this disk (root) |
//! | `nbd:URI` | any NBD URI |
//! | `nbdkit[:PATH]` | nbdkit's file plugin over a unix socket: the transport baseline |
//! | `ironpool:LAYOUT[+log]:NxSIZE[:prop=val,...]` | a pool and volume the tool creates (`+log`: and a log device of SIZE; `bin=PATH` among the properties: this ironpool executable, to compare builds in one run; `encryption=on` without `keylocation`: an encrypted volume whose key the tool makes and keeps in the target's directory) |
//! | `ironpool-fs:LAYOUT:NxSIZE[:prop=val,...]` | a pool and filesystem the tool creates, mounted over FUSE; fio on a file of it (`encryption=on` without `keylocation`: encrypted, with a key the tool makes, as for volumes) |

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use thiserror::Error;

use crate::units::{parse_size, size_short, SizeError};

/// A target spec that does not parse.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum SpecError {
    /// The word before the first `:` is not a target kind.
    #[error("unknown target kind in {0:?} (expected raw, raw-pair, file, dir, ext4, nbd, nbdkit, ironpool or ironpool-fs)")]
    UnknownKind(String),
    /// A kind that needs a path or URI got none.
    #[error("target {0:?} needs a value after the colon")]
    MissingValue(String),
    /// An ironpool spec that is not `ironpool:LAYOUT:NxSIZE[:props]`.
    #[error("ironpool target {spec:?}: {reason} (expected e.g. ironpool:mirror:2x2G or ironpool:raidz2:6x1G:compression=off)")]
    Ironpool {
        /// The spec.
        spec: String,
        /// What is wrong.
        reason: String,
    },
    /// A size that does not parse.
    #[error(transparent)]
    Size(#[from] SizeError),
}

/// The vdev layout of an ironpool target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Plain striping over the disks (no layout word on `ironpool create`).
    Stripe,
    /// One mirror of all disks.
    Mirror,
    /// RAID-Z with this many parity disks (1-3).
    Raidz(u8),
}

impl Layout {
    /// The layout word of `ironpool create`, if any.
    pub fn create_word(self) -> Option<String> {
        match self {
            Layout::Stripe => None,
            Layout::Mirror => Some("mirror".to_string()),
            Layout::Raidz(parity) => Some(format!("raidz{parity}")),
        }
    }

    /// The name in specs.
    pub fn name(self) -> String {
        self.create_word().unwrap_or_else(|| "stripe".to_string())
    }
}

/// An ironpool pool and volume (or filesystem) to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IronpoolSpec {
    /// A filesystem mounted over FUSE (`ironpool-fs:`) rather than a volume
    /// over NBD.
    pub filesystem: bool,
    /// The vdev layout.
    pub layout: Layout,
    /// Number of disk images.
    pub disk_count: u32,
    /// Size of each disk image.
    pub disk_size_bytes: u64,
    /// A separate log device (an image of the disks' size) beside the data
    /// disks: `LAYOUT+log`.
    pub log: bool,
    /// The ironpool executable for this target (`bin=PATH`), so that two
    /// builds are measured side by side in one run; `None`: the run's.
    pub bin: Option<PathBuf>,
    /// The server's poll window (`poll_us=N`: `IRONPOOL_POLL_US=N` in the
    /// environment of `ironpool serve`); `None`: its default.
    pub poll_us: Option<u64>,
    /// Pool tunables (`tune.NAME=VALUE`: `ironpool tune POOL NAME VALUE`
    /// once the server is up), in order.
    pub tunables: Vec<(String, String)>,
    /// Volume properties (`-o prop=val`), in order.
    pub properties: Vec<(String, String)>,
}

/// A parsed target spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetSpec {
    /// A raw file or block device; `None` creates `raw.img` in `--out`.
    Raw(Option<PathBuf>),
    /// Two raw files in `--out`, the same job on both at once: what a
    /// mirror of two files on this disk can do at most.
    RawPair,
    /// A file on a filesystem.
    File(PathBuf),
    /// A directory on a filesystem.
    Dir(PathBuf),
    /// ext4 on a loop device over an image in `--out`, made and removed by
    /// the tool: what a kernel filesystem does on this disk, the limit of
    /// a filesystem's own tests (metadata, names, buffered writes).
    Ext4,
    /// An NBD URI.
    Nbd(String),
    /// nbdkit's file plugin serving a file; `None` creates `nbdkit.img`.
    Nbdkit(Option<PathBuf>),
    /// nbdkit's memory plugin of the working set's size: the same NBD
    /// transport with its data in RAM, the ceiling of reads from a cache.
    NbdkitMemory,
    /// An ironpool pool and volume.
    Ironpool(IronpoolSpec),
}

impl TargetSpec {
    /// raw, file, dir, ext4, nbd, nbdkit or ironpool.
    pub fn kind(&self) -> &'static str {
        match self {
            TargetSpec::Raw(_) => "raw",
            TargetSpec::RawPair => "raw-pair",
            TargetSpec::File(_) => "file",
            TargetSpec::Dir(_) => "dir",
            TargetSpec::Ext4 => "ext4",
            TargetSpec::Nbd(_) => "nbd",
            TargetSpec::Nbdkit(_) => "nbdkit",
            TargetSpec::NbdkitMemory => "nbdkit-memory",
            TargetSpec::Ironpool(spec) if spec.filesystem => "ironpool-fs",
            TargetSpec::Ironpool(_) => "ironpool",
        }
    }

    /// A name safe for file names: `ironpool-mirror-2x2G`.
    pub fn slug(&self) -> String {
        let text = self.to_string();
        let mut slug: String = text
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '.' {
                    c
                } else {
                    '-'
                }
            })
            .collect();
        while slug.contains("--") {
            slug = slug.replace("--", "-");
        }
        slug.trim_matches('-').chars().take(60).collect()
    }
}

impl fmt::Display for TargetSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TargetSpec::Raw(None) => write!(f, "raw"),
            TargetSpec::Raw(Some(path)) => write!(f, "raw:{}", path.display()),
            TargetSpec::RawPair => write!(f, "raw-pair"),
            TargetSpec::File(path) => write!(f, "file:{}", path.display()),
            TargetSpec::Dir(path) => write!(f, "dir:{}", path.display()),
            TargetSpec::Ext4 => write!(f, "ext4"),
            TargetSpec::Nbd(uri) => write!(f, "nbd:{uri}"),
            TargetSpec::Nbdkit(None) => write!(f, "nbdkit"),
            TargetSpec::Nbdkit(Some(path)) => write!(f, "nbdkit:{}", path.display()),
            TargetSpec::NbdkitMemory => write!(f, "nbdkit-memory"),
            TargetSpec::Ironpool(spec) => {
                write!(
                    f,
                    "{}:{}{}:{}x{}",
                    if spec.filesystem {
                        "ironpool-fs"
                    } else {
                        "ironpool"
                    },
                    spec.layout.name(),
                    if spec.log { "+log" } else { "" },
                    spec.disk_count,
                    size_short(spec.disk_size_bytes)
                )?;
                let props: Vec<String> = spec
                    .bin
                    .iter()
                    .map(|bin| format!("bin={}", bin.display()))
                    .chain(spec.poll_us.iter().map(|us| format!("poll_us={us}")))
                    .chain(
                        spec.tunables
                            .iter()
                            .map(|(name, value)| format!("tune.{name}={value}")),
                    )
                    .chain(spec.properties.iter().map(|(k, v)| format!("{k}={v}")))
                    .collect();
                if !props.is_empty() {
                    write!(f, ":{}", props.join(","))?;
                }
                Ok(())
            }
        }
    }
}

impl FromStr for TargetSpec {
    type Err = SpecError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (kind, value) = match text.split_once(':') {
            Some((kind, value)) => (kind, Some(value)),
            None => (text, None),
        };
        let required = || {
            value
                .filter(|v| !v.is_empty())
                .ok_or_else(|| SpecError::MissingValue(text.to_string()))
        };
        let optional_path = || value.filter(|v| !v.is_empty()).map(PathBuf::from);
        match kind {
            "raw" => Ok(TargetSpec::Raw(optional_path())),
            "raw-pair" if value.is_none() => Ok(TargetSpec::RawPair),
            "file" => Ok(TargetSpec::File(PathBuf::from(required()?))),
            "dir" => Ok(TargetSpec::Dir(PathBuf::from(required()?))),
            "ext4" if value.is_none() => Ok(TargetSpec::Ext4),
            "nbd" => Ok(TargetSpec::Nbd(required()?.to_string())),
            "nbdkit" => Ok(TargetSpec::Nbdkit(optional_path())),
            "nbdkit-memory" if value.is_none() => Ok(TargetSpec::NbdkitMemory),
            "ironpool" => parse_ironpool(text, required()?).map(TargetSpec::Ironpool),
            "ironpool-fs" => parse_ironpool(text, required()?).map(|spec| {
                TargetSpec::Ironpool(IronpoolSpec {
                    filesystem: true,
                    ..spec
                })
            }),
            _ => Err(SpecError::UnknownKind(text.to_string())),
        }
    }
}

/// `LAYOUT:NxSIZE[:prop=val,...]`.
fn parse_ironpool(spec: &str, value: &str) -> Result<IronpoolSpec, SpecError> {
    let error = |reason: &str| SpecError::Ironpool {
        spec: spec.to_string(),
        reason: reason.to_string(),
    };
    let mut parts = value.splitn(3, ':');
    let layout_word = parts.next().unwrap_or_default();
    let (layout_word, log) = match layout_word.strip_suffix("+log") {
        Some(word) => (word, true),
        None => (layout_word, false),
    };
    let layout = match layout_word {
        "stripe" => Layout::Stripe,
        "mirror" => Layout::Mirror,
        "raidz" | "raidz1" => Layout::Raidz(1),
        "raidz2" => Layout::Raidz(2),
        "raidz3" => Layout::Raidz(3),
        _ => {
            return Err(error(
                "unknown layout (stripe, mirror, raidz1, raidz2, raidz3)",
            ))
        }
    };
    let disks = parts
        .next()
        .ok_or_else(|| error("no NxSIZE disk count and size"))?;
    let (count, size) = disks
        .split_once('x')
        .ok_or_else(|| error("disks must be NxSIZE, e.g. 2x2G"))?;
    let disk_count: u32 = count
        .parse()
        .map_err(|_| error("disk count is not a number"))?;
    let disk_size_bytes = parse_size(size)?;
    let minimum = match layout {
        Layout::Stripe => 1,
        Layout::Mirror => 2,
        Layout::Raidz(parity) => u32::from(parity) + 1,
    };
    if disk_count < minimum {
        return Err(error(&format!(
            "{} needs at least {minimum} disks",
            layout.name()
        )));
    }
    let mut properties = Vec::new();
    let mut bin = None;
    let mut poll_us = None;
    let mut tunables = Vec::new();
    for pair in parts
        .next()
        .unwrap_or_default()
        .split(',')
        .filter(|p| !p.is_empty())
    {
        let (key, val) = pair
            .split_once('=')
            .ok_or_else(|| error("properties must be prop=val,prop=val"))?;
        if key == "bin" {
            bin = Some(PathBuf::from(val));
        } else if let Some(name) = key.strip_prefix("tune.") {
            if name.is_empty() {
                return Err(error(
                    "tune.NAME=VALUE names a tunable (see `ironpool tune`)",
                ));
            }
            tunables.push((name.to_string(), val.to_string()));
        } else if key == "poll_us" {
            poll_us = Some(
                val.parse::<u64>()
                    .map_err(|_| error("poll_us takes microseconds (0: never poll)"))?,
            );
        } else {
            properties.push((key.to_string(), val.to_string()));
        }
    }
    Ok(IronpoolSpec {
        filesystem: false,
        layout,
        disk_count,
        disk_size_bytes,
        log,
        bin,
        poll_us,
        tunables,
        properties,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::{GIB, MIB};

    #[test]
    fn parses_specs() {
        assert_eq!("raw".parse::<TargetSpec>().unwrap(), TargetSpec::Raw(None));
        assert_eq!("ext4".parse::<TargetSpec>().unwrap(), TargetSpec::Ext4);
        assert_eq!(TargetSpec::Ext4.to_string(), "ext4");
        assert!("ext4:/x".parse::<TargetSpec>().is_err());
        assert_eq!(
            "raw:/dev/vdb".parse::<TargetSpec>().unwrap(),
            TargetSpec::Raw(Some("/dev/vdb".into()))
        );
        assert_eq!(
            "nbd:nbd+unix:///pool/vol?socket=/s"
                .parse::<TargetSpec>()
                .unwrap(),
            TargetSpec::Nbd("nbd+unix:///pool/vol?socket=/s".into())
        );
        let spec: TargetSpec = "ironpool:raidz2:6x1G:compression=off,volblocksize=64K"
            .parse()
            .unwrap();
        let TargetSpec::Ironpool(pool) = &spec else {
            panic!("not ironpool")
        };
        assert_eq!(pool.layout, Layout::Raidz(2));
        assert_eq!(pool.disk_count, 6);
        assert_eq!(pool.disk_size_bytes, GIB);
        assert_eq!(pool.properties[1], ("volblocksize".into(), "64K".into()));
        assert_eq!(
            spec.to_string(),
            "ironpool:raidz2:6x1G:compression=off,volblocksize=64K"
        );
        assert_eq!(
            spec.slug(),
            "ironpool-raidz2-6x1G-compression-off-volblocksize-64K"
        );
        let fs: TargetSpec = "ironpool-fs:mirror:2x1G:recordsize=16K".parse().unwrap();
        assert_eq!(fs.kind(), "ironpool-fs");
        assert_eq!(fs.to_string(), "ironpool-fs:mirror:2x1G:recordsize=16K");
        let TargetSpec::Ironpool(fs) = fs else {
            panic!("not ironpool")
        };
        assert!(fs.filesystem);
        let logged: TargetSpec = "ironpool:mirror+log:2x4G:bin=/old/ironpool,sync=always"
            .parse()
            .unwrap();
        assert_eq!(
            logged.to_string(),
            "ironpool:mirror+log:2x4G:bin=/old/ironpool,sync=always"
        );
        let TargetSpec::Ironpool(logged) = logged else {
            panic!("not ironpool")
        };
        assert!(logged.log);
        assert_eq!(logged.bin, Some(PathBuf::from("/old/ironpool")));
        let polled: TargetSpec = "ironpool-fs:mirror:2x4G:poll_us=0,recordsize=16K"
            .parse()
            .unwrap();
        assert_eq!(
            polled.to_string(),
            "ironpool-fs:mirror:2x4G:poll_us=0,recordsize=16K"
        );
        let TargetSpec::Ironpool(polled) = polled else {
            panic!("an ironpool spec")
        };
        assert_eq!(polled.poll_us, Some(0));
        let tuned: TargetSpec = "ironpool:raidz1:4x768M:tune.dirty_data_max_bytes=0"
            .parse()
            .unwrap();
        assert_eq!(
            tuned.to_string(),
            "ironpool:raidz1:4x768M:tune.dirty_data_max_bytes=0"
        );
        let TargetSpec::Ironpool(tuned) = tuned else {
            panic!("an ironpool spec")
        };
        assert_eq!(
            tuned.tunables,
            [("dirty_data_max_bytes".to_string(), "0".to_string())]
        );
        assert!(tuned.properties.is_empty());
        assert!("ironpool:mirror:2x1G:tune.=1"
            .parse::<TargetSpec>()
            .is_err());
        assert!("ironpool:mirror:2x4G:poll_us=soon"
            .parse::<TargetSpec>()
            .is_err());
        assert_eq!(logged.properties, [("sync".into(), "always".into())]);
        assert_eq!(
            "raw-pair".parse::<TargetSpec>().unwrap(),
            TargetSpec::RawPair
        );
        let stripe: TargetSpec = "ironpool:stripe:1x512M".parse().unwrap();
        let TargetSpec::Ironpool(stripe) = stripe else {
            panic!("not ironpool")
        };
        assert_eq!(
            (stripe.layout.create_word(), stripe.disk_size_bytes),
            (None, 512 * MIB)
        );
    }

    #[test]
    fn rejects_bad_specs() {
        assert!(matches!(
            "tape:x".parse::<TargetSpec>(),
            Err(SpecError::UnknownKind(_))
        ));
        assert!(matches!(
            "file".parse::<TargetSpec>(),
            Err(SpecError::MissingValue(_))
        ));
        assert!(matches!(
            "ironpool:mirror:1x2G".parse::<TargetSpec>(),
            Err(SpecError::Ironpool { .. })
        ));
        assert!(matches!(
            "ironpool:mirror:2G".parse::<TargetSpec>(),
            Err(SpecError::Ironpool { .. })
        ));
        assert!(matches!(
            "ironpool:raid5:3x1G".parse::<TargetSpec>(),
            Err(SpecError::Ironpool { .. })
        ));
        assert!(matches!(
            "ironpool:mirror:2x2Q".parse::<TargetSpec>(),
            Err(SpecError::Size(_))
        ));
    }
}
