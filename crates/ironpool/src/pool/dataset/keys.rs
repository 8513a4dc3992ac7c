//! Keys of encrypted volumes and filesystems (issue 73): creating an
//! encryption root, `load-key`, `unload-key` and `change-key`, and which
//! keys are loaded.
//!
//! An encrypted dataset's directory record holds its master key wrapped by
//! the user's key ([`CryptRecord`]); the key itself is in memory only while
//! loaded, in [`LoadedKeys`], by the record's key guid. A clone of an
//! encrypted volume's snapshot keeps its origin's record, and so its key
//! guid and master key: the two are one encryption root, loaded, unloaded
//! and rewrapped together (OpenZFS's clones keep their origin's encryption
//! root too).
//!
//! What needs the key: a volume's reads and writes of data (so it is
//! exported over NBD only while loaded), a filesystem's reads and writes
//! of files and directories (so it is mounted only while loaded), and
//! sends. What does not: import, intent log replay (an encrypted dataset
//! logs block pointers, sizes and times, never copies of its data, names
//! or attributes), scrub, resilver, device removal, trim, snapshots and
//! destroys, which handle blocks as stored.

use std::collections::BTreeMap;
use std::rc::Rc;

use zeroize::Zeroizing;

use crate::crypto::{
    CryptoError, DatasetKey, KeyFormat, KeyParams, Suite, WrappedKey, WrappingKey,
    PASSPHRASE_BYTES_MAX,
};
use crate::pool::dataset::directory::CryptRecord;
use crate::pool::PoolError;

/// Largest key file read (`keylocation=file://`): a passphrase's limit,
/// with room for a newline; a larger file is not a key.
const KEY_FILE_BYTES_MAX: u64 = PASSPHRASE_BYTES_MAX as u64 + 2;

/// The properties that make a dataset encrypted, given at `volume create`
/// or `fs create` only: taken out of its properties before the others are
/// checked.
pub const ENCRYPTION_PROPERTIES: [&str; 4] =
    ["encryption", "keyformat", "keylocation", "pbkdf2iters"];

/// The keys loaded, by key guid, and those being unloaded.
#[derive(Default)]
pub struct LoadedKeys {
    /// The keys, and those being unloaded: their volumes are no longer
    /// exported while their write-back drains, before the key goes.
    pub(in crate::pool) keys: crate::crypto::KeyRing,
}

/// What `volume create` or `fs create -o encryption=...` asks for.
pub struct NewEncryption {
    pub suite: Suite,
    pub params: KeyParams,
    pub keylocation: String,
    /// The user's key when the caller read it (a prompt); else it is read
    /// from `keylocation`.
    pub material: Option<Zeroizing<Vec<u8>>>,
}

impl NewEncryption {
    /// Takes the encryption properties out of `properties`: None when
    /// `encryption` is absent or `off` (and then no other may be given).
    pub fn take(
        properties: &mut BTreeMap<String, String>,
        material: Option<Zeroizing<Vec<u8>>>,
    ) -> Result<Option<NewEncryption>, PoolError> {
        let mut given: BTreeMap<&str, String> = BTreeMap::new();
        for name in ENCRYPTION_PROPERTIES {
            if let Some(value) = properties.remove(name) {
                given.insert(name, value);
            }
        }
        let encryption = given.remove("encryption");
        let Some(suite) = encryption.filter(|value| value != "off") else {
            if let Some(name) = given.keys().next() {
                return Err(PoolError::InvalidArgument(format!(
                    "{name} applies to an encrypted volume or filesystem only (-o encryption=on)"
                )));
            }
            return Ok(None);
        };
        let suite = Suite::parse(&suite).map_err(invalid)?;
        let format = match given.remove("keyformat") {
            Some(value) => KeyFormat::parse(&value).map_err(invalid)?,
            None => {
                return Err(PoolError::InvalidArgument(
                    "an encrypted volume or filesystem needs keyformat=raw|hex|passphrase".into(),
                ))
            }
        };
        let iterations = match given.remove("pbkdf2iters") {
            Some(value) => Some(value.parse::<u32>().map_err(|_| {
                PoolError::InvalidArgument(format!("pbkdf2iters={value}: not a number"))
            })?),
            None => None,
        };
        let keylocation = given
            .remove("keylocation")
            .unwrap_or_else(|| "prompt".into());
        check_keylocation(&keylocation)?;
        if let Some(checksum) = properties.get("checksum") {
            if !matches!(checksum.as_str(), "xxh3" | "on") {
                return Err(PoolError::InvalidArgument(format!(
                    "checksum={checksum}: an encrypted dataset's blocks use xxh3 (the MAC takes the other half of the checksum's place)"
                )));
            }
        }
        Ok(Some(NewEncryption {
            suite,
            params: KeyParams::new(format, iterations).map_err(invalid)?,
            keylocation,
            material,
        }))
    }
}

/// How a dataset (volume or filesystem) being created is encrypted (none:
/// it takes the key of the encrypted filesystem it is under, if any); see
/// [`crate::pool::Pool::crypt_of_new`].
pub enum CreateKey {
    /// A new encryption root (`volume create -o encryption=...`).
    New(NewEncryption),
    /// The sender's root, as a raw stream carries it (its master key
    /// wrapped by the sender's user key): see [`received_crypt`].
    Received(CryptRecord),
    /// `encryption=off` given: refused under an encrypted filesystem,
    /// whose key the volume would take otherwise.
    Off,
}

impl CreateKey {
    /// Takes the encryption properties out of `properties` (see
    /// [`NewEncryption::take`]), the user's key being `material` or read
    /// from the `keylocation` given.
    pub fn take(
        properties: &mut BTreeMap<String, String>,
        material: Option<Zeroizing<Vec<u8>>>,
    ) -> Result<Option<CreateKey>, PoolError> {
        let off = encryption_off_given(properties);
        Ok(match NewEncryption::take(properties, material)? {
            Some(encryption) => Some(CreateKey::New(encryption)),
            None if off => Some(CreateKey::Off),
            None => None,
        })
    }
}

/// The encryption record of a volume a raw stream creates: the sender's
/// key guid and wrapped master key, so the sender's user key loads it;
/// `keylocation` (`receive -o keylocation=...`) or `prompt`.
pub fn received_crypt(
    raw: &crate::format::stream::RawKey,
    keylocation: Option<String>,
) -> Result<CryptRecord, PoolError> {
    let keylocation = keylocation.unwrap_or_else(|| "prompt".into());
    check_keylocation(&keylocation)?;
    let record = CryptRecord {
        key_guid: raw.key_guid,
        wrapped_key: raw.wrapped_key.clone(),
        keylocation,
    };
    if raw.key_guid == 0 {
        return Err(PoolError::InvalidArgument(
            "stream refused: its key guid is 0".into(),
        ));
    }
    decode_wrapped("the stream", &record).map_err(|_| {
        PoolError::InvalidArgument("stream refused: its wrapped key is damaged".into())
    })?;
    Ok(record)
}

/// Whether `properties` ask for `encryption=off` (before
/// [`NewEncryption::take`] takes it out): refused under an encrypted
/// parent ([`Pool::inherited_crypt`]).
fn encryption_off_given(properties: &BTreeMap<String, String>) -> bool {
    properties.get("encryption").map(String::as_str) == Some("off")
}

pub(in crate::pool) fn invalid(error: CryptoError) -> PoolError {
    PoolError::InvalidArgument(error.to_string())
}

/// Checks a `keylocation`: `prompt` or `file://` and an absolute path.
pub fn check_keylocation(location: &str) -> Result<(), PoolError> {
    if location == "prompt" || key_file(location).is_some() {
        return Ok(());
    }
    Err(PoolError::InvalidArgument(format!(
        "keylocation={location}: expected prompt or file:///ABSOLUTE/PATH"
    )))
}

pub(in crate::pool) fn key_file(location: &str) -> Option<&str> {
    location
        .strip_prefix("file://")
        .filter(|path| path.starts_with('/'))
}

/// Reads the user's key from `location` (a `file://` one), at most
/// [`KEY_FILE_BYTES_MAX`] bytes of it: the server for `keylocation`, the
/// command line for `load-key -L`.
pub fn read_key_file(name: &str, location: &str) -> Result<Zeroizing<Vec<u8>>, PoolError> {
    let Some(path) = key_file(location) else {
        return Err(PoolError::InvalidArgument(format!(
            "{name} has keylocation={location}: give the key on standard input (load-key reads it there)"
        )));
    };
    let file = std::fs::File::open(path).map_err(|error| {
        PoolError::InvalidArgument(format!("{name}: cannot open key file {path}: {error}"))
    })?;
    let mut material = Zeroizing::new(Vec::new());
    use std::io::Read;
    file.take(KEY_FILE_BYTES_MAX + 1)
        .read_to_end(&mut material)
        .map_err(|error| {
            PoolError::InvalidArgument(format!("{name}: cannot read key file {path}: {error}"))
        })?;
    if material.len() as u64 > KEY_FILE_BYTES_MAX {
        return Err(PoolError::InvalidArgument(format!(
            "{name}: key file {path} is larger than any key ({KEY_FILE_BYTES_MAX} bytes)"
        )));
    }
    Ok(material)
}

/// The wrapping key of `material` under `params`. A passphrase's PBKDF2
/// (a third of a second at the default iterations) runs on a thread of its
/// own, so the engine goes on serving meanwhile; a raw or hex key is read
/// inline.
pub(in crate::pool) async fn derive_wrapping(
    params: KeyParams,
    material: Zeroizing<Vec<u8>>,
) -> Result<WrappingKey, PoolError> {
    if params.format != KeyFormat::Passphrase {
        return WrappingKey::derive(&params, &material).map_err(invalid);
    }
    let derived = crate::rt::offload::run_apart(move || {
        Ok(WrappingKey::derive(&params, &material).map_err(invalid))
    })
    .await;
    derived.map_err(|error| PoolError::Io(format!("deriving the key: {error}")))?
}

impl LoadedKeys {
    /// The loaded key of `guid`, for reading and writing blocks (a key
    /// being unloaded still writes out its volumes' held blocks).
    pub fn get(&self, guid: u64) -> Option<Rc<DatasetKey>> {
        self.keys.get(guid)
    }

    /// The keys themselves, shared with the object sets that seal blocks.
    pub fn ring(&self) -> crate::crypto::KeyRing {
        self.keys.clone()
    }

    /// Whether the volumes of `guid` may be served: loaded, and not being
    /// unloaded.
    pub fn available(&self, guid: u64) -> bool {
        self.keys.usable(guid)
    }
}

/// Lower-case hexadecimal of `bytes` (the directory is JSON).
pub(in crate::pool) fn decode_wrapped(
    name: &str,
    record: &CryptRecord,
) -> Result<WrappedKey, PoolError> {
    unhex(&record.wrapped_key)
        .and_then(|bytes| WrappedKey::decode(&bytes).ok())
        .ok_or_else(|| PoolError::Corrupt(format!("{name}: its wrapped key is damaged")))
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// The bytes of hexadecimal `text`, or None if it is not.
pub fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || !text.is_ascii() {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|at| u8::from_str_radix(&text[at..at + 2], 16).ok())
        .collect()
}
