//! send | receive of filesystems through the real binary and real FUSE
//! mounts: a varied tree (nested directories, a directory of thousands of
//! entries whose hash leaves split, a 3 MiB file of random bytes, a sparse
//! file, symlinks, hard links, a FIFO, extended attributes, owners, modes
//! with setuid and sticky bits, set modification times) sent full into the
//! same pool and through a pipe into a second pool, incrementally after
//! deletions, renames across directories, truncation, growth, overwrites
//! and a directory losing most of its entries; a stream cut short kept
//! with `-s` and resumed with its token, or discarded with `-A`; a target
//! written since its snapshot refused without `-F`; and damaged streams
//! that change nothing. Trees are compared entry by entry (type, mode,
//! owner, links, size, contents, targets, extended attributes, and the
//! modification times of files) between the source's snapshots under
//! `.zfs/snapshot` and the received filesystems, heads and snapshots.

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant, SystemTime};

use common::fuse::*;
use common::*;

/// Detaches the test's mounts when the test ends, passed or not (a mount
/// left by a dead server answers ENOTCONN), then removes the directories
/// the server made for mounts outside the test's directories (a received
/// filesystem first mounts at its default, `/POOL/NAME`).
#[derive(Default)]
struct Cleanup {
    mounts: Vec<PathBuf>,
    dirs: Vec<PathBuf>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for path in self.mounts.iter().rev() {
            // Mounts may be stacked on one path: detach them all.
            for _ in 0..4 {
                if !mounted(path) {
                    break;
                }
                let target = std::ffi::CString::new(path.display().to_string()).unwrap();
                // SAFETY: a NUL-terminated path; umount2 reads it only.
                unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
            }
        }
        for dir in &self.dirs {
            // Only if empty: nothing but the server's mountpoint goes.
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// A pool of two mirrored files with filesystem `src` mounted at
/// `POOLDIR/src-mnt`, served.
fn source_pool(name: &str) -> (TestPool, PathBuf) {
    assert!(
        Path::new("/dev/fuse").exists(),
        "these tests need /dev/fuse (the FUSE module) and root"
    );
    let mut pool = TestPool::new(name);
    pool.create("2G", &["mirror", "a.img", "b.img"]);
    let mnt = pool.path("src-mnt");
    pool.ok(&[
        "fs",
        "create",
        &format!("{name}/src"),
        "-o",
        &format!("mountpoint={}", mnt.display()),
        "-d",
        &dir(&pool),
    ]);
    pool.serve();
    (pool, mnt)
}

/// `get`'s value of property `name` of `target`.
fn property(pool: &TestPool, target: &str, name: &str) -> String {
    let text = pool.admin(&["--json", "get", name, target]);
    let rows: serde_json::Value = serde_json::from_str(&text).expect("get JSON");
    rows["properties"]
        .as_array()
        .and_then(|rows| rows.iter().find(|row| row["property"] == name))
        .and_then(|row| row["value"].as_str())
        .unwrap_or_else(|| panic!("no {name} in {text}"))
        .to_string()
}

/// Mounts received filesystem `target` at `mountpoint` with `atime=off`
/// (reading the copy must not count as writing to it, or the next
/// incremental receive would want `-F`), and waits for the mount. The
/// mount the server made at the filesystem's default mountpoint is
/// detached and its directory removed at the end of the test.
fn mount_received(
    pool: &TestPool,
    target: &str,
    mountpoint: &Path,
    cleanup: &mut Cleanup,
) -> PathBuf {
    let first = PathBuf::from(property(pool, target, "mountpoint"));
    if first.is_absolute() && !first.starts_with(pool.dir.path()) {
        cleanup.mounts.push(first.clone());
        cleanup.dirs.push(first.clone());
        if let Some(parent) = first.parent().filter(|parent| *parent != Path::new("/")) {
            cleanup.dirs.push(parent.to_path_buf());
        }
    }
    cleanup.mounts.push(mountpoint.to_path_buf());
    pool.admin(&[
        "set",
        &format!("mountpoint={}", mountpoint.display()),
        "atime=off",
        target,
    ]);
    wait_mounted(pool, mountpoint);
    mountpoint.to_path_buf()
}

fn xattr_set(path: &Path, name: &str, value: &[u8]) {
    set_xattr(path, name, value, 0)
        .unwrap_or_else(|errno| panic!("setxattr {name} on {}: errno {errno}", path.display()));
}

fn xattr_remove(path: &Path, name: &str) {
    remove_xattr(path, name)
        .unwrap_or_else(|errno| panic!("removexattr {name} on {}: errno {errno}", path.display()));
}

/// The extended attributes of `path` (not following a symlink), sorted by
/// name: name and value.
fn xattrs(path: &Path) -> std::io::Result<Vec<(String, Vec<u8>)>> {
    let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    let mut names = vec![0u8; 65536];
    // SAFETY: the buffer is as long as the length passed.
    let length =
        unsafe { libc::llistxattr(c_path.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    if length < 0 {
        return Err(std::io::Error::last_os_error());
    }
    names.truncate(length as usize);
    let mut out = Vec::new();
    for name in names
        .split(|byte| *byte == 0)
        .filter(|name| !name.is_empty())
    {
        let c_name = std::ffi::CString::new(name).unwrap();
        let mut value = vec![0u8; 128 << 10];
        // SAFETY: the buffer is as long as the length passed.
        let read = unsafe {
            libc::lgetxattr(
                c_path.as_ptr(),
                c_name.as_ptr(),
                value.as_mut_ptr().cast(),
                value.len(),
            )
        };
        if read < 0 {
            return Err(std::io::Error::last_os_error());
        }
        value.truncate(read as usize);
        out.push((String::from_utf8_lossy(name).into_owned(), value));
    }
    out.sort();
    Ok(out)
}

fn blake3(bytes: &[u8]) -> String {
    format!(
        "{:?}",
        ironpool::format::ChecksumAlgo::Blake3.compute(bytes)
    )
}

/// Every entry under `root` (`.`: the root itself), by path relative to
/// it, without following symlinks and without `.zfs`: its type, mode bits
/// (with setuid, setgid, sticky), owner, link count and size; for a file
/// its modification time and the BLAKE3 of its contents; for a symlink its
/// target; for files and directories their extended attributes.
fn tree_digest(root: &Path) -> std::io::Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(relative) = stack.pop() {
        let path = if relative.as_os_str().is_empty() {
            root.to_path_buf()
        } else {
            root.join(&relative)
        };
        let meta = std::fs::symlink_metadata(&path)?;
        let kind = meta.file_type();
        let name = if kind.is_dir() {
            "dir"
        } else if kind.is_file() {
            "file"
        } else if kind.is_symlink() {
            "symlink"
        } else if std::os::unix::fs::FileTypeExt::is_fifo(&kind) {
            "fifo"
        } else {
            "other"
        };
        let mut line = format!(
            "{name} {:o} {}:{} nlink {} size {}",
            meta.mode() & 0o7777,
            meta.uid(),
            meta.gid(),
            meta.nlink(),
            meta.size()
        );
        if kind.is_file() {
            let bytes = std::fs::read(&path)?;
            line.push_str(&format!(
                " mtime {}.{:09} read {} blake3 {}",
                meta.mtime(),
                meta.mtime_nsec(),
                bytes.len(),
                blake3(&bytes)
            ));
        } else if kind.is_symlink() {
            line.push_str(&format!(" -> {}", std::fs::read_link(&path)?.display()));
        } else if kind.is_dir() {
            for entry in std::fs::read_dir(&path)? {
                let entry_name = entry?.file_name();
                if relative.as_os_str().is_empty() && entry_name == ".zfs" {
                    continue;
                }
                stack.push(relative.join(entry_name));
            }
        }
        if kind.is_file() || kind.is_dir() {
            for (xattr, value) in xattrs(&path)? {
                let shown = if value.len() <= 32 {
                    String::from_utf8_lossy(&value).into_owned()
                } else {
                    format!("{} bytes {}", value.len(), blake3(&value))
                };
                line.push_str(&format!(" [{xattr}={shown}]"));
            }
        }
        let key = if relative.as_os_str().is_empty() {
            ".".to_string()
        } else {
            relative.display().to_string()
        };
        out.insert(key, line);
    }
    Ok(out)
}

/// What differs between two digests (the first few), empty if nothing.
fn differences(actual: &BTreeMap<String, String>, expected: &BTreeMap<String, String>) -> String {
    let mut lines = Vec::new();
    for (path, want) in expected {
        match actual.get(path) {
            None => lines.push(format!("missing {path}: {want}")),
            Some(have) if have != want => {
                lines.push(format!("differs {path}:\n  have {have}\n  want {want}"))
            }
            Some(_) => {}
        }
    }
    for (path, have) in actual {
        if !expected.contains_key(path) {
            lines.push(format!("extra {path}: {have}"));
        }
    }
    let count = lines.len();
    lines.truncate(12);
    if count > lines.len() {
        lines.push(format!("... {} more", count - lines.len()));
    }
    lines.join("\n")
}

/// Waits (20 s at most) until the tree at `root` is `expected`: a mount
/// the server replaces after a receive or a rollback takes a moment.
fn wait_same_tree(root: &Path, expected: &BTreeMap<String, String>, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let problem = match tree_digest(root) {
            Ok(actual) if actual == *expected => return,
            Ok(actual) => differences(&actual, expected),
            Err(error) => format!("reading {}: {error}", root.display()),
        };
        assert!(
            Instant::now() < deadline,
            "{what}: {} is not the tree expected ({} entries):\n{problem}",
            root.display(),
            expected.len()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Bytes from xorshift64, different for each seed.
fn random_bytes(length: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(length + 8);
    while out.len() < length {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.extend_from_slice(&state.to_le_bytes());
    }
    out.truncate(length);
    out
}

/// Writes `data` to a new file `path` and makes it durable.
fn write_synced(path: &Path, data: &[u8]) {
    let mut file = std::fs::File::create(path)
        .unwrap_or_else(|error| panic!("create {}: {error}", path.display()));
    file.write_all(data).unwrap();
    file.sync_all().unwrap();
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn set_mtime(path: &Path, seconds: u64, nanos: u32) {
    let file = std::fs::File::options().write(true).open(path).unwrap();
    file.set_modified(SystemTime::UNIX_EPOCH + Duration::new(seconds, nanos))
        .unwrap();
    file.sync_all().unwrap();
}

fn sync_dir(path: &Path) {
    std::fs::File::open(path).unwrap().sync_all().unwrap();
}

/// Entries of the big directory `many` (its hash leaves split many times).
const MANY: usize = 3000;
/// Where the sparse file's second write lands.
const SPARSE_TAIL: u64 = 64 << 20;

/// Fills the source filesystem for snapshot @a.
fn populate(root: &Path) {
    for dir in [
        "nested/a/b/c",
        "nested/x/y",
        "nested/gone/sub",
        "docs",
        "data",
        "many",
        "empty-dir",
    ] {
        std::fs::create_dir_all(root.join(dir)).unwrap();
    }
    write_synced(&root.join("docs/readme.txt"), b"read me\n");
    write_synced(&root.join("docs/small.txt"), &random_bytes(200, 1));
    write_synced(&root.join("docs/delete-me.txt"), b"short-lived\n");
    write_synced(&root.join("docs/empty"), b"");
    write_synced(&root.join("docs/shared.txt"), b"one file, many names\n");
    write_synced(&root.join("docs/owned.txt"), b"someone else's\n");
    write_synced(&root.join("docs/old.txt"), b"written long ago\n");
    write_synced(&root.join("nested/a/b/c/deep.txt"), b"deep down\n");
    write_synced(&root.join("nested/x/y/z.txt"), &random_bytes(5000, 4));
    for index in 0..5 {
        write_synced(
            &root.join(format!("nested/gone/sub/{index}.txt")),
            &random_bytes(100 * index, 10 + index as u64),
        );
    }
    write_synced(&root.join("data/random.bin"), &random_bytes(3 << 20, 2));
    write_synced(&root.join("data/shrinks.bin"), &random_bytes(2 << 20, 3));
    write_synced(&root.join("data/setuid.bin"), b"#!/bin/true\n");
    // Sparse: 4 KiB at 0 and a few bytes at 64 MiB, a hole between.
    let sparse = std::fs::File::create(root.join("data/sparse.bin")).unwrap();
    sparse.write_all_at(&random_bytes(4096, 5), 0).unwrap();
    sparse.write_all_at(b"the tail", SPARSE_TAIL).unwrap();
    sparse.sync_all().unwrap();
    drop(sparse);
    // Links: relative, dangling, a target too long to fit beside the inode.
    std::os::unix::fs::symlink("docs/readme.txt", root.join("link")).unwrap();
    std::os::unix::fs::symlink("/nonexistent/target", root.join("dangling")).unwrap();
    std::os::unix::fs::symlink("x/".repeat(150), root.join("nested/long-link")).unwrap();
    std::fs::hard_link(
        root.join("docs/shared.txt"),
        root.join("nested/a/shared-link"),
    )
    .unwrap();
    let fifo = c_string(&root.join("data/fifo").display().to_string());
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o640) }, 0, "mkfifo");
    // The big directory, with long and non-ASCII names among the many.
    for index in 0..MANY {
        std::fs::write(
            root.join(format!("many/entry-{index:04}")),
            format!("entry {index}\n"),
        )
        .unwrap();
    }
    for index in 0..10 {
        std::fs::write(
            root.join(format!("many/long-{index:02}-{}", "n".repeat(200))),
            b"long",
        )
        .unwrap();
        std::fs::write(root.join(format!("many/żółw-🦀-{index}")), b"utf-8").unwrap();
    }
    // Extended attributes: small, large (its own object), on a directory
    // and on the root.
    xattr_set(&root.join("docs/readme.txt"), "user.comment", b"first");
    xattr_set(&root.join("docs/readme.txt"), "user.removed", b"gone in b");
    xattr_set(
        &root.join("data/random.bin"),
        "user.big",
        &random_bytes(60_000, 6),
    );
    xattr_set(&root.join("nested"), "user.dir", b"yes");
    xattr_set(root, "user.root", b"top");
    // Owners, modes (setuid after chown, which clears it), times.
    std::os::unix::fs::chown(root.join("docs/owned.txt"), Some(1234), Some(5678)).unwrap();
    std::os::unix::fs::chown(root.join("nested/x"), Some(4321), Some(8765)).unwrap();
    chmod(&root.join("docs/owned.txt"), 0o640);
    chmod(&root.join("nested/x/y"), 0o1777);
    chmod(&root.join("data/setuid.bin"), 0o4755);
    chmod(&root.join("empty-dir"), 0o700);
    chmod(root, 0o750);
    set_mtime(&root.join("docs/old.txt"), 1_000_000_000, 123_456_789);
    sync_dir(root);
}

/// The changes between @a and @b.
fn modify(root: &Path) {
    std::fs::remove_file(root.join("docs/delete-me.txt")).unwrap();
    std::fs::remove_dir_all(root.join("nested/gone")).unwrap();
    // Renames across directories: a file (its attributes go with it) and
    // a directory with its contents.
    std::fs::rename(
        root.join("docs/readme.txt"),
        root.join("nested/a/b/readme.txt"),
    )
    .unwrap();
    std::fs::rename(root.join("nested/x"), root.join("moved-x")).unwrap();
    // Shrink, grow past one block, overwrite in the middle, write into
    // the hole.
    let shrinks = std::fs::File::options()
        .write(true)
        .open(root.join("data/shrinks.bin"))
        .unwrap();
    shrinks.set_len((1 << 20) + 123).unwrap();
    shrinks.sync_all().unwrap();
    let mut small = std::fs::File::options()
        .append(true)
        .open(root.join("docs/small.txt"))
        .unwrap();
    small
        .write_all(&random_bytes((300 << 10) - 200, 7))
        .unwrap();
    small.sync_all().unwrap();
    let random = std::fs::File::options()
        .write(true)
        .open(root.join("data/random.bin"))
        .unwrap();
    random
        .write_all_at(&random_bytes(256 << 10, 9), (1 << 20) + 5000)
        .unwrap();
    random.sync_all().unwrap();
    let sparse = std::fs::File::options()
        .write(true)
        .open(root.join("data/sparse.bin"))
        .unwrap();
    sparse.write_all_at(b"middle", SPARSE_TAIL / 2).unwrap();
    sparse.sync_all().unwrap();
    // The big directory loses 2000 of its 3000 and gains 500.
    for index in (0..MANY).filter(|index| index % 3 != 0) {
        std::fs::remove_file(root.join(format!("many/entry-{index:04}"))).unwrap();
    }
    for index in 0..500 {
        std::fs::write(
            root.join(format!("many/added-{index:03}")),
            format!("added {index}\n"),
        )
        .unwrap();
    }
    for index in (0..10).step_by(2) {
        std::fs::remove_file(root.join(format!("many/long-{index:02}-{}", "n".repeat(200))))
            .unwrap();
    }
    // Attributes changed, removed, added.
    let readme = root.join("nested/a/b/readme.txt");
    xattr_set(&readme, "user.comment", b"second, and longer");
    xattr_remove(&readme, "user.removed");
    xattr_set(&root.join("data/shrinks.bin"), "user.new", b"new in b");
    // New directories, a new link to an old file, new modes and times.
    std::fs::create_dir_all(root.join("fresh/deep/er")).unwrap();
    write_synced(&root.join("fresh/deep/er/leaf.txt"), b"leaf\n");
    std::fs::hard_link(root.join("docs/shared.txt"), root.join("fresh/third-name")).unwrap();
    chmod(&root.join("docs/owned.txt"), 0o600);
    std::os::unix::fs::chown(root.join("fresh"), Some(42), Some(43)).unwrap();
    set_mtime(&root.join("docs/old.txt"), 1_234_567_890, 987_654_321);
    sync_dir(root);
}

/// Takes snapshot `fs@name` and returns the digest of its tree under
/// `.zfs/snapshot`, checking it is the tree the head had.
fn snapshot_digest(pool: &TestPool, fs: &str, mnt: &Path, name: &str) -> BTreeMap<String, String> {
    let live = tree_digest(mnt).expect("the source's tree");
    pool.admin(&["snapshot", &format!("{fs}@{name}")]);
    let snapshot = mnt.join(".zfs/snapshot").join(name);
    wait_same_tree(&snapshot, &live, &format!("{fs}@{name} against its head"));
    live
}

/// Runs `line` in bash with pipefail, SRC and DST standing for the binary
/// talking to `source`'s and `target`'s servers.
fn pipe(source: &TestPool, target: &TestPool, line: &str) -> Output {
    let binary = ironpool_binary().display().to_string();
    let line = line
        .replace(
            "SRC",
            &format!("{binary} --control {}", source.control().display()),
        )
        .replace(
            "DST",
            &format!("{binary} --control {}", target.control().display()),
        );
    Command::new("bash")
        .args(["-c", &format!("set -o pipefail; {line}")])
        .output()
        .expect("bash")
}

fn pipe_ok(source: &TestPool, target: &TestPool, line: &str) {
    let output = pipe(source, target, line);
    assert!(
        output.status.success(),
        "{line}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The snapshots of `dataset`, by full name, in the order listed.
fn snapshots_of(pool: &TestPool, dataset: &str) -> Vec<String> {
    let listing: serde_json::Value =
        serde_json::from_str(&pool.admin(&["--json", "list", "-t", "snapshot", &pool.name]))
            .expect("list JSON");
    let prefix = format!("{dataset}@");
    listing["datasets"]
        .as_array()
        .expect("datasets")
        .iter()
        .filter_map(|row| row["name"].as_str())
        .filter(|name| name.starts_with(&prefix))
        .map(str::to_string)
        .collect()
}

/// The names of the pool's volumes and filesystems.
fn dataset_names(pool: &TestPool) -> Vec<String> {
    let listing: serde_json::Value =
        serde_json::from_str(&pool.admin(&["--json", "list", "-t", "all", &pool.name]))
            .expect("list JSON");
    listing["datasets"]
        .as_array()
        .expect("datasets")
        .iter()
        .filter_map(|row| row["name"].as_str())
        .map(str::to_string)
        .collect()
}

fn resume_token(pool: &TestPool, target: &str) -> String {
    let json: serde_json::Value =
        serde_json::from_str(&pool.admin(&["--json", "get", "receive_resume_token", target]))
            .expect("get JSON");
    json["properties"][0]["value"]
        .as_str()
        .unwrap_or_else(|| panic!("no token: {json}"))
        .to_string()
}

fn file_bytes(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().len()
}

#[test]
fn full_incremental_and_resumed_filesystem_streams_give_identical_trees() {
    let (mut source, src_mnt) = source_pool("fsrepl");
    let mut backup = TestPool::new("fsreplbak");
    backup.create("1G", &["a.img"]);
    backup.serve();
    let mut cleanup = Cleanup::default();
    cleanup.mounts.push(src_mnt.clone());
    wait_mounted(&source, &src_mnt);

    populate(&src_mnt);
    let at_a = snapshot_digest(&source, "fsrepl/src", &src_mnt, "a");
    assert!(at_a.len() > MANY + 30, "{} entries", at_a.len());
    for expected in ["data/sparse.bin", "data/fifo", "nested/long-link", "."] {
        assert!(at_a.contains_key(expected), "no {expected} in the digest");
    }
    assert!(
        at_a["docs/old.txt"].contains("mtime 1000000000."),
        "{}",
        at_a["docs/old.txt"]
    );

    // Full, into the same pool.
    let full = source.path("full.stream");
    let summary = source.send_to_file(&["send", "fsrepl/src@a"], &full);
    assert!(summary.contains("sent fsrepl/src@a"), "{summary}");
    let full_bytes = file_bytes(&full);
    assert!(
        full_bytes > 5 << 20 && full_bytes < 24 << 20,
        "the full stream is {full_bytes} bytes: it holds 5 MiB of random data, \
         and the sparse file's 64 MiB hole travels as a hole"
    );
    // Mounted where -o says from the start (the other receives below move
    // theirs with `set` after the fact).
    let copy_mnt = source.path("copy-mnt");
    cleanup.mounts.push(copy_mnt.clone());
    receive_ok(
        &source,
        "fsrepl/copy",
        &full,
        &[
            "-o",
            &format!("mountpoint={}", copy_mnt.display()),
            "-o",
            "atime=off",
        ],
    );
    assert_eq!(property(&source, "fsrepl/copy", "atime"), "off");
    wait_mounted(&source, &copy_mnt);
    wait_same_tree(&copy_mnt, &at_a, "fsrepl/copy");
    wait_same_tree(&copy_mnt.join(".zfs/snapshot/a"), &at_a, "fsrepl/copy@a");
    let sparse = std::fs::symlink_metadata(copy_mnt.join("data/sparse.bin")).unwrap();
    assert!(
        sparse.blocks() * 512 < 4 << 20,
        "the received sparse file takes {} bytes: its hole was filled",
        sparse.blocks() * 512
    );
    assert_eq!(snapshots_of(&source, "fsrepl/copy"), ["fsrepl/copy@a"]);
    // Listed by the filesystem's own name too.
    let listed = source.admin(&["list", "-t", "snapshot", "fsrepl/copy"]);
    assert!(listed.contains("fsrepl/copy@a"), "{listed}");

    // Full, into another pool through a pipe.
    pipe_ok(
        &source,
        &backup,
        "SRC send fsrepl/src@a | DST receive fsreplbak/copy",
    );
    let backup_mnt = mount_received(
        &backup,
        "fsreplbak/copy",
        &backup.path("copy-mnt"),
        &mut cleanup,
    );
    wait_same_tree(&backup_mnt, &at_a, "fsreplbak/copy");

    // Incremental: only what changed travels.
    modify(&src_mnt);
    let at_b = snapshot_digest(&source, "fsrepl/src", &src_mnt, "b");
    assert_ne!(at_a, at_b);
    assert!(at_b["docs/small.txt"].contains("size 307200"));
    assert!(at_b["data/shrinks.bin"].contains(&format!("size {}", (1 << 20) + 123)));
    let incremental = source.path("a-b.stream");
    let summary = source.send_to_file(&["send", "-i", "@a", "fsrepl/src@b"], &incremental);
    assert!(summary.contains("sent fsrepl/src@b"), "{summary}");
    let incremental_bytes = file_bytes(&incremental);
    assert!(
        incremental_bytes * 2 < full_bytes,
        "incremental {incremental_bytes} bytes against full {full_bytes}"
    );
    receive_ok(&source, "fsrepl/copy", &incremental, &[]);
    wait_same_tree(&copy_mnt, &at_b, "fsrepl/copy after @b");
    wait_same_tree(&copy_mnt.join(".zfs/snapshot/b"), &at_b, "fsrepl/copy@b");
    wait_same_tree(
        &copy_mnt.join(".zfs/snapshot/a"),
        &at_a,
        "fsrepl/copy@a after @b",
    );
    assert_eq!(
        snapshots_of(&source, "fsrepl/copy"),
        ["fsrepl/copy@a", "fsrepl/copy@b"]
    );
    // A receive into the source's pool leaves the source as it was.
    wait_same_tree(&src_mnt.join(".zfs/snapshot/a"), &at_a, "fsrepl/src@a");

    // The same incremental sent from a bookmark of @a lands on another
    // copy of @a (replication.rs sends one after the snapshot is gone).
    source.admin(&["bookmark", "fsrepl/src@a", "#a-mark"]);
    let mark_mnt = source.path("mark-mnt");
    cleanup.mounts.push(mark_mnt.clone());
    receive_ok(
        &source,
        "fsrepl/marked",
        &full,
        &["-o", &format!("mountpoint={}", mark_mnt.display())],
    );
    let from_mark = source.path("mark-b.stream");
    let summary = source.send_to_file(&["send", "-i", "#a-mark", "fsrepl/src@b"], &from_mark);
    assert!(summary.contains("from fsrepl/src#a-mark"), "{summary}");
    receive_ok(&source, "fsrepl/marked", &from_mark, &[]);
    wait_mounted(&source, &mark_mnt);
    wait_same_tree(&mark_mnt, &at_b, "fsrepl/marked from the bookmark");

    // A target written since its latest snapshot needs -F; without it,
    // nothing changes.
    write_synced(&backup_mnt.join("written-since-a"), b"local change\n");
    sync_dir(&backup_mnt);
    let refused = receive_fails(&backup, "fsreplbak/copy", &incremental, &[]);
    assert!(refused.contains("-F"), "{refused}");
    assert_eq!(
        std::fs::read(backup_mnt.join("written-since-a")).unwrap(),
        b"local change\n",
        "a refused receive changed the target"
    );
    assert_eq!(
        snapshots_of(&backup, "fsreplbak/copy"),
        ["fsreplbak/copy@a"]
    );
    pipe_ok(
        &source,
        &backup,
        "SRC send -i @a fsrepl/src@b | DST receive -F fsreplbak/copy",
    );
    wait_same_tree(&backup_mnt, &at_b, "fsreplbak/copy after -F");
    wait_same_tree(
        &backup_mnt.join(".zfs/snapshot/a"),
        &at_a,
        "fsreplbak/copy@a",
    );
    assert_eq!(
        snapshots_of(&backup, "fsreplbak/copy"),
        ["fsreplbak/copy@a", "fsreplbak/copy@b"]
    );

    // An interrupted stream, kept with -s, resumes from its token.
    let part = source.path("part.stream");
    let bytes = std::fs::read(&full).unwrap();
    std::fs::write(&part, &bytes[..bytes.len() * 3 / 5]).unwrap();
    let error = receive_fails(&backup, "fsreplbak/resumed", &part, &["-s"]);
    assert!(error.contains("send -t"), "{error}");
    assert!(
        !dataset_names(&backup)
            .iter()
            .any(|name| name.contains("resumed")),
        "a partial receive is not a filesystem: {:?}",
        dataset_names(&backup)
    );
    assert!(
        !mounted(Path::new("/fsreplbak/resumed")),
        "a partial receive is mounted"
    );
    let token = resume_token(&backup, "fsreplbak/resumed");
    assert!(token.len() > 2 && token != "-", "token {token:?}");
    // A fresh receive into the same name is refused while the partial one
    // waits.
    let refused = receive_fails(&backup, "fsreplbak/resumed", &full, &[]);
    assert!(refused.contains("interrupted receive"), "{refused}");
    let rest = source.path("rest.stream");
    source.send_to_file(&["send", "-t", &token], &rest);
    assert!(
        file_bytes(&rest) < full_bytes,
        "the resumed stream ({} bytes) skips what was received ({full_bytes} in all)",
        file_bytes(&rest)
    );
    let resumed = receive_ok(&backup, "fsreplbak/resumed", &rest, &["-s"]);
    assert!(resumed.contains("resumed at"), "{resumed}");
    let resumed_mnt = mount_received(
        &backup,
        "fsreplbak/resumed",
        &backup.path("resumed-mnt"),
        &mut cleanup,
    );
    wait_same_tree(&resumed_mnt, &at_a, "fsreplbak/resumed");
    assert_eq!(
        snapshots_of(&backup, "fsreplbak/resumed"),
        ["fsreplbak/resumed@a"]
    );

    // An interrupted receive can also be discarded, and received again.
    let error = receive_fails(&backup, "fsreplbak/dropped", &part, &["-s"]);
    assert!(error.contains("send -t"), "{error}");
    backup.admin(&["receive", "-A", "fsreplbak/dropped"]);
    receive_ok(&backup, "fsreplbak/dropped", &full, &[]);
    let dropped_mnt = mount_received(
        &backup,
        "fsreplbak/dropped",
        &backup.path("dropped-mnt"),
        &mut cleanup,
    );
    wait_same_tree(&dropped_mnt, &at_a, "fsreplbak/dropped");

    assert_check_clean(&source);
    assert_check_clean(&backup);
    stop_and_check(&mut source);
    stop_and_check(&mut backup);
}

/// Flips one byte in the middle of `stream`, into `damaged`.
fn damage(stream: &Path, damaged: &Path) {
    let mut bytes = std::fs::read(stream).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x5a;
    std::fs::write(damaged, &bytes).unwrap();
}

fn says_damaged(error: &str) -> bool {
    ["damaged", "checksum", "magic", "exceeds", "truncated"]
        .iter()
        .any(|word| error.contains(word))
}

#[test]
fn a_damaged_filesystem_stream_changes_nothing() {
    let (mut pool, src_mnt) = source_pool("fsdamage");
    let mut cleanup = Cleanup::default();
    cleanup.mounts.push(src_mnt.clone());
    cleanup.mounts.push(PathBuf::from("/fsdamage/target"));
    wait_mounted(&pool, &src_mnt);
    std::fs::create_dir_all(src_mnt.join("d/e")).unwrap();
    write_synced(&src_mnt.join("d/e/random.bin"), &random_bytes(2 << 20, 21));
    for index in 0..50 {
        std::fs::write(src_mnt.join(format!("d/f{index}")), index.to_string()).unwrap();
    }
    xattr_set(&src_mnt.join("d"), "user.tag", b"kept");
    sync_dir(&src_mnt);
    let at_a = snapshot_digest(&pool, "fsdamage/src", &src_mnt, "a");
    write_synced(&src_mnt.join("d/e/random.bin"), &random_bytes(1 << 20, 22));
    std::fs::remove_file(src_mnt.join("d/f7")).unwrap();
    sync_dir(&src_mnt);
    let at_b = snapshot_digest(&pool, "fsdamage/src", &src_mnt, "b");

    // A damaged full stream creates nothing.
    let full = pool.path("full.stream");
    pool.send_to_file(&["send", "fsdamage/src@a"], &full);
    let damaged = pool.path("damaged.stream");
    damage(&full, &damaged);
    let error = receive_fails(&pool, "fsdamage/target", &damaged, &[]);
    assert!(says_damaged(&error), "{error}");
    let names = dataset_names(&pool);
    assert!(
        !names
            .iter()
            .any(|name| name.contains("target") || name.contains('%')),
        "{names:?}"
    );
    assert!(snapshots_of(&pool, "fsdamage/target").is_empty());
    assert!(!mounted(Path::new("/fsdamage/target")));
    assert_eq!(
        resume_token(&pool, "fsdamage/target"),
        "-",
        "a receive without -s left something to resume"
    );
    assert_check_clean(&pool);
    // A bad -o property is refused before anything is received.
    let error = receive_fails(&pool, "fsdamage/target", &full, &["-o", "recordsize=3"]);
    assert!(error.contains("recordsize"), "{error}");
    assert!(!dataset_names(&pool)
        .iter()
        .any(|name| name.contains("target")));

    // The intact stream is received; then a damaged incremental one
    // leaves the target as it was.
    receive_ok(&pool, "fsdamage/target", &full, &[]);
    let target_mnt = mount_received(
        &pool,
        "fsdamage/target",
        &pool.path("target-mnt"),
        &mut cleanup,
    );
    wait_same_tree(&target_mnt, &at_a, "fsdamage/target");
    let incremental = pool.path("a-b.stream");
    pool.send_to_file(&["send", "-i", "@a", "fsdamage/src@b"], &incremental);
    damage(&incremental, &damaged);
    let error = receive_fails(&pool, "fsdamage/target", &damaged, &[]);
    assert!(says_damaged(&error), "{error}");
    wait_same_tree(&target_mnt, &at_a, "fsdamage/target after a damaged stream");
    assert_eq!(
        snapshots_of(&pool, "fsdamage/target"),
        ["fsdamage/target@a"]
    );
    assert!(
        !dataset_names(&pool).iter().any(|name| name.contains('%')),
        "{:?}",
        dataset_names(&pool)
    );
    assert_check_clean(&pool);
    receive_ok(&pool, "fsdamage/target", &incremental, &[]);
    wait_same_tree(&target_mnt, &at_b, "fsdamage/target after @b");
    stop_and_check(&mut pool);
}

/// `diff` lines of `from` to `to` (None: the filesystem now), as
/// (change, path, new path).
fn diff_lines(pool: &TestPool, from: &str, to: Option<&str>) -> Vec<(String, String, String)> {
    let mut args = vec!["--json", "diff", from];
    args.extend(to);
    let report: serde_json::Value = serde_json::from_str(&pool.admin(&args)).expect("diff JSON");
    assert_eq!(report["truncated"], false, "{report}");
    let text = |value: &serde_json::Value| value.as_str().unwrap_or("").to_string();
    let mut lines: Vec<_> = report["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| {
            (
                text(&entry["change"]),
                text(&entry["path"]),
                text(&entry["new_path"]),
            )
        })
        .collect();
    lines.sort();
    lines
}

/// `diff` names what was created, removed, modified and renamed between
/// two snapshots, and up to the filesystem now (through a temporary
/// snapshot it leaves no trace of), with paths under the mountpoint;
/// objects untouched beside changed ones, and children of a renamed
/// directory that did not change themselves, are not listed.
#[test]
fn diff_names_what_changed_between_snapshots_and_since_one() {
    let (mut pool, mnt, _unmount) = served_filesystem("fsdiff");
    let at = |path: &str| mnt.join(path).display().to_string();
    std::fs::create_dir_all(mnt.join("dir/sub")).unwrap();
    for name in ["dir/sub/kept", "dir/edited", "moved", "removed", "same"] {
        std::fs::write(mnt.join(name), name.as_bytes()).unwrap();
    }
    std::fs::write(mnt.join("odd\tname"), b"x").unwrap();
    pool.admin(&["snapshot", "fsdiff/fs@one"]);
    std::fs::OpenOptions::new()
        .append(true)
        .open(mnt.join("dir/edited"))
        .unwrap()
        .write_all(b" and more")
        .unwrap();
    std::fs::rename(mnt.join("moved"), mnt.join("dir/sub/arrived")).unwrap();
    std::fs::remove_file(mnt.join("removed")).unwrap();
    std::fs::write(mnt.join("created"), b"new").unwrap();
    std::fs::rename(mnt.join("odd\tname"), mnt.join("odd\tnamed")).unwrap();
    pool.admin(&["snapshot", "fsdiff/fs@two"]);
    let s = String::new;
    let two = vec![
        ("+".to_string(), at("created"), s()),
        ("-".to_string(), at("removed"), s()),
        ("M".to_string(), at("dir/edited"), s()),
        ("M".to_string(), at("dir/sub"), s()),
        ("M".to_string(), mnt.display().to_string(), s()),
        ("R".to_string(), at("moved"), at("dir/sub/arrived")),
        ("R".to_string(), at("odd\\011name"), at("odd\\011named")),
    ];
    let mut expected = two.clone();
    expected.sort();
    assert_eq!(
        diff_lines(&pool, "fsdiff/fs@one", Some("fsdiff/fs@two")),
        expected
    );

    // Up to now: a renamed directory is listed, its unchanged children
    // are not; the temporary snapshot is gone afterwards.
    std::fs::rename(mnt.join("dir"), mnt.join("folder")).unwrap();
    let now = diff_lines(&pool, "fsdiff/fs@two", None);
    let mut want = vec![
        ("M".to_string(), mnt.display().to_string(), s()),
        ("R".to_string(), at("dir"), at("folder")),
    ];
    want.sort();
    assert_eq!(now, want);
    let snapshots = pool.admin(&["list", "-t", "snapshot", "fsdiff/fs"]);
    assert!(!snapshots.contains("ironpool-diff"), "{snapshots}");
    let text = pool.admin(&["diff", "-F", "fsdiff/fs@one", "fsdiff/fs@two"]);
    assert!(
        text.contains(&format!("+\tF\t{}\n", at("created"))),
        "{text}"
    );

    // Bad input: a clear error.
    let control = pool.control().display().to_string();
    let error = pool.fails(&[
        "--control",
        &control,
        "diff",
        "fsdiff/fs@two",
        "fsdiff/fs@one",
    ]);
    assert!(error.contains("is not earlier than"), "{error}");
    let error = pool.fails(&["--control", &control, "diff", "fsdiff/fs@nope"]);
    assert!(error.contains("no snapshot"), "{error}");
    stop_and_check(&mut pool);
}
