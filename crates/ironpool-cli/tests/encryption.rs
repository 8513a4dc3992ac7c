//! Encrypted volumes through the real binary and real NBD clients (issue
//! 73): the devices hold no plaintext, a served volume is exported only
//! while its key is loaded, a wrong key is refused, `change-key` rewraps,
//! `serve --load-keys` starts unattended, scrub needs no key, and a raw
//! send (`send -w`) is received still sealed.

mod common;

use std::io::Write;
use std::process::Stdio;

use common::{tool, tool_fails, TestPool};

/// What the test writes, over and over: found on a device only in the clear.
const MARKER: &[u8] = b"IRONPOOL-SECRET-";
/// Bytes written: 4 MiB of the marker.
const WRITTEN_BYTES: usize = 4 << 20;

fn marker_file(pool: &TestPool) -> std::path::PathBuf {
    let path = pool.path("pattern");
    std::fs::write(&path, MARKER.repeat(WRITTEN_BYTES / MARKER.len())).unwrap();
    path
}

/// How many times the marker is on the pool's device files.
fn markers_on_devices(pool: &TestPool, devices: &[&str]) -> usize {
    devices
        .iter()
        .map(|device| {
            let bytes = std::fs::read(pool.path(device)).unwrap();
            bytes
                .windows(MARKER.len())
                .step_by(1)
                .filter(|window| *window == MARKER)
                .count()
        })
        .sum()
}

/// The first `WRITTEN_BYTES` of an export, read by nbdcopy.
fn read_back(pool: &TestPool, volume: &str) -> Vec<u8> {
    let out = pool.path("read-back");
    tool("nbdcopy", &[&pool.uri(volume), &out.display().to_string()]);
    let mut bytes = std::fs::read(&out).unwrap();
    bytes.truncate(WRITTEN_BYTES);
    bytes
}

fn exports(pool: &TestPool) -> String {
    let uri = format!("nbd+unix:///?socket={}", pool.socket().display());
    tool("nbdinfo", &["--list", &uri])
}

/// `ironpool ARGS` against the server with `input` on standard input.
fn with_stdin(pool: &TestPool, args: &[&str], input: &[u8]) -> std::process::Output {
    let control = pool.control().display().to_string();
    let mut child = pool
        .command()
        .args(["--control", &control])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn encrypted_volumes_keep_no_plaintext_and_open_only_with_their_key() {
    let mut pool = TestPool::new("tank");
    pool.create("512M", &["mirror", "a.img", "b.img"]);
    pool.serve();
    let pattern = marker_file(&pool);
    let passphrase = pool.path("passphrase");
    std::fs::write(&passphrase, "correct horse battery staple\n").unwrap();
    let location = format!("file://{}", passphrase.display());
    pool.admin(&[
        "volume",
        "create",
        "tank/secret",
        "64M",
        "-o",
        "encryption=on",
        "-o",
        "keyformat=passphrase",
        "-o",
        &format!("keylocation={location}"),
        "-o",
        "pbkdf2iters=100000",
    ]);
    assert_eq!(pool.property("tank/secret", "encryption").0, "aes-256-gcm");
    assert_eq!(pool.property("tank/secret", "keystatus").0, "available");
    // A key typed at the prompt (here: given on standard input).
    let typed = with_stdin(
        &pool,
        &[
            "volume",
            "create",
            "tank/typed",
            "16M",
            "-o",
            "encryption=aes-128-gcm",
            "-o",
            "keyformat=passphrase",
        ],
        b"another long passphrase\n",
    );
    assert!(
        typed.status.success(),
        "{}",
        String::from_utf8_lossy(&typed.stderr)
    );
    assert_eq!(pool.property("tank/typed", "keylocation").0, "prompt");

    tool(
        "nbdcopy",
        &[&pattern.display().to_string(), &pool.uri("secret")],
    );
    pool.admin(&["sync", "tank"]);
    assert_eq!(read_back(&pool, "secret"), std::fs::read(&pattern).unwrap());
    assert_eq!(
        markers_on_devices(&pool, &["a.img", "b.img"]),
        0,
        "an encrypted volume's data is on the devices in the clear"
    );

    // Restarted: nothing encrypted is served until its key is loaded.
    pool.stop();
    pool.serve();
    assert!(
        !exports(&pool).contains("tank/secret"),
        "{}",
        exports(&pool)
    );
    assert_eq!(pool.property("tank/secret", "keystatus").0, "unavailable");
    tool_fails("nbdinfo", &[&pool.uri("secret")]);
    let wrong = with_stdin(
        &pool,
        &["load-key", "-L", "prompt", "tank/secret"],
        b"not the passphrase\n",
    );
    assert!(!wrong.status.success());
    assert!(
        String::from_utf8_lossy(&wrong.stderr).contains("wrong key"),
        "{}",
        String::from_utf8_lossy(&wrong.stderr)
    );
    assert_eq!(pool.property("tank/secret", "keystatus").0, "unavailable");
    pool.admin(&["load-key", "tank/secret"]);
    assert!(exports(&pool).contains("tank/secret"));
    assert_eq!(read_back(&pool, "secret"), std::fs::read(&pattern).unwrap());

    // A new raw key: the data stays, the passphrase opens nothing.
    let raw = pool.path("raw.key");
    std::fs::write(&raw, [0x5au8; 32]).unwrap();
    pool.admin(&[
        "change-key",
        "-o",
        "keyformat=raw",
        "-o",
        &format!("keylocation=file://{}", raw.display()),
        "tank/secret",
    ]);
    pool.admin(&["unload-key", "tank/secret"]);
    assert!(!exports(&pool).contains("tank/secret"));
    let old = pool.admin_fails(&["load-key", "-L", &location, "tank/secret"]);
    assert!(old.contains("raw key is exactly 32 bytes"), "{old}");

    // Scrub with the key unloaded verifies every copy.
    let scrub = pool.admin(&["--json", "scrub", "-w", "tank"]);
    let scrub: serde_json::Value = serde_json::from_str(scrub.lines().last().unwrap()).unwrap();
    assert_eq!(scrub["errors"], 0, "{scrub}");
    assert!(
        scrub["examined_bytes"].as_u64().unwrap_or(0) >= WRITTEN_BYTES as u64,
        "{scrub}"
    );

    // An unattended start loads keys kept in files; the one at a prompt waits.
    pool.stop();
    pool.serve_with(&["--load-keys"]);
    assert!(exports(&pool).contains("tank/secret"), "{}", pool.log());
    assert!(!exports(&pool).contains("tank/typed"));
    assert_eq!(read_back(&pool, "secret"), std::fs::read(&pattern).unwrap());

    // Sent (as plaintext, read through the cache that now holds it opened)
    // and received as a volume that is not encrypted.
    pool.admin(&["snapshot", "tank/secret@s"]);
    let stream = pool.path("stream");
    pool.send_to_file(&["send", "tank/secret@s"], &stream);
    let received = pool.receive_from_file(&["receive", "tank/copy"], &stream);
    assert!(
        received.status.success(),
        "{}",
        String::from_utf8_lossy(&received.stderr)
    );
    assert_eq!(pool.property("tank/copy", "encryption").0, "off");
    assert_eq!(read_back(&pool, "copy"), std::fs::read(&pattern).unwrap());

    // Sent raw, with the key unloaded (a raw send needs none), and received
    // still sealed: not served until the same key, found where `receive
    // -o keylocation` says, opens it.
    pool.admin(&["unload-key", "tank/secret"]);
    let raw_stream = pool.path("raw-stream");
    pool.send_to_file(&["send", "-w", "tank/secret@s"], &raw_stream);
    assert_eq!(
        markers_on_devices(&pool, &["raw-stream"]),
        0,
        "a raw stream holds plaintext"
    );
    let keylocation = format!("keylocation=file://{}", raw.display());
    let received = pool.receive_from_file(
        &["receive", "-o", &keylocation, "tank/rawcopy"],
        &raw_stream,
    );
    assert!(
        received.status.success(),
        "{}",
        String::from_utf8_lossy(&received.stderr)
    );
    assert_eq!(pool.property("tank/rawcopy", "encryption").0, "aes-256-gcm");
    assert_eq!(pool.property("tank/rawcopy", "keyformat").0, "raw");
    assert_eq!(pool.property("tank/rawcopy", "keystatus").0, "unavailable");
    assert!(!exports(&pool).contains("tank/rawcopy"));
    pool.admin(&["load-key", "tank/rawcopy"]);
    assert_eq!(
        read_back(&pool, "rawcopy"),
        std::fs::read(&pattern).unwrap()
    );

    // A replication package sends raw too (-R -w).
    let package = pool.path("raw-package");
    pool.send_to_file(&["send", "-R", "-w", "tank/secret@s"], &package);
    assert_eq!(markers_on_devices(&pool, &["raw-package"]), 0);
    let received = pool.receive_from_file(&["receive", "tank/rawtree"], &package);
    assert!(
        received.status.success(),
        "{}",
        String::from_utf8_lossy(&received.stderr)
    );
    assert_eq!(pool.property("tank/rawtree", "keystatus").0, "available");
    assert_eq!(
        read_back(&pool, "rawtree"),
        std::fs::read(&pattern).unwrap()
    );

    // encryptionroot: a clone (and a clone of it) shares its origin's key,
    // so its root is the volume the chain began with; a raw copy is its
    // own root, and a plain volume has none.
    pool.admin(&["clone", "tank/secret@s", "tank/child"]);
    pool.admin(&["snapshot", "tank/child@c"]);
    pool.admin(&["clone", "tank/child@c", "tank/grandchild"]);
    for (volume, root) in [
        ("tank/secret", "tank/secret"),
        ("tank/child", "tank/secret"),
        ("tank/grandchild", "tank/secret"),
        ("tank/child@c", "tank/secret"),
        ("tank/rawcopy", "tank/rawcopy"),
    ] {
        assert_eq!(pool.property(volume, "encryptionroot").0, root, "{volume}");
    }
    pool.admin(&["volume", "create", "tank/unsealed", "16M"]);
    assert_eq!(pool.property("tank/unsealed", "encryptionroot").0, "-");
    let refused = pool.admin_fails(&["set", "encryptionroot=tank/unsealed", "tank/child"]);
    assert!(refused.contains("read-only"), "{refused}");
    // Unloading the key through the grandchild closes the whole chain.
    pool.admin(&["unload-key", "tank/grandchild"]);
    for volume in ["tank/secret", "tank/child", "tank/grandchild"] {
        assert_eq!(
            pool.property(volume, "keystatus").0,
            "unavailable",
            "{volume}"
        );
    }
    pool.admin(&["load-key", "tank/secret"]);
    assert_eq!(pool.property("tank/grandchild", "keystatus").0, "available");

    // `set keylocation=` moves where every volume sharing the key finds it,
    // with no key needed; a bad location or a plain volume is refused.
    let before = pool.property("tank/secret", "keylocation").0;
    assert!(before.starts_with("file:///"), "{before}");
    pool.admin(&["set", "keylocation=prompt", "tank/grandchild"]);
    for volume in ["tank/secret", "tank/child", "tank/grandchild"] {
        assert_eq!(pool.property(volume, "keylocation").0, "prompt", "{volume}");
    }
    for (assignment, volume, reason) in [
        ("keylocation=file://relative", "tank/secret", "ABSOLUTE"),
        (
            "keylocation=https://example.com/key",
            "tank/secret",
            "ABSOLUTE",
        ),
        ("keylocation=prompt", "tank/unsealed", "encrypted volumes"),
    ] {
        let refused = pool.admin_fails(&["set", assignment, volume]);
        assert!(refused.contains(reason), "{assignment} {volume}: {refused}");
    }
    pool.admin(&["set", &format!("keylocation={before}"), "tank/secret"]);
    assert_eq!(pool.property("tank/child", "keylocation").0, before);
    pool.admin(&["unload-key", "tank/secret"]);
    pool.admin(&["load-key", "tank/child"]);
    assert_eq!(pool.property("tank/secret", "keystatus").0, "available");

    // Filesystems are not encrypted yet, and say so.
    let refused = pool.admin_fails(&["fs", "create", "tank/fs", "-o", "encryption=on"]);
    assert!(
        refused.contains("filesystems are not encrypted yet"),
        "{refused}"
    );
    pool.stop();

    // The check looks where plaintext would be: the same writes to a
    // volume that is not encrypted are found.
    pool.serve();
    pool.admin(&["volume", "create", "tank/plain", "64M"]);
    tool(
        "nbdcopy",
        &[&pattern.display().to_string(), &pool.uri("plain")],
    );
    pool.admin(&["sync", "tank"]);
    assert!(markers_on_devices(&pool, &["a.img"]) >= WRITTEN_BYTES / MARKER.len());
    pool.stop();
}
