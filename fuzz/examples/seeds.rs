//! Writes the seed corpora under `fuzz/corpus/<target>/`: valid encodings of
//! each structure, made with the engine's own encoders, so the fuzzer starts
//! from inputs that pass every check and mutates from there.
//!
//! Run from anywhere (deterministic: rerunning rewrites the same files):
//!     cargo run --manifest-path fuzz/Cargo.toml --example seeds
//! Every seed is also run through its target's check before it is written.

use std::path::{Path, PathBuf};

use ironpool::format::bp::{BlockPointer, Compression, Dva, BLOCK_POINTER_BYTES};
use ironpool::format::checksum::ChecksumAlgo;
use ironpool::format::dnode::{Dnode, ObjectType, DNODE_BYTES};
use ironpool::format::label::{Label, LeafConfig, PoolConfig, PoolState, TopVdevConfig, TopVdevKind};
use ironpool::format::spacemap::{encode_records, Record};
use ironpool::format::uberblock::Uberblock;
use ironpool::format::FORMAT_VERSION;
use ironpool::nbd::proto::*;
use ironpool::pool::dataset::directory::Directory;
use ironpool_fuzz::nbd_handshake::{encode_info_request, encode_meta_context_request, encode_option};
use ironpool_fuzz::nbd_request::encode_request;

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let mut writer = SeedWriter { root, written_count: 0, written_bytes: 0 };
    nbd_handshake_seeds(&mut writer);
    nbd_request_seeds(&mut writer);
    label_seeds(&mut writer);
    uberblock_seeds(&mut writer);
    block_pointer_seeds(&mut writer);
    tree_node_seeds(&mut writer);
    dnode_seeds(&mut writer);
    spacemap_seeds(&mut writer);
    clone_table_seeds(&mut writer);
    indirect_mapping_seeds(&mut writer);
    directory_seeds(&mut writer);
    send_stream_seeds(&mut writer);
    replication_package_seeds(&mut writer);
    intent_log_seeds(&mut writer);
    fuse_request_seeds(&mut writer);
    println!("wrote {} seeds, {} bytes, under {}", writer.written_count, writer.written_bytes, writer.root.display());
}

struct SeedWriter {
    root: PathBuf,
    written_count: usize,
    written_bytes: usize,
}

impl SeedWriter {
    /// Checks that `data` is accepted, runs `target`'s check on it, then writes
    /// it as `corpus/<target>/<name>`.
    fn write(&mut self, target: &str, name: &str, data: &[u8]) {
        assert!(accepted(target, data), "seed {target}/{name} is refused by its decoder");
        let (_, check) = ironpool_fuzz::TARGETS.iter().find(|(known, _)| *known == target).expect("a known target");
        check(data);
        let folder = self.root.join(target);
        std::fs::create_dir_all(&folder).expect("corpus folder");
        std::fs::write(folder.join(name), data).expect("seed written");
        self.written_count += 1;
        self.written_bytes += data.len();
    }
}

/// Whether the decoder behind `target` accepts `data` whole (a seed that is
/// refused would start the fuzzer at the first check instead of past all).
fn accepted(target: &str, data: &[u8]) -> bool {
    use ironpool::format::bp::BlockPointer;
    match target {
        "nbd_handshake" => parse_client_flags(data[..4].try_into().expect("4 bytes")).is_ok() && options_parse(&data[4..]),
        "nbd_request" => parse_request(data[..REQUEST_HEADER_BYTES].try_into().expect("a header")).is_ok(),
        "label" => Label::decode(data).is_ok(),
        "uberblock" => Uberblock::decode(data).is_ok(),
        "block_pointer" => BlockPointer::decode(data).is_ok(),
        "tree_node" => data[1..].chunks(BLOCK_POINTER_BYTES).all(|chunk| BlockPointer::decode(chunk).is_ok()),
        "dnode" => Dnode::decode(data).is_ok(),
        "spacemap" => ironpool::format::spacemap::decode_records(data).is_ok(),
        "clone_table" => ironpool::format::clones::decode_records(data).is_ok(),
        "indirect_mapping" => ironpool::format::remap::decode_entries(data).is_ok(),
        "directory" => Directory::decode(data).is_ok(),
        "send_stream" => ironpool::format::stream::check_stream(data).is_ok(),
        "replication_package" => {
            use ironpool::format::package::{copy_one_stream, read_manifest, PACKAGE_MAGIC};
            let Some(mut input) = data.strip_prefix(&PACKAGE_MAGIC[..]) else { return false };
            let Ok(manifest) = read_manifest(&mut input) else { return false };
            let streams: usize = manifest.datasets.iter().map(|dataset| dataset.snapshots.len()).sum();
            (0..streams).all(|_| copy_one_stream(&mut input, &mut std::io::sink()).is_ok()) && input.is_empty()
        }
        "intent_log" => ironpool::format::intent_log::decode_block(data, 0x5eed, 3).is_ok(),
        "fuse_request" => {
            let fuse = ironpool::fuse::proto::header(data).expect("a header");
            ironpool::fuse::proto::request(&fuse, data).is_ok()
        }
        _ => panic!("unknown target {target}"),
    }
}

/// Whether every option in `stream` has a sound header and, for the options
/// with structured data, data that parses.
fn options_parse(mut stream: &[u8]) -> bool {
    while !stream.is_empty() {
        let Ok(header) = parse_option_header(stream[..OPTION_HEADER_BYTES].try_into().expect("a header")) else { return false };
        let data = &stream[OPTION_HEADER_BYTES..OPTION_HEADER_BYTES + header.length as usize];
        let parsed = match header.option {
            OPT_INFO | OPT_GO => parse_info_request(data).is_ok(),
            OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => parse_meta_context_request(data).is_ok(),
            _ => true,
        };
        if !parsed {
            return false;
        }
        stream = &stream[OPTION_HEADER_BYTES + data.len()..];
    }
    true
}

// ---- NBD ----

fn client_flags() -> Vec<u8> {
    (CLIENT_FLAG_FIXED_NEWSTYLE | CLIENT_FLAG_NO_ZEROES).to_be_bytes().to_vec()
}

fn nbd_handshake_seeds(writer: &mut SeedWriter) {
    let info = encode_info_request(&InfoRequest { name: "vol".into(), requests: vec![INFO_EXPORT, INFO_NAME, INFO_BLOCK_SIZE] });
    let default_export = encode_info_request(&InfoRequest { name: String::new(), requests: vec![] });
    let list_contexts = encode_meta_context_request(&MetaContextRequest { export: "vol".into(), queries: vec![] });
    let set_context =
        encode_meta_context_request(&MetaContextRequest { export: "vol".into(), queries: vec![CONTEXT_BASE_ALLOCATION.into(), "base:".into()] });
    let sessions: [(&str, Vec<Vec<u8>>); 6] = [
        (
            "go-structured-block-status",
            vec![encode_option(OPT_STRUCTURED_REPLY, &[]), encode_option(OPT_SET_META_CONTEXT, &set_context), encode_option(OPT_GO, &info)],
        ),
        ("info-then-go-default-export", vec![encode_option(OPT_INFO, &info), encode_option(OPT_GO, &default_export)]),
        ("list-meta-contexts", vec![encode_option(OPT_LIST_META_CONTEXT, &list_contexts), encode_option(OPT_ABORT, &[])]),
        ("list-exports-unknown-option", vec![encode_option(OPT_LIST, &[]), encode_option(OPT_STARTTLS, &[]), encode_option(99, b"x")]),
        ("export-name", vec![encode_option(OPT_EXPORT_NAME, b"vol")]),
        ("flags-only", vec![]),
    ];
    for (name, options) in sessions {
        let mut stream = client_flags();
        options.iter().for_each(|option| stream.extend_from_slice(option));
        writer.write("nbd_handshake", name, &stream);
    }
}

fn request(command: u16, flags: u16, offset: u64, length: u32) -> Vec<u8> {
    encode_request(&Request { flags, command, cookie: 0x1000 + command as u64, offset, length }).to_vec()
}

fn nbd_request_seeds(writer: &mut SeedWriter) {
    let mut write = request(CMD_WRITE, CMD_FLAG_FUA, 4096, 512);
    write.extend_from_slice(&[0xa5; 512]);
    let mixed = [
        request(CMD_READ, 0, 0, 4096),
        write.clone(),
        request(CMD_FLUSH, 0, 0, 0),
        request(CMD_TRIM, 0, 8192, 65536),
        request(CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE, 1 << 20, 1 << 16),
        request(CMD_BLOCK_STATUS, CMD_FLAG_REQ_ONE, 0, u32::MAX),
        request(CMD_CACHE, 0, 0, 4096),
        request(CMD_READ, CMD_FLAG_DF, u64::MAX - 511, 512),
        request(CMD_DISC, 0, 0, 0),
    ]
    .concat();
    writer.write("nbd_request", "mixed-session", &mixed);
    writer.write("nbd_request", "write-with-payload", &write);
    writer.write("nbd_request", "read-past-payload-max", &request(CMD_READ, 0, 0, PAYLOAD_BYTES_MAX + 1));
    writer.write("nbd_request", "unknown-command", &request(42, 0xffff, 7, 7));
}

// ---- labels and uberblocks ----

fn leaf(guid: u64, path: &str) -> LeafConfig {
    LeafConfig::new(guid, path.into(), 2 << 30)
}

fn top(id: u32, guid: u64, kind: TopVdevKind, ashift: u8, children: Vec<LeafConfig>) -> TopVdevConfig {
    TopVdevConfig { id, guid, kind, ashift, asize_bytes: 120 << 24, metaslab_shift: 24, children, log: false }
}

fn pool_config(name: &str, state: PoolState, vdevs: Vec<TopVdevConfig>) -> PoolConfig {
    PoolConfig { name: name.into(), pool_guid: 0x7a11_0001, version: FORMAT_VERSION, config_txg: 5, state, hostname: "host".into(), vdevs, spares: Vec::new() }
}

/// A label's config area cut after its config document (decode reads no further).
fn label_bytes(config: PoolConfig, leaf_guid: u64) -> Vec<u8> {
    let label = Label { pool_guid: config.pool_guid, leaf_guid, config_txg: config.config_txg, config };
    let mut bytes = label.encode().expect("sample label encodes");
    let document_bytes = u32::from_le_bytes(bytes[12..16].try_into().expect("4 bytes")) as usize;
    bytes.truncate(64 + document_bytes);
    bytes
}

fn label_seeds(writer: &mut SeedWriter) {
    let disk = pool_config("tank", PoolState::Active, vec![top(0, 5, TopVdevKind::Disk, 12, vec![leaf(10, "/dev/a")])]);
    writer.write("label", "single-disk", &label_bytes(disk, 10));
    let mirror = top(0, 5, TopVdevKind::Mirror, 9, vec![leaf(10, "/a"), leaf(11, "/b"), leaf(12, "/c")]);
    writer.write("label", "three-way-mirror-exported", &label_bytes(pool_config("backup", PoolState::Exported, vec![mirror]), 12));
    let striped = vec![
        top(0, 5, TopVdevKind::Mirror, 12, vec![leaf(10, "/a"), leaf(11, "/b")]),
        top(1, 6, TopVdevKind::Disk, 16, vec![leaf(20, "/c \"quoted\" \u{e9}")]),
    ];
    writer.write("label", "mirror-and-disk", &label_bytes(pool_config("t.a-n_k", PoolState::Active, striped), 20));
    let mut degraded = vec![leaf(30, "/r0"), leaf(31, "/r1"), leaf(32, "/r2"), leaf(33, "/r3")];
    degraded[1].offline = true;
    degraded[1].dtl = vec![[7, u64::MAX]];
    degraded[3].dtl = vec![[2, 4], [6, 6]];
    let raidz = vec![top(0, 5, TopVdevKind::Raidz2, 12, degraded), top(1, 6, TopVdevKind::Mirror, 12, vec![leaf(40, "/m0"), leaf(41, "/m1")])];
    writer.write("label", "raidz2-degraded-and-mirror", &label_bytes(pool_config("tank", PoolState::Active, raidz), 33));
    // A pool whose first vdev was removed (format 4): no children left.
    let removed = vec![top(0, 5, TopVdevKind::Indirect, 12, vec![]), top(1, 6, TopVdevKind::Mirror, 12, vec![leaf(50, "/n0"), leaf(51, "/n1")])];
    writer.write("label", "indirect-and-mirror", &label_bytes(pool_config("tank", PoolState::Active, removed), 51));
}

fn hole_root(object_type: ObjectType, birth_txg: u64) -> BlockPointer {
    BlockPointer::hole(0, object_type, birth_txg)
}

fn uberblock_seeds(writer: &mut SeedWriter) {
    let empty_table = Dnode {
        object_type: ObjectType::DnodeTable,
        levels: 1,
        data_block_shift: 14,
        indirect_block_shift: 15,
        root: hole_root(ObjectType::DnodeTable, 0),
        ..Dnode::default()
    };
    let first =
        Uberblock { txg: 1, pool_guid: 0x7a11_0001, guid_sum: 10, timestamp_ns: 1_700_000_000_000_000_000, config_txg: 1, dnode_table: empty_table };
    writer.write("uberblock", "first-txg", &first.encode());
    let table = Dnode {
        levels: 2,
        used_bytes: 3 * 16384,
        logical_bytes: 16384,
        creation_txg: 1,
        root: pointer(1, ObjectType::DnodeTable, ChecksumAlgo::Blake3, 2),
        ..empty_table
    };
    let later = Uberblock { txg: 9_000_001, guid_sum: 21, config_txg: 4, dnode_table: table, ..first };
    writer.write("uberblock", "two-level-dnode-table", &later.encode());
}

// ---- block pointers, tree nodes, dnodes ----

/// A sound pointer at `level` with `copies` DVAs of 16 KiB.
fn pointer(level: u8, object_type: ObjectType, checksum_algo: ChecksumAlgo, copies: usize) -> BlockPointer {
    let mut dvas = [Dva::default(); 3];
    for (index, dva) in dvas.iter_mut().take(copies).enumerate() {
        *dva = Dva { vdev: index as u32, asize: 16384, offset: (1 << 30) + index as u64 * (1 << 20) };
    }
    BlockPointer {
        dvas,
        birth_txg: 42,
        physical_birth: 0,
        logical_size: 16384,
        physical_size: 16384,
        level,
        object_type,
        checksum_algo,
        compression: Compression::Off,
        fill: if level == 0 { 1 } else { 32 },
        checksum: checksum_algo.compute(&[level, copies as u8]),
        crypt: None,
    }
}

fn encode_pointer(pointer: &BlockPointer) -> [u8; BLOCK_POINTER_BYTES] {
    let mut bytes = [0u8; BLOCK_POINTER_BYTES];
    pointer.encode(&mut bytes);
    bytes
}

fn block_pointer_seeds(writer: &mut SeedWriter) {
    writer.write("block_pointer", "data-xxh3-two-copies", &encode_pointer(&pointer(0, ObjectType::VolumeData, ChecksumAlgo::Xxh3, 2)));
    writer.write("block_pointer", "indirect-blake3-three-copies", &encode_pointer(&pointer(3, ObjectType::Directory, ChecksumAlgo::Blake3, 3)));
    let compressed =
        BlockPointer { physical_size: 4096, compression: Compression::Lz4, ..pointer(0, ObjectType::SpaceMap, ChecksumAlgo::Fletcher4, 1) };
    writer.write("block_pointer", "data-lz4-fletcher4", &encode_pointer(&compressed));
    writer.write("block_pointer", "hole-born-txg-9", &encode_pointer(&BlockPointer::hole(2, ObjectType::VolumeData, 9)));
    let sealed = BlockPointer {
        crypt: Some(ironpool::format::bp::BlockCrypt { salt: 0x0123_4567_89ab_cdef, iv: [7; 12], mac: [9; 16] }),
        ..pointer(0, ObjectType::VolumeData, ChecksumAlgo::Xxh3, 1)
    };
    writer.write("block_pointer", "data-encrypted", &encode_pointer(&sealed));
}

fn tree_node_seeds(writer: &mut SeedWriter) {
    // Byte 0 is the level (1 + byte % LEVEL_MAX); the rest starts the node,
    // and the node's tail (not written) is holes.
    let mut level_one = vec![0u8];
    level_one.extend_from_slice(&encode_pointer(&pointer(0, ObjectType::VolumeData, ChecksumAlgo::Xxh3, 1)));
    level_one.extend_from_slice(&encode_pointer(&BlockPointer::hole(0, ObjectType::VolumeData, 7)));
    level_one.extend_from_slice(&encode_pointer(&pointer(0, ObjectType::VolumeData, ChecksumAlgo::Blake3, 2)));
    writer.write("tree_node", "level-1-data-pointers", &level_one);
    let mut level_three = vec![2u8];
    level_three.extend_from_slice(&encode_pointer(&BlockPointer::hole(2, ObjectType::DnodeTable, 0)));
    level_three.extend_from_slice(&encode_pointer(&pointer(2, ObjectType::DnodeTable, ChecksumAlgo::Xxh3, 2)));
    writer.write("tree_node", "level-3-indirect-pointers", &level_three);
}

fn encode_dnode(dnode: &Dnode) -> [u8; DNODE_BYTES] {
    let mut bytes = [0u8; DNODE_BYTES];
    dnode.encode(&mut bytes);
    bytes
}

fn dnode_seeds(writer: &mut SeedWriter) {
    let volume = Dnode {
        object_type: ObjectType::VolumeData,
        levels: 3,
        data_block_shift: 14,
        indirect_block_shift: 15,
        checksum_algo: ChecksumAlgo::Xxh3,
        compression: Compression::Lz4,
        length_bytes: 1 << 31,
        used_bytes: 12345 * 512,
        creation_txg: 4,
        logical_bytes: 1 << 20,
        root: pointer(2, ObjectType::VolumeData, ChecksumAlgo::Xxh3, 2),
        ..Dnode::default()
    };
    writer.write("dnode", "volume-three-levels", &encode_dnode(&volume));
    let snapshot = Dnode { flags: 1, levels: 1, data_block_shift: 9, indirect_block_shift: 17, root: hole_root(ObjectType::VolumeData, 3), ..volume };
    writer.write("dnode", "read-only-one-level", &encode_dnode(&snapshot));
    let space_map = Dnode {
        object_type: ObjectType::SpaceMap,
        levels: 1,
        checksum_algo: ChecksumAlgo::Fletcher4,
        compression: Compression::Off,
        root: pointer(0, ObjectType::SpaceMap, ChecksumAlgo::Fletcher4, 2),
        ..volume
    };
    writer.write("dnode", "space-map", &encode_dnode(&space_map));
    writer.write("dnode", "free-slot", &encode_dnode(&Dnode::default()));
}

// ---- space maps, the block reference table and the directory ----

fn clone_table_seeds(writer: &mut SeedWriter) {
    use ironpool::format::clones::{encode_records, CloneRecord};
    let block = |vdev, offset, delta| CloneRecord { vdev, asize: 16384, offset, delta };
    // A log: two clones of one block, one of another, a reference dropped.
    let log = [block(0, 1 << 20, 2), block(1, 4 << 20, 1), block(0, 1 << 20, -1)];
    writer.write("clone_table", "log", &encode_records(&log));
    // A rewritten table: one record per cloned block.
    let whole = [block(0, 1 << 20, 1), block(1, 4 << 20, 1), block(u32::MAX, u64::MAX - 16384, 7)];
    writer.write("clone_table", "rewritten", &encode_records(&whole));
}

fn indirect_mapping_seeds(writer: &mut SeedWriter) {
    use ironpool::format::remap::{encode_entries, MappingEntry};
    let moved = |source_offset, source_asize, vdev, offset, asize| MappingEntry { source_offset, source_asize, target: Dva { vdev, asize, offset } };
    // Blocks of a mirror moved to two vdevs, one to a RAID-Z group (a larger
    // allocated size there).
    let entries = [moved(0, 16384, 0, 8 << 20, 16384), moved(16384, 4096, 2, 1 << 20, 4096), moved(1 << 30, 131072, 2, 64 << 20, 172032)];
    writer.write("indirect_mapping", "moved", &encode_entries(&entries));
    writer.write("indirect_mapping", "far", &encode_entries(&[moved(u64::MAX - 65536, 65536, u32::MAX, u64::MAX - 512, 512)]));
}

fn spacemap_seeds(writer: &mut SeedWriter) {
    let checkpoint = [
        Record::Txg(5),
        Record::Allocate { offset: 0, length: 1 << 20 },
        Record::Allocate { offset: 4 << 20, length: 16384 },
        Record::Free { offset: 8192, length: 4096 },
    ];
    writer.write("spacemap", "metaslab-checkpoint", &encode_records(&checkpoint));
    let log = [
        Record::Txg(6),
        Record::Vdev(0),
        Record::Allocate { offset: 1 << 30, length: 512 },
        Record::Vdev(u32::MAX),
        Record::Free { offset: (1 << 56) - 513, length: 512 },
        Record::Txg(u64::MAX),
    ];
    writer.write("spacemap", "space-log", &encode_records(&log));
}

/// Directory documents are written as JSON text, then decoded and re-encoded
/// by the crate, so the seeds are exactly what the engine writes (fields added
/// later with `#[serde(default)]` keep these valid).
fn directory_seeds(writer: &mut SeedWriter) {
    let documents = [
        ("new-pool", r#"{"version":1,"metaslab_arrays":[2],"volumes":{}}"#),
        (
            "volumes-scrub-logs",
            r#"{"version":1,"metaslab_arrays":[2,3],
               "volumes":{"vol":{"object":9,"size_bytes":1073741824,"block_bytes":16384,"created_txg":3,
                                 "properties":{"org:owner":"ops \"team\" \u00e9"}},
                          "vol2":{"object":10,"size_bytes":4096,"block_bytes":512,"created_txg":8}},
               "properties":{"compression":"lz4"},
               "last_scrub":{"started_unix_seconds":1700000000,"finished_unix_seconds":1700000100,
                             "examined_bytes":1073741824,"repaired_bytes":4096,"errors":1,"completed":true},
               "space_logs":[{"object":11,"first_txg":5},{"object":12,"first_txg":9}]}"#,
        ),
        (
            "snapshots-clone-receive",
            r#"{"version":1,"metaslab_arrays":[2],
               "volumes":{"vol":{"object":9,"size_bytes":1073741824,"block_bytes":16384,"created_txg":3,"guid":77,"dead_list":13,
                                 "snapshots":[{"name":"monday","object":14,"txg":20,"guid":78,"dead_list":0,"created_unix_seconds":1700000000,"clones":["copy"]}]},
                          "copy":{"object":15,"size_bytes":1073741824,"block_bytes":16384,"created_txg":21,"guid":79,
                                  "origin":{"volume":"vol","snapshot":"monday"}},
                          "incoming":{"object":16,"size_bytes":4096,"block_bytes":4096,"created_txg":22,
                                      "receive":{"target":"vol","snapshot":"tank/vol@tuesday","to_guid":80,"from":"tank/vol@monday","from_guid":78,"next_block":4}}}}"#,
        ),
    ];
    for (name, document) in documents {
        let directory = Directory::decode(document.as_bytes()).unwrap_or_else(|error| panic!("seed {name}: {error}"));
        writer.write("directory", name, &directory.encode());
    }
}

/// A `send -R` package: a filesystem with two snapshots and a volume below
/// it with one (the streams are empty volume streams, BEGIN and END: the
/// package reader looks at record headers only).
fn replication_package_seeds(writer: &mut SeedWriter) {
    use ironpool::format::package::{write_header, Manifest, PackageDataset, MANIFEST_VERSION};
    use ironpool::format::stream::{StreamBegin, StreamWriter, STREAM_VERSION};
    let stream = |snapshot: &str, from: Option<&str>| {
        let mut stream = StreamWriter::new();
        stream.begin(&StreamBegin {
            version: STREAM_VERSION,
            snapshot: snapshot.into(),
            to_guid: 0x1234,
            from: from.map(String::from),
            from_guid: if from.is_some() { 0x99 } else { 0 },
            size_bytes: 16 * 4096,
            block_bytes: 4096,
            resume_block: None,
            properties: Default::default(),
            filesystem: None,
            resume_object: None,
            raw: None,
        });
        stream.end();
        stream.bytes
    };
    let manifest = Manifest {
        version: MANIFEST_VERSION,
        snapshot: "two".into(),
        datasets: vec![
            PackageDataset {
                name: String::new(),
                kind: "filesystem".into(),
                properties: [("atime".to_string(), "off".to_string())].into_iter().collect(),
                snapshots: vec!["one".into(), "two".into()],
                from: None,
                existing: Some(vec!["one".into(), "two".into(), "three".into()]),
            },
            PackageDataset {
                name: "b/v".into(),
                kind: "volume".into(),
                properties: Default::default(),
                snapshots: vec!["two".into()],
                from: None,
                existing: Some(vec!["two".into()]),
            },
        ],
        from: None,
        unsent: Some(vec!["late".into()]),
    };
    let mut package = Vec::new();
    write_header(&mut package, &manifest).expect("a header in memory");
    package.extend(stream("tank/a@one", None));
    package.extend(stream("tank/a@two", Some("tank/a@one")));
    package.extend(stream("tank/a/b/v@two", None));
    writer.write("replication_package", "subtree", &package);
}

fn send_stream_seeds(writer: &mut SeedWriter) {
    use ironpool::format::stream::{StreamBegin, StreamWriter, STREAM_VERSION};
    let begin = |from: Option<&str>, resume_block: Option<u64>| StreamBegin {
        version: STREAM_VERSION,
        snapshot: "tank/vol@b".into(),
        to_guid: 0x1234,
        from: from.map(String::from),
        from_guid: if from.is_some() { 0x99 } else { 0 },
        size_bytes: 64 * 4096,
        block_bytes: 4096,
        resume_block,
        properties: [("compression".to_string(), "lz4".to_string())].into_iter().collect(),
        filesystem: None,
        resume_object: None,
        raw: None,
    };
    let mut full = StreamWriter::new();
    full.begin(&begin(None, None));
    full.write(0, 2, &[0x11u8; 8192]);
    full.write(5, 1, &[0x22u8; 4096]);
    full.end();
    writer.write("send_stream", "full", &full.bytes);
    let mut incremental = StreamWriter::new();
    incremental.begin(&begin(Some("tank/vol@a"), None));
    incremental.free(0, 4);
    incremental.write(4, 1, &[0x33u8; 4096]);
    incremental.free(10, 54);
    incremental.end();
    writer.write("send_stream", "incremental", &incremental.bytes);
    let mut resumed = StreamWriter::new();
    resumed.begin(&begin(None, Some(32)));
    resumed.write(40, 1, &[0x44u8; 4096]);
    resumed.end();
    writer.write("send_stream", "resumed", &resumed.bytes);
    // A raw stream (`send -w`): sealed blocks as stored, the key wrapped.
    use ironpool::format::bp::{BlockCrypt, Compression};
    use ironpool::format::stream::{RawBlock, RawKey, STREAM_VERSION_RAW};
    let mut raw = StreamWriter::new();
    raw.begin(&StreamBegin {
        version: STREAM_VERSION_RAW,
        raw: Some(RawKey {
            key_guid: 0x7e57,
            wrapped_key: "5a".repeat(104),
        }),
        ..begin(Some("tank/vol@a"), None)
    });
    let sealed = |block: u64, physical: u32, compression: Compression| RawBlock {
        block,
        logical: 4096,
        physical,
        compression,
        crypt: BlockCrypt {
            salt: 0x5a17,
            iv: [block as u8; 12],
            mac: [0xac; 16],
        },
    };
    raw.write_raw(&sealed(0, 4096, Compression::Off), &[0x88u8; 4096]);
    raw.free(1, 2);
    raw.write_raw(&sealed(3, 700, Compression::Lz4), &[0x99u8; 700]);
    raw.end();
    writer.write("send_stream", "raw", &raw.bytes);

    // A filesystem's: objects, their blocks and holes, freed slots.
    use ironpool::format::dnode::{ObjectType, BONUS_BYTES};
    use ironpool::format::stream::{FsStreamInfo, StreamObject};
    let fs_begin = |from: Option<&str>, resume: Option<(u64, u64)>| StreamBegin {
        snapshot: "tank/fs@b".into(),
        size_bytes: 0,
        block_bytes: 128 * 1024,
        resume_block: resume.map(|(_, block)| block),
        resume_object: resume.map(|(object, _)| object),
        filesystem: Some(FsStreamInfo { root: 1, next_object: 40 }),
        ..begin(from, None)
    };
    let object = |object: u64, object_type: ObjectType, block_shift: u8| StreamObject {
        object,
        object_type,
        block_shift,
        length: 3 << block_shift,
        bonus: vec![0x01; BONUS_BYTES],
    };
    let mut fs_full = StreamWriter::new();
    fs_full.begin(&fs_begin(None, None));
    fs_full.object(&object(1, ObjectType::FsDirectory, 10));
    fs_full.object_write(1, 1, 1, &[0x55u8; 1024]);
    fs_full.object(&object(2, ObjectType::FsFile, 9));
    fs_full.object_write(2, 0, 2, &[0x66u8; 1024]);
    fs_full.object(&object(3, ObjectType::FsXattr, 9));
    fs_full.object_write(3, 0, 1, &[0x77u8; 512]);
    fs_full.end();
    writer.write("send_stream", "fs_full", &fs_full.bytes);
    let mut fs_incremental = StreamWriter::new();
    fs_incremental.begin(&fs_begin(Some("tank/fs@a"), None));
    fs_incremental.object(&object(2, ObjectType::FsFile, 12));
    fs_incremental.object_free(2, 1, 7);
    fs_incremental.free_objects(3, 29);
    fs_incremental.end();
    writer.write("send_stream", "fs_incremental", &fs_incremental.bytes);
    let mut fs_resumed = StreamWriter::new();
    fs_resumed.begin(&fs_begin(None, Some((2, 1))));
    fs_resumed.object(&object(2, ObjectType::FsFile, 9));
    fs_resumed.object_write(2, 1, 1, &[0x66u8; 512]);
    fs_resumed.end();
    writer.write("send_stream", "fs_resumed", &fs_resumed.bytes);
    // A filesystem's raw stream: its blocks and leaves as stored.
    let mut fs_raw = StreamWriter::new();
    fs_raw.begin(&StreamBegin {
        version: STREAM_VERSION_RAW,
        raw: Some(RawKey {
            key_guid: 0x7e57,
            wrapped_key: "5a".repeat(104),
        }),
        ..fs_begin(None, None)
    });
    let sealed_object = |block: u64, logical: u32, physical: u32, compression: Compression| RawBlock {
        logical,
        ..sealed(block, physical, compression)
    };
    fs_raw.object(&object(1, ObjectType::FsDirectory, 10));
    fs_raw.object_write_raw(1, &sealed_object(1, 1024, 1024, Compression::Off), &[0x55u8; 1024]);
    fs_raw.object(&object(2, ObjectType::FsFile, 12));
    fs_raw.object_write_raw(2, &sealed_object(0, 4096, 700, Compression::Lz4), &[0x66u8; 700]);
    fs_raw.object_free(2, 1, 2);
    fs_raw.end();
    writer.write("send_stream", "fs_raw", &fs_raw.bytes);
}

fn intent_log_seeds(writer: &mut SeedWriter) {
    use ironpool::format::intent_log::{encode_block, LogBlockHeader, LogPointer, LogRecord};
    let header = LogBlockHeader {
        chain_guid: 0x5eed,
        seq: 3,
        next: LogPointer { dva: Dva { vdev: 0, asize: 4096, offset: 8 << 20 }, bytes: 4096 },
        commit: 12,
        ends_commit: true,
    };
    let records = vec![
        LogRecord::Block { object: 260, blkid: 7, pointer: pointer(0, ObjectType::VolumeData, ChecksumAlgo::Xxh3, 1) },
        LogRecord::Hole { object: 260, blkid: 8, txg: 9 },
        LogRecord::Copy { object: 260, blkid: 9, data: vec![0x42; 700] },
    ];
    let mut block = vec![0u8; 4096];
    encode_block(&header, &records, &mut block);
    writer.write("intent_log", "three-records", &block);
    let mut empty = vec![0u8; 4096];
    encode_block(&header, &[], &mut empty);
    writer.write("intent_log", "no-records", &empty);
}

// ---- FUSE ----

/// One request of each kind the server decodes, in the kernel's layout.
fn fuse_request_seeds(writer: &mut SeedWriter) {
    use ironpool::fuse::proto::{self as fuse, InHeader, Request, SetattrIn};
    let header = |opcode: u32| InHeader { len: 0, opcode, unique: 42, nodeid: 1, uid: 1000, gid: 1000, pid: 7 };
    let requests: Vec<(&str, u32, Request)> = vec![
        ("init", fuse::INIT, Request::Init { major: 7, minor: 45, max_readahead: 131072, flags: 0x7fff_ffff }),
        ("lookup", fuse::LOOKUP, Request::Lookup { name: b"file.txt" }),
        ("getattr", fuse::GETATTR, Request::Getattr),
        (
            "setattr",
            fuse::SETATTR,
            Request::Setattr(SetattrIn { valid: 0x5ff, size: 4096, atime: (1, 2), mtime: (3, 4), ctime: (5, 6), mode: 0o644, uid: 1, gid: 2 }),
        ),
        ("symlink", fuse::SYMLINK, Request::Symlink { name: b"link", target: b"../target" }),
        ("mknod", fuse::MKNOD, Request::Mknod { name: b"fifo", mode: 0o10644, rdev: 0, umask: 0o22 }),
        ("mkdir", fuse::MKDIR, Request::Mkdir { name: b"dir", mode: 0o755, umask: 0o22 }),
        ("unlink", fuse::UNLINK, Request::Unlink { name: b"gone" }),
        ("rename", fuse::RENAME, Request::Rename { new_dir: 5, name: b"a", new_name: b"b", flags: 0 }),
        ("rename2-exchange", fuse::RENAME2, Request::Rename { new_dir: 5, name: b"a", new_name: b"b", flags: 2 }),
        ("link", fuse::LINK, Request::Link { old_node: 9, name: b"hard" }),
        ("open-direct", fuse::OPEN, Request::Open { flags: libc_o_direct() | 2 }),
        ("create", fuse::CREATE, Request::Create { name: b"new", flags: 0o101, mode: 0o100644, umask: 0o22 }),
        ("read", fuse::READ, Request::Read { fh: 0, offset: 1 << 20, size: 65536, flags: libc_o_direct() }),
        ("write", fuse::WRITE, Request::Write { fh: 0, offset: 4096, write_flags: 0, flags: 0, data: &[0xa5; 512] }),
        ("fsync", fuse::FSYNC, Request::Fsync { datasync: true }),
        ("readdir", fuse::READDIR, Request::Readdir { offset: 3, size: 4096, plus: false }),
        ("setxattr", fuse::SETXATTR, Request::Setxattr { name: b"user.mime_type", value: b"text/plain", flags: 1 }),
        ("getxattr-size", fuse::GETXATTR, Request::Getxattr { name: b"user.mime_type", size: 0 }),
        ("listxattr", fuse::LISTXATTR, Request::Listxattr { size: 4096 }),
        ("removexattr", fuse::REMOVEXATTR, Request::Removexattr { name: b"user.mime_type" }),
        (
            "ioctl-fssetxattr",
            fuse::IOCTL,
            Request::Ioctl { flags: 0, cmd: 0x401c_5820, out_size: 0, data: &[0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0] },
        ),
        ("tmpfile", fuse::TMPFILE, Request::Tmpfile { flags: 0o2, mode: 0o100600, umask: 0o22 }),
        ("statx", fuse::STATX, Request::Statx),
        (
            "copy-file-range",
            fuse::COPY_FILE_RANGE,
            Request::CopyFileRange { offset_in: 1 << 20, node_out: 9, offset_out: 16384, length: 1 << 30, flags: 0 },
        ),
        ("unknown-opcode", 99, Request::Unsupported(99)),
    ];
    for (name, opcode, request) in requests {
        writer.write("fuse_request", name, &ironpool_fuzz::fuse_request::encode_request(&header(opcode), &request));
    }
}

/// Linux's `O_DIRECT` on x86-64 and arm64 (the fuzz crate has no libc).
fn libc_o_direct() -> u32 {
    0o40000
}
