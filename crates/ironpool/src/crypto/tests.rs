//! Known answers from an independent implementation (Python's
//! `cryptography` and `hashlib`, over OpenSSL), and the refusals a wrong key
//! or an altered block must meet.

use super::*;

fn hex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|at| u8::from_str_radix(&text[at..at + 2], 16).unwrap())
        .collect()
}

fn master(suite: Suite, first: u8) -> MasterKey {
    let mut bytes = Zeroizing::new([0u8; KEY_BYTES]);
    for (index, byte) in bytes.iter_mut().enumerate() {
        *byte = first.wrapping_add(index as u8);
    }
    MasterKey { suite, bytes }
}

/// The GCM specification's test case 16 (AES-256, 60 bytes, 20 bytes of
/// associated data), opened through this module's `open_with`.
#[test]
fn gcm_specification_test_case_16_opens() {
    let key = LessSafeKey::new(
        UnboundKey::new(
            &aead::AES_256_GCM,
            &hex("feffe9928665731c6d6a8f9467308308feffe9928665731c6d6a8f9467308308"),
        )
        .unwrap(),
    );
    let plain = hex("d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a721c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de657ba637b39");
    let mut data = hex("522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa8cb08e48590dbb3da7b08b1056828838c5f61e6393ba7a0abcc9f662");
    let aad = hex("feedfacedeadbeeffeedfacedeadbeefabaddad2");
    let mut sealed = Sealed {
        salt: 0,
        iv: hex("cafebabefacedbaddecaf888").try_into().unwrap(),
        mac: hex("76fc6ece0f4e1768cddf8853bb2d551b").try_into().unwrap(),
    };
    let mut copy = data.clone();
    open_with(&key, &sealed, &aad, &mut data).unwrap();
    assert_eq!(data, plain);
    // One bit of the tag, of the data or of the associated data changed:
    // refused.
    sealed.mac[0] ^= 1;
    assert_eq!(
        open_with(&key, &sealed, &aad, &mut copy.clone()),
        Err(CryptoError::Authentication)
    );
    sealed.mac[0] ^= 1;
    copy[59] ^= 0x80;
    assert_eq!(
        open_with(&key, &sealed, &aad, &mut copy.clone()),
        Err(CryptoError::Authentication)
    );
    copy[59] ^= 0x80;
    assert_eq!(
        open_with(&key, &sealed, &aad[1..], &mut copy),
        Err(CryptoError::Authentication)
    );
}

/// A block key is HKDF-SHA256(salt = the salt's 8 bytes LE, key = the
/// master key, info = "ironpool block key v1"): the block below was sealed
/// by Python from that definition, for both key sizes.
#[test]
fn block_keys_follow_their_definition() {
    let plain = b"ironpool encrypts this block.".repeat(4);
    let aad = b"block pointer fields";
    let cases = [
        (
            Suite::Aes256Gcm,
            "6955fdbfad3b7c795896cdc30e5e5c0cbc9e2f52d75c73c091e86ebaeddf2087f7d7b679dbe6bc9cf416425c86e5c4781f4ed25273e51ccc53c6073aec21756837e9731889f976f04888318b5ad314c893eee0a4880217826158d56b6c3c9dbd59a6bbe6d8ff2e020ab723b2f3582dd22fd7b208",
            "b0ecbb46c7073b40f181164e4cd1a9d8",
        ),
        (
            Suite::Aes128Gcm,
            "4d71cff96bc50c9a47538f247fc0cf9f1524310c30287dd676a9334993ec63411eb9455429fdfa9e3712d0d5f16d5110ad04b3f53fddc25cd25700ee56fad27e4de01b0c1322e8c5633b67cd265b286d7438dd79f1851aabf260818b6305d779e9038920a95ee0b44553c3a2106d478707c7a6ed",
            "c364fcc082e59e3da2f28abddeb94c79",
        ),
    ];
    for (suite, cipher, mac) in cases {
        let key = DatasetKey::new(master(suite, 100));
        let sealed = Sealed {
            salt: 0x0123_4567_89ab_cdef,
            iv: std::array::from_fn(|index| index as u8 + 1),
            mac: hex(mac).try_into().unwrap(),
        };
        let mut data = hex(cipher);
        key.open(&sealed, aad, &mut data).unwrap();
        assert_eq!(data, plain, "{suite:?}");
    }
}

/// `seal_into` leaves the plaintext as it is and makes what an in-place
/// seal with the same IV makes (the same cipher, out of place), which
/// opens under the key; lengths that differ are refused.
#[test]
fn sealing_out_of_place_is_sealing_in_place() {
    let key = DatasetKey::new(master(Suite::Aes256Gcm, 9));
    let plain: Vec<u8> = (0..16384u32).map(|index| (index * 7) as u8).collect();
    let mut cipher = vec![0u8; plain.len()];
    let sealed = key.seal_into(b"aad", &plain, &mut cipher).unwrap();
    assert_ne!(cipher, plain);
    let mut in_place = plain.clone();
    let block_key = key.opening_key(sealed.salt).unwrap();
    let again = seal_with(&block_key, sealed.salt, sealed.iv, b"aad", &mut in_place).unwrap();
    assert_eq!(in_place, cipher, "out of place and in place differ");
    assert_eq!(again.mac, sealed.mac);
    let mut opened = vec![0u8; plain.len()];
    key.open_into(&sealed, b"aad", &cipher, &mut opened)
        .unwrap();
    assert_eq!(opened, plain);
    assert!(key.seal_into(b"aad", &plain, &mut cipher[1..]).is_err());
}

/// What `seal` makes, `open` gives back, with the same master key loaded
/// anew (keys derived again), and nothing else does.
#[test]
fn sealed_blocks_open_only_under_their_master_key() {
    let writer = DatasetKey::new(master(Suite::Aes256Gcm, 7));
    let plain: Vec<u8> = (0..16384u32).map(|index| (index * 31) as u8).collect();
    let mut data = plain.clone();
    let sealed = writer.seal(b"aad", &mut data).unwrap();
    assert_ne!(data, plain, "sealing changed nothing");
    let mut second = plain.clone();
    let sealed_again = writer.seal(b"aad", &mut second).unwrap();
    assert_eq!(sealed.salt, sealed_again.salt, "one salt per key load");
    assert_ne!(sealed.iv, sealed_again.iv, "an IV per block");
    assert_eq!(sealed.iv[..4], sealed_again.iv[..4], "the salt's prefix");
    let count = |iv: &[u8; IV_BYTES]| u64::from_le_bytes(iv[4..].try_into().unwrap());
    assert_eq!(
        count(&sealed_again.iv),
        count(&sealed.iv).wrapping_add(1),
        "a counter"
    );
    assert_ne!(data, second, "the same block sealed twice looks the same");
    assert_eq!(writer.blocks_sealed(), 2);

    let reader = DatasetKey::new(master(Suite::Aes256Gcm, 7));
    let mut opened = data.clone();
    reader.open(&sealed, b"aad", &mut opened).unwrap();
    assert_eq!(opened, plain);

    let other = DatasetKey::new(master(Suite::Aes256Gcm, 8));
    assert_eq!(
        other.open(&sealed, b"aad", &mut data.clone()),
        Err(CryptoError::Authentication)
    );
    let mut wrong_salt = sealed;
    wrong_salt.salt ^= 1;
    assert_eq!(
        reader.open(&wrong_salt, b"aad", &mut data),
        Err(CryptoError::Authentication)
    );
}

/// The derived keys of many salts stay bounded, and a key dropped from the
/// cache is derived again when met.
#[test]
fn the_block_key_cache_is_bounded() {
    let key = DatasetKey::new(master(Suite::Aes128Gcm, 1));
    let mut blocks = Vec::new();
    for salt in 0..(BLOCK_KEYS_CACHED as u64 * 2) {
        let mut data = vec![salt as u8; 512];
        let sealed = seal_with(
            &key.opening_key(salt).unwrap(),
            salt,
            [1; IV_BYTES],
            b"",
            &mut data,
        )
        .unwrap();
        blocks.push((sealed, data));
    }
    assert_eq!(key.recent.borrow().len(), BLOCK_KEYS_CACHED);
    for (sealed, mut data) in blocks {
        key.open(&sealed, b"", &mut data).unwrap();
        assert!(data.iter().all(|byte| *byte == sealed.salt as u8));
    }
}

/// PBKDF2-HMAC-SHA512 of a passphrase, against Python's `hashlib`; a
/// trailing newline (a key file written by `echo`) is not part of it.
#[test]
fn passphrases_are_stretched_with_pbkdf2_sha512() {
    let params = KeyParams {
        format: KeyFormat::Passphrase,
        iterations: 100_000,
        salt: std::array::from_fn(|index| index as u8),
    };
    let expected = hex("9385cb35db7f2ade8bea34b72a47ef0137f8c55f7ba611f924d7ca2bebfb1b50");
    for material in [&b"correct horse battery"[..], b"correct horse battery\n"] {
        let key = WrappingKey::derive(&params, material).unwrap();
        assert_eq!(&key.0[..], &expected[..]);
    }
}

#[test]
fn key_material_is_checked_against_its_format() {
    let raw = KeyParams::new(KeyFormat::Raw, None).unwrap();
    assert!(WrappingKey::derive(&raw, &[1u8; 32]).is_ok());
    for bad in [&[1u8; 31][..], &[1u8; 33][..], b""] {
        assert!(matches!(
            WrappingKey::derive(&raw, bad),
            Err(CryptoError::BadKeyMaterial(_))
        ));
    }
    let hex_params = KeyParams::new(KeyFormat::Hex, None).unwrap();
    let digits = "0123456789abcdefABCDEF0123456789abcdef0123456789abcdef0123456789";
    let key = WrappingKey::derive(&hex_params, format!("{digits}\n").as_bytes()).unwrap();
    assert_eq!(&key.0[..], &hex(&digits.to_lowercase())[..]);
    for bad in [
        &digits[1..],
        "zz23456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
    ] {
        assert!(
            WrappingKey::derive(&hex_params, bad.as_bytes()).is_err(),
            "{bad}"
        );
    }
    let phrase = KeyParams::new(KeyFormat::Passphrase, Some(PBKDF2_ITERATIONS_MIN)).unwrap();
    assert!(WrappingKey::derive(&phrase, b"seven!!").is_err(), "7 bytes");
    assert!(WrappingKey::derive(&phrase, &[b'a'; PASSPHRASE_BYTES_MAX + 1]).is_err());
    assert!(KeyParams::new(KeyFormat::Passphrase, Some(PBKDF2_ITERATIONS_MIN - 1)).is_err());
    assert!(KeyParams::new(KeyFormat::Raw, Some(PBKDF2_ITERATIONS_MIN)).is_err());
    assert!(Suite::parse("aes-256-ccm").is_err());
    assert_eq!(Suite::parse("on"), Ok(Suite::Aes256Gcm));
}

/// A master key wrapped, stored and read back opens with the key it was
/// wrapped with and no other; `change-key` (a rewrap) keeps the master key.
#[test]
fn wrapped_keys_open_with_their_key_only() {
    let params = KeyParams::new(KeyFormat::Passphrase, Some(PBKDF2_ITERATIONS_MIN)).unwrap();
    let user = WrappingKey::derive(&params, b"first passphrase").unwrap();
    let master = MasterKey::generate(Suite::Aes128Gcm).unwrap();
    let stored = master.wrap(&user, &params).unwrap().encode();
    let wrapped = WrappedKey::decode(&stored).unwrap();
    assert_eq!(wrapped.suite, Suite::Aes128Gcm);
    let opened = wrapped.unwrap(&user).unwrap();
    assert_eq!(opened.bytes, master.bytes);

    let wrong = WrappingKey::derive(&params, b"second passphrase").unwrap();
    assert!(matches!(wrapped.unwrap(&wrong), Err(CryptoError::WrongKey)));

    // Rewrapped under a raw key: same master key, the old key refused.
    let raw = KeyParams::new(KeyFormat::Raw, None).unwrap();
    let new_user = WrappingKey::derive(&raw, &[9u8; 32]).unwrap();
    let rewrapped = WrappedKey::decode(&opened.wrap(&new_user, &raw).unwrap().encode()).unwrap();
    assert_eq!(rewrapped.unwrap(&new_user).unwrap().bytes, master.bytes);
    assert!(matches!(
        rewrapped.unwrap(&user),
        Err(CryptoError::WrongKey)
    ));

    // Parameters stored beside the key are bound to it by the tag: fewer
    // iterations written over them do not make a guess cheaper, they fail.
    let mut tampered = stored;
    tampered[8..12].copy_from_slice(&(PBKDF2_ITERATIONS_MIN + 1).to_le_bytes());
    let tampered = WrappedKey::decode(&tampered).unwrap();
    let guess = WrappingKey::derive(&tampered.params, b"first passphrase").unwrap();
    assert!(matches!(
        tampered.unwrap(&guess),
        Err(CryptoError::WrongKey)
    ));
}

#[test]
fn malformed_wrapped_keys_are_refused() {
    let params = KeyParams::new(KeyFormat::Raw, None).unwrap();
    let user = WrappingKey::derive(&params, &[3u8; 32]).unwrap();
    let good = MasterKey::generate(Suite::Aes256Gcm)
        .unwrap()
        .wrap(&user, &params)
        .unwrap()
        .encode();
    assert!(WrappedKey::decode(&good[1..]).is_err());
    for (at, value) in [(0, 2u8), (1, 9), (2, 0), (5, 1), (8, 1)] {
        let mut bad = good;
        bad[at] = value;
        assert!(WrappedKey::decode(&bad).is_err(), "byte {at} = {value}");
    }
}

/// A salt that sealed its share of blocks is replaced: a new salt, a new
/// key, new IVs; what the old one sealed still opens.
#[test]
fn a_worn_salt_is_replaced() {
    let key = DatasetKey::new(master(Suite::Aes256Gcm, 9));
    let mut first = vec![1u8; 4096];
    let old = key.seal(b"", &mut first).unwrap();
    key.current.borrow_mut().as_mut().unwrap().uses = SALT_USES_MAX;
    let mut second = vec![2u8; 4096];
    let new = key.seal(b"", &mut second).unwrap();
    assert_ne!(old.salt, new.salt);
    assert_eq!(key.current.borrow().as_ref().unwrap().uses, 1);
    key.open(&old, b"", &mut first).unwrap();
    key.open(&new, b"", &mut second).unwrap();
    assert!(first.iter().all(|byte| *byte == 1) && second.iter().all(|byte| *byte == 2));
}

/// Opening into another buffer gives what opening in place gives, leaves
/// the ciphertext as it was, and refuses an altered block or a length
/// that differs.
#[test]
fn opening_into_another_buffer_matches_opening_in_place() {
    let key = DatasetKey::new(master(Suite::Aes256Gcm, 11));
    let plain: Vec<u8> = (0..8192u32).map(|index| (index * 7) as u8).collect();
    let mut cipher = plain.clone();
    let sealed = key.seal(b"aad", &mut cipher).unwrap();
    let kept = cipher.clone();
    let mut out = vec![0u8; cipher.len()];
    key.open_into(&sealed, b"aad", &cipher, &mut out).unwrap();
    assert_eq!(out, plain);
    assert_eq!(cipher, kept);
    cipher[100] ^= 4;
    assert_eq!(
        key.open_into(&sealed, b"aad", &cipher, &mut out),
        Err(CryptoError::Authentication)
    );
    assert!(key
        .open_into(&sealed, b"aad", &kept, &mut out[1..])
        .is_err());
}

/// An object's attributes sealed in its bonus open under their master key,
/// as that object; moved to another object, to an object of another type,
/// altered, or with their clear part changed (the flag a raw send reads
/// without the key, an extended attribute object's owner), they fail.
#[test]
fn sealed_attributes_open_only_as_their_object() {
    use crate::format::sealed_bonus::{is_sealed, SealedBonus};
    use crate::format::znode::{Znode, S_IFREG};
    use crate::format::ObjectType;
    let key = DatasetKey::new(master(Suite::Aes256Gcm, 7));
    let other = DatasetKey::new(master(Suite::Aes256Gcm, 8));
    let znode = Znode {
        mode: S_IFREG | 0o640,
        uid: 0x7a3c_915e,
        gid: 0x5e91_c37a,
        nlink: 0,
        parent: 12,
        ..Znode::default()
    };
    let clear = znode.encode();
    let stored = seal_bonus(&key, 40, ObjectType::FsFile, &clear).unwrap();
    assert!(is_sealed(&stored));
    assert!(
        !stored.0.windows(4).any(|w| w == znode.uid.to_le_bytes()),
        "the owner is in the clear"
    );
    let sealed = SealedBonus::decode(&stored).unwrap().unwrap();
    assert!(
        sealed.no_names,
        "a file with no link is flagged so in the clear"
    );
    assert_eq!(sealed.owner, 0);
    assert_eq!(
        open_bonus(&key, 40, ObjectType::FsFile, &sealed).unwrap(),
        clear
    );
    let refused = |result: Result<_, CryptoError>| {
        assert!(
            matches!(result, Err(CryptoError::Authentication)),
            "{result:?}"
        )
    };
    refused(open_bonus(&other, 40, ObjectType::FsFile, &sealed));
    refused(open_bonus(&key, 41, ObjectType::FsFile, &sealed));
    refused(open_bonus(&key, 40, ObjectType::FsDirectory, &sealed));
    let mut altered = sealed;
    altered.ciphertext[9] ^= 1;
    refused(open_bonus(&key, 40, ObjectType::FsFile, &altered));
    let relinked = SealedBonus {
        no_names: false,
        ..sealed
    };
    refused(open_bonus(&key, 40, ObjectType::FsFile, &relinked));
    // An extended attribute object names its owner in the clear.
    let xattrs = seal_bonus(&key, 41, ObjectType::FsXattr, &clear).unwrap();
    let xattrs = SealedBonus::decode(&xattrs).unwrap().unwrap();
    assert_eq!((xattrs.owner, xattrs.no_names), (12, false));
    let moved = SealedBonus {
        owner: 13,
        ..xattrs
    };
    refused(open_bonus(&key, 41, ObjectType::FsXattr, &moved));
    // Two seals of the same attributes differ (a fresh IV each).
    let again = seal_bonus(&key, 40, ObjectType::FsFile, &clear).unwrap();
    assert_ne!(again, stored);
    // Attributes that do not decode are sealed as they are (a txg build
    // does not fail on them), and read back as such.
    let zeros = seal_bonus(&key, 40, ObjectType::FsFile, &Default::default()).unwrap();
    let zeros = SealedBonus::decode(&zeros).unwrap().unwrap();
    assert!(!zeros.no_names);
    assert_eq!(
        open_bonus(&key, 40, ObjectType::FsFile, &zeros).unwrap(),
        Default::default()
    );
}

/// An intent log record's sealed times open only as the record they were
/// sealed for: the same file, txg and size, under their key.
#[test]
fn sealed_times_open_only_as_their_record() {
    use crate::format::znode::Timestamp;
    let key = DatasetKey::new(master(Suite::Aes128Gcm, 3));
    let mtime = Timestamp {
        seconds: 1_765_100_000,
        nanos: 120_000_000,
    };
    let ctime = Timestamp {
        seconds: 1_765_100_001,
        nanos: 7,
    };
    let sealed = seal_times(&key, 258, 4702, 49152, mtime, ctime).unwrap();
    assert_eq!(
        open_times(&key, 258, 4702, 49152, &sealed).unwrap(),
        (mtime, ctime)
    );
    let refused = |result: Result<_, CryptoError>| {
        assert!(
            matches!(result, Err(CryptoError::Authentication)),
            "{result:?}"
        )
    };
    refused(open_times(&key, 259, 4702, 49152, &sealed));
    refused(open_times(&key, 258, 4703, 49152, &sealed));
    refused(open_times(&key, 258, 4702, 49153, &sealed));
    let mut altered = sealed;
    altered.ciphertext[0] ^= 1;
    refused(open_times(&key, 258, 4702, 49152, &altered));
    let other = DatasetKey::new(master(Suite::Aes128Gcm, 4));
    refused(open_times(&other, 258, 4702, 49152, &sealed));
    // The record's body round-trips.
    let body = sealed.body(49152);
    assert_eq!(
        crate::format::intent_log::SealedTimes::from_body(&body).unwrap(),
        (49152, sealed)
    );
}

/// A record of an encrypted filesystem's log sealed whole (an entry: its
/// name) opens as the record it was, and only under its key, for its
/// object and txg; its name is in none of the sealed bytes.
#[test]
fn sealed_records_open_only_as_their_record() {
    use crate::format::intent_log::{EntryTarget, LogRecord};
    let key = DatasetKey::new(master(Suite::Aes256Gcm, 5));
    let name = b"payroll-2026.ods".to_vec();
    let record = LogRecord::Entry {
        dir: 34,
        txg: 4702,
        name: name.clone(),
        target: Some(EntryTarget {
            object: 258,
            kind: 8,
            cookie: 0x1234_5678,
        }),
    };
    let sealed = seal_record(&key, &record).unwrap();
    let LogRecord::Sealed {
        object,
        txg,
        sealed: bytes,
    } = &sealed
    else {
        panic!("not sealed: {sealed:?}");
    };
    assert_eq!((*object, *txg), (34, 4702));
    assert!(!bytes.windows(name.len()).any(|window| window == name));
    assert_eq!(open_record(&key, 34, 4702, bytes).unwrap(), record);
    let refused = |result: Result<LogRecord, CryptoError>| {
        assert!(
            matches!(result, Err(CryptoError::Authentication)),
            "{result:?}"
        )
    };
    refused(open_record(&key, 35, 4702, bytes));
    refused(open_record(&key, 34, 4703, bytes));
    let mut altered = bytes.clone();
    altered[3] ^= 1;
    refused(open_record(&key, 34, 4702, &altered));
    refused(open_record(&key, 34, 4702, &bytes[..10]));
    let other = DatasetKey::new(master(Suite::Aes256Gcm, 6));
    refused(open_record(&other, 34, 4702, bytes));
}
