//! Encrypted volumes in the simulator (issue 73): their blocks reach the
//! devices sealed and come back as written; a damaged sealed block heals
//! from its other copy, and scrub verifies every copy without the key; a
//! key is refused when wrong, needed to read, and rewrapped by change-key;
//! a FUA write's block survives a crash and replays without the key; a
//! raw send carries sealed blocks to a pool that never had the key.

mod sim_support;

use std::collections::BTreeMap;
use std::rc::Rc;

use ironpool::crypto::{KeyFormat, KeyParams, Suite};
use ironpool::dev::sim::SimDevice;
use ironpool::format::bp::Compression;
use ironpool::format::label::TopVdevKind;
use ironpool::format::stream::Record;
use ironpool::pool::dataset::keys::{CreateKey, NewEncryption};
use ironpool::pool::dataset::send::{ResumeToken, SendRequest};
use ironpool::pool::dataset::stream_io::MemoryStream;
use ironpool::pool::datasets::receive::ReceiveOptions;
use ironpool::pool::volume::{ReadPiece, Volume};
use ironpool::pool::{Pool, PoolError};
use ironpool::rt::buf::{AlignedBuf, BufSlice};
use ironpool::rt::sim::Rng;
use ironpool::rt::Runtime;
use sim_support::{corrupt_block, crash_all, devices, first_copy, layout, manual_commits, named};
use zeroize::Zeroizing;

const DEVICE_BYTES: u64 = 128 << 20;
const VOLUME_BYTES: u64 = 8 << 20;
const BLOCK: u64 = 16 << 10;
/// What the test's blocks repeat: found on a device only in the clear.
const MARKER: &[u8; 16] = b"IRONPOOL-SECRET-";

fn raw_key(byte: u8) -> Zeroizing<Vec<u8>> {
    Zeroizing::new(vec![byte; 32])
}

fn encryption(key: u8, suite: Suite) -> NewEncryption {
    NewEncryption {
        suite,
        params: KeyParams::new(KeyFormat::Raw, None).unwrap(),
        keylocation: "prompt".into(),
        material: Some(raw_key(key)),
    }
}

/// `blocks` whole blocks of the marker, each with its number in its first
/// bytes (so no two blocks are equal).
fn marked(blocks: u64) -> BufSlice {
    let mut buffer = AlignedBuf::zeroed((blocks * BLOCK) as usize);
    for (index, chunk) in buffer.chunks_mut(MARKER.len()).enumerate() {
        chunk.copy_from_slice(MARKER);
        if ((index * MARKER.len()) as u64).is_multiple_of(BLOCK) {
            chunk[..8].copy_from_slice(&(index as u64).to_le_bytes());
        }
    }
    BufSlice::whole(buffer.into_shared())
}

async fn read(pool: &Rc<Pool>, volume: &Rc<Volume>, offset: u64, length: u64) -> Vec<u8> {
    ReadPiece::concat(pool.read(volume, offset, length).await.unwrap())
}

async fn mirror(disks: &[Rc<SimDevice>]) -> Rc<Pool> {
    Pool::create_on_devices(
        "tank",
        layout(disks, TopVdevKind::Mirror),
        false,
        manual_commits(),
    )
    .await
    .unwrap()
}

/// The bytes block `blkid` of `volume` occupies on `disk`, and whether its
/// pointer says it is sealed.
async fn stored(pool: &Rc<Pool>, volume: &Volume, disk: &SimDevice, blkid: u64) -> (Vec<u8>, bool) {
    let (pointer, offset) = first_copy(pool, volume, blkid).await;
    (
        disk.peek(offset, pointer.physical_size as usize),
        pointer.crypt.is_some(),
    )
}

/// `pool`'s volume tank/v of test blocks, encrypted (AES-256-GCM) under
/// the raw key of `key` bytes.
async fn encrypted_v(pool: &Rc<Pool>, key: u8, properties: BTreeMap<String, String>) -> Rc<Volume> {
    pool.create_volume_with(
        "tank/v",
        VOLUME_BYTES,
        BLOCK as u32,
        properties,
        Some(CreateKey::New(encryption(key, Suite::Aes256Gcm))),
    )
    .await
    .unwrap()
}

fn holds_marker(bytes: &[u8]) -> bool {
    bytes.windows(MARKER.len()).any(|window| window == MARKER)
}

/// What an encrypted volume stores is ciphertext (the same writes to a
/// volume without encryption are found in the clear at the same kind of
/// place, so the look is at the right bytes), with and without
/// compression, under both suites; it reads back as written.
#[test]
fn encrypted_blocks_are_stored_sealed_and_read_back() {
    let disks = devices(2, DEVICE_BYTES, 73);
    Runtime::new_sim(73).block_on(async {
        let pool = mirror(&disks).await;
        let plain = pool
            .create_volume("tank/plain", VOLUME_BYTES, BLOCK as u32, BTreeMap::new())
            .await
            .unwrap();
        let data = marked(32);
        pool.write(&plain, 0, data.clone(), false).await.unwrap();
        pool.commit().await.unwrap();
        let (bytes, sealed) = stored(&pool, &plain, &disks[0], 3).await;
        assert!(
            !sealed && holds_marker(&bytes),
            "the plain volume's block is not where it was looked for"
        );

        for (name, suite, compression) in [
            ("tank/gcm256", Suite::Aes256Gcm, "off"),
            ("tank/gcm128", Suite::Aes128Gcm, "off"),
            ("tank/lz4", Suite::Aes256Gcm, "lz4"),
        ] {
            let properties = BTreeMap::from([("compression".to_string(), compression.to_string())]);
            let volume = pool
                .create_volume_with(
                    name,
                    VOLUME_BYTES,
                    BLOCK as u32,
                    properties,
                    Some(CreateKey::New(encryption(1, suite))),
                )
                .await
                .unwrap();
            pool.write(&volume, 0, data.clone(), false).await.unwrap();
            pool.commit().await.unwrap();
            for blkid in 0..32 {
                for disk in &disks {
                    let (bytes, sealed) = stored(&pool, &volume, disk, blkid).await;
                    assert!(sealed, "{name} block {blkid} is not marked sealed");
                    assert!(
                        !holds_marker(&bytes),
                        "{name} block {blkid} is stored in the clear"
                    );
                }
            }
            if compression == "lz4" {
                let pointer = pool
                    .objects()
                    .block_pointer(&volume.object, 0)
                    .await
                    .unwrap();
                assert!(
                    pointer.physical_size < pointer.logical_size,
                    "compressed before sealing"
                );
            }
            assert_eq!(
                read(&pool, &volume, 0, 32 * BLOCK).await,
                &data[..],
                "{name}"
            );
            // Again: the cache holds the blocks opened now.
            let hits = pool.store().cache.stats().demand_data.hits;
            assert_eq!(
                read(&pool, &volume, 0, 32 * BLOCK).await,
                &data[..],
                "{name}"
            );
            assert!(pool.store().cache.stats().demand_data.hits > hits);
            // And from the devices, not the cache.
            pool.set_tunable("arc_max_bytes", "0").unwrap();
            assert_eq!(
                read(&pool, &volume, 0, 32 * BLOCK).await,
                &data[..],
                "{name}"
            );
            pool.set_tunable("arc_max_bytes", &(64u64 << 20).to_string())
                .unwrap();
        }
        pool.export().await.unwrap();
    });
}

/// A sealed block damaged on one side is found by its checksum (which
/// covers the ciphertext) and rewritten from the other; scrub verifies and
/// repairs with the key unloaded.
#[test]
fn damaged_sealed_blocks_heal_and_scrub_needs_no_key() {
    let disks = devices(2, DEVICE_BYTES, 74);
    let mut rng = Rng::new(74);
    Runtime::new_sim(74).block_on(async {
        let pool = mirror(&disks).await;
        let volume = encrypted_v(&pool, 2, BTreeMap::new()).await;
        let data = marked(16);
        pool.write(&volume, 0, data.clone(), false).await.unwrap();
        pool.commit().await.unwrap();
        pool.set_tunable("arc_max_bytes", "0").unwrap();
        for (blkid, disk) in [(2u64, 0usize), (9, 1)] {
            corrupt_block(&pool, &volume, blkid, &disks[disk], &mut rng).await;
        }
        // Reads heal what they meet (each takes a side at random).
        for _ in 0..64 {
            assert_eq!(read(&pool, &volume, 0, 16 * BLOCK).await, &data[..]);
            pool.store().repairs_quiesced().await;
            if pool.store().stats().healed_reads >= 2 {
                break;
            }
        }
        assert!(
            pool.store().stats().healed_reads >= 2,
            "{:?}",
            pool.store().stats()
        );

        // Damage again, then scrub without the key: found and repaired.
        corrupt_block(&pool, &volume, 5, &disks[1], &mut rng).await;
        pool.unload_key("tank/v").await.unwrap();
        assert!(!pool.volume_key_available(&volume));
        pool.scrub_start().unwrap();
        pool.scrub_wait().await;
        let scrub = pool.scrub_status();
        assert_eq!(scrub.errors, 0, "{:?}", scrub.error_details);
        assert!(scrub.bad_copies >= 1, "scrub did not find the damaged copy");
        pool.scrub_start().unwrap();
        pool.scrub_wait().await;
        assert_eq!(pool.scrub_status().bad_copies, 0, "the repair did not hold");
        pool.load_key("tank/v", Some(raw_key(2))).await.unwrap();
        assert_eq!(read(&pool, &volume, 0, 16 * BLOCK).await, &data[..]);
        pool.export().await.unwrap();
    });
}

/// The key is needed to read, refused when wrong (nothing loaded), and
/// rewrapped by change-key: the old key then opens nothing, the data is
/// unchanged. A clone shares its origin's key.
#[test]
fn keys_are_needed_checked_and_changed() {
    let disks = devices(2, DEVICE_BYTES, 75);
    Runtime::new_sim(75).block_on(async {
        let pool = mirror(&disks).await;
        let volume = encrypted_v(&pool, 3, BTreeMap::new()).await;
        let data = marked(8);
        pool.write(&volume, 0, data.clone(), false).await.unwrap();
        pool.snapshot(&["tank/v@s".to_string()]).await.unwrap();
        let clone = pool.clone_snapshot("tank/v@s", "tank/c").await.unwrap();
        assert_eq!(read(&pool, &volume, 0, 8 * BLOCK).await, &data[..]);
        let plain = pool
            .create_volume("tank/plain", VOLUME_BYTES, BLOCK as u32, BTreeMap::new())
            .await
            .unwrap();
        pool.write(&plain, 0, data.clone(), false).await.unwrap();
        pool.commit().await.unwrap();
        assert_eq!(read(&pool, &plain, 0, 8 * BLOCK).await, &data[..]);
        assert!(pool.store().cache.opened_entries() >= 8);
        let cached = pool.store().cache.stats().size_bytes;
        pool.unload_key("tank/v").await.unwrap();
        assert_eq!(
            pool.store().cache.opened_entries(),
            0,
            "plaintext cached after its key went"
        );
        let kept = pool.store().cache.stats().size_bytes;
        assert!(
            kept >= 8 * BLOCK && kept < cached,
            "the plain volume's blocks went with the key ({cached} cached, {kept} kept)"
        );
        pool.set_tunable("arc_max_bytes", "0").unwrap();
        for volume in [&volume, &clone] {
            assert!(!pool.volume_key_available(volume));
            match pool.read(volume, 0, BLOCK).await {
                Err(PoolError::KeyUnavailable(_)) => {}
                other => panic!("read without the key: {:?}", other.map(|_| ())),
            }
        }
        match pool.load_key("tank/v", Some(raw_key(4))).await {
            Err(PoolError::InvalidArgument(message)) => {
                assert!(message.contains("wrong key"), "{message}")
            }
            other => panic!("a wrong key: {other:?}"),
        }
        assert!(!pool.volume_key_available(&volume));
        // Loaded through the clone: one key for both.
        pool.load_key("tank/c", Some(raw_key(3))).await.unwrap();
        assert_eq!(read(&pool, &volume, 0, 8 * BLOCK).await, &data[..]);
        assert_eq!(read(&pool, &clone, 0, 8 * BLOCK).await, &data[..]);

        pool.change_key(
            "tank/v",
            Some(KeyFormat::Hex),
            None,
            None,
            Some(Zeroizing::new(b"ab".repeat(32))),
        )
        .await
        .unwrap();
        pool.unload_key("tank/v").await.unwrap();
        assert!(
            pool.load_key("tank/v", Some(raw_key(3))).await.is_err(),
            "the old key still opens it"
        );
        pool.load_key("tank/v", Some(Zeroizing::new(b"AB".repeat(32))))
            .await
            .unwrap();
        assert_eq!(read(&pool, &clone, 0, 8 * BLOCK).await, &data[..]);
        pool.export().await.unwrap();
    });
    // After an import the key is not loaded; the new one opens it.
    Runtime::new_sim(76).block_on(async {
        let pool = Pool::import_from_devices("tank", named(&disks), manual_commits())
            .await
            .unwrap();
        let volume = pool.volume("tank/v").unwrap();
        assert!(!pool.volume_key_available(&volume));
        pool.load_key("tank/v", Some(Zeroizing::new(b"ab".repeat(32))))
            .await
            .unwrap();
        assert_eq!(read(&pool, &volume, 0, 8 * BLOCK).await, &marked(8)[..]);
        pool.export().await.unwrap();
    });
}

/// A FUA write to an encrypted volume is sealed in place and logged as a
/// pointer (never as a copy of its bytes): after a crash it replays at
/// import, which has no key, and reads back once the key is loaded.
#[test]
fn a_durable_write_replays_without_the_key() {
    let disks = devices(2, DEVICE_BYTES, 77);
    let data = marked(4);
    let expected = data.to_vec();
    Runtime::new_sim(77).block_on(async {
        let pool = mirror(&disks).await;
        let volume = encrypted_v(&pool, 5, BTreeMap::new()).await;
        pool.commit().await.unwrap();
        // One block each: small FUA writes are what an unencrypted volume
        // copies into its log.
        for index in 0..4 {
            let block = data.slice((index * BLOCK) as usize..((index + 1) * BLOCK) as usize);
            pool.write(&volume, (4 + index) * BLOCK, block, true)
                .await
                .unwrap();
        }
        crash_all(&disks, &mut Rng::new(77));
    });
    Runtime::new_sim(78).block_on(async {
        let pool = Pool::import_from_devices("tank", named(&disks), manual_commits())
            .await
            .unwrap();
        let volume = pool.volume("tank/v").unwrap();
        pool.load_key("tank/v", Some(raw_key(5))).await.unwrap();
        assert_eq!(
            read(&pool, &volume, 4 * BLOCK, 4 * BLOCK).await,
            expected,
            "a FUA write was lost"
        );
        for blkid in 4..8 {
            for disk in &disks {
                let (bytes, sealed) = stored(&pool, &volume, disk, blkid).await;
                assert!(
                    sealed && !holds_marker(&bytes),
                    "block {blkid} in the clear"
                );
            }
        }
        pool.export().await.unwrap();
    });
}

/// Sends `snapshot` (from `from`) raw or not, into memory.
async fn send_bytes(pool: &Rc<Pool>, snapshot: &str, from: Option<&str>, raw: bool) -> Vec<u8> {
    let request = SendRequest {
        snapshot: snapshot.to_string(),
        from: from.map(str::to_string),
        resume_block: None,
        resume_object: None,
        raw,
    };
    let stream = MemoryStream::new();
    pool.send(request, &stream).await.unwrap();
    stream.into_bytes()
}

async fn receive_bytes(pool: &Rc<Pool>, target: &str, bytes: Vec<u8>) -> Result<(), PoolError> {
    receive_partial(pool, target, bytes, false).await
}

/// [`receive_bytes`], kept for resuming when the stream breaks (`-s`) if
/// `save_partial`.
async fn receive_partial(
    pool: &Rc<Pool>,
    target: &str,
    bytes: Vec<u8>,
    save_partial: bool,
) -> Result<(), PoolError> {
    let options = ReceiveOptions {
        target: target.to_string(),
        force: false,
        save_partial,
        properties: BTreeMap::new(),
        received: None,
    };
    pool.receive(options, &MemoryStream::from_bytes(bytes))
        .await
        .map(|_| ())
}

/// A raw send (`send -w`) carries an encrypted volume's blocks sealed and
/// needs no key; the pool that receives it never had the key, stores the
/// blocks sealed, scrubs them, and opens them byte for byte once the
/// sender's user key is loaded, full and incremental (with holes), also
/// after an import. A raw stream applies only to a volume of the same key.
#[test]
fn raw_send_keeps_volumes_sealed_into_a_pool_without_the_key() {
    let disks = devices(4, DEVICE_BYTES, 79);
    let expected = Runtime::new_sim(79).block_on(async {
        let source = mirror(&disks[..2]).await;
        let backup = Pool::create_on_devices(
            "backup",
            layout(&disks[2..], TopVdevKind::Mirror),
            false,
            manual_commits(),
        )
        .await
        .unwrap();
        let properties: BTreeMap<String, String> =
            [("compression".to_string(), "lz4".to_string())].into();
        let volume = encrypted_v(&source, 6, properties).await;
        let data = marked(32);
        source.write(&volume, 0, data.clone(), false).await.unwrap();
        source.snapshot(&["tank/v@a".to_string()]).await.unwrap();
        // The sender needs no key either.
        source.unload_key("tank/v").await.unwrap();
        let full = send_bytes(&source, "tank/v@a", None, true).await;
        assert!(!holds_marker(&full), "a raw stream holds plaintext");
        let records = ironpool::format::stream::check_stream(&full).unwrap();
        let compressed = records
            .iter()
            .filter(|record| {
                matches!(record, Record::WriteRaw(raw)
                    if raw.compression != Compression::Off && raw.physical < raw.logical)
            })
            .count();
        assert_eq!(compressed, 32, "blocks are sent as stored, compressed");
        receive_bytes(&backup, "backup/copy", full.clone())
            .await
            .unwrap();
        let copy = backup.volume("backup/copy").unwrap();
        assert!(!backup.volume_key_available(&copy));
        match backup.read(&copy, 0, BLOCK).await {
            Err(PoolError::KeyUnavailable(_)) => {}
            other => panic!("read without the key: {:?}", other.map(|_| ())),
        }
        backup.commit().await.unwrap();
        for disk in &disks[2..] {
            let (bytes, sealed) = stored(&backup, &copy, disk, 7).await;
            assert!(sealed && !holds_marker(&bytes), "received in the clear");
        }
        backup.scrub_start().unwrap();
        backup.scrub_wait().await;
        let scrub = backup.scrub_status();
        assert_eq!(scrub.errors, 0, "{:?}", scrub.error_details);
        assert_eq!(scrub.bad_copies, 0);
        assert!(backup
            .load_key("backup/copy", Some(raw_key(7)))
            .await
            .is_err());
        backup
            .load_key("backup/copy", Some(raw_key(6)))
            .await
            .unwrap();
        assert_eq!(read(&backup, &copy, 0, 32 * BLOCK).await, &data[..]);

        // Incremental: new blocks and holes, sent and received without keys.
        source.load_key("tank/v", Some(raw_key(6))).await.unwrap();
        let later = marked(40);
        source
            .write(
                &volume,
                100 * BLOCK,
                later.slice(32 * BLOCK as usize..40 * BLOCK as usize),
                false,
            )
            .await
            .unwrap();
        source
            .zero(&volume, 0, 4 * BLOCK, false, true)
            .await
            .unwrap();
        source.snapshot(&["tank/v@b".to_string()]).await.unwrap();
        let expected = read(&source, &volume, 0, VOLUME_BYTES).await;
        source.unload_key("tank/v").await.unwrap();
        backup.unload_key("backup/copy").await.unwrap();
        let incremental = send_bytes(&source, "tank/v@b", Some("@a"), true).await;
        assert!(!holds_marker(&incremental));
        receive_bytes(&backup, "backup/copy", incremental.clone())
            .await
            .unwrap();

        // Refused: a raw stream into a volume that does not seal its
        // blocks under the stream's key (here: @a received as plaintext,
        // which the sender's key must be loaded for).
        source.load_key("tank/v", Some(raw_key(6))).await.unwrap();
        let plain = send_bytes(&source, "tank/v@a", None, false).await;
        assert!(holds_marker(&plain));
        receive_bytes(&backup, "backup/plain", plain).await.unwrap();
        match receive_bytes(&backup, "backup/plain", incremental).await {
            Err(PoolError::InvalidArgument(message)) => {
                assert!(message.contains("not encrypted"), "{message}")
            }
            other => panic!("a raw stream into a plain volume: {other:?}"),
        }

        // A raw receive cut short resumes raw, from where it stopped.
        let mut cut = full.clone();
        cut.truncate(full.len() * 2 / 3);
        assert!(receive_partial(&backup, "backup/part", cut, true)
            .await
            .is_err());
        let token =
            ResumeToken::decode(&backup.receive_resume_token("backup/part").unwrap()).unwrap();
        assert!(token.raw && token.next_block > 0, "{token:?}");
        // Its rest sent as plaintext is refused (the blocks received are
        // stored sealed): nothing changes, and the raw rest still applies.
        let plain_rest = MemoryStream::new();
        let request = SendRequest {
            snapshot: token.snapshot.clone(),
            from: token.from.clone(),
            resume_block: Some(token.next_block),
            resume_object: None,
            raw: false,
        };
        source.send(request, &plain_rest).await.unwrap();
        match receive_partial(&backup, "backup/part", plain_rest.into_bytes(), true).await {
            Err(PoolError::InvalidArgument(message)) => {
                assert!(message.contains("was raw"), "{message}")
            }
            other => panic!("a plain stream resuming a raw receive: {other:?}"),
        }
        let request = SendRequest {
            snapshot: token.snapshot,
            from: token.from,
            resume_block: Some(token.next_block),
            resume_object: None,
            raw: token.raw,
        };
        let rest = MemoryStream::new();
        source.send(request, &rest).await.unwrap();
        let rest = rest.into_bytes();
        assert!(rest.len() < full.len() && !holds_marker(&rest));
        receive_partial(&backup, "backup/part", rest, true)
            .await
            .unwrap();
        let part = backup.volume("backup/part").unwrap();
        assert!(!backup.volume_key_available(&part));
        backup
            .load_key("backup/part", Some(raw_key(6)))
            .await
            .unwrap();
        assert!(
            backup.volume_key_available(&backup.volume("backup/copy").unwrap()),
            "copies of one root share its key"
        );
        assert_eq!(read(&backup, &part, 0, 32 * BLOCK).await, &data[..]);
        backup.export().await.unwrap();
        source.export().await.unwrap();
        expected
    });
    Runtime::new_sim(80).block_on(async {
        let backup = Pool::import_from_devices("backup", named(&disks[2..]), manual_commits())
            .await
            .unwrap();
        let copy = backup.volume("backup/copy").unwrap();
        assert!(!backup.volume_key_available(&copy));
        backup
            .load_key("backup/copy", Some(raw_key(6)))
            .await
            .unwrap();
        assert_eq!(read(&backup, &copy, 0, VOLUME_BYTES).await, expected);
        let snapshot = backup.snapshot_volume("backup/copy@a").await.unwrap();
        assert_eq!(
            read(&backup, &snapshot, 0, 32 * BLOCK).await,
            &marked(32)[..]
        );
        backup.export().await.unwrap();
    });
}
