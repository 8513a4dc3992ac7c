//! send | receive (full, incremental, resumed, across pools through a pipe),
//! refused streams, compression and properties: the real binary with real NBD
//! clients (qemu-io, qemu-img, nbdinfo) on pools of real files.

mod common;

use std::process::Command;

use common::{ironpool_binary, receive_fails, receive_ok, tool, TestPool};

fn compare(first: &str, second: &str) {
    let output = tool(
        "qemu-img",
        &["compare", "-f", "raw", "-F", "raw", first, second],
    );
    assert!(
        output.contains("identical"),
        "{first} and {second} differ: {output}"
    );
}

fn snapshot_uri(pool: &TestPool, volume_and_snapshot: &str) -> String {
    pool.uri(volume_and_snapshot)
}

/// A source pool with volume `vol` and snapshots @a, @b, @c of different data
/// (overwrites, partial blocks, unmapped ranges).
fn source_pool() -> TestPool {
    let mut pool = TestPool::new("tank");
    pool.create("1G", &["mirror", "a.img", "b.img"]);
    pool.create_volume("vol", "64M");
    pool.serve();
    let uri = pool.uri("vol");
    tool(
        "qemu-io",
        &[
            "-f",
            "raw",
            &uri,
            "-c",
            "write -P 0x11 0 8M",
            "-c",
            "write -P 0x22 12M 4M",
            "-c",
            "write -P 0x33 30M 12k",
            "-c",
            "flush",
        ],
    );
    pool.admin(&["snapshot", "tank/vol@a"]);
    tool(
        "qemu-io",
        &[
            "-f",
            "raw",
            &uri,
            "-c",
            "write -P 0x44 2M 2M",
            "-c",
            "write -z -u 12M 2M",
            "-c",
            "write -P 0x55 40M 1M",
            "-c",
            "write -P 0x66 30M 4k",
            "-c",
            "flush",
        ],
    );
    pool.admin(&["snapshot", "tank/vol@b"]);
    tool(
        "qemu-io",
        &[
            "-f",
            "raw",
            &uri,
            "-c",
            "write -P 0x77 50M 3M",
            "-c",
            "write -z -u 0 1M",
            "-c",
            "flush",
        ],
    );
    pool.admin(&["snapshot", "tank/vol@c"]);
    pool
}

fn snapshots_of(pool: &TestPool, volume: &str) -> Vec<String> {
    let listing: serde_json::Value =
        serde_json::from_str(&pool.admin(&["--json", "list", "-t", "snapshot", volume]))
            .expect("list JSON");
    listing["datasets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row["name"].as_str().unwrap().to_string())
        .collect()
}

fn volume_names(pool: &TestPool) -> Vec<String> {
    let listing: serde_json::Value =
        serde_json::from_str(&pool.admin(&["--json", "volume", "list", &pool.name]))
            .expect("volume list JSON");
    listing["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row["name"].as_str().unwrap().to_string())
        .collect()
}

fn check(pool: &TestPool) {
    pool.ok(&[
        "check",
        &pool.name,
        "-d",
        &pool.dir.path().display().to_string(),
    ]);
}

#[test]
fn full_incremental_piped_and_resumed_streams_give_identical_volumes() {
    let mut source = source_pool();
    let full = source.path("full.stream");
    let summary = source.send_to_file(&["send", "tank/vol@a"], &full);
    assert!(summary.contains("sent tank/vol@a"), "{summary}");
    receive_ok(&source, "tank/copy", &full, &[]);
    compare(&snapshot_uri(&source, "vol@a"), &source.uri("copy"));
    compare(
        &snapshot_uri(&source, "vol@a"),
        &snapshot_uri(&source, "copy@a"),
    );

    let incremental = source.path("a-b.stream");
    source.send_to_file(&["send", "-i", "@a", "tank/vol@b"], &incremental);
    // Only what changed travels: far less than the volume's data.
    let full_bytes = std::fs::metadata(&full).unwrap().len();
    let incremental_bytes = std::fs::metadata(&incremental).unwrap().len();
    assert!(
        incremental_bytes < full_bytes / 2,
        "incremental {incremental_bytes} vs full {full_bytes}"
    );
    receive_ok(&source, "tank/copy", &incremental, &[]);
    compare(&snapshot_uri(&source, "vol@b"), &source.uri("copy"));
    compare(
        &snapshot_uri(&source, "vol@a"),
        &snapshot_uri(&source, "copy@a"),
    );
    assert_eq!(
        snapshots_of(&source, "tank/copy"),
        vec!["tank/copy@a", "tank/copy@b"]
    );

    // Between two pools (two servers) through a pipe, as over ssh.
    let mut backup = TestPool::new("backup");
    backup.create("1G", &["a.img"]);
    backup.serve();
    let pipe = |command: &str| {
        let binary = ironpool_binary().display().to_string();
        let line = command
            .replace(
                "SRC",
                &format!("{binary} --control {}", source.control().display()),
            )
            .replace(
                "DST",
                &format!("{binary} --control {}", backup.control().display()),
            );
        let output = Command::new("bash")
            .args(["-c", &format!("set -o pipefail; {line}")])
            .output()
            .expect("sh");
        assert!(
            output.status.success(),
            "{line}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    };
    pipe("SRC send tank/vol@a | DST receive backup/vol");
    pipe("SRC send -i @a tank/vol@b | DST receive backup/vol");
    pipe("SRC send -i tank/vol@b tank/vol@c | DST receive backup/vol");
    compare(&snapshot_uri(&source, "vol@c"), &backup.uri("vol"));
    compare(
        &snapshot_uri(&source, "vol@b"),
        &snapshot_uri(&backup, "vol@b"),
    );

    // An interrupted stream, kept with -s, resumes from its token.
    let part = source.path("part.stream");
    let bytes = std::fs::read(&full).unwrap();
    std::fs::write(&part, &bytes[..bytes.len() * 3 / 5]).unwrap();
    let error = receive_fails(&backup, "backup/resumed", &part, &["-s"]);
    assert!(
        error.contains("truncated") && error.contains("send -t"),
        "{error}"
    );
    assert!(
        !volume_names(&backup)
            .iter()
            .any(|name| name.contains("resumed")),
        "a partial receive is not a volume"
    );
    let token_json: serde_json::Value = serde_json::from_str(&backup.admin(&[
        "--json",
        "get",
        "receive_resume_token",
        "backup/resumed",
    ]))
    .unwrap();
    let token = token_json["properties"][0]["value"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(token.starts_with("1-"), "{token_json}");
    // A fresh receive into the same name is refused while the partial one waits.
    let refused = receive_fails(&backup, "backup/resumed", &full, &[]);
    assert!(refused.contains("interrupted receive"), "{refused}");
    let rest = source.path("rest.stream");
    source.send_to_file(&["send", "-t", &token], &rest);
    assert!(
        std::fs::metadata(&rest).unwrap().len() < bytes.len() as u64,
        "the resumed stream skips what was received"
    );
    let resumed = receive_ok(&backup, "backup/resumed", &rest, &["-s"]);
    assert!(resumed.contains("resumed at block"), "{resumed}");
    compare(&snapshot_uri(&source, "vol@a"), &backup.uri("resumed"));

    // An interrupted receive can also be discarded.
    let error = receive_fails(&backup, "backup/dropped", &part, &["-s"]);
    assert!(error.contains("send -t"), "{error}");
    backup.admin(&["receive", "-A", "backup/dropped"]);
    receive_ok(&backup, "backup/dropped", &full, &[]);
    compare(&snapshot_uri(&source, "vol@a"), &backup.uri("dropped"));

    source.stop();
    backup.stop();
    check(&source);
    check(&backup);
}

#[test]
fn damaged_truncated_and_mismatched_streams_leave_the_target_unchanged() {
    let mut pool = source_pool();
    let full = pool.path("full.stream");
    pool.send_to_file(&["send", "tank/vol@a"], &full);
    receive_ok(&pool, "tank/target", &full, &[]);
    let incremental = pool.path("a-b.stream");
    pool.send_to_file(&["send", "-i", "@a", "tank/vol@b"], &incremental);
    let bytes = std::fs::read(&incremental).unwrap();
    let intact = |pool: &TestPool| {
        compare(&snapshot_uri(pool, "vol@a"), &pool.uri("target"));
        assert_eq!(snapshots_of(pool, "tank/target"), vec!["tank/target@a"]);
        assert!(
            !volume_names(pool).iter().any(|name| name.contains('%')),
            "no leftover partial receive: {:?}",
            volume_names(pool)
        );
    };

    // One flipped bit in the data, in a header, in the END record.
    for position in [bytes.len() / 2, 40, bytes.len() - 10] {
        let mut damaged = bytes.clone();
        damaged[position] ^= 0x08;
        let file = pool.path("damaged.stream");
        std::fs::write(&file, &damaged).unwrap();
        let error = receive_fails(&pool, "tank/target", &file, &[]);
        assert!(
            error.contains("damaged")
                || error.contains("checksum")
                || error.contains("magic")
                || error.contains("exceeds"),
            "flip at {position}: {error}"
        );
        assert!(error.contains("unchanged"), "{error}");
        intact(&pool);
    }
    // Truncated anywhere.
    for length in [10, bytes.len() / 3, bytes.len() - 1] {
        let file = pool.path("short.stream");
        std::fs::write(&file, &bytes[..length]).unwrap();
        let error = receive_fails(&pool, "tank/target", &file, &[]);
        assert!(
            error.contains("truncated") || error.contains("empty"),
            "cut at {length}: {error}"
        );
        intact(&pool);
    }
    // Not a stream at all.
    let garbage = pool.path("garbage.stream");
    std::fs::write(
        &garbage,
        (0..8192u32)
            .map(|index| (index.wrapping_mul(2654435761) >> 13) as u8)
            .collect::<Vec<u8>>(),
    )
    .unwrap();
    assert!(
        receive_fails(&pool, "tank/target", &garbage, &[]).contains("not an ironpool send stream")
    );
    intact(&pool);
    // An incremental stream from a snapshot the target does not have.
    let later = pool.path("b-c.stream");
    pool.send_to_file(&["send", "-i", "@b", "tank/vol@c"], &later);
    assert!(receive_fails(&pool, "tank/target", &later, &[]).contains("does not have"));
    intact(&pool);
    // A full stream onto an existing volume.
    assert!(receive_fails(&pool, "tank/target", &full, &[]).contains("exists"));
    intact(&pool);
    // A target written since its snapshot needs -F, which rolls it back first.
    tool(
        "qemu-io",
        &[
            "-f",
            "raw",
            &pool.uri("target"),
            "-c",
            "write -P 0x99 5M 1M",
            "-c",
            "flush",
        ],
    );
    assert!(receive_fails(&pool, "tank/target", &incremental, &[]).contains("-F"));
    tool(
        "qemu-io",
        &["-f", "raw", &pool.uri("target"), "-c", "read -P 0x99 5M 1M"],
    );
    receive_ok(&pool, "tank/target", &incremental, &["-F"]);
    compare(&snapshot_uri(&pool, "vol@b"), &pool.uri("target"));
    assert_eq!(
        snapshots_of(&pool, "tank/target"),
        vec!["tank/target@a", "tank/target@b"]
    );
    // The source snapshot of a stream being received cannot be destroyed, and
    // the streams' snapshots stay sendable afterwards.
    pool.stop();
    check(&pool);
}

/// Text-like data (log lines with varying numbers): compresses about 3x with lz4.
fn compressible(bytes: usize, seed: u64) -> Vec<u8> {
    let words = [
        "GET",
        "POST",
        "/api/v1/volumes",
        "/api/v1/pools",
        "200",
        "404",
        "ironpool",
        "latency_us=",
        "bytes=",
        "client=10.0.0.",
    ];
    let mut state = seed | 1;
    let mut out = Vec::with_capacity(bytes);
    while out.len() < bytes {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.extend_from_slice(words[(state % words.len() as u64) as usize].as_bytes());
        out.extend_from_slice(format!("{} ", state % 1000).as_bytes());
        if state.is_multiple_of(7) {
            out.push(b'\n');
        }
    }
    out.truncate(bytes);
    out
}

fn random(bytes: usize, seed: u64) -> Vec<u8> {
    let mut state = seed | 1;
    let mut out = Vec::with_capacity(bytes);
    while out.len() < bytes {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.extend_from_slice(&state.to_le_bytes());
    }
    out.truncate(bytes);
    out
}

fn property(pool: &TestPool, name: &str, property: &str) -> (String, String) {
    let json: serde_json::Value =
        serde_json::from_str(&pool.admin(&["--json", "get", property, name])).expect("get JSON");
    let row = &json["properties"][0];
    (
        row["value"].as_str().unwrap().to_string(),
        row["source"].as_str().unwrap().to_string(),
    )
}

fn ratio(pool: &TestPool, volume: &str) -> f64 {
    property(pool, volume, "compressratio")
        .0
        .trim_end_matches('x')
        .parse()
        .unwrap()
}

#[test]
fn compression_saves_space_on_compressible_data_and_keeps_every_byte() {
    let mut pool = TestPool::new("tank");
    pool.create("1G", &["a.img"]);
    pool.serve();
    for (volume, setting) in [
        ("off", "off"),
        ("lz4", "lz4"),
        ("zstd", "zstd"),
        ("random", "lz4"),
    ] {
        pool.admin(&[
            "volume",
            "create",
            &format!("tank/{volume}"),
            "32M",
            "-o",
            &format!("compression={setting}"),
        ]);
    }
    let text = pool.path("text.raw");
    std::fs::write(&text, compressible(32 << 20, 3)).unwrap();
    let noise = pool.path("noise.raw");
    std::fs::write(&noise, random(32 << 20, 5)).unwrap();
    for (volume, source) in [
        ("off", &text),
        ("lz4", &text),
        ("zstd", &text),
        ("random", &noise),
    ] {
        let uri = pool.uri(volume);
        tool(
            "qemu-img",
            &[
                "convert",
                "-n",
                "-f",
                "raw",
                "-O",
                "raw",
                &source.display().to_string(),
                &uri,
            ],
        );
        compare(&source.display().to_string(), &uri);
    }
    let figures: Vec<(String, f64)> = ["off", "lz4", "zstd", "random"]
        .iter()
        .map(|volume| (volume.to_string(), ratio(&pool, &format!("tank/{volume}"))))
        .collect();
    eprintln!("compressratio: {figures:?}");
    let lookup = |name: &str| figures.iter().find(|(volume, _)| volume == name).unwrap().1;
    assert_eq!(lookup("off"), 1.0);
    assert!(lookup("lz4") >= 1.5, "lz4 on text: {figures:?}");
    assert!(
        lookup("zstd") >= lookup("lz4"),
        "zstd compresses at least as well as lz4: {figures:?}"
    );
    assert!(
        lookup("random") <= 1.01,
        "random data is stored as it is: {figures:?}"
    );
    // What the data takes (a thick volume's `used` also counts what its
    // refreservation holds back).
    let used = |volume: &str| {
        property(&pool, &format!("tank/{volume}"), "usedbydataset")
            .0
            .parse::<u64>()
            .unwrap()
    };
    assert!(
        used("lz4") * 3 < used("off") * 2,
        "lz4 uses less space: {} vs {}",
        used("lz4"),
        used("off")
    );
    // Every byte survives a restart, and a send of a compressed volume carries
    // the data itself (a receiver without compression gets the same bytes).
    pool.stop();
    pool.serve();
    compare(&text.display().to_string(), &pool.uri("zstd"));
    pool.admin(&["snapshot", "tank/lz4@s"]);
    let stream = pool.path("lz4.stream");
    pool.send_to_file(&["send", "tank/lz4@s"], &stream);
    receive_ok(&pool, "tank/plain", &stream, &[]);
    compare(&text.display().to_string(), &pool.uri("plain"));
    assert_eq!(ratio(&pool, "tank/plain"), 1.0);
    pool.stop();
    check(&pool);
}

#[test]
fn properties_inherit_persist_and_take_effect() {
    let mut pool = TestPool::new("tank");
    pool.create("1G", &["mirror", "a.img", "b.img"]);
    pool.serve();
    pool.admin(&[
        "set",
        "compression=zstd",
        "com.example:owner=storage-team",
        "tank",
    ]);
    pool.admin(&["volume", "create", "tank/vol", "64M"]);
    assert_eq!(
        property(&pool, "tank/vol", "compression"),
        ("zstd".into(), "inherited from tank".into())
    );
    assert_eq!(
        property(&pool, "tank/vol", "com.example:owner"),
        ("storage-team".into(), "inherited from tank".into())
    );
    pool.admin(&["set", "compression=lz4", "com.example:owner=db", "tank/vol"]);
    assert_eq!(
        property(&pool, "tank/vol", "compression"),
        ("lz4".into(), "local".into())
    );
    assert_eq!(
        property(&pool, "tank/vol", "checksum"),
        ("xxh3".into(), "default".into())
    );
    pool.admin(&["inherit", "compression", "tank/vol"]);
    assert_eq!(
        property(&pool, "tank/vol", "compression"),
        ("zstd".into(), "inherited from tank".into())
    );

    // Bad assignments are refused, and change nothing (all or none).
    for (assignment, message) in [
        ("volblocksize=8K", "created"),
        ("colour=blue", "unknown property"),
        ("compression=gzip", "compression"),
        ("used=1", "read-only"),
        ("sync=sometimes", "sync"),
    ] {
        let error = pool.fails(&[
            "--control",
            &pool.control().display().to_string(),
            "set",
            "checksum=blake3",
            assignment,
            "tank/vol",
        ]);
        assert!(error.contains(message), "{assignment}: {error}");
    }
    assert_eq!(property(&pool, "tank/vol", "checksum").0, "xxh3");

    // readonly refuses writes at once, and lifts at once.
    let uri = pool.uri("vol");
    tool("qemu-io", &["-f", "raw", &uri, "-c", "write -P 0x10 0 1M"]);
    pool.admin(&["set", "readonly=on", "tank/vol"]);
    let output = Command::new("qemu-io")
        .args(["-f", "raw", &uri, "-c", "write -P 0x20 0 1M"])
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        !output.status.success()
            || text.contains("failed")
            || text.contains("ermission")
            || text.contains("read-only")
            || text.contains("Read-only"),
        "{text}"
    );
    tool(
        "qemu-io",
        &["-r", "-f", "raw", &uri, "-c", "read -P 0x10 0 1M"],
    );
    pool.admin(&["set", "readonly=off", "tank/vol"]);
    tool(
        "qemu-io",
        &[
            "-f",
            "raw",
            &uri,
            "-c",
            "write -P 0x20 0 1M",
            "-c",
            "read -P 0x20 0 1M",
        ],
    );

    // volsize grows (never shrinks), and clients see the new size.
    pool.admin(&["set", "volsize=128M", "tank/vol"]);
    let info: serde_json::Value =
        serde_json::from_str(&tool("nbdinfo", &["--json", &uri])).unwrap();
    assert_eq!(info["exports"][0]["export-size"], 128u64 << 20);
    tool(
        "qemu-io",
        &[
            "-f",
            "raw",
            &uri,
            "-c",
            "write -P 0x30 120M 1M",
            "-c",
            "read -P 0x30 120M 1M",
            "-c",
            "read -P 0x20 0 1M",
        ],
    );
    assert!(pool
        .fails(&[
            "--control",
            &pool.control().display().to_string(),
            "set",
            "volsize=32M",
            "tank/vol"
        ])
        .contains("only grow"));

    // sync=always: a write is durable when acknowledged, without any flush.
    pool.admin(&["set", "sync=always", "tank/vol"]);
    tool("qemu-io", &["-f", "raw", &uri, "-c", "write -P 0x40 8M 2M"]);
    pool.kill9();
    pool.serve();
    tool(
        "qemu-io",
        &[
            "-f",
            "raw",
            &uri,
            "-c",
            "read -P 0x40 8M 2M",
            "-c",
            "read -P 0x30 120M 1M",
        ],
    );
    // Settings survive restarts.
    assert_eq!(
        property(&pool, "tank/vol", "sync"),
        ("always".into(), "local".into())
    );
    assert_eq!(
        property(&pool, "tank/vol", "com.example:owner"),
        ("db".into(), "local".into())
    );
    assert_eq!(
        property(&pool, "tank/vol", "volsize").0,
        (128u64 << 20).to_string()
    );
    assert_eq!(
        property(&pool, "tank", "compression"),
        ("zstd".into(), "local".into())
    );
    pool.stop();
    check(&pool);
}

/// The tags `holds --json` lists for `snapshot`.
fn hold_tags(pool: &TestPool, snapshot: &str) -> Vec<String> {
    let listing: serde_json::Value =
        serde_json::from_str(&pool.admin(&["--json", "holds", snapshot])).expect("holds JSON");
    listing["holds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|hold| {
            assert_eq!(hold["snapshot"], snapshot, "{listing}");
            assert!(hold["created_unix_seconds"].as_u64().unwrap() > 0);
            hold["tag"].as_str().unwrap().to_string()
        })
        .collect()
}

/// User holds keep snapshots from every kind of destroy, persist across a
/// restart, and are placed and released all or nothing; a bookmark of a
/// snapshot sends the next incremental after the snapshot is destroyed, and
/// the receiver ends up with the same bytes.
#[test]
fn holds_keep_snapshots_and_bookmarks_send_after_their_snapshot_is_gone() {
    let mut source = source_pool();
    let full = source.path("full.stream");
    source.send_to_file(&["send", "tank/vol@a"], &full);
    let mut backup = TestPool::new("backup");
    backup.create("1G", &["a.img"]);
    backup.serve();
    receive_ok(&backup, "backup/vol", &full, &[]);

    // A hold stops a destroy of the snapshot, of its dataset, and a
    // rollback past it; nothing changes.
    source.admin(&["hold", "keep", "tank/vol@a"]);
    source.admin(&["hold", "-r", "replica", "tank@b"]);
    assert_eq!(hold_tags(&source, "tank/vol@a"), ["keep"]);
    assert_eq!(hold_tags(&source, "tank/vol@b"), ["replica"]);
    let error = source.admin_fails(&["destroy", "tank/vol@a"]);
    assert!(error.contains("is held (tags: keep)"), "{error}");
    let error = source.admin_fails(&["destroy", "-r", "tank/vol"]);
    assert!(error.contains("is held"), "{error}");
    let error = source.admin_fails(&["rollback", "-r", "tank/vol@a"]);
    assert!(error.contains("tank/vol@b is held"), "{error}");
    assert_eq!(
        snapshots_of(&source, "tank/vol"),
        ["tank/vol@a", "tank/vol@b", "tank/vol@c"]
    );
    let userrefs = source.admin(&["get", "userrefs", "tank/vol@a"]);
    assert!(
        userrefs.contains("userrefs") && userrefs.contains(" 1 "),
        "{userrefs}"
    );

    // All or nothing, with clear errors.
    let error = source.admin_fails(&["hold", "keep", "tank/vol@a"]);
    assert!(
        error.contains("already has a hold tagged 'keep'"),
        "{error}"
    );
    let error = source.admin_fails(&["hold", "more", "tank/vol@c", "tank/vol@nope"]);
    assert!(error.contains("no snapshot 'tank/vol@nope'"), "{error}");
    assert!(hold_tags(&source, "tank/vol@c").is_empty());
    let error = source.admin_fails(&["release", "other", "tank/vol@a"]);
    assert!(error.contains("has no hold tagged 'other'"), "{error}");
    let error = source.admin_fails(&["hold", "", "tank/vol@a"]);
    assert!(error.contains("not a hold tag"), "{error}");

    // Holds are on disk: a restart keeps them.
    source.stop();
    source.serve();
    assert_eq!(hold_tags(&source, "tank/vol@a"), ["keep"]);
    let error = source.admin_fails(&["destroy", "tank/vol@a"]);
    assert!(error.contains("is held"), "{error}");

    // A bookmark of @a outlives it: the incremental to @b is sent from the
    // bookmark and received onto the backup's @a.
    source.admin(&["bookmark", "tank/vol@a", "#a-sent"]);
    source.admin(&["bookmark", "tank/vol#a-sent", "tank/vol#copy"]);
    let error = source.admin_fails(&["bookmark", "tank/vol@a", "tank/vol#copy"]);
    assert!(error.contains("already exists"), "{error}");
    let error = source.admin_fails(&["bookmark", "tank/vol@nope", "#x"]);
    assert!(error.contains("no snapshot"), "{error}");
    source.admin(&["release", "keep", "tank/vol@a"]);
    source.admin(&["release", "-r", "replica", "tank@b"]);
    source.admin(&["destroy", "tank/vol@a"]);
    source.admin(&["destroy", "tank/vol#copy"]);
    let listing: serde_json::Value =
        serde_json::from_str(&source.admin(&["--json", "list", "-t", "bookmark", "tank/vol"]))
            .unwrap();
    let rows = listing["datasets"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{listing}");
    assert_eq!(rows[0]["name"], "tank/vol#a-sent", "{listing}");
    let incremental = source.path("bookmark-b.stream");
    let summary = source.send_to_file(&["send", "-i", "#a-sent", "tank/vol@b"], &incremental);
    assert!(summary.contains("from tank/vol#a-sent"), "{summary}");
    let full_bytes = std::fs::metadata(&full).unwrap().len();
    assert!(std::fs::metadata(&incremental).unwrap().len() < full_bytes / 2);
    receive_ok(&backup, "backup/vol", &incremental, &[]);
    compare(&snapshot_uri(&source, "vol@b"), &backup.uri("vol"));
    assert_eq!(
        snapshots_of(&backup, "backup/vol"),
        ["backup/vol@a", "backup/vol@b"]
    );

    source.stop();
    backup.stop();
    check(&source);
    check(&backup);
}
