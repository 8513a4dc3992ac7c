//! A replication package (`send -R`): a subtree of datasets with their
//! properties and snapshots, as one byte stream for `receive`. An
//! incremental package (`send -R -i @FROM` or `-I @FROM`) starts each
//! dataset that has snapshot FROM with a stream incremental from it (the
//! receiver must have FROM); a dataset made since starts with a full one.
//!
//! | part | bytes | what |
//! |---|---|---|
//! | magic | 8 | `IPRPKG01` |
//! | manifest length | 8 | little-endian, at most [`MANIFEST_BYTES_MAX`] |
//! | manifest | length | JSON ([`Manifest`]) |
//! | streams | ... | the send streams the manifest lists, one after another, each whole (BEGIN to END, see [`super::stream`]) |
//!
//! A stream's records carry their own lengths and its END closes it, so
//! the streams need no framing of their own: a reader takes one record at
//! a time ([`copy_one_stream`]) and knows where the next stream starts.
//! Each stream keeps its own chained checksums; the manifest is checked
//! against them as the receiver applies each (a stream names its snapshot).

use std::collections::BTreeMap;
use std::io::{Read, Write};

use serde::{Deserialize, Serialize};

use super::stream::{decode_header, RecordKind, RECORD_HEADER_BYTES};

/// The first bytes of a package (a lone stream starts with `IPSR`).
pub const PACKAGE_MAGIC: [u8; 8] = *b"IPRPKG01";
/// Largest manifest: a few hundred bytes per dataset and snapshot; 16 MiB
/// is tens of thousands of them, and bounds what a reader allocates
/// before it has checked anything.
pub const MANIFEST_BYTES_MAX: u64 = 16 * 1024 * 1024;
/// Version of a full package's manifest (no `from`), which every build
/// that reads packages reads.
pub const MANIFEST_VERSION: u32 = 1;
/// Version of an incremental package's manifest (`from` set): a build
/// that reads only version 1 refuses it rather than take its first
/// streams for full ones.
pub const MANIFEST_VERSION_INCREMENTAL: u32 = 2;

/// What a package holds, in the order its streams come.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub version: u32,
    /// The snapshot sent (`-R POOL/A@SNAP`): every dataset's streams end
    /// at its snapshot of this name.
    pub snapshot: String,
    /// An incremental package's base snapshot (`-i @FROM`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// The subtree, parents before children.
    pub datasets: Vec<PackageDataset>,
    /// The datasets of the subtree the sender has and did not send (they
    /// lack the snapshot, or lie below one that does), by name below its
    /// top: `receive -F` keeps their copies, and destroys those of any
    /// other dataset the package does not name (it is gone on the
    /// sender). None (a package of an older build): nothing is destroyed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unsent: Option<Vec<String>>,
}

/// One dataset of a package.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PackageDataset {
    /// Its name below the top of the subtree (`""` for the top itself,
    /// `b/c` for `POOL/A/b/c` when `POOL/A` was sent).
    pub name: String,
    /// `filesystem` or `volume`.
    pub kind: String,
    /// Its own properties (source `local`), set on the received dataset.
    pub properties: BTreeMap<String, String>,
    /// Its snapshots in the order their streams follow: the first a full
    /// stream (or, with `from`, incremental from it), each next one
    /// incremental from the one before.
    pub snapshots: Vec<String>,
    /// The snapshot (the package's `from`) its first stream is
    /// incremental from; None: its first stream is full.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// Every snapshot the sender's dataset has, sent or not: `receive -F`
    /// destroys the copy's others (gone on the sender), as `zfs receive
    /// -F` of a replication stream does. None (a package of an older
    /// build): no snapshot is destroyed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub existing: Option<Vec<String>>,
}

/// Why a package is refused.
#[derive(Debug, thiserror::Error)]
pub enum PackageError {
    #[error("reading the package: {0}")]
    Io(#[from] std::io::Error),
    #[error("not a replication package")]
    NotAPackage,
    #[error("the package's manifest is {0} bytes, more than the {MANIFEST_BYTES_MAX} allowed")]
    ManifestTooLarge(u64),
    #[error("the package's manifest is malformed: {0}")]
    Manifest(String),
    #[error("the package's stream is damaged: {0}")]
    Stream(#[from] super::stream::StreamError),
}

/// Writes the package's magic and manifest.
pub fn write_header(output: &mut impl Write, manifest: &Manifest) -> std::io::Result<()> {
    let json = serde_json::to_vec(manifest).expect("a manifest serializes");
    output.write_all(&PACKAGE_MAGIC)?;
    output.write_all(&(json.len() as u64).to_le_bytes())?;
    output.write_all(&json)
}

/// Reads the manifest of a package whose magic was read already.
pub fn read_manifest(input: &mut impl Read) -> Result<Manifest, PackageError> {
    let mut length = [0u8; 8];
    input.read_exact(&mut length)?;
    let length = u64::from_le_bytes(length);
    if length > MANIFEST_BYTES_MAX {
        return Err(PackageError::ManifestTooLarge(length));
    }
    let mut json = vec![0u8; length as usize];
    input.read_exact(&mut json)?;
    let manifest: Manifest =
        serde_json::from_slice(&json).map_err(|error| PackageError::Manifest(error.to_string()))?;
    let wanted = if manifest.from.is_some() {
        MANIFEST_VERSION_INCREMENTAL
    } else {
        MANIFEST_VERSION
    };
    if manifest.version != wanted {
        return Err(PackageError::Manifest(format!(
            "version {} (this build reads {MANIFEST_VERSION} and, with a base snapshot, {MANIFEST_VERSION_INCREMENTAL})",
            manifest.version
        )));
    }
    if let Some(from) = manifest
        .from
        .as_deref()
        .filter(|from| !super::valid_name(from))
    {
        return Err(PackageError::Manifest(format!(
            "base snapshot name '{from}'"
        )));
    }
    for dataset in &manifest.datasets {
        let name_ok = dataset.name.is_empty() || dataset.name.split('/').all(super::valid_name);
        if !name_ok || !matches!(dataset.kind.as_str(), "filesystem" | "volume") {
            return Err(PackageError::Manifest(format!(
                "dataset '{}' ({})",
                dataset.name, dataset.kind
            )));
        }
        if let Some(bad) = dataset
            .snapshots
            .iter()
            .chain(dataset.existing.iter().flatten())
            .find(|name| !super::valid_name(name))
        {
            return Err(PackageError::Manifest(format!(
                "dataset '{}': snapshot name '{bad}'",
                dataset.name
            )));
        }
        if dataset.from.is_some() && dataset.from != manifest.from {
            return Err(PackageError::Manifest(format!(
                "dataset '{}' starts from a snapshot other than the package's base",
                dataset.name
            )));
        }
        if dataset.snapshots.is_empty() {
            return Err(PackageError::Manifest(format!(
                "dataset '{}' has no snapshot",
                dataset.name
            )));
        }
        if let Some(missing) = dataset.existing.as_ref().and_then(|existing| {
            dataset
                .snapshots
                .iter()
                .find(|sent| !existing.contains(sent))
        }) {
            return Err(PackageError::Manifest(format!(
                "dataset '{}': snapshot '{missing}' is sent but not among those it has",
                dataset.name
            )));
        }
    }
    if let Some(bad) = manifest.unsent.iter().flatten().find(|name| {
        name.is_empty()
            || !name.split('/').all(super::valid_name)
            || manifest.datasets.iter().any(|sent| &sent.name == *name)
    }) {
        return Err(PackageError::Manifest(format!(
            "unsent dataset '{bad}' (empty, malformed or also sent)"
        )));
    }
    Ok(manifest)
}

/// Copies one whole send stream from `input` to `output`, record by
/// record, reading nothing past its END: the next stream of a package
/// starts right after. Returns the bytes copied. The records' checksums
/// are the receiver's to check; here only their headers are read.
pub fn copy_one_stream(
    input: &mut impl Read,
    output: &mut impl Write,
) -> Result<u64, PackageError> {
    let mut copied = 0u64;
    let mut payload = Vec::new();
    for record in 0u64.. {
        let mut header = [0u8; RECORD_HEADER_BYTES];
        input.read_exact(&mut header)?;
        let parsed = decode_header(&header, record)?;
        payload.resize(parsed.payload_bytes as usize, 0);
        input.read_exact(&mut payload)?;
        output.write_all(&header)?;
        output.write_all(&payload)?;
        copied += (RECORD_HEADER_BYTES + payload.len()) as u64;
        if parsed.kind == RecordKind::End {
            break;
        }
    }
    Ok(copied)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manifest_round_trips_and_bad_ones_are_refused() {
        let manifest = Manifest {
            version: MANIFEST_VERSION,
            snapshot: "s".into(),
            datasets: vec![PackageDataset {
                name: "b/c".into(),
                kind: "filesystem".into(),
                properties: BTreeMap::from([("atime".into(), "off".into())]),
                snapshots: vec!["r".into(), "s".into()],
                from: None,
                existing: Some(vec!["p".into(), "r".into(), "s".into()]),
            }],
            from: None,
            unsent: Some(vec!["late".into()]),
        };
        let mut bytes = Vec::new();
        write_header(&mut bytes, &manifest).unwrap();
        assert_eq!(&bytes[..8], &PACKAGE_MAGIC);
        assert_eq!(read_manifest(&mut &bytes[8..]).unwrap(), manifest);
        let mut huge = Vec::new();
        huge.extend_from_slice(&(MANIFEST_BYTES_MAX + 1).to_le_bytes());
        assert!(matches!(
            read_manifest(&mut &huge[..]),
            Err(PackageError::ManifestTooLarge(_))
        ));
        for bad in ["../x", "a//b", "a@b"] {
            let mut wrong = manifest.clone();
            wrong.datasets[0].name = bad.into();
            let mut bytes = Vec::new();
            write_header(&mut bytes, &wrong).unwrap();
            assert!(read_manifest(&mut &bytes[8..]).is_err(), "{bad}");
        }
        // What `receive -F` destroys by must be well formed: a snapshot
        // sent is one the dataset has; an unsent dataset is not sent too.
        for wrong in [
            {
                let mut wrong = manifest.clone();
                wrong.datasets[0].existing = Some(vec!["s".into()]);
                wrong
            },
            {
                let mut wrong = manifest.clone();
                wrong.datasets[0].existing = Some(vec!["r".into(), "s".into(), "a@b".into()]);
                wrong
            },
            Manifest {
                unsent: Some(vec!["b/c".into()]),
                ..manifest.clone()
            },
            Manifest {
                unsent: Some(vec!["".into()]),
                ..manifest.clone()
            },
        ] {
            let mut bytes = Vec::new();
            write_header(&mut bytes, &wrong).unwrap();
            assert!(read_manifest(&mut &bytes[8..]).is_err(), "{wrong:?}");
        }
        // A package of an older build (neither) reads, and destroys nothing.
        let older = br#"{"version":1,"snapshot":"s","datasets":[{"name":"","kind":"volume","properties":{},"snapshots":["s"]}]}"#;
        let mut bytes = (older.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(older);
        let read = read_manifest(&mut &bytes[..]).unwrap();
        assert!(read.unsent.is_none() && read.datasets[0].existing.is_none());
        // An incremental package: version 2, its datasets' bases its own.
        let mut incremental = manifest.clone();
        incremental.version = MANIFEST_VERSION_INCREMENTAL;
        incremental.from = Some("q".into());
        incremental.datasets[0].from = Some("q".into());
        let mut bytes = Vec::new();
        write_header(&mut bytes, &incremental).unwrap();
        assert_eq!(read_manifest(&mut &bytes[8..]).unwrap(), incremental);
        for wrong in [
            Manifest {
                version: MANIFEST_VERSION,
                ..incremental.clone()
            },
            Manifest {
                from: Some("a/b".into()),
                ..incremental.clone()
            },
            Manifest {
                from: Some("p".into()),
                ..incremental.clone()
            },
        ] {
            let mut bytes = Vec::new();
            write_header(&mut bytes, &wrong).unwrap();
            assert!(read_manifest(&mut &bytes[8..]).is_err(), "{wrong:?}");
        }
        let mut truncated = Vec::new();
        write_header(&mut truncated, &manifest).unwrap();
        truncated.truncate(20);
        assert!(read_manifest(&mut &truncated[8..]).is_err());
    }

    #[test]
    fn a_stream_is_copied_up_to_its_end_and_no_further() {
        let mut stream = Vec::new();
        let mut previous = [0u8; 16];
        for (kind, payload) in [
            (RecordKind::Begin, vec![7u8; 40]),
            (RecordKind::End, vec![0u8; 24]),
        ] {
            let (header, checksum) =
                super::super::stream::encode_header(kind, &[&payload], &previous);
            previous = checksum;
            stream.extend_from_slice(&header);
            stream.extend_from_slice(&payload);
        }
        let mut input = stream.clone();
        input.extend_from_slice(b"next stream");
        let mut reader = &input[..];
        let mut copied = Vec::new();
        let bytes = copy_one_stream(&mut reader, &mut copied).unwrap();
        assert_eq!(bytes as usize, stream.len());
        assert_eq!(copied, stream);
        assert_eq!(reader, b"next stream");
        // A stream cut short, or not a stream, is refused.
        assert!(copy_one_stream(&mut &stream[..50], &mut Vec::new()).is_err());
        assert!(copy_one_stream(
            &mut &b"IPRPKG01 and more bytes than a header"[..],
            &mut Vec::new()
        )
        .is_err());
    }
}
