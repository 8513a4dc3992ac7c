//! Pools made by older builds import and work with this one: the fixture
//! pools under `tests/fixtures` (see its README), used through the real
//! mount and a real NBD client.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use common::fuse::*;
use common::*;

/// The bytes of `data.bin` in the fixture.
fn fixture_data() -> Vec<u8> {
    (0..200_000u32).map(|i| ((i * 7 + 3) % 251) as u8).collect()
}

/// What the fixture's filesystem holds, checked through the mount.
fn check_fixture_tree(mnt: &Path) {
    for index in 0..5u8 {
        let bytes = std::fs::read(mnt.join(format!("small/f{index}"))).unwrap();
        assert_eq!(
            bytes,
            vec![index; 100 * index as usize + 1],
            "small/f{index}"
        );
    }
    let mut names: Vec<String> = std::fs::read_dir(mnt.join("big"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("file-"))
        .collect();
    names.sort();
    assert_eq!(
        names.len(),
        1500,
        "the old split directory lists every name"
    );
    for index in (0..1500).step_by(37) {
        let bytes = std::fs::read(mnt.join(format!("big/file-{index:05}"))).unwrap();
        assert_eq!(bytes, format!("entry {index}\n").into_bytes());
    }
    assert!(std::fs::read(mnt.join("data.bin")).unwrap() == fixture_data());
    assert_eq!(
        std::fs::read_link(mnt.join("link")).unwrap(),
        Path::new("data.bin")
    );
    assert_eq!(
        get_xattr(&mnt.join("data.bin"), "user.kept").unwrap(),
        b"value"
    );
    assert!(mnt.join("empty").is_dir());
}

/// A pool made by 6093ca7 (directories' root leaves at block 1 in 16 KiB
/// leaves; freed dnodes not zeros) imports and works with this build: what
/// it held reads back, its old directories take and lose names (the small
/// one splits, the split one splits further), new directories are made in
/// the new layout beside them, files are freed, and after a restart
/// everything is there and `check` is clean.
#[test]
fn a_pool_made_by_6093ca7_imports_and_its_old_directories_keep_working() {
    let mut pool = TestPool::new("old");
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pool-6093ca7.tar.xz");
    tool(
        "tar",
        &[
            "-xJf",
            &fixture.display().to_string(),
            "-C",
            &pool.dir.path().display().to_string(),
        ],
    );
    let mnt = pool.path("mnt");
    let _unmount = Unmount(mnt.clone());
    let directory = dir(&pool);
    pool.ok(&["import", "-d", &directory, "old"]);
    pool.ok(&[
        "set",
        &format!("mountpoint={}", mnt.display()),
        "old/fs",
        "-d",
        &directory,
    ]);
    pool.serve();
    wait_mounted(&pool, &mnt);
    check_fixture_tree(&mnt);
    qemu_io(&pool.uri("vol"), &["read -P 0x5a 0 1M"]);

    // The old directories change, and grow past a leaf.
    for index in 5..400 {
        std::fs::write(mnt.join(format!("small/f{index}")), b"new").unwrap();
    }
    for index in 1500..3000 {
        std::fs::write(mnt.join(format!("big/file-{index:05}")), b"new").unwrap();
    }
    for index in (0..1500).step_by(3) {
        std::fs::remove_file(mnt.join(format!("big/file-{index:05}"))).unwrap();
    }
    // New directories beside them, one growing past its first leaf.
    std::fs::create_dir(mnt.join("fresh")).unwrap();
    for index in 0..300 {
        std::fs::write(mnt.join(format!("fresh/n{index}")), b"fresh").unwrap();
    }
    std::fs::create_dir(mnt.join("empty/inside")).unwrap();
    std::fs::rename(mnt.join("small/f1"), mnt.join("fresh/moved")).unwrap();
    let expect_after = |mnt: &Path| {
        assert_eq!(std::fs::read_dir(mnt.join("small")).unwrap().count(), 399);
        assert_eq!(std::fs::read_dir(mnt.join("big")).unwrap().count(), 2500);
        assert_eq!(std::fs::read_dir(mnt.join("fresh")).unwrap().count(), 301);
        assert_eq!(
            std::fs::read(mnt.join("fresh/moved")).unwrap(),
            vec![1u8; 101]
        );
        assert_eq!(std::fs::read(mnt.join("small/f399")).unwrap(), b"new");
        assert!(!mnt.join("big/file-00000").exists());
        assert_eq!(
            std::fs::read(mnt.join("big/file-00001")).unwrap(),
            b"entry 1\n"
        );
        assert!(std::fs::read(mnt.join("data.bin")).unwrap() == fixture_data());
        assert_eq!(std::fs::metadata(mnt.join("empty")).unwrap().nlink(), 3);
    };
    expect_after(&mnt);
    pool.stop();
    pool.serve();
    wait_mounted(&pool, &mnt);
    expect_after(&mnt);
    qemu_io(&pool.uri("vol"), &["read -P 0x5a 0 1M"]);
    stop_and_check(&mut pool);
}

/// Send streams written by 6093ca7 (stream version 1, its directory
/// layout) are received by this build, which writes version 2 streams: the
/// received filesystem and volume hold what was sent, take changes, and
/// are sent on again (version 2) and received as a second copy.
#[test]
fn streams_sent_by_6093ca7_are_received_and_sent_on() {
    let mut pool = TestPool::new("recv");
    let mnt = pool.path("mnt");
    let copy = pool.path("copy");
    let _unmount = (Unmount(mnt.clone()), Unmount(copy.clone()));
    pool.create("256M", &["mirror", "a.img", "b.img"]);
    pool.serve();
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let unpacked = |name: &str| {
        let target = pool.path(name);
        let script = format!(
            "xz -dc {} > {}",
            fixtures.join(format!("stream-6093ca7-{name}.xz")).display(),
            target.display()
        );
        tool("sh", &["-c", &script]);
        target
    };
    let mountpoint = format!("mountpoint={}", mnt.display());
    receive_ok(&pool, "recv/fs", &unpacked("fs"), &["-o", &mountpoint]);
    receive_ok(&pool, "recv/vol", &unpacked("vol"), &[]);
    wait_mounted(&pool, &mnt);
    check_fixture_tree(&mnt);
    qemu_io(&pool.uri("vol"), &["read -P 0x5a 0 1M"]);
    // Changed here, then sent with this build's stream version.
    std::fs::create_dir(mnt.join("added")).unwrap();
    std::fs::write(mnt.join("added/file"), b"added here").unwrap();
    for index in 0..200 {
        std::fs::write(mnt.join(format!("small/more{index}")), b"m").unwrap();
    }
    pool.admin(&["snapshot", "recv/fs@here"]);
    let stream = pool.path("here.stream");
    pool.send_to_file(&["send", "recv/fs@here"], &stream);
    let mountpoint = format!("mountpoint={}", copy.display());
    receive_ok(&pool, "recv/copy", &stream, &["-o", &mountpoint]);
    wait_mounted(&pool, &copy);
    check_fixture_tree(&copy);
    assert_eq!(
        std::fs::read(copy.join("added/file")).unwrap(),
        b"added here"
    );
    assert_eq!(std::fs::read_dir(copy.join("small")).unwrap().count(), 205);
    stop_and_check(&mut pool);
}
