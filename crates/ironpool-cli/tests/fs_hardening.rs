//! A mounted filesystem against a local user trying to break it (issue 75):
//! two mount sessions of one filesystem alive at once, directory offsets
//! `telldir` and `seekdir` can use, and lists of extended attributes that
//! `listxattr` can always return. Each test fails on the build before the
//! fault's fix.

mod common;

use std::ffi::CString;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::fuse::*;
use common::*;

/// A path into the mount an open directory `dir` belongs to, that still
/// works once that mount was moved away or unmounted lazily.
fn through(dir: &std::fs::File, name: &str) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}/{name}", dir.as_raw_fd()))
}

/// Waits (30 s at most) until the server's log says `line`.
fn wait_log(pool: &TestPool, line: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !pool.log().contains(line) {
        assert!(
            Instant::now() < deadline,
            "the log never said {line:?}:\n{}",
            pool.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until the server says the mount of filesystem `name` at `path` it
/// replaced has ended (its last open file closed), then 2 s more: the time
/// within which the old session's end freed the new one's files.
fn wait_session_ended(pool: &TestPool, name: &str, path: &Path) {
    wait_log(pool, &format!("unmounted {name} from {}", path.display()));
    std::thread::sleep(Duration::from_secs(2));
}

/// Opens `path` for reading and writing, creating it, and writes `data`.
fn written(path: &Path, data: &[u8]) -> std::fs::File {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(path)
        .unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    file.write_all_at(data, 0).unwrap();
    file
}

/// Reads all of an open file through its handle.
fn read_all(file: &std::fs::File) -> Vec<u8> {
    let length = file.metadata().unwrap().len() as usize;
    let mut bytes = vec![0u8; length];
    file.read_exact_at(&mut bytes, 0).unwrap();
    bytes
}

/// While a file stays open on the old mount, the filesystem has two mount
/// sessions: the old one ends only when that file closes. Its end must let
/// go of its own holds only (it let go of every session's, so the new
/// mount's open files, one of them removed, were freed under their users:
/// reads and writes returned ENOENT). And a change made through one
/// session must be seen through the other, whose kernel caches names,
/// absent names and attributes for a day (a file created through the old
/// mount was absent to `stat` on the new one, `open(O_CREAT)` failed with
/// EEXIST, and a file grown through the old mount read 100 bytes of
/// 100,100). Both for a mountpoint move and for `unmount` + `mount`.
#[test]
fn two_mount_sessions_of_one_filesystem_keep_their_files_and_see_each_others_changes() {
    let (mut pool, old, _unmount) = served_filesystem("fssessions");
    let moved = pool.path("moved");
    let _unmount_moved = Unmount(moved.clone());
    let name = format!("{}/fs", pool.name);
    // A file and the directory held open on the old mount.
    let old_dir = std::fs::File::open(&old).unwrap();
    let held = written(&old.join("held.bin"), b"held open on the old mount");
    let small = written(&old.join("grow.bin"), &[7u8; 100]);
    drop(small);
    pool.admin(&["set", &format!("mountpoint={}", moved.display()), &name]);
    wait_mounted(&pool, &moved);

    // The new mount's kernel reads what the old one left...
    assert_eq!(std::fs::read(moved.join("grow.bin")).unwrap(), [7u8; 100]);
    assert!(!moved.join("late.txt").exists(), "not created yet");
    // ...then changes come through the old mount.
    std::fs::write(through(&old_dir, "late.txt"), b"made through the old mount").unwrap();
    let mut grow = std::fs::OpenOptions::new()
        .append(true)
        .open(through(&old_dir, "grow.bin"))
        .unwrap();
    grow.write_all(&[8u8; 100_000]).unwrap();
    drop(grow);
    std::fs::create_dir(through(&old_dir, "sub")).unwrap();
    std::fs::remove_file(through(&old_dir, "held.bin")).unwrap();
    // The name was absent here before (a cached absent name).
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(moved.join("late.txt"))
        .expect("open(O_CREAT) of a name made through the other mount");
    assert_eq!(
        std::fs::read(moved.join("late.txt")).expect("a file made through the old mount"),
        b"made through the old mount"
    );
    let grown = std::fs::read(moved.join("grow.bin")).unwrap();
    assert_eq!(grown.len(), 100_100, "the size the other mount left");
    assert!(grown[..100] == [7u8; 100] && grown[100..] == [8u8; 100_000]);
    assert!(moved.join("sub").is_dir());
    assert!(
        !moved.join("held.bin").exists(),
        "removed through the old mount"
    );
    // And the other way: the old mount sees the new one's changes.
    std::fs::write(moved.join("new.txt"), b"made through the new mount").unwrap();
    assert_eq!(
        std::fs::read(through(&old_dir, "new.txt")).unwrap(),
        b"made through the new mount"
    );
    std::fs::remove_file(moved.join("late.txt")).unwrap();
    assert!(!through(&old_dir, "late.txt").exists());

    // Both mounts changing one directory and one file at once: each
    // change is told to the other kernel, which takes the directory's lock
    // (or the file's pages) to apply it while its own requests wait on
    // this server. Told before the reply, the two waited on each other.
    std::fs::write(moved.join("shared.bin"), [0u8; 800]).unwrap();
    let busy = |root: PathBuf, tag: &'static str, parity: u64| {
        std::thread::spawn(move || {
            let shared = std::fs::OpenOptions::new()
                .write(true)
                .open(root.join("shared.bin"))
                .unwrap();
            for index in 0..400u64 {
                let path = root.join(format!("busy-{tag}-{index}"));
                std::fs::write(&path, tag).unwrap();
                std::fs::remove_file(&path).unwrap();
                shared
                    .write_all_at(&tag.as_bytes()[..1], index * 2 + parity)
                    .unwrap();
            }
        })
    };
    let threads = [
        busy(through(&old_dir, ""), "old", 0),
        busy(moved.clone(), "new", 1),
    ];
    let deadline = Instant::now() + Duration::from_secs(60);
    while threads.iter().any(|thread| !thread.is_finished()) {
        assert!(
            Instant::now() < deadline,
            "the two mounts hung on each other"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    for thread in threads {
        thread.join().unwrap();
    }
    let shared = std::fs::read(moved.join("shared.bin")).unwrap();
    assert!(
        shared.chunks(2).all(|pair| pair == b"on"),
        "each mount's writes to one file are all there"
    );

    // On the new mount: a file open and removed, a second open.
    let removed_data = distinct_bytes(64 << 10, 3);
    let removed = written(&moved.join("removed.bin"), &removed_data);
    std::fs::remove_file(moved.join("removed.bin")).unwrap();
    let second_data = distinct_bytes(64 << 10, 4);
    let second = written(&moved.join("second.bin"), &second_data);
    let objects = fs_objects(&pool);
    // The old session ends with the last file open on it.
    assert_eq!(read_all(&held), b"held open on the old mount");
    drop(held);
    drop(old_dir);
    wait_session_ended(&pool, &name, &old);
    assert_eq!(
        fs_objects(&pool),
        objects - 1,
        "only the old mount's removed file goes"
    );
    assert!(
        read_all(&removed) == removed_data,
        "a removed file open on the new mount"
    );
    assert!(read_all(&second) == second_data);
    removed.write_all_at(b"still writable", 0).unwrap();
    second.write_all_at(b"still writable", 0).unwrap();
    assert_eq!(&read_all(&removed)[..14], b"still writable");
    drop(removed);
    wait_objects(&pool, objects - 2);

    // unmount + mount while a file is open: the same.
    let kept = written(&moved.join("kept.bin"), b"open across an unmount");
    let gone = written(&moved.join("gone.bin"), b"removed, open across an unmount");
    std::fs::remove_file(moved.join("gone.bin")).unwrap();
    pool.admin(&["unmount", &name]);
    pool.admin(&["mount", &name]);
    wait_mounted(&pool, &moved);
    let open_again = written(&moved.join("again.bin"), b"the second session's");
    std::fs::remove_file(moved.join("again.bin")).unwrap();
    let objects = fs_objects(&pool);
    drop(kept);
    drop(gone);
    drop(second);
    wait_session_ended(&pool, &name, &moved);
    assert_eq!(
        fs_objects(&pool),
        objects - 1,
        "the first session's removed file alone"
    );
    assert_eq!(read_all(&open_again), b"the second session's");
    assert_eq!(
        std::fs::read(moved.join("kept.bin")).unwrap(),
        b"open across an unmount"
    );
    drop(open_again);
    wait_objects(&pool, objects - 2);
    stop_and_check(&mut pool);
}

/// `telldir` of every entry of a directory of 300 files, then `seekdir` to
/// each and `readdir`: the entry after it, every time. A directory offset
/// with its top bit set (half of them were) is a negative `loff_t`, which
/// `lseek` of the directory refuses.
#[test]
fn telldir_and_seekdir_work_for_every_entry() {
    let (mut pool, mnt, _unmount) = served_filesystem("fsseekdir");
    let dir = mnt.join("many");
    std::fs::create_dir(&dir).unwrap();
    for index in 0..300 {
        std::fs::write(dir.join(format!("file{index:03}")), b"").unwrap();
    }
    let path = CString::new(dir.display().to_string()).unwrap();
    // SAFETY: the libc directory stream calls, on a stream opened here and
    // closed once, with pointers read before the next call on it.
    unsafe {
        let stream = libc::opendir(path.as_ptr());
        assert!(!stream.is_null());
        // (the name read, the position after it)
        let mut positions = Vec::new();
        loop {
            let entry = libc::readdir(stream);
            if entry.is_null() {
                break;
            }
            let name = std::ffi::CStr::from_ptr((*entry).d_name.as_ptr())
                .to_string_lossy()
                .into_owned();
            positions.push((name, libc::telldir(stream)));
        }
        assert_eq!(positions.len(), 302, "300 files, . and ..");
        let negative = positions.iter().filter(|(_, at)| *at < 0).count();
        assert_eq!(negative, 0, "negative directory offsets");
        for pair in positions.windows(2) {
            let ((_, at), (next, _)) = (&pair[0], &pair[1]);
            libc::seekdir(stream, *at);
            let entry = libc::readdir(stream);
            assert!(
                !entry.is_null(),
                "seekdir({at:#x}) then readdir found the end"
            );
            let name = std::ffi::CStr::from_ptr((*entry).d_name.as_ptr()).to_string_lossy();
            assert_eq!(&name, next, "seekdir({at:#x})");
        }
        libc::closedir(stream);
    }
    stop_and_check(&mut pool);
}

/// Names of extended attributes are refused with ENOSPC once their list
/// would not fit what `listxattr` can return (64 KiB): 7,281 names of 12
/// bytes were taken, then `listxattr` failed with E2BIG, and `cp -a`
/// could not copy the file. Such a file is copied whole by `cp -a` now.
#[test]
fn extended_attribute_names_stop_where_listxattr_can_still_list_them() {
    let (mut pool, mnt, _unmount) = served_filesystem("fsxattrnames");
    let file = mnt.join("many-names");
    std::fs::write(&file, b"data").unwrap();
    let mut set = 0;
    let refused = loop {
        match set_xattr(&file, &format!("user.k{set:06}"), b"", 0) {
            Ok(()) => set += 1,
            Err(errno) => break errno,
        }
        assert!(set < 10_000, "never refused");
    };
    assert_eq!(refused, libc::ENOSPC, "after {set} names");
    // Each name is 12 bytes and its NUL: the list holds 65536 / 13 of them.
    assert_eq!(set, 65536 / 13);
    let names = list_xattrs(&file).expect("listxattr of every name");
    assert_eq!(names.len(), set);
    let copy = mnt.join("copy");
    tool(
        "cp",
        &[
            "-a",
            &file.display().to_string(),
            &copy.display().to_string(),
        ],
    );
    assert_eq!(list_xattrs(&copy).unwrap().len(), set);
    // Removing one makes room for one.
    remove_xattr(&file, "user.k000000").unwrap();
    set_xattr(&file, "user.again1", b"", 0).unwrap();
    stop_and_check(&mut pool);
}

/// `sync` and `syncfs` never reach a FUSE server (Linux sends `FUSE_SYNCFS`
/// to virtiofs alone), so a copy and a `mkdir` followed by `sync` and a
/// kill -9 were both gone after the restart. `ironpool sync POOL/FS` (and
/// `ironpool sync POOL`) return once every change answered before is
/// durable. The txg timer is set to ten minutes here, so nothing but the
/// command commits.
#[test]
fn ironpool_sync_makes_a_mounted_filesystems_changes_durable() {
    let (mut pool, mnt) = filesystem_pool("fssync");
    let _unmount = Unmount(mnt.clone());
    let name = format!("{}/fs", pool.name);
    let data = distinct_bytes(300_000, 9);
    let pool_name = pool.name.clone();
    for (round, target) in [&name, &pool_name].into_iter().enumerate() {
        pool.serve_with(&["-o", "txg_timeout_ms=600000"]);
        wait_mounted(&pool, &mnt);
        let file = mnt.join(format!("copied{round}.bin"));
        std::fs::write(pool.path("source.bin"), &data).unwrap();
        tool(
            "cp",
            &[
                &pool.path("source.bin").display().to_string(),
                &file.display().to_string(),
            ],
        );
        std::fs::create_dir(mnt.join(format!("made{round}"))).unwrap();
        tool("sync", &[]);
        pool.admin(&["sync", target]);
        pool.kill9();
        pool.serve();
        wait_mounted(&pool, &mnt);
        assert!(
            std::fs::read(&file).ok() == Some(data.clone()),
            "the copy synced by `ironpool sync {target}`"
        );
        assert!(mnt.join(format!("made{round}")).is_dir(), "the directory");
        if round == 0 {
            pool.stop();
        }
    }
    let refused = pool.fails(&[
        "--control",
        &pool.control().display().to_string(),
        "sync",
        &format!("{}/absent", pool.name),
    ]);
    assert!(refused.contains("absent"), "{refused}");
    stop_and_check(&mut pool);
}

/// Used space of the mount at `path` as `df` reports it, once the frees of
/// the last commits came back: the server commits every 100 ms
/// ([`FAST_TXGS`]), and the figure is read until it stays the same for a
/// second (a freed block is allocatable two txgs after its own).
fn settled_used(path: &Path) -> u64 {
    let used = || {
        let (size, available) = space_of(path);
        size - available
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = used();
    let mut still_since = Instant::now();
    while still_since.elapsed() < Duration::from_secs(1) {
        assert!(Instant::now() < deadline, "df never settled");
        std::thread::sleep(Duration::from_millis(100));
        let now = used();
        if now != last {
            last = now;
            still_since = Instant::now();
        }
    }
    last
}

/// The server option that commits a txg every 100 ms, so that what is
/// freed comes back within a second.
const FAST_TXGS: [&str; 2] = ["-o", "txg_timeout_ms=100"];

/// A loop of `mkdir` by any user on a small pool: it must meet ENOSPC, as
/// writes do, with the pool ONLINE, removal working and the space coming
/// back. It suspended the pool (EIO for every change, `clear` failing,
/// SIGTERM unable to export): directories claimed no space and filled the
/// part kept for metadata, until a txg build found no room.
#[test]
fn a_mkdir_loop_meets_enospc_and_the_pool_stays_online() {
    let mut pool = TestPool::new("fsmkdirs");
    let mnt = pool.path("mnt");
    let _unmount = Unmount(mnt.clone());
    pool.create("256M", &["mirror", "a.img", "b.img"]);
    create_filesystem(&pool, "fs", &mnt, &[]);
    pool.serve_with(&FAST_TXGS);
    wait_mounted(&pool, &mnt);
    let start = settled_used(&mnt);
    let script = format!(
        "import os\ni = 0\nwhile True:\n    try:\n        os.mkdir(f'{}/d{{i}}')\n\
         \x20   except OSError as error:\n        print(i)\n        print(error)\n        break\n\
         \x20   i += 1\n",
        mnt.display()
    );
    let output = tool("python3", &["-c", &script]);
    let made: u64 = output.lines().next().unwrap().parse().unwrap();
    assert!(
        output.contains("No space left on device"),
        "mkdir stopped after {made}: {output}"
    );
    assert!(made > 1000, "only {made} directories in 256 MiB");
    let status = pool.status_json();
    assert_eq!(status["health"], "ONLINE", "{status}");
    tool("sh", &["-c", &format!("rm -rf {}/d*", mnt.display())]);
    let used = settled_used(&mnt);
    // The root directory keeps the leaves its names split into.
    assert!(
        used < start + (8 << 20),
        "{used} bytes used after removing them all, {start} before"
    );
    std::fs::create_dir(mnt.join("again")).unwrap();
    std::fs::write(mnt.join("again/file"), b"after").unwrap();
    stop_and_check(&mut pool);
}

/// Empty files created and deleted with their directory, three rounds
/// (as `tar` and build trees do): `df` shows the space back where it
/// started. It grew by about 1 KiB per file ever created (275, 324, 373
/// MiB for an empty filesystem after rounds of 50,000), as dnode table
/// blocks whose objects were all freed kept their space.
#[test]
fn files_created_and_deleted_give_their_metadata_space_back() {
    let (mut pool, mnt) = filesystem_pool("fschurn");
    let _unmount = Unmount(mnt.clone());
    pool.serve_with(&FAST_TXGS);
    wait_mounted(&pool, &mnt);
    let start = settled_used(&mnt);
    let mut after = Vec::new();
    for round in 0..3 {
        let script = format!(
            "import os\nd = '{}/round{round}'\nos.mkdir(d)\n\
             for i in range(20000):\n    open(f'{{d}}/f{{i}}', 'w').close()\n",
            mnt.display()
        );
        tool("python3", &["-c", &script]);
        tool(
            "rm",
            &[
                "-rf",
                &mnt.join(format!("round{round}")).display().to_string(),
            ],
        );
        after.push(settled_used(&mnt));
    }
    for used in &after {
        assert!(
            *used <= start + (1 << 20),
            "used {after:?} after each round, {start} before"
        );
    }
    stop_and_check(&mut pool);
}
