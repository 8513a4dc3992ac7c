//! Native encryption's primitives: the user's key, the master key it wraps,
//! and the sealing of one block (issue 73). Nothing here touches a device:
//! the pool stores what these functions return (docs/FORMAT.md,
//! "Encryption").
//!
//! Three keys, as OpenZFS has them:
//! - The **user's key** (a passphrase, or 32 raw or hex bytes) never reaches
//!   a device. A passphrase is stretched with PBKDF2-HMAC-SHA512 over a
//!   random salt stored beside the wrapped key, so that guessing costs
//!   `pbkdf2iters` hashes per guess. What it gives is the *wrapping key*.
//! - The **master key** is random, one per encryption root, made once. It
//!   is stored only wrapped (sealed with AES-256-GCM under the wrapping key),
//!   so `change-key` rewraps 48 bytes and rewrites no data, and a wrong user
//!   key fails the wrapped key's tag: it is refused, never used.
//! - **Block keys** are derived from the master key with HKDF-SHA256 and a
//!   random 64-bit salt, drawn when the key is loaded and again after
//!   [`SALT_USES_MAX`] blocks. A block's 96-bit IV is the salt's own 32
//!   random bits, then a 64-bit counter that starts at a random value and
//!   counts the salt's blocks. GCM fails badly if one key seals two blocks
//!   with one IV (the XOR of the plaintexts and the hash key leak): under
//!   one salt's key the counter never repeats (it would take 2^64 blocks),
//!   so no two blocks share an IV. Two loads that drew the same salt (2^-64
//!   per pair of loads) share a key; they would also need the same 32
//!   random bits and overlapping runs of their random counters to repeat an
//!   IV. A counter is also cheaper than drawing 12 random bytes per block
//!   (0.44 us each here, against 1.1 us to seal 16 KiB).
//!
//! Crate choice: `aws-lc-rs`. Measured on this machine (a scratch crate,
//! `--release`, one core, AES-256-GCM sealing in place, 2 GiB per size):
//! 16 KiB blocks 15.4 GB/s, against 10.1 GB/s for `ring` and 3.9 GB/s for
//! RustCrypto's `aes-gcm` (4 KiB: 12.4, 9.5, 3.6; 128 KiB: 16.1, 10.4,
//! 3.9). AWS-LC also cleanses the memory of a key it frees, so an unloaded
//! key's schedule does not stay in the heap; the key bytes this module
//! holds itself are `Zeroizing`.

use std::cell::{Cell, RefCell};
use std::num::NonZeroU32;
use std::sync::Arc;

use aws_lc_rs::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
use aws_lc_rs::{hkdf, pbkdf2};
use zeroize::Zeroizing;

pub mod gather;

/// Bytes of a batch to seal, or of the opens of one round of the loop
/// ([`gather`]), from which the work goes to a worker thread
/// ([`crate::rt::offload`]) rather than the engine: a handoff costs the
/// server about 9 us of CPU (measured for lz4, `pool::data`'s
/// `INLINE_LZ4_MAX_BYTES`), and AES-256-GCM runs at about 3.4 GB/s on one
/// core of this project's test machine (`--example crypto_speed`,
/// 2026-12-07), so 64 KiB (about 19 us) repays it.
pub const CRYPT_OFFLOAD_MIN_BYTES: usize = 64 * 1024;

/// Bytes of a raw user key, of a master key and of an AES-256 key.
pub const KEY_BYTES: usize = 32;
/// Bytes of an IV (GCM's 96-bit nonce) and of a MAC (GCM's full tag,
/// never truncated), as block pointers store them.
pub use crate::format::bp::{IV_BYTES, MAC_BYTES};
/// Bytes of the PBKDF2 salt stored with a wrapped key (NIST SP 800-132
/// asks for at least 16).
pub const PBKDF2_SALT_BYTES: usize = 32;
/// PBKDF2 iterations when none are asked for: OpenZFS's default, which
/// costs a guess about a third of a second on this machine's cores.
pub const PBKDF2_ITERATIONS_DEFAULT: u32 = 350_000;
/// Fewest PBKDF2 iterations accepted (OpenZFS's minimum): fewer would make a
/// passphrase cheap to guess from a stolen device.
pub const PBKDF2_ITERATIONS_MIN: u32 = 100_000;
/// Most PBKDF2 iterations accepted: a larger count would hold `load-key`
/// for minutes (and the engine's thread with it, where it runs there).
pub const PBKDF2_ITERATIONS_MAX: u32 = 100_000_000;
/// Shortest passphrase accepted (OpenZFS's minimum).
pub const PASSPHRASE_BYTES_MIN: usize = 8;
/// Longest passphrase accepted (OpenZFS's maximum): bounds what a key file
/// or a prompt is read for.
pub const PASSPHRASE_BYTES_MAX: usize = 512;
/// Blocks sealed under one salt's key before a new salt is drawn (OpenZFS's
/// default). See the module's note on IVs.
pub const SALT_USES_MAX: u64 = 400_000_000;
/// Block keys of older salts kept derived for reads: a pool read back
/// after several server runs meets a salt per run; a key not kept costs one
/// HKDF (about a microsecond) when next needed.
pub const BLOCK_KEYS_CACHED: usize = 16;
/// Encoded size of a [`WrappedKey`].
pub const WRAPPED_KEY_BYTES: usize = 8 + 4 + PBKDF2_SALT_BYTES + IV_BYTES + KEY_BYTES + MAC_BYTES;
/// Version byte of a [`WrappedKey`]'s encoding.
const WRAPPED_KEY_VERSION: u8 = 1;
/// Domain of the wrapped key's associated data: the tag binds the suite,
/// the key format, the iterations and the salt to the key.
const WRAPPED_KEY_DOMAIN: &[u8] = b"ironpool wrapped master key v1";
/// HKDF's `info` for block keys: keys derived for another use never equal
/// these.
const BLOCK_KEY_INFO: &[u8] = b"ironpool block key v1";
/// HKDF's `info` for the key of object-set MACs (no salt: one per master
/// key, for the dataset's whole life).
const OBJSET_MAC_KEY_INFO: &[u8] = b"ironpool objset mac v1";
/// Domain of an object-set MAC's input.
const OBJSET_MAC_DOMAIN: &[u8] = b"ironpool objset 1";

/// Why a key or a block was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CryptoError {
    #[error("{0}")]
    BadKeyMaterial(String),
    #[error("wrong key: it does not open the dataset's wrapped master key")]
    WrongKey,
    #[error("the block failed its authentication (MAC): altered, or sealed under another key")]
    Authentication,
    #[error("the stored wrapped key is malformed: {0}")]
    Malformed(&'static str),
    #[error("the system's random number generator failed")]
    Random,
}

/// The cipher of an encryption root (`encryption=`). `on` means
/// AES-256-GCM, as in OpenZFS. The CCM suites OpenZFS also offers are not:
/// AWS-LC has no general AES-CCM, and GCM is OpenZFS's default and faster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Suite {
    Aes128Gcm,
    Aes256Gcm,
}

impl Suite {
    /// The property value: `aes-128-gcm` or `aes-256-gcm`.
    pub fn name(self) -> &'static str {
        match self {
            Suite::Aes128Gcm => "aes-128-gcm",
            Suite::Aes256Gcm => "aes-256-gcm",
        }
    }

    /// Parses an `encryption=` value other than `off`.
    pub fn parse(value: &str) -> Result<Suite, CryptoError> {
        match value {
            "on" | "aes-256-gcm" => Ok(Suite::Aes256Gcm),
            "aes-128-gcm" => Ok(Suite::Aes128Gcm),
            "aes-128-ccm" | "aes-192-ccm" | "aes-256-ccm" | "aes-192-gcm" => {
                Err(CryptoError::BadKeyMaterial(format!(
                    "encryption={value} is not offered: use on (aes-256-gcm) or aes-128-gcm"
                )))
            }
            _ => Err(CryptoError::BadKeyMaterial(format!(
                "encryption={value}: expected off, on, aes-256-gcm or aes-128-gcm"
            ))),
        }
    }

    /// The code stored in a wrapped key.
    pub fn code(self) -> u8 {
        match self {
            Suite::Aes128Gcm => 1,
            Suite::Aes256Gcm => 2,
        }
    }

    pub fn from_code(code: u8) -> Option<Suite> {
        match code {
            1 => Some(Suite::Aes128Gcm),
            2 => Some(Suite::Aes256Gcm),
            _ => None,
        }
    }

    fn algorithm(self) -> &'static aead::Algorithm {
        match self {
            Suite::Aes128Gcm => &aead::AES_128_GCM,
            Suite::Aes256Gcm => &aead::AES_256_GCM,
        }
    }

    fn key_bytes(self) -> usize {
        self.algorithm().key_len()
    }
}

/// How the user's key is given (`keyformat=`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyFormat {
    /// Exactly 32 bytes.
    Raw,
    /// 64 hexadecimal digits (a trailing newline is ignored).
    Hex,
    /// 8 to 512 bytes (a trailing newline is ignored), stretched by PBKDF2.
    Passphrase,
}

impl KeyFormat {
    pub fn name(self) -> &'static str {
        match self {
            KeyFormat::Raw => "raw",
            KeyFormat::Hex => "hex",
            KeyFormat::Passphrase => "passphrase",
        }
    }

    pub fn parse(value: &str) -> Result<KeyFormat, CryptoError> {
        match value {
            "raw" => Ok(KeyFormat::Raw),
            "hex" => Ok(KeyFormat::Hex),
            "passphrase" => Ok(KeyFormat::Passphrase),
            _ => Err(CryptoError::BadKeyMaterial(format!(
                "keyformat={value}: expected raw, hex or passphrase"
            ))),
        }
    }

    fn code(self) -> u8 {
        match self {
            KeyFormat::Raw => 1,
            KeyFormat::Hex => 2,
            KeyFormat::Passphrase => 3,
        }
    }

    fn from_code(code: u8) -> Option<KeyFormat> {
        match code {
            1 => Some(KeyFormat::Raw),
            2 => Some(KeyFormat::Hex),
            3 => Some(KeyFormat::Passphrase),
            _ => None,
        }
    }
}

/// How a user's key becomes the wrapping key: its format, and for a
/// passphrase the PBKDF2 iterations and salt. Stored in the clear with the
/// wrapped key (they are not secret; the tag binds them to it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyParams {
    pub format: KeyFormat,
    pub iterations: u32,
    pub salt: [u8; PBKDF2_SALT_BYTES],
}

impl KeyParams {
    /// New parameters for a key of `format`, with a fresh salt;
    /// `iterations` (a passphrase's) is checked against the bounds.
    pub fn new(format: KeyFormat, iterations: Option<u32>) -> Result<KeyParams, CryptoError> {
        let iterations = match format {
            KeyFormat::Passphrase => {
                let iterations = iterations.unwrap_or(PBKDF2_ITERATIONS_DEFAULT);
                check_iterations(iterations)?;
                iterations
            }
            _ if iterations.is_some() => {
                return Err(CryptoError::BadKeyMaterial(
                    "pbkdf2iters applies to keyformat=passphrase only".into(),
                ))
            }
            _ => 0,
        };
        let mut salt = [0u8; PBKDF2_SALT_BYTES];
        random(&mut salt)?;
        Ok(KeyParams {
            format,
            iterations,
            salt,
        })
    }
}

fn check_iterations(iterations: u32) -> Result<(), CryptoError> {
    if !(PBKDF2_ITERATIONS_MIN..=PBKDF2_ITERATIONS_MAX).contains(&iterations) {
        return Err(CryptoError::BadKeyMaterial(format!(
            "pbkdf2iters={iterations}: expected {PBKDF2_ITERATIONS_MIN} to {PBKDF2_ITERATIONS_MAX}"
        )));
    }
    Ok(())
}

/// Fills `out` from AWS-LC's generator (a DRBG seeded from the kernel);
/// under the simulator, from its seeded generator instead, so that a run
/// with encrypted volumes writes the same bytes each time it replays
/// (never outside one: a server's keys, salts and IVs are always AWS-LC's).
pub fn random(out: &mut [u8]) -> Result<(), CryptoError> {
    if crate::rt::in_simulation() {
        for chunk in out.chunks_mut(8) {
            let draw = crate::rt::simulated_random_u64().ok_or(CryptoError::Random)?;
            chunk.copy_from_slice(&draw.to_le_bytes()[..chunk.len()]);
        }
        return Ok(());
    }
    aws_lc_rs::rand::fill(out).map_err(|_| CryptoError::Random)
}

/// The key that wraps a master key, made from the user's key material.
pub struct WrappingKey(Zeroizing<[u8; KEY_BYTES]>);

impl WrappingKey {
    /// Checks `material` (a key file's bytes, or what was typed) against
    /// `params.format` and derives the wrapping key from it. A passphrase
    /// costs `params.iterations` hashes: the caller runs this off the
    /// engine's thread.
    pub fn derive(params: &KeyParams, material: &[u8]) -> Result<WrappingKey, CryptoError> {
        let mut key = Zeroizing::new([0u8; KEY_BYTES]);
        match params.format {
            KeyFormat::Raw => {
                if material.len() != KEY_BYTES {
                    return Err(CryptoError::BadKeyMaterial(format!(
                        "a raw key is exactly {KEY_BYTES} bytes; this one is {}",
                        material.len()
                    )));
                }
                key.copy_from_slice(material);
            }
            KeyFormat::Hex => {
                let text = trim_newline(material);
                if text.len() != 2 * KEY_BYTES {
                    return Err(CryptoError::BadKeyMaterial(format!(
                        "a hex key is exactly {} hexadecimal digits; this one is {} characters",
                        2 * KEY_BYTES,
                        text.len()
                    )));
                }
                for (index, pair) in text.chunks_exact(2).enumerate() {
                    let digits = (hex_digit(pair[0]), hex_digit(pair[1]));
                    let (Some(high), Some(low)) = digits else {
                        return Err(CryptoError::BadKeyMaterial(
                            "a hex key holds hexadecimal digits only".into(),
                        ));
                    };
                    key[index] = high << 4 | low;
                }
            }
            KeyFormat::Passphrase => {
                let text = trim_newline(material);
                if !(PASSPHRASE_BYTES_MIN..=PASSPHRASE_BYTES_MAX).contains(&text.len()) {
                    return Err(CryptoError::BadKeyMaterial(format!(
                        "a passphrase is {PASSPHRASE_BYTES_MIN} to {PASSPHRASE_BYTES_MAX} bytes; this one is {}",
                        text.len()
                    )));
                }
                check_iterations(params.iterations)?;
                let iterations = NonZeroU32::new(params.iterations)
                    .ok_or(CryptoError::Malformed("iterations"))?;
                pbkdf2::derive(
                    pbkdf2::PBKDF2_HMAC_SHA512,
                    iterations,
                    &params.salt,
                    text,
                    &mut key[..],
                );
            }
        }
        Ok(WrappingKey(key))
    }
}

fn trim_newline(material: &[u8]) -> &[u8] {
    let material = material.strip_suffix(b"\n").unwrap_or(material);
    material.strip_suffix(b"\r").unwrap_or(material)
}

fn hex_digit(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        b'A'..=b'F' => Some(digit - b'A' + 10),
        _ => None,
    }
}

/// An encryption root's master key, in memory only while its key is loaded.
pub struct MasterKey {
    suite: Suite,
    bytes: Zeroizing<[u8; KEY_BYTES]>,
}

impl MasterKey {
    /// A new random master key (a new encryption root).
    pub fn generate(suite: Suite) -> Result<MasterKey, CryptoError> {
        let mut bytes = Zeroizing::new([0u8; KEY_BYTES]);
        random(&mut bytes[..])?;
        Ok(MasterKey { suite, bytes })
    }

    pub fn suite(&self) -> Suite {
        self.suite
    }

    /// Seals this key under `wrapping` (made from `params`), with a fresh
    /// IV: what the pool stores. Rewrapping (`change-key`) is this with a
    /// new wrapping key; the master key, and so every block, stays.
    pub fn wrap(
        &self,
        wrapping: &WrappingKey,
        params: &KeyParams,
    ) -> Result<WrappedKey, CryptoError> {
        let mut iv = [0u8; IV_BYTES];
        random(&mut iv)?;
        let key = wrapping_cipher(wrapping)?;
        let mut sealed = [0u8; KEY_BYTES + MAC_BYTES];
        sealed[..KEY_BYTES].copy_from_slice(&self.bytes[..]);
        let aad = wrapped_aad(self.suite, params);
        let tag = key
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(iv),
                Aad::from(&aad[..]),
                &mut sealed[..KEY_BYTES],
            )
            .map_err(|_| CryptoError::Random)?;
        sealed[KEY_BYTES..].copy_from_slice(tag.as_ref());
        Ok(WrappedKey {
            suite: self.suite,
            params: *params,
            iv,
            sealed,
        })
    }
}

fn wrapping_cipher(wrapping: &WrappingKey) -> Result<LessSafeKey, CryptoError> {
    UnboundKey::new(&aead::AES_256_GCM, &wrapping.0[..])
        .map(LessSafeKey::new)
        .map_err(|_| CryptoError::Malformed("wrapping key"))
}

fn wrapped_aad(suite: Suite, params: &KeyParams) -> Vec<u8> {
    let mut aad = Vec::with_capacity(WRAPPED_KEY_DOMAIN.len() + 6 + PBKDF2_SALT_BYTES);
    aad.extend_from_slice(WRAPPED_KEY_DOMAIN);
    aad.push(suite.code());
    aad.push(params.format.code());
    aad.extend_from_slice(&params.iterations.to_le_bytes());
    aad.extend_from_slice(&params.salt);
    aad
}

/// A master key sealed under a wrapping key, with what it takes to derive
/// that key again: the record an encryption root stores (layout in
/// docs/FORMAT.md, "Encryption").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WrappedKey {
    pub suite: Suite,
    pub params: KeyParams,
    iv: [u8; IV_BYTES],
    sealed: [u8; KEY_BYTES + MAC_BYTES],
}

impl WrappedKey {
    /// Opens the master key with `wrapping`; [`CryptoError::WrongKey`] when
    /// it is not the key this was wrapped with (the tag fails, so a wrong
    /// key is never used to read or write a block).
    pub fn unwrap(&self, wrapping: &WrappingKey) -> Result<MasterKey, CryptoError> {
        let key = wrapping_cipher(wrapping)?;
        let mut opened = Zeroizing::new(self.sealed);
        let (text, tag) = opened.split_at_mut(KEY_BYTES);
        let aad = wrapped_aad(self.suite, &self.params);
        key.open_in_place_separate_tag(
            Nonce::assume_unique_for_key(self.iv),
            Aad::from(&aad[..]),
            tag,
            text,
        )
        .map_err(|_| CryptoError::WrongKey)?;
        let mut bytes = Zeroizing::new([0u8; KEY_BYTES]);
        bytes.copy_from_slice(text);
        Ok(MasterKey {
            suite: self.suite,
            bytes,
        })
    }

    /// The stored form: version, suite, key format, three zero bytes,
    /// iterations (u32 LE), PBKDF2 salt, IV, sealed master key, tag.
    pub fn encode(&self) -> [u8; WRAPPED_KEY_BYTES] {
        let mut out = [0u8; WRAPPED_KEY_BYTES];
        out[0] = WRAPPED_KEY_VERSION;
        out[1] = self.suite.code();
        out[2] = self.params.format.code();
        out[8..12].copy_from_slice(&self.params.iterations.to_le_bytes());
        let mut at = 12;
        for part in [&self.params.salt[..], &self.iv[..], &self.sealed[..]] {
            out[at..at + part.len()].copy_from_slice(part);
            at += part.len();
        }
        debug_assert_eq!(at, WRAPPED_KEY_BYTES);
        out
    }

    /// Reads the stored form back, refusing anything [`WrappedKey::encode`]
    /// would not have written.
    pub fn decode(bytes: &[u8]) -> Result<WrappedKey, CryptoError> {
        if bytes.len() != WRAPPED_KEY_BYTES {
            return Err(CryptoError::Malformed("length"));
        }
        if bytes[0] != WRAPPED_KEY_VERSION {
            return Err(CryptoError::Malformed("version"));
        }
        let suite = Suite::from_code(bytes[1]).ok_or(CryptoError::Malformed("suite"))?;
        let format = KeyFormat::from_code(bytes[2]).ok_or(CryptoError::Malformed("key format"))?;
        if bytes[3..8].iter().any(|byte| *byte != 0) {
            return Err(CryptoError::Malformed("reserved bytes"));
        }
        let iterations = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
        if (format == KeyFormat::Passphrase) != (iterations != 0) {
            return Err(CryptoError::Malformed("iterations"));
        }
        let mut salt = [0u8; PBKDF2_SALT_BYTES];
        let mut iv = [0u8; IV_BYTES];
        let mut sealed = [0u8; KEY_BYTES + MAC_BYTES];
        let mut at = 12;
        for part in [&mut salt[..], &mut iv[..], &mut sealed[..]] {
            let len = part.len();
            part.copy_from_slice(&bytes[at..at + len]);
            at += len;
        }
        Ok(WrappedKey {
            suite,
            params: KeyParams {
                format,
                iterations,
                salt,
            },
            iv,
            sealed,
        })
    }
}

/// What a sealed block's pointer stores beside its ciphertext: the salt of
/// its block key, its IV and its MAC.
pub use crate::format::bp::BlockCrypt as Sealed;

/// The salt blocks are sealed under now, with its key, how many blocks it
/// has sealed, and the IVs it gives: its random prefix and its counter.
struct CurrentSalt {
    salt: u64,
    key: Arc<LessSafeKey>,
    uses: u64,
    iv_prefix: [u8; 4],
    counter: u64,
}

/// A loaded encryption root's keys: seals and opens blocks. Its block keys
/// are `Arc` so that sealing can run on a worker thread.
pub struct DatasetKey {
    master: MasterKey,
    current: RefCell<Option<CurrentSalt>>,
    /// Keys of salts met by reads, newest last, at most [`BLOCK_KEYS_CACHED`].
    recent: RefCell<Vec<(u64, Arc<LessSafeKey>)>>,
    /// Blocks sealed, for the metrics.
    sealed: Cell<u64>,
    /// The key of [`DatasetKey::objset_mac`], derived when first needed.
    mac_key: RefCell<Option<Zeroizing<[u8; KEY_BYTES]>>>,
}

impl DatasetKey {
    pub fn new(master: MasterKey) -> DatasetKey {
        DatasetKey {
            master,
            current: RefCell::new(None),
            recent: RefCell::new(Vec::new()),
            sealed: Cell::new(0),
            mac_key: RefCell::new(None),
        }
    }

    /// The MAC of an authenticated dataset whose root dnode has portable
    /// digest `digest` (`format::portable::dnode_digest`): keyed BLAKE3
    /// under a key HKDF-SHA256 derives from the master key, truncated to
    /// 16 bytes. Only a holder of the key makes one that a load of the key
    /// accepts (docs/FORMAT.md, "Object-set MAC").
    pub fn objset_mac(
        &self,
        digest: &crate::format::portable::Digest,
    ) -> Result<[u8; crate::format::dnode::DNODE_MAC_BYTES], CryptoError> {
        let mut cached = self.mac_key.borrow_mut();
        if cached.is_none() {
            let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, &[]).extract(&self.master.bytes[..]);
            let info = [OBJSET_MAC_KEY_INFO];
            let okm = prk
                .expand(&info, BlockKeyLen(KEY_BYTES))
                .map_err(|_| CryptoError::Malformed("MAC key length"))?;
            let mut bytes = Zeroizing::new([0u8; KEY_BYTES]);
            okm.fill(&mut bytes[..])
                .map_err(|_| CryptoError::Malformed("MAC key length"))?;
            *cached = Some(bytes);
        }
        let key = cached.as_ref().expect("derived above");
        let mut hasher = blake3::Hasher::new_keyed(key);
        hasher.update(OBJSET_MAC_DOMAIN);
        hasher.update(digest);
        let mut mac = [0u8; crate::format::dnode::DNODE_MAC_BYTES];
        let len = mac.len();
        mac.copy_from_slice(&hasher.finalize().as_bytes()[..len]);
        Ok(mac)
    }

    pub fn suite(&self) -> Suite {
        self.master.suite
    }

    /// The master key (for `change-key`, which wraps it anew).
    pub fn master(&self) -> &MasterKey {
        &self.master
    }

    /// Blocks sealed since the key was loaded.
    pub fn blocks_sealed(&self) -> u64 {
        self.sealed.get()
    }

    /// The block key of `salt`: HKDF-SHA256 of the master key, with the
    /// salt as HKDF's salt.
    fn derive(&self, salt: u64) -> Result<Arc<LessSafeKey>, CryptoError> {
        let suite = self.master.suite;
        let prk =
            hkdf::Salt::new(hkdf::HKDF_SHA256, &salt.to_le_bytes()).extract(&self.master.bytes[..]);
        let info = [BLOCK_KEY_INFO];
        let okm = prk
            .expand(&info, BlockKeyLen(suite.key_bytes()))
            .map_err(|_| CryptoError::Malformed("block key length"))?;
        let mut bytes = Zeroizing::new([0u8; KEY_BYTES]);
        let bytes = &mut bytes[..suite.key_bytes()];
        okm.fill(bytes)
            .map_err(|_| CryptoError::Malformed("block key length"))?;
        let key = UnboundKey::new(suite.algorithm(), bytes)
            .map_err(|_| CryptoError::Malformed("block key"))?;
        Ok(Arc::new(LessSafeKey::new(key)))
    }

    /// The salt, key and IV the next block is sealed under (each IV is
    /// given once): a new salt when none was drawn yet or the current one
    /// sealed [`SALT_USES_MAX`].
    pub fn sealing_key(&self) -> Result<(u64, Arc<LessSafeKey>, [u8; IV_BYTES]), CryptoError> {
        let mut current = self.current.borrow_mut();
        if current.as_ref().is_none_or(|c| c.uses >= SALT_USES_MAX) {
            let mut drawn = [0u8; 20];
            random(&mut drawn)?;
            let salt = u64::from_le_bytes(drawn[..8].try_into().expect("8 bytes"));
            let key = self.derive(salt)?;
            *current = Some(CurrentSalt {
                salt,
                key,
                uses: 0,
                iv_prefix: drawn[8..12].try_into().expect("4 bytes"),
                counter: u64::from_le_bytes(drawn[12..20].try_into().expect("8 bytes")),
            });
        }
        let Some(current) = current.as_mut() else {
            unreachable!("a salt was just drawn");
        };
        let mut iv = [0u8; IV_BYTES];
        iv[..4].copy_from_slice(&current.iv_prefix);
        iv[4..].copy_from_slice(&current.counter.to_le_bytes());
        current.counter = current.counter.wrapping_add(1);
        current.uses += 1;
        debug_assert!(current.uses <= SALT_USES_MAX);
        self.sealed.set(self.sealed.get() + 1);
        Ok((current.salt, current.key.clone(), iv))
    }

    /// The key of `salt`, for opening a block.
    pub fn opening_key(&self, salt: u64) -> Result<Arc<LessSafeKey>, CryptoError> {
        if let Some(current) = self.current.borrow().as_ref() {
            if current.salt == salt {
                return Ok(current.key.clone());
            }
        }
        let mut recent = self.recent.borrow_mut();
        if let Some(index) = recent.iter().position(|(known, _)| *known == salt) {
            let entry = recent.remove(index);
            let key = entry.1.clone();
            recent.push(entry);
            return Ok(key);
        }
        let key = self.derive(salt)?;
        if recent.len() >= BLOCK_KEYS_CACHED {
            recent.remove(0);
        }
        recent.push((salt, key.clone()));
        Ok(key)
    }

    /// Seals `data` in place with a fresh IV under the current salt's key;
    /// `aad` (what the block pointer says of the block) is authenticated
    /// with it.
    pub fn seal(&self, aad: &[u8], data: &mut [u8]) -> Result<Sealed, CryptoError> {
        let (salt, key, iv) = self.sealing_key()?;
        seal_with(&key, salt, iv, aad, data)
    }

    /// Seals `plaintext` into `ciphertext`, of the same length, with a
    /// fresh IV (as [`DatasetKey::seal`]), leaving `plaintext` as it is:
    /// a write-back's held copy stays readable, and no copy is made first
    /// (an in-place seal of a shared block needs one: 0.06-0.13 us per 16
    /// KiB in a warm loop here, 1.16-1.19 us for the seal itself; more when
    /// the block is cold in the cache, as a written-out block is).
    pub fn seal_into(
        &self,
        aad: &[u8],
        plaintext: &[u8],
        ciphertext: &mut [u8],
    ) -> Result<Sealed, CryptoError> {
        let (salt, key, iv) = self.sealing_key()?;
        seal_into_with(&key, salt, iv, aad, plaintext, ciphertext)
    }

    /// Opens a block sealed by [`DatasetKey::seal`] in place.
    pub fn open(&self, sealed: &Sealed, aad: &[u8], data: &mut [u8]) -> Result<(), CryptoError> {
        let key = self.opening_key(sealed.salt)?;
        open_with(&key, sealed, aad, data)
    }

    /// Opens `ciphertext` (a block as stored, which stays as it is: the
    /// read cache may share it) into `plaintext`, of the same length, with
    /// no copy first; [`CryptoError::Authentication`] when its MAC fails
    /// (`plaintext` is then unspecified).
    pub fn open_into(
        &self,
        sealed: &Sealed,
        aad: &[u8],
        ciphertext: &[u8],
        plaintext: &mut [u8],
    ) -> Result<(), CryptoError> {
        let key = self.opening_key(sealed.salt)?;
        open_into_with(&key, sealed, aad, ciphertext, plaintext)
    }
}

/// [`DatasetKey::seal_into`] under `key` (of `salt`) with `iv`, which must
/// never have sealed anything under this key ([`DatasetKey::sealing_key`]
/// gives such): on any thread, so that a batch of blocks is sealed off the
/// engine thread with IVs the engine handed out in order.
pub fn seal_into_with(
    key: &LessSafeKey,
    salt: u64,
    iv: [u8; IV_BYTES],
    aad: &[u8],
    plaintext: &[u8],
    ciphertext: &mut [u8],
) -> Result<Sealed, CryptoError> {
    if plaintext.len() != ciphertext.len() {
        return Err(CryptoError::Malformed("ciphertext length"));
    }
    let mut mac = [0u8; MAC_BYTES];
    key.seal_out_of_place_scatter(
        Nonce::assume_unique_for_key(iv),
        Aad::from(aad),
        plaintext,
        ciphertext,
        &[],
        &mut mac,
    )
    .map_err(|_| CryptoError::Malformed("block too large to seal"))?;
    Ok(Sealed { salt, iv, mac })
}

/// [`DatasetKey::open_into`] under `key`, the block key of the block's
/// salt ([`DatasetKey::opening_key`]): on any thread.
pub fn open_into_with(
    key: &LessSafeKey,
    sealed: &Sealed,
    aad: &[u8],
    ciphertext: &[u8],
    plaintext: &mut [u8],
) -> Result<(), CryptoError> {
    if ciphertext.len() != plaintext.len() {
        return Err(CryptoError::Malformed("plaintext length"));
    }
    key.open_separate_gather(
        Nonce::assume_unique_for_key(sealed.iv),
        Aad::from(aad),
        ciphertext,
        &sealed.mac,
        plaintext,
    )
    .map_err(|_| CryptoError::Authentication)
}

/// Seals `data` in place under `key` (of `salt`) with `iv`, which must
/// never have sealed anything under this key ([`DatasetKey::sealing_key`]
/// gives such). Runs on any thread.
pub fn seal_with(
    key: &LessSafeKey,
    salt: u64,
    iv: [u8; IV_BYTES],
    aad: &[u8],
    data: &mut [u8],
) -> Result<Sealed, CryptoError> {
    let tag = key
        .seal_in_place_separate_tag(Nonce::assume_unique_for_key(iv), Aad::from(aad), data)
        .map_err(|_| CryptoError::Malformed("block too large to seal"))?;
    let mut mac = [0u8; MAC_BYTES];
    mac.copy_from_slice(tag.as_ref());
    Ok(Sealed { salt, iv, mac })
}

/// Opens `data` in place under `key`; [`CryptoError::Authentication`] when
/// its MAC fails (the bytes are then unspecified and must not be used).
pub fn open_with(
    key: &LessSafeKey,
    sealed: &Sealed,
    aad: &[u8],
    data: &mut [u8],
) -> Result<(), CryptoError> {
    key.open_in_place_separate_tag(
        Nonce::assume_unique_for_key(sealed.iv),
        Aad::from(aad),
        &sealed.mac,
        data,
    )
    .map(|_| ())
    .map_err(|_| CryptoError::Authentication)
}

/// Domain of an encrypted block's associated data.
const BLOCK_AAD_DOMAIN: &[u8; 16] = b"ironpool block 1";

/// What a block's MAC authenticates besides its bytes: the pointer's
/// fields that say how to read them (type, level, compression, sizes). Not
/// where the block is nor when it was born: device removal moves blocks
/// and block cloning links them again, with the same bytes. The same for a
/// volume's data, a file's, and a directory's leaves (docs/FORMAT.md,
/// "Encryption").
pub fn block_aad(
    object_type: crate::format::ObjectType,
    level: u8,
    compression: crate::format::bp::Compression,
    logical: u32,
    physical: u32,
) -> [u8; 27] {
    let mut aad = [0u8; 27];
    aad[..16].copy_from_slice(BLOCK_AAD_DOMAIN);
    aad[16] = object_type.code();
    aad[17] = level;
    aad[18] = compression.code();
    aad[19..23].copy_from_slice(&logical.to_le_bytes());
    aad[23..27].copy_from_slice(&physical.to_le_bytes());
    aad
}

/// Seals the attributes of object `object` (of `object_type`, a file,
/// directory or extended attribute object of an encrypted filesystem), a
/// znode in the clear in `bonus`, as the dnode stores them
/// (`format::sealed_bonus`): with a fresh IV, bound to the object.
pub fn seal_bonus(
    key: &DatasetKey,
    object: u64,
    object_type: crate::format::ObjectType,
    bonus: &crate::format::dnode::Bonus,
) -> Result<crate::format::dnode::Bonus, CryptoError> {
    use crate::format::sealed_bonus::{SealedBonus, SEALED_ZNODE_BYTES};
    use crate::format::ObjectType;
    // Attributes that do not decode (damaged in memory) are sealed as they
    // are, and read as damaged once opened: a txg build must not fail.
    let znode = crate::format::znode::Znode::decode(bonus).ok();
    let mut sealed = SealedBonus {
        no_names: matches!(object_type, ObjectType::FsFile | ObjectType::FsDirectory)
            && znode.is_some_and(|znode| znode.nlink == 0),
        owner: match znode {
            Some(znode) if object_type == ObjectType::FsXattr => znode.parent,
            _ => 0,
        },
        crypt: Sealed::default(),
        ciphertext: [0; SEALED_ZNODE_BYTES],
    };
    sealed
        .ciphertext
        .copy_from_slice(&bonus.0[..SEALED_ZNODE_BYTES]);
    let aad = sealed.aad(object, object_type);
    sealed.crypt = key.seal(&aad, &mut sealed.ciphertext)?;
    Ok(sealed.encode())
}

/// Opens the attributes [`seal_bonus`] sealed: the znode in the clear;
/// [`CryptoError::Authentication`] when they were altered, or belong to
/// another object.
pub fn open_bonus(
    key: &DatasetKey,
    object: u64,
    object_type: crate::format::ObjectType,
    sealed: &crate::format::sealed_bonus::SealedBonus,
) -> Result<crate::format::dnode::Bonus, CryptoError> {
    use crate::format::sealed_bonus::SEALED_ZNODE_BYTES;
    let aad = sealed.aad(object, object_type);
    let mut bonus = crate::format::dnode::Bonus::default();
    let plain = &mut bonus.0[..SEALED_ZNODE_BYTES];
    plain.copy_from_slice(&sealed.ciphertext);
    key.open(&sealed.crypt, &aad, plain)?;
    Ok(bonus)
}

/// Seals a file's modification and change times for an encrypted
/// filesystem's intent log (`format::intent_log::SealedTimes`), bound to
/// the file, the txg of its writes and the size they left.
pub fn seal_times(
    key: &DatasetKey,
    object: u64,
    txg: u64,
    length: u64,
    mtime: crate::format::znode::Timestamp,
    ctime: crate::format::znode::Timestamp,
) -> Result<crate::format::intent_log::SealedTimes, CryptoError> {
    use crate::format::intent_log::{times_bytes, SealedTimes};
    let mut ciphertext = times_bytes(mtime, ctime);
    let crypt = key.seal(&SealedTimes::aad(object, txg, length), &mut ciphertext)?;
    Ok(SealedTimes { crypt, ciphertext })
}

/// Opens what [`seal_times`] sealed: (mtime, ctime);
/// [`CryptoError::Authentication`] when altered or moved.
pub fn open_times(
    key: &DatasetKey,
    object: u64,
    txg: u64,
    length: u64,
    sealed: &crate::format::intent_log::SealedTimes,
) -> Result<
    (
        crate::format::znode::Timestamp,
        crate::format::znode::Timestamp,
    ),
    CryptoError,
> {
    use crate::format::intent_log::{times_from_bytes, SealedTimes};
    let mut plain = sealed.ciphertext;
    key.open(
        &sealed.crypt,
        &SealedTimes::aad(object, txg, length),
        &mut plain,
    )?;
    Ok(times_from_bytes(&plain))
}

/// Seals `record` (an object's state, an entry or a list of extended
/// attributes of an encrypted filesystem's log) whole under `key`, with a
/// fresh IV: the record as [`crate::format::intent_log::record_bytes`]
/// writes it, then the sealing. Its object and txg stay in the clear head,
/// and in the associated data.
pub fn seal_record(
    key: &DatasetKey,
    record: &crate::format::intent_log::LogRecord,
) -> Result<crate::format::intent_log::LogRecord, CryptoError> {
    use crate::format::intent_log::{record_bytes, sealed_record_aad, LogRecord};
    let (object, _) = record.target();
    let txg = record.txg();
    let mut sealed = record_bytes(record);
    let crypt = key.seal(&sealed_record_aad(object, txg), &mut sealed)?;
    sealed.extend_from_slice(&crypt.to_bytes());
    Ok(LogRecord::Sealed {
        object,
        txg,
        sealed,
    })
}

/// Opens what [`seal_record`] sealed: the record, whose object and txg
/// must be those of the clear head. [`CryptoError::Authentication`] when
/// altered or moved to another object or txg.
pub fn open_record(
    key: &DatasetKey,
    object: u64,
    txg: u64,
    sealed: &[u8],
) -> Result<crate::format::intent_log::LogRecord, CryptoError> {
    use crate::format::bp::{BlockCrypt, SEALING_BYTES};
    use crate::format::intent_log::{record_from_bytes, sealed_record_aad};
    let Some(split) = sealed.len().checked_sub(SEALING_BYTES) else {
        return Err(CryptoError::Authentication);
    };
    let crypt = BlockCrypt::from_bytes(sealed[split..].try_into().expect("the sealing's bytes"))
        .ok_or(CryptoError::Authentication)?;
    let mut plain = sealed[..split].to_vec();
    key.open(&crypt, &sealed_record_aad(object, txg), &mut plain)?;
    let record = record_from_bytes(&plain).map_err(|_| CryptoError::Authentication)?;
    if record.target().0 != object || record.txg() != txg {
        return Err(CryptoError::Authentication);
    }
    Ok(record)
}

/// The keys loaded in one pool, by key guid: shared by the pool (which
/// loads and unloads them) and the object sets of encrypted filesystems
/// (which seal and open their directories' blocks with them at the txg
/// build and on reads), so that a key unloaded is gone for all of them at
/// once. An `Rc`: it lives on the engine thread with the pool.
#[derive(Clone, Default)]
pub struct KeyRing(std::rc::Rc<RingState>);

/// What a [`KeyRing`] shares.
#[derive(Default)]
struct RingState {
    keys: RefCell<rustc_hash::FxHashMap<u64, std::rc::Rc<DatasetKey>>>,
    /// Keys being unloaded: still there to seal and open what was changed
    /// before the unload began, but no new change may need them.
    unloading: RefCell<rustc_hash::FxHashSet<u64>>,
}

impl KeyRing {
    /// The loaded key of `guid`.
    pub fn get(&self, guid: u64) -> Option<std::rc::Rc<DatasetKey>> {
        self.0.keys.borrow().get(&guid).cloned()
    }

    /// Whether the key of `guid` is loaded.
    pub fn contains(&self, guid: u64) -> bool {
        self.0.keys.borrow().contains_key(&guid)
    }

    /// Whether the key of `guid` is loaded and not being unloaded: a new
    /// change that will need it may be made.
    pub fn usable(&self, guid: u64) -> bool {
        self.contains(guid) && !self.0.unloading.borrow().contains(&guid)
    }

    /// Marks `guid`'s key as being unloaded (false if it already was).
    pub fn begin_unload(&self, guid: u64) -> bool {
        self.0.unloading.borrow_mut().insert(guid)
    }

    /// Ends an unload of `guid`'s key, done or given up.
    pub fn end_unload(&self, guid: u64) {
        self.0.unloading.borrow_mut().remove(&guid);
    }

    /// Loads `key` as `guid`'s unless one is loaded already (two loads of
    /// one key that raced: the first stays); whether it was loaded here.
    pub fn insert(&self, guid: u64, key: DatasetKey) -> bool {
        let mut keys = self.0.keys.borrow_mut();
        if keys.contains_key(&guid) {
            return false;
        }
        keys.insert(guid, std::rc::Rc::new(key));
        true
    }

    /// Unloads `guid`'s key (its memory is cleansed when the last user
    /// lets it go).
    pub fn remove(&self, guid: u64) {
        self.0.keys.borrow_mut().remove(&guid);
    }
}

/// HKDF output length for a block key.
struct BlockKeyLen(usize);

impl hkdf::KeyType for BlockKeyLen {
    fn len(&self) -> usize {
        self.0
    }
}

#[cfg(test)]
mod tests;
