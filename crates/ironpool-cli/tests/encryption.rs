//! Encrypted volumes through the real binary and real NBD clients (issue
//! 73): the devices hold no plaintext, a served volume is exported only
//! while its key is loaded, a wrong key is refused, `change-key` rewraps,
//! `serve --load-keys` starts unattended, scrub needs no key, and a raw
//! send (`send -w`) is received still sealed. Encrypted filesystems through
//! the kernel's FUSE: no file's bytes, name, link target or extended
//! attribute on the devices in the clear, mounted only while the key is
//! loaded, what `fsync` made durable kept across a kill -9, and a raw send
//! received sealed and mounted once the key is loaded.

mod common;

use std::io::Write;
use std::process::Stdio;

use common::fuse::{get_xattr, set_xattr, wait_mounted, wait_unmounted, Unmount};
use common::{assert_check_clean, receive_ok, tool, tool_fails, TestPool};

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
    pattern_on_devices(pool, devices, MARKER)
}

/// How many times `pattern` is on the pool's device files.
fn pattern_on_devices(pool: &TestPool, devices: &[&str], pattern: &[u8]) -> usize {
    devices
        .iter()
        .map(|device| {
            let bytes = std::fs::read(pool.path(device)).unwrap();
            bytes
                .windows(pattern.len())
                .filter(|window| *window == pattern)
                .count()
        })
        .sum()
}

/// The owner and group [`write_secrets`] gives a file: values no other
/// bytes hold, so that their attributes in the clear (a znode holds the
/// user then the group, each 4 bytes little-endian) are found on a device.
const SECRET_UID: u32 = 0x7a3c_915e;
const SECRET_GID: u32 = 0x5e91_c37a;

/// The bytes of [`SECRET_UID`] and [`SECRET_GID`] as a znode holds them.
fn secret_owners() -> Vec<u8> {
    SECRET_UID
        .to_le_bytes()
        .into_iter()
        .chain(SECRET_GID.to_le_bytes())
        .collect()
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
/// Gives `dataset`'s encryption root a new raw key of 32 `byte`s, kept in
/// a file that `keylocation` names: the file's path.
fn change_to_raw_key(pool: &TestPool, dataset: &str, byte: u8) -> std::path::PathBuf {
    let raw = pool.path("raw.key");
    std::fs::write(&raw, [byte; 32]).unwrap();
    pool.admin(&[
        "change-key",
        "-o",
        "keyformat=raw",
        "-o",
        &format!("keylocation=file://{}", raw.display()),
        dataset,
    ]);
    raw
}

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
    let raw = change_to_raw_key(&pool, "tank/secret", 0x5a);
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
    receive_ok(&pool, "tank/copy", &stream, &[]);
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
    assert_eq!(
        pattern_on_devices(&pool, &["raw-stream"], &secret_owners()),
        0,
        "a raw stream holds a file's owner in the clear"
    );
    let keylocation = format!("keylocation=file://{}", raw.display());
    receive_ok(&pool, "tank/rawcopy", &raw_stream, &["-o", &keylocation]);
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
    receive_ok(&pool, "tank/rawtree", &package, &[]);
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

    // An encrypted filesystem needs its key's format, as a volume does.
    let refused = pool.admin_fails(&["fs", "create", "tank/fs", "-o", "encryption=on"]);
    assert!(refused.contains("keyformat"), "{refused}");
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

/// Writes into an encrypted filesystem what a user would keep secret (a
/// large file, a small one, a name, a link's target, an extended
/// attribute), each holding the marker, and `fsync`s them.
fn write_secrets(root: &std::path::Path, pattern: &std::path::Path) {
    let name = String::from_utf8_lossy(MARKER).into_owned();
    std::fs::copy(pattern, root.join("big")).unwrap();
    let dir = root.join(format!("{name}dir"));
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join(format!("{name}file")), MARKER.repeat(3)).unwrap();
    std::os::unix::fs::chown(
        dir.join(format!("{name}file")),
        Some(SECRET_UID),
        Some(SECRET_GID),
    )
    .unwrap();
    std::os::unix::fs::symlink(format!("/{name}target"), root.join("link")).unwrap();
    set_xattr(&root.join("big"), "user.note", &MARKER.repeat(2), 0).unwrap();
    for path in [root.join("big"), dir.join(format!("{name}file"))] {
        std::fs::File::open(path).unwrap().sync_all().unwrap();
    }
    std::fs::File::open(&dir).unwrap().sync_all().unwrap();
}

/// Reads back what [`write_secrets`] wrote.
fn assert_secrets(root: &std::path::Path, pattern: &std::path::Path) {
    let name = String::from_utf8_lossy(MARKER).into_owned();
    assert!(std::fs::read(root.join("big")).unwrap() == std::fs::read(pattern).unwrap());
    let file = root.join(format!("{name}dir/{name}file"));
    assert_eq!(std::fs::read(&file).unwrap(), MARKER.repeat(3));
    let meta = std::fs::metadata(&file).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!((meta.uid(), meta.gid()), (SECRET_UID, SECRET_GID));
    assert_eq!(
        std::fs::read_link(root.join("link")).unwrap(),
        std::path::PathBuf::from(format!("/{name}target"))
    );
    assert_eq!(
        get_xattr(&root.join("big"), "user.note").unwrap(),
        MARKER.repeat(2)
    );
}

#[test]
fn encrypted_filesystems_keep_no_plaintext_and_mount_only_with_their_key() {
    let mut pool = TestPool::new("tank");
    pool.create("512M", &["mirror", "a.img", "b.img"]);
    pool.serve();
    let pattern = marker_file(&pool);
    let passphrase = pool.path("passphrase");
    std::fs::write(&passphrase, "correct horse battery staple\n").unwrap();
    let location = format!("file://{}", passphrase.display());
    let vault = pool.path("vault");
    let _unmount = Unmount(vault.clone());
    pool.admin(&[
        "fs",
        "create",
        "tank/vault",
        "-o",
        "encryption=on",
        "-o",
        "keyformat=passphrase",
        "-o",
        &format!("keylocation={location}"),
        "-o",
        "pbkdf2iters=100000",
        "-o",
        &format!("mountpoint={}", vault.display()),
    ]);
    wait_mounted(&pool, &vault);
    assert_eq!(pool.property("tank/vault", "encryption").0, "aes-256-gcm");
    assert_eq!(pool.property("tank/vault", "keystatus").0, "available");
    assert_eq!(
        pool.property("tank/vault", "encryptionroot").0,
        "tank/vault"
    );
    write_secrets(&vault, &pattern);

    // A write made durable by fsync after the last txg survives a kill -9:
    // the log of an encrypted filesystem carries its block pointers.
    pool.admin(&["sync", "tank"]);
    let late = distinct_late_bytes();
    {
        use std::io::{Seek, SeekFrom};
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .open(vault.join("big"))
            .unwrap();
        file.seek(SeekFrom::Start(1 << 20)).unwrap();
        file.write_all(&late).unwrap();
        file.sync_all().unwrap();
    }
    // So does a file created after it, its name (the marker: looked for on
    // the devices below) made durable by an fsync of the directory: the log
    // carries names sealed.
    let fresh = vault.join(format!("{}fresh", String::from_utf8_lossy(MARKER)));
    std::fs::write(&fresh, b"made durable by the log").unwrap();
    std::fs::File::open(&fresh).unwrap().sync_all().unwrap();
    std::fs::File::open(&vault).unwrap().sync_all().unwrap();
    pool.kill9();
    // Served without the key, the import claims the log and applies
    // nothing of it; `load-key` replays it, then the server mounts it.
    pool.serve();
    let status = pool.admin(&["status", "tank"]);
    assert!(
        status.contains("intent log: claimed"),
        "the log not claimed: {status}"
    );
    let refused = pool.admin_fails(&["snapshot", "tank/vault@claimed"]);
    assert!(refused.contains("load its key"), "{refused}");
    pool.admin(&["load-key", "tank/vault"]);
    wait_mounted(&pool, &vault);
    assert_eq!(
        std::fs::read(&fresh).unwrap(),
        b"made durable by the log",
        "the file created and fsynced before the kill"
    );
    std::fs::remove_file(&fresh).unwrap();
    let big = std::fs::read(vault.join("big")).unwrap();
    assert!(
        big[1 << 20..(1 << 20) + late.len()] == late[..],
        "the fsynced write is lost"
    );
    // The rest as first written.
    {
        use std::io::{Seek, SeekFrom};
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .open(vault.join("big"))
            .unwrap();
        file.seek(SeekFrom::Start(1 << 20)).unwrap();
        let original = std::fs::read(&pattern).unwrap();
        file.write_all(&original[1 << 20..(1 << 20) + late.len()])
            .unwrap();
        file.sync_all().unwrap();
    }
    assert_secrets(&vault, &pattern);
    // A child takes its parent's key (its encryption root is the parent),
    // and so does a volume under it; an unencrypted child is refused.
    pool.admin(&["fs", "create", "tank/vault/child"]);
    let child = vault.join("child");
    wait_mounted(&pool, &child);
    assert_eq!(
        pool.property("tank/vault/child", "encryption").0,
        "aes-256-gcm"
    );
    assert_eq!(
        pool.property("tank/vault/child", "encryptionroot").0,
        "tank/vault"
    );
    let name = String::from_utf8_lossy(MARKER).into_owned();
    std::fs::write(child.join(format!("{name}child")), MARKER.repeat(5)).unwrap();
    pool.admin(&["volume", "create", "tank/vault/vol", "16M"]);
    assert_eq!(
        pool.property("tank/vault/vol", "encryptionroot").0,
        "tank/vault"
    );
    let refused = pool.admin_fails(&["fs", "create", "-o", "encryption=off", "tank/vault/open"]);
    assert!(refused.contains("encryption=off"), "{refused}");
    let refused = pool.admin_fails(&[
        "volume",
        "create",
        "-o",
        "encryption=off",
        "tank/vault/openvol",
        "16M",
    ]);
    assert!(
        refused.contains("encryption=off") && refused.contains("is encrypted"),
        "{refused}"
    );
    pool.stop();
    assert_eq!(
        markers_on_devices(&pool, &["a.img", "b.img"]),
        0,
        "an encrypted filesystem's bytes, names or attributes are on the devices in the clear"
    );
    assert_eq!(
        pattern_on_devices(&pool, &["a.img", "b.img"], &secret_owners()),
        0,
        "an encrypted filesystem's file owner is on the devices in the clear"
    );

    // Restarted without its key: not mounted, and `mount` says why.
    pool.serve();
    assert_eq!(pool.property("tank/vault", "keystatus").0, "unavailable");
    assert!(!common::fuse::mounted(&vault));
    let refused = pool.admin_fails(&["mount", "tank/vault"]);
    assert!(refused.contains("load its key"), "{refused}");
    // Scrub and check need no key: the checksums cover the ciphertext.
    let scrub = pool.admin(&["--json", "scrub", "-w", "tank"]);
    let scrub: serde_json::Value = serde_json::from_str(scrub.lines().last().unwrap()).unwrap();
    assert_eq!(scrub["errors"], 0, "{scrub}");
    assert_check_clean(&pool);
    // Sending needs the key, or sends the blocks as stored (raw, -w):
    // received so, the copy is sealed under the same key, and not mounted
    // while the key is not loaded.
    pool.admin(&["snapshot", "tank/vault@s"]);
    let stream = pool.path("stream");
    let refused = pool.admin_fails(&["send", "tank/vault@s"]);
    assert!(refused.contains("load its key"), "{refused}");
    let raw_stream = pool.path("raw-stream");
    pool.send_to_file(&["send", "-w", "tank/vault@s"], &raw_stream);
    assert_eq!(
        markers_on_devices(&pool, &["raw-stream"]),
        0,
        "a raw stream holds plaintext"
    );
    let raw_copy = pool.path("rawcopy");
    let _unmount_raw_copy = Unmount(raw_copy.clone());
    receive_ok(
        &pool,
        "tank/rawcopy",
        &raw_stream,
        &[
            "-o",
            &format!("mountpoint={}", raw_copy.display()),
            "-o",
            &format!("keylocation={location}"),
        ],
    );
    assert_eq!(pool.property("tank/rawcopy", "keystatus").0, "unavailable");
    assert_eq!(
        pool.property("tank/rawcopy", "encryptionroot").0,
        "tank/rawcopy"
    );
    assert!(!common::fuse::mounted(&raw_copy));
    // So does a replication package (-R -w), keyless too.
    let raw_package = pool.path("raw-package");
    pool.send_to_file(&["send", "-R", "-w", "tank/vault@s"], &raw_package);
    assert_eq!(markers_on_devices(&pool, &["raw-package"]), 0);
    let raw_tree = pool.path("rawtree");
    let _unmount_raw_tree = Unmount(raw_tree.clone());
    receive_ok(
        &pool,
        "tank/rawtree",
        &raw_package,
        &["-o", &format!("mountpoint={}", raw_tree.display())],
    );
    assert_eq!(pool.property("tank/rawtree", "keystatus").0, "unavailable");
    let wrong = with_stdin(
        &pool,
        &["load-key", "-L", "prompt", "tank/vault"],
        b"not the passphrase\n",
    );
    assert!(!wrong.status.success());
    assert!(!common::fuse::mounted(&vault));
    // The key loaded, the server mounts it, its child, and its raw copy
    // (which holds the same master key).
    pool.admin(&["load-key", "tank/vault"]);
    wait_mounted(&pool, &vault);
    wait_mounted(&pool, &child);
    assert_secrets(&vault, &pattern);
    for copy in [&raw_copy, &raw_tree] {
        wait_mounted(&pool, copy);
        assert_secrets(copy, &pattern);
    }
    for copy in ["tank/rawcopy", "tank/rawtree"] {
        pool.admin(&["unmount", copy]);
    }
    wait_unmounted(&raw_copy, "unmount of tank/rawcopy");
    wait_unmounted(&raw_tree, "unmount of tank/rawtree");
    assert_eq!(
        std::fs::read(child.join(format!("{name}child"))).unwrap(),
        MARKER.repeat(5)
    );
    // Its snapshot reads through the same key.
    assert_eq!(
        std::fs::read(vault.join(format!(".zfs/snapshot/s/{name}dir/{name}file"))).unwrap(),
        MARKER.repeat(3)
    );
    // Sent with the key as plaintext, received as a filesystem that is not
    // encrypted.
    pool.send_to_file(&["send", "tank/vault@s"], &stream);
    let copy = pool.path("copy");
    let _unmount_copy = Unmount(copy.clone());
    receive_ok(
        &pool,
        "tank/copy",
        &stream,
        &["-o", &format!("mountpoint={}", copy.display())],
    );
    assert_eq!(pool.property("tank/copy", "encryption").0, "off");
    wait_mounted(&pool, &copy);
    assert_secrets(&copy, &pattern);
    // A clone of the snapshot shares the key; its directories, read after
    // the send left them opened in the read cache, read right.
    pool.admin(&["clone", "tank/vault@s", "tank/vault/c"]);
    let clone = vault.join("c");
    wait_mounted(&pool, &clone);
    assert_eq!(
        pool.property("tank/vault/c", "encryptionroot").0,
        "tank/vault"
    );
    assert_secrets(&clone, &pattern);
    pool.admin(&["unmount", "tank/vault/c"]);
    wait_unmounted(&clone, "unmount of tank/vault/c");
    // Keys stay where they fit: a dataset that shares its parent's key
    // does not move out from under it, nor an unencrypted one in.
    let refused = pool.admin_fails(&["rename", "tank/vault/c", "tank/c"]);
    assert!(refused.contains("shares the key"), "{refused}");
    let refused = pool.admin_fails(&["rename", "tank/copy", "tank/vault/copy"]);
    assert!(refused.contains("unencrypted"), "{refused}");

    // A new key, given through the child, rewraps the root's: the old
    // passphrase opens nothing, the new raw key everything.
    change_to_raw_key(&pool, "tank/vault/child", 0x6b);
    assert_eq!(pool.property("tank/vault", "keyformat").0, "raw");

    // A mounted filesystem keeps its key (its child's mount too);
    // unmounted, the key goes.
    let refused = pool.admin_fails(&["unload-key", "tank/vault"]);
    assert!(refused.contains("unmount it first"), "{refused}");
    pool.admin(&["unmount", "tank/vault/child"]);
    wait_unmounted(&child, "unmount of tank/vault/child");
    let refused = pool.admin_fails(&["unload-key", "tank/vault/child"]);
    assert!(refused.contains("unmount it first"), "{refused}");
    pool.admin(&["unmount", "tank/vault"]);
    wait_unmounted(&vault, "unmount of tank/vault");
    pool.admin(&["unload-key", "tank/vault"]);
    for dataset in ["tank/vault", "tank/vault/child", "tank/vault/vol"] {
        assert_eq!(
            pool.property(dataset, "keystatus").0,
            "unavailable",
            "{dataset}"
        );
    }
    let old = pool.admin_fails(&["load-key", "-L", &location, "tank/vault"]);
    assert!(old.contains("raw key is exactly 32 bytes"), "{old}");
    pool.admin(&["load-key", "tank/vault"]);
    pool.admin(&["mount", "tank/vault"]);
    wait_mounted(&pool, &vault);
    assert_secrets(&vault, &pattern);
    pool.stop();

    // The check looks where plaintext would be: the plaintext copy's
    // bytes, names and owners are found.
    assert!(markers_on_devices(&pool, &["a.img"]) >= WRITTEN_BYTES / MARKER.len());
    assert!(pattern_on_devices(&pool, &["a.img"], &secret_owners()) > 0);
}

/// Bytes the kill -9 test writes over `big`: no marker in them.
fn distinct_late_bytes() -> Vec<u8> {
    (0..64 << 10).map(|index| (index % 251) as u8).collect()
}
