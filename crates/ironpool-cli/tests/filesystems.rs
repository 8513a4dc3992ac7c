//! Filesystems served over FUSE by `ironpool serve`, used through the real
//! kernel mount: files, directories, links and renames with the standard
//! library, fio with io_uring and `O_DIRECT` at queue depth 64 verifying
//! what it wrote, everything still there after a clean restart, and a
//! mount left dead by a killed server replaced by the next one.

mod common;

use std::io::{Read, Write};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::fuse::*;
use common::*;

/// The options of the ironpool mount at `path`.
fn mount_options(path: &Path) -> Vec<String> {
    ironpool_mount(path)
        .and_then(|fields| fields.get(3).cloned())
        .map(|options| options.split(',').map(str::to_string).collect())
        .unwrap_or_default()
}

/// Waits (10 s at most) until the mount at `path` has option `option`.
fn wait_mount_option(path: &Path, option: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !mount_options(path).iter().any(|have| have == option) {
        assert!(
            Instant::now() < deadline,
            "{} has not {option}: {:?}",
            path.display(),
            mount_options(path)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What the tree should hold: path → contents (None: a directory).
fn tree(root: &Path) -> Vec<(String, Option<Vec<u8>>)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let mut entries: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for path in entries {
            let name = path.strip_prefix(root).unwrap().display().to_string();
            let kind = std::fs::symlink_metadata(&path).unwrap().file_type();
            if kind.is_dir() {
                out.push((name, None));
                stack.push(path);
            } else if kind.is_symlink() {
                out.push((
                    name,
                    Some(
                        std::fs::read_link(&path)
                            .unwrap()
                            .display()
                            .to_string()
                            .into_bytes(),
                    ),
                ));
            } else {
                out.push((name, Some(std::fs::read(&path).unwrap())));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn files_and_directories_work_through_a_real_mount_and_survive_a_restart() {
    let (mut pool, mnt, _unmount) = served_filesystem("fsbasic");
    // Files, directories, renames, links, truncation.
    std::fs::create_dir_all(mnt.join("a/b/c")).unwrap();
    std::fs::write(mnt.join("a/hello.txt"), b"hello, world\n").unwrap();
    let big = distinct_bytes(3 << 20, 7);
    std::fs::write(mnt.join("a/b/big.bin"), &big).unwrap();
    assert!(std::fs::read(mnt.join("a/b/big.bin")).unwrap() == big);
    std::fs::rename(mnt.join("a/hello.txt"), mnt.join("a/b/c/moved.txt")).unwrap();
    assert!(!mnt.join("a/hello.txt").exists());
    std::fs::hard_link(mnt.join("a/b/c/moved.txt"), mnt.join("link.txt")).unwrap();
    assert_eq!(std::fs::metadata(mnt.join("link.txt")).unwrap().nlink(), 2);
    std::os::unix::fs::symlink("a/b/c/moved.txt", mnt.join("sym")).unwrap();
    assert_eq!(std::fs::read(mnt.join("sym")).unwrap(), b"hello, world\n");
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(mnt.join("a/b/big.bin"))
        .unwrap();
    file.set_len(1_000_000).unwrap();
    file.write_all_at(b"tail", 999_996).unwrap();
    file.sync_all().unwrap();
    drop(file);
    let mut expected = big[..1_000_000].to_vec();
    expected[999_996..].copy_from_slice(b"tail");
    assert!(std::fs::read(mnt.join("a/b/big.bin")).unwrap() == expected);
    assert_eq!(
        std::fs::remove_dir(mnt.join("a"))
            .unwrap_err()
            .raw_os_error(),
        Some(libc::ENOTEMPTY)
    );
    for index in 0..500 {
        std::fs::write(mnt.join(format!("a/b/c/f{index}")), index.to_string()).unwrap();
    }
    for index in (0..500).step_by(3) {
        std::fs::remove_file(mnt.join(format!("a/b/c/f{index}"))).unwrap();
    }
    assert_eq!(
        std::fs::read_dir(mnt.join("a/b/c")).unwrap().count(),
        1 + 500 - 167
    );
    // fio: io_uring, O_DIRECT, queue depth 64, every block verified.
    let stats = verify_at_depth_64(
        &pool,
        &[&format!("--filename={}", mnt.join("fio.dat").display())],
    );
    // Its 16K writes came one after another: their payloads were read
    // into buffers of their own and held as they lay (over /dev/fuse; a
    // test beside may have turned FUSE over io_uring on for this mount).
    if !stats["transport"].as_str().unwrap().starts_with("io_uring") {
        let apart = stats["write_payloads_apart"].as_u64().unwrap();
        assert!(apart > 1000, "{apart} payloads read apart: {stats}");
    }
    let before = tree(&mnt);
    assert!(before.len() > 300);
    // A clean stop unmounts; the next server mounts the same tree.
    stop_and_check(&mut pool);
    assert!(!mounted(&mnt), "still mounted after the server stopped");
    pool.serve();
    wait_mounted(&pool, &mnt);
    assert!(tree(&mnt) == before, "the tree changed across a restart");
    let mut text = String::new();
    std::fs::File::open(mnt.join("link.txt"))
        .unwrap()
        .read_to_string(&mut text)
        .unwrap();
    assert_eq!(text, "hello, world\n");
    stop_and_check(&mut pool);
}

/// `path` created (or emptied) and opened to read and write.
fn read_write_new(path: impl AsRef<Path>) -> std::fs::File {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .unwrap()
}

/// `lseek(fd, offset, SEEK_DATA or SEEK_HOLE)`: the offset, or the errno.
fn seek(file: &std::fs::File, offset: u64, whence: i32) -> Result<u64, i32> {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid descriptor; lseek touches no memory.
    let found = unsafe { libc::lseek(file.as_raw_fd(), offset as libc::off_t, whence) };
    if found < 0 {
        Err(errno())
    } else {
        Ok(found as u64)
    }
}

/// `SEEK_DATA` and `SEEK_HOLE` find data and holes exact to the record
/// (16K here), as OpenZFS does: a record never written and one written as
/// zeros are holes, the end of the file is one, a buffered write not yet on
/// the devices is data at once, and the answers stay the same after a
/// restart. `cp --sparse=always` keeps the holes (it asks the same).
#[test]
fn seek_data_and_seek_hole_find_records_written_and_holes() {
    const K: u64 = 1024;
    let (mut pool, mnt, _unmount) = served_filesystem("fsseek");
    let path = mnt.join("sparse");
    let file = std::fs::File::create(&path).unwrap();
    file.write_all_at(&distinct_bytes(16 << 10, 1), 0).unwrap();
    file.write_all_at(&distinct_bytes(16 << 10, 2), 64 * K)
        .unwrap();
    file.write_all_at(&vec![0u8; 16 << 10], 96 * K).unwrap();
    file.write_all_at(&distinct_bytes(4 << 10, 3), 130 * K)
        .unwrap();
    file.set_len(200 * K).unwrap();
    file.sync_all().unwrap();
    let check = |file: &std::fs::File, what: &str| {
        let expected: [(u64, i32, Result<u64, i32>); 12] = [
            (0, libc::SEEK_DATA, Ok(0)),
            (0, libc::SEEK_HOLE, Ok(16 * K)),
            (5 * K, libc::SEEK_HOLE, Ok(16 * K)),
            (16 * K, libc::SEEK_DATA, Ok(64 * K)),
            (20 * K, libc::SEEK_DATA, Ok(64 * K)),
            (20 * K, libc::SEEK_HOLE, Ok(20 * K)),
            (64 * K, libc::SEEK_HOLE, Ok(80 * K)),
            // The record of zeros is a hole.
            (80 * K, libc::SEEK_DATA, Ok(128 * K)),
            (129 * K, libc::SEEK_HOLE, Ok(144 * K)),
            (144 * K, libc::SEEK_DATA, Err(libc::ENXIO)),
            (199 * K, libc::SEEK_HOLE, Ok(199 * K)),
            (200 * K, libc::SEEK_HOLE, Err(libc::ENXIO)),
        ];
        for (offset, whence, want) in expected {
            assert_eq!(
                seek(file, offset, whence),
                want,
                "{what}: lseek({offset}, {})",
                if whence == libc::SEEK_DATA {
                    "SEEK_DATA"
                } else {
                    "SEEK_HOLE"
                }
            );
        }
    };
    check(&file, "written and synced");
    // A buffered write is data as soon as it returns.
    file.write_all_at(&distinct_bytes(4 << 10, 4), 176 * K)
        .unwrap();
    assert_eq!(seek(&file, 150 * K, libc::SEEK_DATA), Ok(176 * K));
    assert_eq!(seek(&file, 176 * K, libc::SEEK_HOLE), Ok(192 * K));
    file.set_len(176 * K).unwrap();
    file.set_len(200 * K).unwrap();
    drop(file);
    let copy = mnt.join("copy");
    let copied = std::process::Command::new("cp")
        .args(["--sparse=always"])
        .arg(&path)
        .arg(&copy)
        .status()
        .unwrap();
    assert!(copied.success());
    assert!(std::fs::read(&copy).unwrap() == std::fs::read(&path).unwrap());
    let copy = std::fs::File::open(&copy).unwrap();
    assert_eq!(
        seek(&copy, 16 * K, libc::SEEK_DATA),
        Ok(64 * K),
        "the copy keeps the holes"
    );
    drop(copy);
    pool.stop();
    pool.serve();
    wait_mounted(&pool, &mnt);
    check(&std::fs::File::open(&path).unwrap(), "after a restart");
    stop_and_check(&mut pool);
}

/// Requests of kind `op` the filesystem's front end has served.
fn op_count(pool: &TestPool, op: &str) -> u64 {
    listed_filesystem(pool)["front_end"]["ops"][op]["count"]
        .as_u64()
        .unwrap_or(0)
}

/// `ls -l` of a directory the kernel has not seen costs no LOOKUP per
/// entry: READDIRPLUS hands each entry's attributes with the listing.
/// Every node it hands is counted as a lookup is: once the files are
/// removed and the kernel forgets them, every object is freed (a node
/// counted twice would live on, one not counted would be freed while
/// the kernel holds it).
#[test]
fn a_long_listing_takes_the_attributes_with_the_names() {
    const FILES: usize = 300;
    let (mut pool, mnt, _unmount) = served_filesystem("fsplus");
    let base = fs_objects(&pool);
    std::fs::create_dir(mnt.join("d")).unwrap();
    for index in 0..FILES {
        std::fs::write(mnt.join(format!("d/f{index}")), vec![7u8; index]).unwrap();
    }
    pool.stop();
    pool.serve();
    wait_mounted(&pool, &mnt);
    let lookups = op_count(&pool, "LOOKUP");
    let mut seen = 0;
    for entry in std::fs::read_dir(mnt.join("d")).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().into_string().unwrap();
        let index: usize = name[1..].parse().unwrap();
        // What `ls -l` asks of each entry (statx of its path).
        let metadata = std::fs::symlink_metadata(entry.path()).unwrap();
        assert_eq!(metadata.len(), index as u64, "{name}");
        seen += 1;
    }
    assert_eq!(seen, FILES);
    assert!(op_count(&pool, "READDIRPLUS") >= 1);
    let looked_up = op_count(&pool, "LOOKUP") - lookups;
    assert!(
        looked_up < FILES as u64 / 4,
        "{looked_up} LOOKUPs for a listing of {FILES} entries"
    );
    for index in 0..FILES {
        std::fs::remove_file(mnt.join(format!("d/f{index}"))).unwrap();
    }
    std::fs::remove_dir(mnt.join("d")).unwrap();
    // The kernel lets go of the inodes it cached (each a FORGET).
    std::fs::write("/proc/sys/vm/drop_caches", "2").unwrap();
    wait_objects(&pool, base);
    stop_and_check(&mut pool);
}

/// `fallocate(fd, mode, offset, length)`: Ok, or the errno.
fn fallocate(file: &std::fs::File, mode: i32, offset: u64, length: u64) -> Result<(), i32> {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid descriptor; fallocate touches no memory.
    let done = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            mode,
            offset as libc::off_t,
            length as libc::off_t,
        )
    };
    if done < 0 {
        Err(errno())
    } else {
        Ok(())
    }
}

/// `fallocate`: a punched hole reads as zeros, gives whole records' space
/// back and shows as a hole, the size kept; `ZERO_RANGE` zeroes and may
/// grow the file; mode 0 grows it and refuses more than the pool has; a
/// mode OpenZFS does not offer gets EOPNOTSUPP (so callers fall back),
/// and everything holds after a restart.
#[test]
fn fallocate_punches_holes_zeroes_ranges_and_grows_files() {
    const K: u64 = 1024;
    let (mut pool, mnt, _unmount) = served_filesystem("fsfalloc");
    let path = mnt.join("file");
    let data = distinct_bytes(1 << 20, 5);
    let file = read_write_new(&path);
    file.write_all_at(&data, 0).unwrap();
    file.sync_all().unwrap();
    let blocks_before = file.metadata().unwrap().blocks();
    let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    fallocate(&file, punch, 64 * K, 256 * K).unwrap();
    // Not on a record boundary: zeros there, the records stay data.
    fallocate(&file, punch, 5000, 4000).unwrap();
    file.sync_all().unwrap();
    let mut expected = data.clone();
    expected[64 << 10..320 << 10].fill(0);
    expected[5000..9000].fill(0);
    let check = |file: &std::fs::File, expected: &[u8], what: &str| {
        let mut read = vec![0u8; expected.len()];
        file.read_exact_at(&mut read, 0).unwrap();
        assert!(read == expected, "{what}: the contents differ");
        assert_eq!(seek(file, 0, libc::SEEK_HOLE), Ok(64 * K), "{what}");
        assert_eq!(seek(file, 64 * K, libc::SEEK_DATA), Ok(320 * K), "{what}");
    };
    check(&file, &expected, "punched");
    assert_eq!(file.metadata().unwrap().len(), 1 << 20, "the size is kept");
    let blocks_after = file.metadata().unwrap().blocks();
    assert!(
        blocks_before - blocks_after >= 400,
        "256 KiB punched gives its space back: {blocks_before} -> {blocks_after} blocks"
    );
    // Zeroing past the end grows the file; with KEEP_SIZE it does not.
    fallocate(&file, libc::FALLOC_FL_ZERO_RANGE, 1000 * K, 48 * K).unwrap();
    assert_eq!(file.metadata().unwrap().len(), 1048 * K);
    expected[1000 << 10..].fill(0);
    expected.resize(1048 << 10, 0);
    fallocate(
        &file,
        libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
        1040 * K,
        64 * K,
    )
    .unwrap();
    assert_eq!(file.metadata().unwrap().len(), 1048 * K);
    // Mode 0 grows the file (reading zeros), and refuses what cannot fit.
    fallocate(&file, 0, 2048 * K, 1024 * K).unwrap();
    assert_eq!(file.metadata().unwrap().len(), 3072 * K);
    expected.resize(3072 << 10, 0);
    assert_eq!(fallocate(&file, 0, 0, 100 << 30), Err(libc::ENOSPC));
    assert_eq!(
        fallocate(&file, libc::FALLOC_FL_COLLAPSE_RANGE, 0, 64 * K),
        Err(libc::EOPNOTSUPP)
    );
    assert_eq!(file.metadata().unwrap().len(), 3072 * K);
    file.sync_all().unwrap();
    check(&file, &expected, "zeroed and grown");
    drop(file);
    // The work follows the data, not the range: a terabyte zeroed past
    // the end grows the file at once, and a punch over it skips the holes.
    let big = read_write_new(mnt.join("big"));
    big.write_all_at(&distinct_bytes(4096, 6), 0).unwrap();
    fallocate(&big, libc::FALLOC_FL_ZERO_RANGE, 4096, 1 << 40).unwrap();
    assert_eq!(big.metadata().unwrap().len(), (1 << 40) + 4096);
    big.write_all_at(&distinct_bytes(4096, 7), 1 << 40).unwrap();
    let started = Instant::now();
    fallocate(&big, punch, 0, (1 << 40) + 4096).unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(seek(&big, 0, libc::SEEK_DATA), Err(libc::ENXIO));
    assert_eq!(big.metadata().unwrap().len(), (1 << 40) + 4096);
    drop(big);
    std::fs::remove_file(mnt.join("big")).unwrap();
    pool.stop();
    pool.serve();
    wait_mounted(&pool, &mnt);
    check(
        &std::fs::File::open(&path).unwrap(),
        &expected,
        "after a restart",
    );
    stop_and_check(&mut pool);
}

#[test]
fn a_mount_left_dead_by_a_killed_server_is_replaced_and_fsynced_data_is_there() {
    let (mut pool, mnt, _unmount) = served_filesystem("fsdead");
    let data = distinct_bytes(1 << 20, 3);
    let mut file = std::fs::File::create(mnt.join("durable.bin")).unwrap();
    file.write_all(&data).unwrap();
    file.sync_all().unwrap();
    drop(file);
    std::fs::create_dir(mnt.join("dir")).unwrap();
    std::fs::rename(mnt.join("durable.bin"), mnt.join("dir/durable.bin")).unwrap();
    std::fs::File::open(mnt.join("dir"))
        .unwrap()
        .sync_all()
        .unwrap();
    pool.kill9();
    // The kernel's mount is still there, with nobody serving it.
    let dead = std::fs::metadata(&mnt).unwrap_err().raw_os_error();
    assert!(
        matches!(dead, Some(libc::ENOTCONN | libc::ECONNABORTED)),
        "the dead mount answers {dead:?}"
    );
    pool.serve();
    wait_mounted(&pool, &mnt);
    assert!(std::fs::read(mnt.join("dir/durable.bin")).unwrap() == data);
    stop_and_check(&mut pool);
}

fn durable_txg(pool: &TestPool) -> u64 {
    pool.status_json()["durable_txg"]
        .as_u64()
        .expect("status has durable_txg")
}

/// A change of attributes alone (no data written, no object made), after
/// the pool went idle, is committed by the txg timer as any change is, and
/// survives kill -9 without an fsync once the timer has run. The timer
/// used to look at the pool's own objects only and left such a change in
/// memory until some other change came (a chmod made after an idle
/// minute was lost to a kill -9 twelve seconds later).
#[test]
fn an_attribute_change_alone_is_committed_by_the_txg_timer() {
    let (mut pool, mnt) = filesystem_pool("fsidle");
    let _unmount = Unmount(mnt.clone());
    pool.serve_with(&["-o", "txg_timeout_ms=500"]);
    wait_mounted(&pool, &mnt);
    let file = mnt.join("f");
    std::fs::write(&file, b"data").unwrap();
    let set_mode = |mode: u32| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    set_mode(0o644);
    // Idle: the durable txg has stopped moving for 3 s (six timeouts; the
    // empty txgs that release earlier frees come first).
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = durable_txg(&pool);
    let mut still_since = Instant::now();
    while still_since.elapsed() < Duration::from_secs(3) {
        assert!(Instant::now() < deadline, "the pool never went idle");
        std::thread::sleep(Duration::from_millis(200));
        let now = durable_txg(&pool);
        if now != last {
            last = now;
            still_since = Instant::now();
        }
    }
    set_mode(0o600);
    let deadline = Instant::now() + Duration::from_secs(10);
    while durable_txg(&pool) <= last {
        assert!(
            Instant::now() < deadline,
            "the chmod was not committed in 10 s (20 txg timeouts): durable txg stays {last}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    pool.kill9();
    pool.serve();
    wait_mounted(&pool, &mnt);
    let mode = std::fs::metadata(&file).unwrap().mode() & 0o7777;
    assert_eq!(mode, 0o600, "the committed chmod is there after kill -9");
    stop_and_check(&mut pool);
}

/// The test filesystem's entry in `fs list --json`.
fn loaded_objects(pool: &TestPool) -> u64 {
    listed_filesystem(pool)["loaded_objects"]
        .as_u64()
        .expect("loaded_objects")
}

/// With `fs_objects_loaded_max` far below the files a workload touches,
/// the objects in memory come back under the bound after each txg, and
/// every file dropped from memory is loaded again the same: contents,
/// names, renames, removals and links, before and after kill -9.
#[test]
fn loaded_objects_stay_bounded_and_dropped_ones_load_back_the_same() {
    let (mut pool, mnt) = filesystem_pool("fsevict");
    let _unmount = Unmount(mnt.clone());
    pool.serve_with(&["-o", "fs_objects_loaded_max=64", "-o", "txg_timeout_ms=200"]);
    wait_mounted(&pool, &mnt);
    let mut expected = std::collections::BTreeMap::new();
    for dir in 0..3 {
        std::fs::create_dir(mnt.join(format!("d{dir}"))).unwrap();
        for file in 0..400 {
            let name = format!("d{dir}/f{file}");
            // The name first: no two files hold the same bytes.
            let mut data = name.clone().into_bytes();
            data.extend(distinct_bytes(100 + file * 37, (dir * 7 + file) as u8));
            std::fs::write(mnt.join(&name), &data).unwrap();
            expected.insert(name, data);
        }
    }
    // Renames, removals and hard links over files that may have left memory.
    for file in (0..400).step_by(7) {
        let from = format!("d0/f{file}");
        let to = format!("d1/moved{file}");
        std::fs::rename(mnt.join(&from), mnt.join(&to)).unwrap();
        let data = expected.remove(&from).unwrap();
        expected.insert(to, data);
    }
    for file in (1..400).step_by(11) {
        let name = format!("d2/f{file}");
        std::fs::remove_file(mnt.join(&name)).unwrap();
        expected.remove(&name);
    }
    for file in (2..400).step_by(13) {
        let from = format!("d1/f{file}");
        let to = format!("d0/link{file}");
        std::fs::hard_link(mnt.join(&from), mnt.join(&to)).unwrap();
        let data = expected[&from].clone();
        expected.insert(to, data);
    }
    // After a few txgs with nothing in flight, memory is back under the
    // bound (plus the root and the table, which always stay).
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let loaded = loaded_objects(&pool);
        if loaded <= 64 + 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{loaded} objects still loaded with a bound of 64"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let check = |what: &str| {
        for (name, data) in &expected {
            let read = std::fs::read(mnt.join(name))
                .unwrap_or_else(|error| panic!("{what}: {name}: {error}"));
            assert!(read == *data, "{what}: {name} differs");
        }
        for dir in 0..3 {
            let mut names: Vec<String> = std::fs::read_dir(mnt.join(format!("d{dir}")))
                .unwrap()
                .map(|entry| format!("d{dir}/{}", entry.unwrap().file_name().to_string_lossy()))
                .collect();
            names.sort();
            // (A BTreeMap's keys come sorted.)
            let wanted: Vec<String> = expected
                .keys()
                .filter(|name| name.starts_with(&format!("d{dir}/")))
                .cloned()
                .collect();
            assert_eq!(names, wanted, "{what}: the names in d{dir}");
        }
    };
    check("read back after eviction");
    let link = std::fs::metadata(mnt.join("d0/link2")).unwrap();
    assert_eq!(link.nlink(), 2, "a hard link's count survives eviction");
    // Everything was committed by the timer: a kill -9 loses nothing.
    let committed = durable_txg(&pool);
    let deadline = Instant::now() + Duration::from_secs(10);
    while durable_txg(&pool) <= committed + 1 {
        assert!(Instant::now() < deadline, "no txg committed");
        std::thread::sleep(Duration::from_millis(100));
    }
    pool.kill9();
    pool.serve_with(&["-o", "fs_objects_loaded_max=64", "-o", "txg_timeout_ms=200"]);
    wait_mounted(&pool, &mnt);
    check("after kill -9");
    stop_and_check(&mut pool);
}

fn cached_data_bytes(pool: &TestPool) -> u64 {
    cache_stats(pool)["data_bytes"]
        .as_u64()
        .expect("data_bytes")
}

/// The read cache's counters (`arcstat --json`).
fn cache_stats(pool: &TestPool) -> serde_json::Value {
    let text = pool.admin(&["--json", "arcstat", &pool.name]);
    let stats: serde_json::Value = serde_json::from_str(&text).expect("arcstat JSON");
    stats["cache"].clone()
}

/// `O_DIRECT` reads keep nothing in the cache; buffered reads fill it; then
/// `O_DIRECT` reads take the blocks it holds (OpenZFS 2.3's rule) and still
/// keep nothing more.
#[test]
fn o_direct_reads_do_not_fill_the_read_cache_but_take_what_it_holds() {
    let (mut pool, mnt, _unmount) = served_filesystem("fsdirect");
    let file = mnt.join("data.bin");
    let file_arg = format!("of={}", file.display());
    tool(
        "dd",
        &[
            "if=/dev/urandom",
            &file_arg,
            "bs=1M",
            "count=16",
            "oflag=direct",
        ],
    );
    pool.admin(&["tune", &pool.name, "arc_drop", "1"]);
    let before = cached_data_bytes(&pool);
    let input = format!("if={}", file.display());
    tool("dd", &[&input, "of=/dev/null", "bs=1M", "iflag=direct"]);
    let after_direct = cached_data_bytes(&pool);
    assert!(
        after_direct < before + (1 << 20),
        "O_DIRECT reads filled the cache: {before} -> {after_direct} bytes"
    );
    tool("dd", &[&input, "of=/dev/null", "bs=1M"]);
    let after_buffered = cached_data_bytes(&pool);
    assert!(
        after_buffered >= after_direct + (8 << 20),
        "buffered reads did not fill the cache: {after_direct} -> {after_buffered} bytes"
    );
    let hits = |pool: &TestPool| cache_stats(pool)["demand_data"]["hits"].as_u64().unwrap();
    let before_hits = hits(&pool);
    tool("dd", &[&input, "of=/dev/null", "bs=1M", "iflag=direct"]);
    // 16 MiB in 128 KiB records: 128 blocks, most of them cached.
    let taken = hits(&pool) - before_hits;
    assert!(
        taken >= 64,
        "O_DIRECT reads took {taken} blocks from the cache"
    );
    assert!(
        cached_data_bytes(&pool) <= after_buffered,
        "O_DIRECT reads added to the cache"
    );
    stop_and_check(&mut pool);
}

/// `open(O_TMPFILE)` in directory `dir` with `flags` (`O_RDWR`...): the
/// file it makes, with no name.
fn open_tmpfile(dir: &Path, flags: i32) -> std::fs::File {
    use std::os::fd::FromRawFd;
    let path = std::ffi::CString::new(dir.display().to_string()).unwrap();
    // SAFETY: a NUL-terminated path; the descriptor returned is owned here.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_TMPFILE | flags, 0o640) };
    assert!(fd >= 0, "O_TMPFILE: {}", std::io::Error::last_os_error());
    // SAFETY: `fd` was just opened and nothing else owns it.
    unsafe { std::fs::File::from_raw_fd(fd) }
}

/// `linkat(file, "", AT_FDCWD, to, AT_EMPTY_PATH)`: names an `O_TMPFILE`
/// file; the errno when refused.
fn link_tmpfile(file: &std::fs::File, to: &Path) -> Result<(), i32> {
    use std::os::fd::AsRawFd;
    let to = std::ffi::CString::new(to.display().to_string()).unwrap();
    // SAFETY: an open descriptor, an empty and a NUL-terminated path.
    let result = unsafe {
        libc::linkat(
            file.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::AT_EMPTY_PATH,
        )
    };
    if result == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    }
}

/// `open(O_TMPFILE)` makes a file with no name: `linkat` names it (not
/// one opened with `O_EXCL`, as the kernel rules), one closed unnamed is
/// gone, and one a crash caught unnamed is freed at the next import
/// (`check` finds no leak). Every file has a birth time (`statx`).
#[test]
fn tmpfiles_are_named_by_linkat_or_go_and_files_have_birth_times() {
    let (mut pool, mnt, _unmount) = served_filesystem("fstmp");
    let started = std::time::SystemTime::now() - Duration::from_secs(2);
    let data = distinct_bytes(3 << 20, 4);
    let mut file = open_tmpfile(&mnt, libc::O_RDWR);
    file.write_all(&data).unwrap();
    assert_eq!(file.metadata().unwrap().nlink(), 0);
    let names = |mnt: &Path| std::fs::read_dir(mnt).unwrap().count();
    assert_eq!(names(&mnt), 0, "an O_TMPFILE file has no name");
    link_tmpfile(&file, &mnt.join("named")).unwrap();
    drop(file);
    let named = mnt.join("named");
    assert!(std::fs::read(&named).unwrap() == data);
    let metadata = std::fs::metadata(&named).unwrap();
    assert_eq!((metadata.nlink(), metadata.mode() & 0o777), (1, 0o640));
    let born = metadata.created().expect("statx gives the birth time");
    assert!(
        born >= started && born <= std::time::SystemTime::now(),
        "{born:?}"
    );
    // O_EXCL: never to be named.
    let excl = open_tmpfile(&mnt, libc::O_RDWR | libc::O_EXCL);
    assert_eq!(link_tmpfile(&excl, &mnt.join("never")), Err(libc::ENOENT));
    drop(excl);
    // Closed unnamed, or caught unnamed by a crash: gone.
    let mut unnamed = open_tmpfile(&mnt, libc::O_WRONLY);
    unnamed.write_all(&data).unwrap();
    drop(unnamed);
    let mut crashed = open_tmpfile(&mnt, libc::O_WRONLY);
    crashed.write_all(&data).unwrap();
    crashed.sync_all().unwrap();
    pool.kill9();
    drop(crashed);
    pool.serve();
    wait_mounted(&pool, &mnt);
    assert_eq!(names(&mnt), 1);
    assert!(std::fs::read(&named).unwrap() == data);
    assert_check_clean(&pool);
    stop_and_check(&mut pool);
}

#[test]
fn a_file_removed_while_open_lives_until_closed_and_a_crash_frees_it() {
    let (mut pool, mnt, _unmount) = served_filesystem("fsunlinked");
    assert_eq!(fs_objects(&pool), 1, "the root directory alone");
    let data = distinct_bytes(1 << 20, 5);
    let file = read_write_new(mnt.join("open.bin"));
    file.write_all_at(&data, 0).unwrap();
    std::fs::remove_file(mnt.join("open.bin")).unwrap();
    assert!(!mnt.join("open.bin").exists());
    // Still readable and writable through the handle, with no links.
    file.write_all_at(b"more", 1 << 20).unwrap();
    let mut back = vec![0u8; 1 << 20];
    file.read_exact_at(&mut back, 0).unwrap();
    assert!(back == data, "the open file's data changed");
    assert_eq!(file.metadata().unwrap().nlink(), 0);
    assert_eq!(fs_objects(&pool), 2, "freed while open");
    drop(file);
    // The kernel releases the handle after close: then it is freed.
    wait_objects(&pool, 1);
    // Left open by a server that dies: the next import frees it.
    let file = std::fs::File::create(mnt.join("orphan.bin")).unwrap();
    file.write_all_at(&data, 0).unwrap();
    std::fs::remove_file(mnt.join("orphan.bin")).unwrap();
    std::fs::File::open(&mnt).unwrap().sync_all().unwrap();
    pool.kill9();
    drop(file);
    pool.serve();
    wait_mounted(&pool, &mnt);
    assert_eq!(fs_objects(&pool), 1, "the orphan was not freed at import");
    assert!(
        pool.log().contains("freed 1 objects removed while in use"),
        "{}",
        pool.log()
    );
    stop_and_check(&mut pool);
}

#[test]
fn a_removed_file_or_directory_the_kernel_holds_answers_until_it_is_forgotten() {
    use std::os::unix::fs::OpenOptionsExt;
    let (mut pool, mnt, _unmount) = served_filesystem("fsforget");
    assert_eq!(fs_objects(&pool), 1, "the root directory alone");
    // An `O_PATH` descriptor holds the kernel's node but opens no handle.
    std::fs::write(mnt.join("path.bin"), b"hello").unwrap();
    let path_only = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH)
        .open(mnt.join("path.bin"))
        .unwrap();
    std::fs::remove_file(mnt.join("path.bin")).unwrap();
    let attributes = path_only
        .metadata()
        .expect("fstat of a removed file the kernel holds");
    assert_eq!((attributes.nlink(), attributes.len()), (0, 5));
    // A directory removed while a process works in it.
    std::fs::create_dir(mnt.join("gone")).unwrap();
    let inside = run_in(
        &mnt.join("gone"),
        "sh",
        &[
            "-c",
            "rmdir ../gone && stat -c %h . && ls -A . && ! touch new 2>/dev/null && echo refused",
        ],
    );
    assert_eq!(inside, "0\nrefused\n", "in the removed directory");
    assert!(!mnt.join("gone").exists());
    // The directory goes once the shell is gone; the file stays.
    wait_objects(&pool, 2);
    assert_eq!(path_only.metadata().unwrap().len(), 5);
    // The kernel forgets the file once the descriptor closes: it is freed.
    drop(path_only);
    wait_objects(&pool, 1);
    // A directory removed while a process works in it, when the server
    // dies: the next import frees it.
    std::fs::create_dir(mnt.join("held")).unwrap();
    let mut sleeper = std::process::Command::new("sleep")
        .arg("60")
        .current_dir(mnt.join("held"))
        .spawn()
        .unwrap();
    std::fs::remove_dir(mnt.join("held")).unwrap();
    std::fs::File::open(&mnt).unwrap().sync_all().unwrap();
    assert_eq!(fs_objects(&pool), 2, "the held directory was freed");
    pool.kill9();
    sleeper.kill().unwrap();
    sleeper.wait().unwrap();
    pool.serve();
    wait_mounted(&pool, &mnt);
    assert_eq!(
        fs_objects(&pool),
        1,
        "the removed directory was not freed at import"
    );
    assert!(
        pool.log().contains("freed 1 objects removed while in use"),
        "{}",
        pool.log()
    );
    stop_and_check(&mut pool);
}

/// `program` with `args` in directory `cwd`; panics with its output unless
/// it succeeds.
fn run_in(cwd: &Path, program: &str, args: &[&str]) -> String {
    let output = std::process::Command::new(program)
        .args(args)
        .current_dir(cwd)
        .output()
        .unwrap_or_else(|error| panic!("{program}: {error}"));
    assert!(
        output.status.success(),
        "{program} {args:?}: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).to_string()
}

#[test]
fn sqlite_commits_survive_kill_9_and_git_works() {
    let (mut pool, mnt, _unmount) = served_filesystem("fsapps");
    // 200 transactions, each committed; the server is killed the moment the
    // last one returns. In its default rollback-journal mode sqlite's commit
    // point is the journal's deletion, which it makes durable (a directory
    // fsync) only with `synchronous=EXTRA`: with FULL a power cut may roll
    // the last transaction back, on any filesystem.
    let db = mnt.join("db.sqlite").display().to_string();
    run_in(
        &mnt,
        "sqlite3",
        &[&db, "create table t(id integer primary key, v text);"],
    );
    let mut script = String::from("pragma synchronous=extra;\n");
    for index in 0..200 {
        script.push_str(&format!(
            "begin; insert into t(v) values ('row {index}'); commit;\n"
        ));
    }
    let before = fs_log_stats(&pool);
    let mut child = std::process::Command::new("sqlite3")
        .arg(&db)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    assert!(child.wait().unwrap().success());
    // Each transaction creates, writes and deletes its journal, and fsyncs
    // the file and the directory: all through the intent log (at most the
    // first fsync, before the chain's head is durable, commits a txg).
    let after = fs_log_stats(&pool);
    assert!(
        after.0 - before.0 >= 400 && after.1 - before.1 <= 1,
        "log commits and txg fallbacks {before:?} -> {after:?}"
    );
    pool.kill9();
    pool.serve();
    wait_mounted(&pool, &mnt);
    let check = run_in(
        &mnt,
        "sqlite3",
        &[
            &db,
            "pragma integrity_check; select count(*), max(id) from t;",
        ],
    );
    assert_eq!(check.trim(), "ok\n200|200", "after kill -9");
    // git: a repository of real files, a commit, gc, fsck.
    let repo = mnt.join("repo");
    std::fs::create_dir(&repo).unwrap();
    run_in(&repo, "git", &["init", "-q"]);
    let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs");
    for entry in std::fs::read_dir(&docs).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, repo.join(path.file_name().unwrap())).unwrap();
    }
    run_in(&repo, "git", &["add", "-A"]);
    run_in(
        &repo,
        "git",
        &[
            "-c",
            "user.email=t@example.com",
            "-c",
            "user.name=t",
            "commit",
            "-qm",
            "docs",
        ],
    );
    run_in(&repo, "git", &["gc", "-q"]);
    run_in(&repo, "git", &["fsck", "--strict"]);
    stop_and_check(&mut pool);
}

#[test]
fn pjdfstest_passes_on_a_mounted_filesystem() {
    // A short mountpoint: pjdfstest binds unix sockets by path, and a
    // socket's path is limited to 108 bytes.
    let pool = TestPool::new("fspjd");
    let short = PathBuf::from(format!("/tmp/ironpool-pjd.{}", std::process::id()));
    let (mut pool, mnt) = filesystem_pool_at(pool, short);
    // With POSIX ACLs on: the kernel checks them, and leaves the umask to
    // the server (pjdfstest's creations check it). And with the kernel's
    // writeback cache: the kernel keeps a file's mtime and ctime then.
    let fs = format!("{}/fs", pool.name);
    pool.ok(&["set", "acltype=posix", &fs, "-d", &dir(&pool)]);
    pool.ok(&["set", "writebackcache=on", &fs, "-d", &dir(&pool)]);
    // A second filesystem of the pool, for the tests that link and rename
    // across filesystems (EXDEV); the whole suite runs on it too, with
    // ACLs and without the writeback cache (the default).
    let secondary = PathBuf::from(format!("/tmp/ironpool-pjd2.{}", std::process::id()));
    create_filesystem(&pool, "other", &secondary, &["acltype=posix"]);
    let _unmount = Unmount(mnt.clone());
    let _unmount_secondary = Unmount(secondary.clone());
    pool.serve();
    wait_mounted(&pool, &mnt);
    wait_mounted(&pool, &secondary);
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/pjdfstest/pjdfstest.toml");
    let work = mnt.join("pjd");
    std::fs::create_dir(&work).unwrap();
    let work_secondary = secondary.join("pjd");
    std::fs::create_dir(&work_secondary).unwrap();
    // Runs pjdfstest with `config` in `work` (with `other` as the second
    // filesystem) on the tests `patterns` name (all if none); requires
    // that none fails and returns (summary, skipped).
    let run_in = |work: &Path, other: &Path, config: &Path, patterns: &[&str]| -> (String, usize) {
        let output = std::process::Command::new("pjdfstest")
            .arg("-c")
            .arg(config)
            .arg("-p")
            .arg(work)
            .arg("-s")
            .arg(other)
            .args(patterns)
            .current_dir(work)
            .output()
            .expect("pjdfstest (scripts/deps.sh installs it)");
        let text = String::from_utf8_lossy(&output.stdout);
        let summary = text
            .lines()
            .find(|line| line.starts_with("Summary:"))
            .unwrap_or_else(|| {
                panic!(
                    "no summary: {text}{}",
                    String::from_utf8_lossy(&output.stderr)
                )
            })
            .to_string();
        let failures: Vec<&str> = text
            .lines()
            .filter(|line| line.trim_end().ends_with("FAILED"))
            .collect();
        assert!(
            output.status.success() && summary.starts_with("Summary: 0 failed"),
            "{summary}\n{}",
            failures.join("\n")
        );
        let skipped = text
            .lines()
            .filter(|line| line.trim_end().ends_with("skipped"))
            .count();
        (summary, skipped)
    };
    let run = |config: &Path, patterns: &[&str]| run_in(&work, &secondary, config, patterns);
    // Everything but the read-only tests, which skip without remounts:
    // the skips are those and the ones tests/pjdfstest/README.md lists.
    // On both filesystems: with and without the writeback cache.
    let (summary, skipped) = run(&config, &[]);
    assert!(skipped <= 14, "{skipped} tests skipped: {summary}");
    let (summary, skipped) = run_in(&work_secondary, &work, &config, &[]);
    assert!(
        skipped <= 14,
        "{skipped} tests skipped without the writeback cache: {summary}"
    );
    // The read-only tests on their own, with remounts allowed: they
    // remount the filesystem read-only, which the kernel refuses while
    // a file is open for writing or an unlinked inode is still held, as
    // the full run leaves them for a moment.
    let remounting = pool.path("pjdfstest-remount.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &remounting,
        text.replace("[settings]\n", "[settings]\nallow_remount = true\n"),
    )
    .unwrap();
    let (summary, skipped) = run(&remounting, &["erofs"]);
    assert!(
        skipped == 0 && summary.contains(" 13 passed"),
        "{skipped} skipped: {summary}"
    );
    // The read-only tests remounted the filesystem read-only and back:
    // it takes writes again.
    std::fs::write(work.join("after"), b"writable").unwrap();
    stop_and_check(&mut pool);
    let _ = std::fs::remove_dir(&mnt);
    let _ = std::fs::remove_dir(&secondary);
}

#[test]
fn extended_attributes_are_kept_replaced_removed_and_bounded() {
    let (mut pool, mnt, _unmount) = served_filesystem("fsxattr");
    let file = mnt.join("tagged");
    std::fs::write(&file, b"data").unwrap();
    let dir = mnt.join("dir");
    std::fs::create_dir(&dir).unwrap();

    assert_eq!(list_xattrs(&file).unwrap(), Vec::<String>::new());
    assert_eq!(get_xattr(&file, "user.none"), Err(libc::ENODATA));
    set_xattr(&file, "user.mime_type", b"text/plain", 0).unwrap();
    let big = distinct_bytes(60_000, 9);
    set_xattr(&file, "user.big", &big, 0).unwrap();
    set_xattr(&file, "user.empty", b"", 0).unwrap();
    set_xattr(&dir, "user.on_a_directory", b"yes", 0).unwrap();
    assert_eq!(get_xattr(&file, "user.mime_type").unwrap(), b"text/plain");
    assert!(get_xattr(&file, "user.big").unwrap() == big);
    assert_eq!(get_xattr(&file, "user.empty").unwrap(), b"");
    assert_eq!(
        list_xattrs(&file).unwrap(),
        ["user.big", "user.empty", "user.mime_type"]
    );
    // setxattr's flags.
    assert_eq!(
        set_xattr(&file, "user.mime_type", b"x", libc::XATTR_CREATE),
        Err(libc::EEXIST)
    );
    assert_eq!(
        set_xattr(&file, "user.absent", b"x", libc::XATTR_REPLACE),
        Err(libc::ENODATA)
    );
    set_xattr(&file, "user.mime_type", b"text/x-rust", libc::XATTR_REPLACE).unwrap();
    // A third large value would pass the 128 KiB a file's list may hold.
    assert_eq!(set_xattr(&file, "user.big2", &big, 0), Ok(()));
    assert_eq!(set_xattr(&file, "user.big3", &big, 0), Err(libc::ENOSPC));
    remove_xattr(&file, "user.big2").unwrap();
    assert_eq!(remove_xattr(&file, "user.big2"), Err(libc::ENODATA));

    // Kept across a restart.
    pool.stop();
    pool.serve();
    wait_mounted(&pool, &mnt);
    assert_eq!(get_xattr(&file, "user.mime_type").unwrap(), b"text/x-rust");
    assert!(get_xattr(&file, "user.big").unwrap() == big);
    assert_eq!(get_xattr(&dir, "user.on_a_directory").unwrap(), b"yes");

    // xattr=off: none are served (they stay on disk).
    let target = format!("{}/fs", pool.name);
    pool.admin(&["set", "xattr=off", &target]);
    assert_eq!(
        pool.property(&target, "xattr"),
        ("off".into(), "local".into())
    );
    assert_eq!(get_xattr(&file, "user.mime_type"), Err(libc::EOPNOTSUPP));
    assert_eq!(set_xattr(&file, "user.x", b"x", 0), Err(libc::EOPNOTSUPP));
    pool.admin(&["inherit", "xattr", &target]);
    assert_eq!(
        pool.property(&target, "xattr"),
        ("on".into(), "default".into())
    );
    assert_eq!(get_xattr(&file, "user.mime_type").unwrap(), b"text/x-rust");

    // Removing every attribute, and a file with attributes, frees their
    // space: check finds every block accounted for.
    for name in list_xattrs(&dir).unwrap() {
        remove_xattr(&dir, &name).unwrap();
    }
    assert_eq!(list_xattrs(&dir).unwrap(), Vec::<String>::new());
    std::fs::remove_file(&file).unwrap();
    assert_check_clean(&pool);
    stop_and_check(&mut pool);
}

#[test]
fn extended_attributes_fsynced_go_through_the_intent_log_and_survive_kill_9() {
    let (mut pool, mnt, _unmount) = served_filesystem("fsxlog");
    let file = mnt.join("tagged");
    std::fs::write(&file, b"data").unwrap();
    let dir = mnt.join("dir");
    std::fs::create_dir(&dir).unwrap();
    let fsync = |path: &Path| std::fs::File::open(path).unwrap().sync_all().unwrap();
    // The first fsync after a start goes through a txg (the chain's head).
    fsync(&mnt);
    let before = fs_log_stats(&pool);
    for round in 0..20u8 {
        set_xattr(&file, &format!("user.n{round}"), &[round; 100], 0).unwrap();
        set_xattr(&dir, "user.round", &[round], 0).unwrap();
        fsync(&file);
        fsync(&dir);
    }
    remove_xattr(&file, "user.n7").unwrap();
    fsync(&file);
    let after = fs_log_stats(&pool);
    assert!(
        after.0 >= before.0 + 20,
        "fsyncs after changes of extended attributes: log commits {before:?} -> {after:?}"
    );
    assert_eq!(
        after.1, before.1,
        "fsyncs after changes of extended attributes went through txgs"
    );
    // A list past what a log record carries (32 KiB) goes through a txg.
    let big = distinct_bytes(40_000, 3);
    set_xattr(&file, "user.big", &big, 0).unwrap();
    fsync(&file);
    assert_eq!(
        fs_log_stats(&pool).1,
        after.1 + 1,
        "a 40 KB list was logged"
    );
    pool.kill9();
    pool.serve();
    wait_mounted(&pool, &mnt);
    for round in 0..20u8 {
        let got = get_xattr(&file, &format!("user.n{round}"));
        if round == 7 {
            assert_eq!(got, Err(libc::ENODATA), "removed before the crash");
        } else {
            assert_eq!(got.unwrap(), [round; 100], "user.n{round} after the crash");
        }
    }
    assert_eq!(get_xattr(&dir, "user.round").unwrap(), [19]);
    assert!(get_xattr(&file, "user.big").unwrap() == big);
    assert_check_clean(&pool);
    stop_and_check(&mut pool);
}

/// The permission bits of `path` from `statx` asked for the mode alone
/// (so a FUSE mount answers from the kernel's cache when it holds it).
fn statx_mode(path: &Path) -> u32 {
    let path = std::ffi::CString::new(path.display().to_string()).unwrap();
    // SAFETY: all zeros is a valid `struct statx`.
    let mut out: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a statx buffer of the right type.
    let done = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            path.as_ptr(),
            libc::AT_STATX_SYNC_AS_STAT,
            libc::STATX_MODE,
            &mut out,
        )
    };
    assert_eq!(done, 0, "statx: {}", std::io::Error::last_os_error());
    u32::from(out.stx_mode) & 0o7777
}

/// Runs `sh -c script` as root without `CAP_FSETID` (as a user's writes
/// are: the kernel then asks the server to drop set-id bits).
fn without_fsetid(script: &str) {
    let status = std::process::Command::new("setpriv")
        .args(["--bounding-set=-fsetid", "sh", "-c", script])
        .status()
        .expect("setpriv (util-linux)");
    assert!(status.success(), "{script}: {status}");
}

#[test]
fn writes_truncates_and_chown_drop_set_id_bits_and_capabilities() {
    // The server asks for FUSE_HANDLE_KILLPRIV_V2 (so the kernel does not
    // ask for security.capability before every buffered write): dropping
    // set-user-id, set-group-id and capabilities is then its job, by
    // Linux's rules, and the kernel's cached mode must follow at once.
    use std::os::unix::fs::PermissionsExt;
    let (mut pool, mnt, _unmount) = served_filesystem("fskillpriv");
    let file = mnt.join("set-id");
    std::fs::write(&file, b"data").unwrap();
    let path = file.display().to_string();
    let mode = || std::fs::metadata(&file).unwrap().mode() & 0o7777;
    let chmod =
        |mode: u32| std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
    let append = || {
        let mut out = std::fs::OpenOptions::new()
            .append(true)
            .open(&file)
            .unwrap();
        out.write_all(b"more").unwrap();
    };

    chmod(0o6777);
    without_fsetid(&format!("printf x >> {path}"));
    // Asked alone, the mode comes from the kernel's cache: the server
    // told the kernel it changed.
    assert_eq!(statx_mode(&file), 0o777, "the kernel's cached mode");
    assert_eq!(mode(), 0o777, "a write without CAP_FSETID drops both bits");
    chmod(0o6777);
    append();
    assert_eq!(mode(), 0o6777, "a write with CAP_FSETID keeps them");
    // Without group execute, set-group-id marks mandatory locking: kept.
    chmod(0o6767);
    without_fsetid(&format!("printf x >> {path}"));
    assert_eq!(mode(), 0o2767);
    chmod(0o6777);
    without_fsetid(&format!("truncate -s 1 {path}"));
    assert_eq!(mode(), 0o777, "a truncate without CAP_FSETID drops both");
    chmod(0o6777);
    std::os::unix::fs::chown(&file, Some(1), Some(1)).unwrap();
    assert_eq!(mode(), 0o777, "a chown drops both, even by root");

    // A capability goes with any write, truncate or chown; other
    // attributes stay.
    std::os::unix::fs::chown(&file, Some(0), Some(0)).unwrap();
    // struct vfs_cap_data, revision 2: effective, CAP_NET_BIND_SERVICE.
    let mut capability = Vec::new();
    for word in [0x0200_0001u32, 1 << 10, 0, 0, 0] {
        capability.extend_from_slice(&word.to_le_bytes());
    }
    set_xattr(&file, "user.kept", b"yes", 0).unwrap();
    let capable = || set_xattr(&file, "security.capability", &capability, 0).unwrap();
    capable();
    assert_eq!(
        list_xattrs(&file).unwrap(),
        ["security.capability", "user.kept"]
    );
    append();
    assert_eq!(list_xattrs(&file).unwrap(), ["user.kept"], "after a write");
    capable();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .unwrap()
        .set_len(2)
        .unwrap();
    assert_eq!(
        list_xattrs(&file).unwrap(),
        ["user.kept"],
        "after a truncate"
    );
    capable();
    std::os::unix::fs::chown(&file, Some(2), Some(2)).unwrap();
    assert_eq!(list_xattrs(&file).unwrap(), ["user.kept"], "after a chown");

    // What the server changed is what a restart finds.
    chmod(0o6777);
    without_fsetid(&format!("printf x >> {path}"));
    pool.stop();
    pool.serve();
    wait_mounted(&pool, &mnt);
    assert_eq!(mode(), 0o777);
    stop_and_check(&mut pool);
}

#[test]
fn filesystem_properties_mounts_listing_and_destroy() {
    let (mut pool, mnt, _unmount) = served_filesystem("fsprops");
    let target = format!("{}/fs", pool.name);

    assert_eq!(pool.property(&target, "type").0, "filesystem");
    assert_eq!(
        pool.property(&target, "recordsize"),
        ("16384".into(), "local".into())
    );
    assert_eq!(pool.property(&target, "mounted").0, "yes");
    assert_eq!(
        pool.property(&target, "compression"),
        ("off".into(), "default".into())
    );
    pool.admin(&["set", "compression=lz4", &pool.name]);
    assert_eq!(
        pool.property(&target, "compression"),
        ("lz4".into(), format!("inherited from {}", pool.name))
    );
    let refused = pool.fails(&[
        "--control",
        &pool.control().display().to_string(),
        "set",
        "volsize=1G",
        &target,
    ]);
    assert!(refused.contains("volume property"), "{refused}");
    let refused = pool.fails(&[
        "--control",
        &pool.control().display().to_string(),
        "set",
        "recordsize=3K",
        &target,
    ]);
    assert!(refused.contains("power of two"), "{refused}");

    // recordsize applies to files that grow past one block afterwards.
    let data = distinct_bytes(1 << 20, 4);
    std::fs::write(mnt.join("old"), &data).unwrap();
    pool.admin(&["set", "recordsize=64K", &target]);
    std::fs::write(mnt.join("new"), &data).unwrap();
    assert_eq!(std::fs::metadata(mnt.join("old")).unwrap().blksize(), 16384);
    assert_eq!(std::fs::metadata(mnt.join("new")).unwrap().blksize(), 65536);
    assert!(std::fs::read(mnt.join("old")).unwrap() == data);
    // lz4 (inherited) shrinks them; their logical size is all there.
    let logical: u64 = pool.property(&target, "logicalused").0.parse().unwrap();
    let used: u64 = pool.property(&target, "used").0.parse().unwrap();
    assert!(
        logical >= 2 << 20,
        "logicalused {logical} for 2 MiB of files"
    );
    assert!(
        used > 0 && used <= logical,
        "used {used}, logicalused {logical}"
    );

    // atime: a read after a write moves the access time (relatime); with
    // atime=off it stays.
    let accessed = |path: &Path| {
        let meta = std::fs::metadata(path).unwrap();
        (
            meta.atime(),
            meta.atime_nsec(),
            meta.mtime(),
            meta.mtime_nsec(),
        )
    };
    let file = mnt.join("new");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        std::fs::read(&file).unwrap();
        let (atime, atime_ns, mtime, mtime_ns) = accessed(&file);
        if (atime, atime_ns) > (mtime, mtime_ns) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a read did not move the access time"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(mount_options(&mnt).contains(&"relatime".to_string()));
    pool.admin(&["set", "atime=off", &target]);
    wait_mount_option(&mnt, "noatime");
    std::fs::OpenOptions::new()
        .append(true)
        .open(&file)
        .unwrap()
        .write_all(b"more")
        .unwrap();
    std::thread::sleep(Duration::from_millis(1100));
    std::fs::read(&file).unwrap();
    std::thread::sleep(Duration::from_millis(1100));
    let (atime, atime_ns, mtime, mtime_ns) = accessed(&file);
    assert!(
        (atime, atime_ns) < (mtime, mtime_ns),
        "atime=off: a read moved the access time"
    );

    // readonly=on makes the mount read-only (the kernel refuses writes
    // before they reach the server), and back.
    pool.admin(&["set", "readonly=on", &target]);
    wait_mount_option(&mnt, "ro");
    let refused = std::fs::write(mnt.join("refused"), b"x").unwrap_err();
    assert_eq!(refused.raw_os_error(), Some(libc::EROFS));
    pool.admin(&["inherit", "readonly", &target]);
    pool.admin(&["inherit", "atime", &target]);
    wait_mount_option(&mnt, "rw");
    wait_mount_option(&mnt, "relatime");
    std::fs::write(mnt.join("accepted"), b"x").unwrap();
    std::fs::remove_file(mnt.join("accepted")).unwrap();

    // unmount and mount.
    pool.admin(&["unmount", &target]);
    assert!(!mounted(&mnt));
    assert_eq!(pool.property(&target, "mounted").0, "no");
    let out = pool.admin(&["mount", &target]);
    assert!(out.contains(&mnt.display().to_string()), "{out}");
    assert!(mounted(&mnt));
    assert!(std::fs::read(mnt.join("old")).unwrap() == data);

    // A new mountpoint moves the mount.
    let moved = pool.path("moved");
    let _unmount_moved = Unmount(moved.clone());
    pool.admin(&["set", &format!("mountpoint={}", moved.display()), &target]);
    wait_mounted(&pool, &moved);
    wait_unmounted(&mnt, "still mounted at the old mountpoint");
    assert!(std::fs::read(moved.join("old")).unwrap() == data);

    // Listed with volumes; destroyed by the generic destroy.
    pool.admin(&["volume", "create", &format!("{}/vol", pool.name), "64M"]);
    let listed = pool.admin(&["list", "-t", "all", &pool.name]);
    assert!(
        listed.contains(&target) && listed.contains(&moved.display().to_string()),
        "{listed}"
    );
    assert!(listed.contains(&format!("{}/vol", pool.name)), "{listed}");
    let only: serde_json::Value =
        serde_json::from_str(&pool.admin(&["--json", "list", "-t", "filesystem", &pool.name]))
            .unwrap();
    assert_eq!(only["datasets"].as_array().map(Vec::len), Some(1), "{only}");
    let out = pool.admin(&["destroy", &target]);
    assert!(out.contains("destroyed filesystem"), "{out}");
    wait_unmounted(&moved, "a destroyed filesystem stays mounted");
    let listed = pool.admin(&["list", "-t", "filesystem", &pool.name]);
    assert!(!listed.contains(&target), "{listed}");
    stop_and_check(&mut pool);
}

/// Every entry under `root`, sorted: its path, type, permissions, mtime and
/// the BLAKE3 of its contents (a link: its target).
fn digest(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let content = if meta.file_type().is_dir() {
                stack.push(path.clone());
                "dir".to_string()
            } else if meta.file_type().is_symlink() {
                format!("-> {}", std::fs::read_link(&path).unwrap().display())
            } else {
                let bytes = std::fs::read(&path).unwrap();
                let sum = ironpool::format::ChecksumAlgo::Blake3.compute(&bytes);
                format!("{} bytes {sum:?}", bytes.len())
            };
            out.push(format!(
                "{} {:o} {}.{} {content}",
                path.strip_prefix(root).unwrap().display(),
                meta.mode(),
                meta.mtime(),
                meta.mtime_nsec()
            ));
        }
    }
    out.sort();
    out
}

/// Fails naming the first entries that differ.
fn assert_same(copy: &[String], original: &[String], what: &str) {
    let differ: Vec<(&String, &String)> = copy
        .iter()
        .zip(original)
        .filter(|(a, b)| a != b)
        .take(5)
        .collect();
    assert!(
        copy.len() == original.len() && differ.is_empty(),
        "{what}: {} entries against {}; first differences (copy, original): {differ:#?}",
        copy.len(),
        original.len()
    );
}

#[test]
fn thousands_of_real_files_copied_in_are_the_same_before_and_after_a_restart() {
    let sources: Vec<&Path> = ["/usr/share/doc", "/usr/lib/python3"]
        .iter()
        .map(Path::new)
        .filter(|path| path.is_dir())
        .collect();
    let before: Vec<Vec<String>> = sources.iter().map(|source| digest(source)).collect();
    let entries: usize = before.iter().map(Vec::len).sum();
    assert!(entries > 2000, "only {entries} files to copy: {sources:?}");
    let (mut pool, mnt, _unmount) = served_filesystem("fstree");
    for (index, source) in sources.iter().enumerate() {
        let copy = mnt.join(format!("tree{index}"));
        let status = std::process::Command::new("cp")
            .arg("-a")
            .arg(source)
            .arg(&copy)
            .status()
            .unwrap();
        assert!(status.success(), "cp -a {} failed", source.display());
        assert_same(
            &digest(&copy),
            &before[index],
            &format!("{} copied", source.display()),
        );
    }
    pool.stop();
    pool.serve();
    wait_mounted(&pool, &mnt);
    for (index, source) in sources.iter().enumerate() {
        let copy = mnt.join(format!("tree{index}"));
        assert_same(
            &digest(&copy),
            &before[index],
            &format!("{} after a restart", source.display()),
        );
    }
    stop_and_check(&mut pool);
}

/// Random buffered, `O_DIRECT` and mapped I/O with truncates and
/// `copy_file_range` (`tests/scripts/fsx.py`, after xfstests' fsx), several
/// files at once on filesystems of 4K, 16K and 128K compressed records,
/// one with `direct=always` and one with the kernel's writeback cache
/// (`writebackcache=on`): every read agrees with the script's model of
/// the file, and so does every snapshot taken between two operations, read
/// under `.zfs/snapshot`; after kill -9 and a new `serve`, every file
/// (fsynced at its end) holds the model's bytes, and the pool checks clean.
#[test]
fn random_buffered_direct_and_mapped_io_agrees_with_a_model_and_survives_kill_9() {
    /// Operations per file: a few seconds each, thousands of requests.
    const OPS: &str = "2000";
    /// Bytes a file may grow to: hundreds of records of every size here.
    const MAX_BYTES: &str = "6291456";
    const FILES_PER_FILESYSTEM: u64 = 2;
    let (mut pool, mnt) = filesystem_pool("fsx");
    let others = [
        ("fs4", vec!["recordsize=4K"]),
        ("fsz", vec!["compression=lz4"]),
        ("fsd", vec!["recordsize=8K", "direct=always"]),
        ("fswb", vec!["writebackcache=on"]),
    ];
    let mut mounts = vec![(mnt, format!("{}/fs", pool.name))];
    for (name, properties) in &others {
        let mountpoint = pool.path(&format!("mnt-{name}"));
        create_filesystem(&pool, name, &mountpoint, properties);
        mounts.push((mountpoint, format!("{}/{name}", pool.name)));
    }
    let _unmount: Vec<Unmount> = mounts
        .iter()
        .map(|(path, _)| Unmount(path.clone()))
        .collect();
    pool.serve();
    for (mount, _) in &mounts {
        wait_mounted(&pool, mount);
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/scripts/fsx.py");
    let control = pool.control();
    let runs: Vec<(PathBuf, std::process::Child)> = mounts
        .iter()
        .flat_map(|mount| (0..FILES_PER_FILESYSTEM).map(move |index| (mount, index)))
        .enumerate()
        .map(|(seed, ((mount, dataset), index))| {
            let file = mount.join(format!("fsx{index}"));
            let child = std::process::Command::new("/usr/bin/python3")
                .arg(script)
                .arg(&file)
                .arg(seed.to_string())
                .args([OPS, MAX_BYTES])
                .arg(ironpool_binary())
                .arg(&control)
                .arg(dataset)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("run tests/scripts/fsx.py with python3");
            (file, child)
        })
        .collect();
    let mut digests = Vec::new();
    for (file, child) in runs {
        let output = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout).to_string();
        assert!(
            output.status.success(),
            "{}: {stdout}{}",
            file.display(),
            String::from_utf8_lossy(&output.stderr)
        );
        let digest = stdout
            .split_whitespace()
            .nth(3)
            .unwrap_or_else(|| panic!("{}: no digest in {stdout:?}", file.display()))
            .to_string();
        digests.push((file, digest));
    }
    pool.kill9();
    pool.serve();
    for (mount, _) in &mounts {
        wait_mounted(&pool, mount);
    }
    for (file, digest) in &digests {
        let path = file.display().to_string();
        let after = tool("sha256sum", &[&path]);
        assert_eq!(
            after.split_whitespace().next(),
            Some(digest.as_str()),
            "{path} after kill -9 and a new serve"
        );
    }
    stop_and_check(&mut pool);
}

/// Writes 1 MiB pieces of distinct bytes to `path` until the filesystem
/// refuses one with ENOSPC (any other error fails), each made durable
/// with `fdatasync` when `sync_each`; then `fdatasync` must succeed: every
/// write that returned was stored. Returns the bytes written.
fn fill_until_enospc(path: &Path, sync_each: bool) -> u64 {
    fill_until_refused(path, sync_each, libc::ENOSPC)
}

/// [`fill_until_enospc`] for the error `errno` (ENOSPC, or EDQUOT at a
/// quota): appends to `path`, and checks that every byte written reads
/// back.
fn fill_until_refused(path: &Path, sync_each: bool, errno: i32) -> u64 {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    let start = file.metadata().unwrap().len();
    let mut written = 0u64;
    loop {
        let piece = distinct_bytes(1 << 20, (written >> 20) as u8);
        let mut result = file.write_all(&piece);
        if sync_each && result.is_ok() {
            result = file.sync_data();
        }
        match result {
            Ok(()) => written += piece.len() as u64,
            Err(error) if error.raw_os_error() == Some(errno) => {
                if let Err(error) = file.sync_data() {
                    panic!("{}: fdatasync after {error}: {error}", path.display());
                }
                break;
            }
            Err(error) => panic!("{}: {error} after {written} bytes", path.display()),
        }
    }
    // A refused write stored nothing: the file is what was written.
    let data = std::fs::read(path).unwrap();
    assert_eq!(data.len() as u64, start + written, "{}", path.display());
    for (index, piece) in data[start as usize..].chunks(1 << 20).enumerate() {
        assert!(
            piece == &distinct_bytes(1 << 20, index as u8)[..piece.len()],
            "{}: piece {index} does not read back",
            path.display()
        );
    }
    written
}

/// Checks that the server let the kernel hold the mount at `mnt`'s dirty
/// pages as a local filesystem's: by default the kernel holds a FUSE
/// mount to a strict 1% share of its dirty limit, and sends every few
/// pages at once.
fn assert_dirty_pages_held(mnt: &Path) {
    let device = std::fs::metadata(mnt).unwrap().dev();
    let bdi = PathBuf::from(format!(
        "/sys/class/bdi/{}:{}",
        libc::major(device),
        libc::minor(device)
    ));
    let strict = std::fs::read_to_string(bdi.join("strict_limit")).unwrap();
    assert_eq!(strict.trim(), "0", "{}", bdi.display());
}

/// With `writebackcache=on` the kernel's page cache holds buffered writes
/// and sends them later; what the server does around that:
/// - a snapshot holds every `write()` that returned before it, sent or not;
/// - the kernel's mtime and ctime reach the server exactly;
/// - `ironpool sync` makes cached writes durable (they survive kill -9), as
///   `fsync` and `O_DSYNC` do;
/// - a stopping server has the kernel send a file still open first;
/// - `O_DIRECT` reads see cached writes, and buffered reads direct ones;
/// - the kernel holds the mount's dirty pages as a local filesystem's;
/// - past the quota the write is refused when the kernel sends it:
///   `fsync` reports EDQUOT, and what was fsynced before reads back.
#[test]
fn the_kernels_writeback_cache_is_flushed_for_snapshots_sync_and_stops() {
    let pool = TestPool::new("fswback");
    let mnt = pool.path("mnt");
    pool.create("1G", &["mirror", "a.img", "b.img"]);
    create_filesystem(&pool, "fs", &mnt, &["writebackcache=on", "quota=48M"]);
    let mut pool = pool;
    let _unmount = Unmount(mnt.clone());
    pool.serve();
    wait_mounted(&pool, &mnt);
    assert_dirty_pages_held(&mnt);
    let fs = format!("{}/fs", pool.name);

    // A snapshot has the cached write (the file stays open: a close has
    // the kernel send the file's pages).
    let cached = distinct_bytes(1 << 20, 1);
    let mut open = std::fs::File::create(mnt.join("cached")).unwrap();
    open.write_all(&cached).unwrap();
    pool.admin(&["snapshot", &format!("{fs}@s")]);
    let snapshot = mnt.join(".zfs/snapshot/s/cached");
    assert!(
        std::fs::read(&snapshot).unwrap() == cached,
        "the snapshot misses cached writes"
    );

    // Direct and buffered I/O of one file agree (dd's O_DIRECT).
    let mixed = mnt.join("mixed");
    let mixed_data = distinct_bytes(1 << 20, 2);
    std::fs::write(&mixed, &mixed_data).unwrap();
    let read_back = pool.path("direct-read");
    tool(
        "dd",
        &[
            &format!("if={}", mixed.display()),
            &format!("of={}", read_back.display()),
            "bs=64k",
            "skip=1",
            "count=1",
            "iflag=direct",
        ],
    );
    assert!(
        std::fs::read(&read_back).unwrap() == mixed_data[65536..131072],
        "an O_DIRECT read misses a cached write"
    );
    let pattern = pool.path("pattern");
    std::fs::write(&pattern, vec![0x5a; 65536]).unwrap();
    tool(
        "dd",
        &[
            &format!("if={}", pattern.display()),
            &format!("of={}", mixed.display()),
            "bs=64k",
            "count=1",
            "oflag=direct",
            "conv=notrunc",
        ],
    );
    let buffered = std::fs::read(&mixed).unwrap();
    assert!(
        buffered[..65536].iter().all(|byte| *byte == 0x5a)
            && buffered[65536..] == mixed_data[65536..],
        "a buffered read misses an O_DIRECT write"
    );

    // The kernel's times reach the server, and `ironpool sync` makes
    // cached writes durable.
    std::thread::sleep(Duration::from_millis(20));
    let mut touched = std::fs::OpenOptions::new()
        .write(true)
        .open(mnt.join("cached"))
        .unwrap();
    touched.write_all(b"rewritten").unwrap();
    let before = std::fs::metadata(mnt.join("cached")).unwrap();
    pool.admin(&["sync", &fs]);
    pool.kill9();
    drop((open, touched));
    pool.serve();
    wait_mounted(&pool, &mnt);
    assert_dirty_pages_held(&mnt);
    let after = std::fs::metadata(mnt.join("cached")).unwrap();
    assert_eq!(
        (
            after.mtime(),
            after.mtime_nsec(),
            after.ctime(),
            after.ctime_nsec()
        ),
        (
            before.mtime(),
            before.mtime_nsec(),
            before.ctime(),
            before.ctime_nsec()
        ),
        "the kernel's times were not kept"
    );
    let mut expected = cached.clone();
    expected[..9].copy_from_slice(b"rewritten");
    assert!(
        std::fs::read(mnt.join("cached")).unwrap() == expected,
        "`sync` lost cached writes"
    );

    // A file still open when the server stops.
    let held_data = distinct_bytes(200_000, 3);
    let mut held = std::fs::File::create(mnt.join("held")).unwrap();
    held.write_all(&held_data).unwrap();
    pool.stop();
    drop(held);
    wait_unmounted(&mnt, "the stopped server's mount");
    pool.serve();
    wait_mounted(&pool, &mnt);
    assert_dirty_pages_held(&mnt);
    assert!(
        std::fs::read(mnt.join("held")).unwrap() == held_data,
        "a stop lost the writes of a file still open"
    );

    // Past the quota: fsync reports it; what was fsynced reads back.
    let mut file = std::fs::File::create(mnt.join("fill")).unwrap();
    let mut synced = 0usize;
    let refused = loop {
        let piece = distinct_bytes(1 << 20, synced as u8);
        let result = file.write_all(&piece).and_then(|()| file.sync_data());
        match result {
            Ok(()) => synced += 1,
            Err(error) => break error,
        }
        assert!(synced < 64, "{synced} MiB fsynced under a 48M quota");
    };
    assert_eq!(refused.raw_os_error(), Some(libc::EDQUOT), "{refused}");
    drop(file);
    let data = std::fs::read(mnt.join("fill")).unwrap();
    for index in 0..synced {
        assert!(
            data[index << 20..(index + 1) << 20] == distinct_bytes(1 << 20, index as u8),
            "fsynced MiB {index} does not read back"
        );
    }
    stop_and_check(&mut pool);
}

/// A filesystem clone's quota bounds what the clone writes, not the 32 MiB
/// it shares with its origin's snapshot (OpenZFS's `used` of a clone).
#[test]
fn a_filesystem_clone_quota_counts_only_its_own_writes() {
    let mut pool = TestPool::new("fsclonequota");
    pool.create("512M", &["a.img"]);
    let name = pool.name.clone();
    let root = pool.path("");
    let origin = root.join("mnt-origin");
    let clone = root.join("mnt-clone");
    create_filesystem(&pool, "origin", &origin, &[]);
    let _unmount = [Unmount(origin.clone()), Unmount(clone.clone())];
    pool.serve();
    wait_mounted(&pool, &origin);
    let shared = distinct_bytes(32 << 20, 7);
    std::fs::write(origin.join("shared"), &shared).unwrap();
    pool.admin(&["snapshot", &format!("{name}/origin@s")]);
    pool.admin(&[
        "clone",
        &format!("{name}/origin@s"),
        &format!("{name}/c"),
        "-o",
        &format!("mountpoint={}", clone.display()),
        "-o",
        "quota=16M",
    ]);
    wait_mounted(&pool, &clone);
    let written = fill_until_refused(&clone.join("own"), false, libc::EDQUOT);
    assert!(
        (12 << 20..=16 << 20).contains(&written),
        "{written} bytes of its own under the clone's 16M quota"
    );
    assert!(std::fs::read(clone.join("shared")).unwrap() == shared);
    stop_and_check(&mut pool);
}

/// Quotas and reservations on a nearly full pool, as OpenZFS's: a
/// filesystem with `quota=100M` gets EDQUOT at its limit, for data and for
/// new files (and `df` shows the quota's size); its snapshot's blocks count
/// against `quota` but not against `refquota`; a quota or refquota under
/// what a filesystem uses is refused; a sibling with `reservation=200M` can still write its 200M
/// (less the metadata the reservation covers too) after a third
/// filesystem filled the rest of the pool (ENOSPC, not EDQUOT); nothing
/// written before a refusal is lost.
#[test]
fn quotas_bound_filesystems_and_reservations_keep_space_for_them() {
    let mut pool = TestPool::new("fsquota");
    pool.create("512M", &["a.img"]);
    let name = pool.name.clone();
    let root = pool.path("");
    let mount = |fs: &str| root.join(format!("mnt-{fs}"));
    create_filesystem(&pool, "limited", &mount("limited"), &["quota=100M"]);
    create_filesystem(&pool, "reserved", &mount("reserved"), &["reservation=200M"]);
    create_filesystem(&pool, "filler", &mount("filler"), &[]);
    let _unmount: Vec<Unmount> = ["limited", "reserved", "filler"]
        .iter()
        .map(|fs| Unmount(mount(fs)))
        .collect();
    pool.serve();
    for fs in ["limited", "reserved", "filler"] {
        wait_mounted(&pool, &mount(fs));
    }
    let limited = format!("{name}/limited");
    assert_eq!(
        pool.property(&limited, "quota"),
        ((100u64 << 20).to_string(), "local".to_string())
    );
    assert_eq!(
        pool.property(&format!("{name}/filler"), "reservation"),
        ("none".to_string(), "default".to_string())
    );
    let (size, available) = space_of(&mount("limited"));
    assert!(
        size <= 100 << 20 && available <= size && available > 90 << 20,
        "df of a 100M quota: size {size}, available {available}"
    );

    // EDQUOT at the quota, within a few records of it.
    let file = mount("limited").join("data");
    let written = fill_until_refused(&file, false, libc::EDQUOT);
    assert!(
        (96 << 20..=100 << 20).contains(&written),
        "{written} bytes written under a 100M quota"
    );
    let control = pool.control().display().to_string();
    let refused = pool.fails(&["--control", &control, "set", "quota=50M", &limited]);
    assert!(refused.contains("less than"), "{refused}");
    // Metadata counts too: a loop creating empty files stops at the quota.
    let mut created = 0;
    let error = loop {
        match std::fs::File::create(mount("limited").join(format!("empty-{created}"))) {
            Ok(_) => created += 1,
            Err(error) => break error,
        }
        assert!(created < 20_000, "{created} files made past the quota");
    };
    assert_eq!(error.raw_os_error(), Some(libc::EDQUOT), "{error}");

    // The snapshot keeps the blocks: the quota still counts them once the
    // file is gone, a refquota does not.
    pool.admin(&["snapshot", &format!("{limited}@kept")]);
    std::fs::remove_file(&file).unwrap();
    let mut referenced = u64::MAX;
    for _ in 0..100 {
        referenced = pool.property(&limited, "referenced").0.parse().unwrap();
        if referenced < 8 << 20 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(referenced < 8 << 20, "{referenced} bytes still referenced");
    let used: u64 = pool.property(&limited, "used").0.parse().unwrap();
    assert!(used >= 96 << 20, "the snapshot holds {used} bytes");
    let again = mount("limited").join("again");
    let error = std::fs::write(&again, distinct_bytes(1 << 20, 1)).unwrap_err();
    assert_eq!(error.raw_os_error(), Some(libc::EDQUOT), "{error}");
    pool.admin(&["set", "quota=none", &limited]);
    pool.admin(&["set", "refquota=100M", &limited]);
    let under_refquota = fill_until_refused(&again, false, libc::EDQUOT);
    assert!(
        (90 << 20..=100 << 20).contains(&under_refquota),
        "{under_refquota} bytes written under a 100M refquota with a 100M snapshot"
    );
    let refused = pool.fails(&["--control", &control, "set", "refquota=10M", &limited]);
    assert!(refused.contains("less than"), "{refused}");

    // The filler takes all but the reservation: ENOSPC, not EDQUOT. Space
    // freed before (the removed file's metadata, its frees deferred by
    // txgs) may still come back after a write got ENOSPC: df shows it and
    // writes take it, so the filler writes again until the two agree.
    let mut filled = 0;
    let mut filler_available = u64::MAX;
    for round in 0..5 {
        let data = mount("filler").join(format!("data{round}"));
        filled += fill_until_enospc(&data, false);
        let (_, reserved_available) = space_of(&mount("reserved"));
        assert!(
            reserved_available >= 200 << 20,
            "df of the reserved filesystem says {reserved_available} after the pool filled ({filled} bytes)"
        );
        filler_available = space_of(&mount("filler")).1;
        if filler_available < 8 << 20 {
            break;
        }
    }
    assert!(
        filler_available < 8 << 20,
        "df of the filler says {filler_available} after five rounds that each ended in ENOSPC"
    );
    // The reservation's 200M are there: its data and the metadata that
    // points at it (as in OpenZFS, a reservation covers both), to within
    // 1%, read back whole.
    let kept = fill_until_enospc(&mount("reserved").join("data"), false);
    assert!(
        kept >= 198 << 20,
        "{kept} bytes written under a 200M reservation on a full pool"
    );
    stop_and_check(&mut pool);
}

/// User and group quotas, as OpenZFS's: a file's space counts against
/// its owner and its group (whoever writes it), a write past either quota
/// gets EDQUOT and loses nothing written before, `userspace` and
/// `groupspace` (and `get userused@ID`) show what each uses, a `chown`
/// moves the space to the new owner, and a quota for a name this host
/// does not know, or on a volume, is refused.
#[test]
fn user_and_group_quotas_bound_what_owners_write() {
    use std::os::unix::fs::chown;
    let mut pool = TestPool::new("fsidq");
    pool.create("1G", &["a.img"]);
    let mnt = pool.path("mnt");
    create_filesystem(&pool, "fs", &mnt, &[]);
    let _unmount = Unmount(mnt.clone());
    pool.serve();
    wait_mounted(&pool, &mnt);
    let fs = format!("{}/fs", pool.name);
    // What the user owned before its quota was set counts.
    let before = mnt.join("before");
    std::fs::write(&before, distinct_bytes(4 << 20, 7)).unwrap();
    chown(&before, Some(12345), Some(12346)).unwrap();
    pool.admin(&["set", "userquota@12345=16M", "groupquota@12346=64M", &fs]);
    assert_eq!(
        pool.property(&fs, "userquota@12345"),
        ((16u64 << 20).to_string(), "local".to_string())
    );
    assert_eq!(
        pool.property(&fs, "userquota@root"),
        ("none".to_string(), "default".to_string())
    );
    let owned = mnt.join("owned");
    std::fs::File::create(&owned).unwrap();
    chown(&owned, Some(12345), Some(12346)).unwrap();
    let written = fill_until_refused(&owned, false, libc::EDQUOT);
    assert!(
        (10 << 20..=12 << 20).contains(&written),
        "{written} bytes written by a user with 4M of a 16M quota used"
    );
    let used: u64 = pool.property(&fs, "userused@12345").0.parse().unwrap();
    assert!((14 << 20..=17 << 20).contains(&used), "userused {used}");
    let users: serde_json::Value =
        serde_json::from_str(&pool.admin(&["--json", "userspace", &fs])).unwrap();
    let row = users["ids"]
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["id"] == 12345)
        .unwrap_or_else(|| panic!("{users}"))
        .clone();
    assert_eq!(row["quota_bytes"], 16u64 << 20, "{users}");
    assert!(row["used_bytes"].as_u64().unwrap() >= 14 << 20, "{users}");
    let listed = pool.admin(&["groupspace", &fs]);
    assert!(
        listed.contains("12346") && listed.contains("64.0M"),
        "{listed}"
    );
    // Root's files are not bound by the user's quota.
    std::fs::write(mnt.join("root"), distinct_bytes(8 << 20, 3)).unwrap();
    // Given away, the file's space is root's: the user writes again.
    chown(&owned, Some(0), Some(0)).unwrap();
    std::thread::sleep(Duration::from_millis(1100));
    let more = mnt.join("more");
    std::fs::File::create(&more).unwrap();
    chown(&more, Some(12345), Some(12346)).unwrap();
    std::fs::write(&more, distinct_bytes(8 << 20, 5)).unwrap();
    // The group's quota binds a file of another user in the group.
    pool.admin(&["set", "groupquota@12346=20M", &fs]);
    let grouped = mnt.join("grouped");
    std::fs::File::create(&grouped).unwrap();
    chown(&grouped, Some(777), Some(12346)).unwrap();
    std::thread::sleep(Duration::from_millis(1100));
    let in_group = fill_until_refused(&grouped, false, libc::EDQUOT);
    assert!(
        (6 << 20..=8 << 20).contains(&in_group),
        "{in_group} bytes written in a group with 12M of a 20M quota used"
    );
    let control = pool.control().display().to_string();
    let refused = pool.fails(&[
        "--control",
        &control,
        "set",
        "userquota@no-such-user-x=1M",
        &fs,
    ]);
    assert!(refused.contains("no user"), "{refused}");
    pool.admin(&["volume", "create", &format!("{}/vol", pool.name), "16M"]);
    let refused = pool.fails(&[
        "--control",
        &control,
        "set",
        "userquota@0=1M",
        &format!("{}/vol", pool.name),
    ]);
    assert!(refused.contains("filesystem property"), "{refused}");
    stop_and_check(&mut pool);
}

/// What `df` says is what a write gets: a filesystem reports as available
/// the space data may still take (not the slop kept for metadata), fills
/// to within a few records of that figure and reads 0 available when
/// writes get ENOSPC, while names still come and go; no write that
/// returned is lost (held writes keep the space they were promised).
/// Right after the file is removed, `df` shows its space and writes take
/// it again: they wait for the frees to come back (a few commits) rather
/// than fail until a timer commits them.
#[test]
fn df_reports_the_space_writes_get_and_a_full_filesystem_recovers() {
    let mut pool = TestPool::new("fsfull");
    pool.create("256M", &["mirror", "a.img", "b.img"]);
    let mnt = pool.path("mnt");
    create_filesystem(&pool, "fs", &mnt, &[]);
    let _unmount = Unmount(mnt.clone());
    pool.serve();
    wait_mounted(&pool, &mnt);
    let (size, available) = space_of(&mnt);
    // The slop (16 MiB at least) is neither used nor available.
    assert!(
        size <= (256 << 20) - (16 << 20) && available <= size,
        "size {size}, available {available}"
    );
    let written = fill_until_enospc(&mnt.join("big"), true);
    assert!(
        written + (8 << 20) >= available && written <= available,
        "df said {available} bytes were available; {written} were written"
    );
    // What is left is at most the metadata the last commits freed, on its
    // way back (a smaller write takes it after waiting for it).
    let (_, left) = space_of(&mnt);
    assert!(
        left < (2 << 20),
        "writes get ENOSPC, yet df says {left} bytes are available"
    );
    // Names still come and go on a full filesystem (metadata may use the
    // slop, data may not), so the file can be removed.
    std::fs::File::create(mnt.join("empty")).unwrap();
    std::fs::remove_file(mnt.join("empty")).unwrap();
    std::fs::remove_file(mnt.join("big")).unwrap();
    // df shows the removed file's space within moments (the server frees
    // its blocks once the kernel forgets the node; a write waits for them
    // to come back), not once the timer's commits have (15 s).
    let mut freed = 0;
    for _ in 0..20 {
        freed = space_of(&mnt).1;
        if freed + (8 << 20) >= written {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(
        freed + (8 << 20) >= written,
        "{written} bytes removed 2 s ago, yet df says {freed} bytes are available"
    );
    // No fsync here: nothing but the writes' own wait commits the frees,
    // and writes may be held and written out behind.
    let again = fill_until_enospc(&mnt.join("again"), false);
    assert!(
        again + (8 << 20) >= available,
        "{again} bytes written right after the removal"
    );
    stop_and_check(&mut pool);
}

const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// The mount's front end, from `fs list --json`.
fn front_end(pool: &TestPool) -> serde_json::Value {
    listed_filesystem(pool)["front_end"].clone()
}

/// Sets `enable_uring` and puts the old value back when dropped (other
/// tests mounting meanwhile get one transport or the other; both serve).
struct UringSetting(Option<String>);

impl UringSetting {
    fn set(value: &str) -> UringSetting {
        let old = std::fs::read_to_string(ENABLE_URING).ok();
        if old.is_some() {
            std::fs::write(ENABLE_URING, value).expect("enable_uring is writable by root");
        }
        UringSetting(old)
    }
}

impl Drop for UringSetting {
    fn drop(&mut self) {
        if let Some(old) = &self.0 {
            let _ = std::fs::write(ENABLE_URING, old.trim());
        }
    }
}

/// fio with io_uring and `O_DIRECT` at queue depth 64 on `target` (its
/// file or directory arguments), 16K random writes of 32 MiB verified
/// with crc32c: the server must have had at least 32 of the 64 in flight
/// at once. Returns the filesystem's front-end figures.
fn verify_at_depth_64(pool: &TestPool, target: &[&str]) -> serde_json::Value {
    let mut args = vec![
        "--name=depth",
        "--size=32M",
        "--rw=randwrite",
        "--bs=16k",
        "--ioengine=io_uring",
        "--direct=1",
        "--iodepth=64",
        "--verify=crc32c",
        "--do_verify=1",
    ];
    args.extend_from_slice(target);
    tool("fio", &args);
    let stats = front_end(pool);
    let most = stats["in_flight_max"].as_u64().unwrap();
    assert!(
        most >= 32,
        "at most {most} requests in flight at the server: {stats}"
    );
    stats
}

#[test]
fn fuse_over_io_uring_is_used_when_the_kernel_offers_it_and_keeps_the_queue_depth() {
    let (mut pool, mnt) = filesystem_pool("fsuring");
    let _unmount = Unmount(mnt.clone());
    let setting = UringSetting::set("Y");
    pool.serve();
    wait_mounted(&pool, &mnt);
    std::fs::write(mnt.join("first"), b"x").unwrap();
    let transport = front_end(&pool)["transport"].as_str().unwrap().to_string();
    let status = pool.admin(&["status", &pool.name]);
    assert!(
        status.contains(&format!("mounted at {} over {transport}", mnt.display())),
        "{status}"
    );
    if setting.0.is_none() {
        // No FUSE over io_uring in this kernel: the fallback says so.
        assert!(transport.contains("no FUSE over io_uring"), "{transport}");
    } else {
        assert!(transport.starts_with("io_uring ("), "{transport}");
    }
    // fio at queue depth 64 with O_DIRECT, four jobs each on a file of its
    // own: every block verified, and (the server answering as requests
    // come) most of a job's 64 in flight at the server at once.
    let stats = verify_at_depth_64(
        &pool,
        &[
            &format!("--directory={}", mnt.display()),
            "--numjobs=4",
            "--group_reporting",
        ],
    );
    assert!(stats["requests"].as_u64().unwrap() > 4 * 2048, "{stats}");

    // Off again: the next mount keeps to /dev/fuse and says why.
    if setting.0.is_some() {
        std::fs::write(ENABLE_URING, "N").unwrap();
        pool.stop();
        pool.serve();
        wait_mounted(&pool, &mnt);
        std::fs::read(mnt.join("first")).unwrap();
        let transport = front_end(&pool)["transport"].as_str().unwrap().to_string();
        assert!(transport.contains("enable_uring is N"), "{transport}");
    }
    drop(setting);
    stop_and_check(&mut pool);
}

/// Requests the server has answered for the pool's filesystem.
fn requests_served(pool: &TestPool) -> u64 {
    front_end(pool)["requests"].as_u64().unwrap()
}

/// How many requests of kind `op` the server has answered, and the
/// microseconds it spent on them.
fn requests_of(pool: &TestPool, op: &str) -> (u64, u64) {
    let ops = &front_end(pool)["ops"][op];
    (
        ops["count"].as_u64().unwrap_or(0),
        ops["service_us"].as_u64().unwrap_or(0),
    )
}

#[test]
fn the_server_counts_its_requests_by_kind_and_iostat_shows_them() {
    let (mut pool, mnt, _unmount) = served_filesystem("fsops");
    std::fs::create_dir(mnt.join("d")).unwrap();
    let (creates, lookups) = (requests_of(&pool, "CREATE"), requests_of(&pool, "LOOKUP"));
    for i in 0..100 {
        std::fs::File::create(mnt.join(format!("d/f{i}"))).unwrap();
    }
    // Each new name is looked up (absent) and then created: one of each,
    // and the kernel asks for nothing else by those names.
    let created = requests_of(&pool, "CREATE");
    assert_eq!(created.0 - creates.0, 100, "{}", front_end(&pool));
    assert!(
        created.1 > creates.1,
        "no time counted: {}",
        front_end(&pool)
    );
    let looked = requests_of(&pool, "LOOKUP").0 - lookups.0;
    assert!(
        (100..=102).contains(&looked),
        "{looked} lookups for 100 creates"
    );
    let (unlinks, _) = requests_of(&pool, "UNLINK");
    for i in 0..100 {
        std::fs::remove_file(mnt.join(format!("d/f{i}"))).unwrap();
    }
    assert_eq!(requests_of(&pool, "UNLINK").0 - unlinks, 100);
    let report = pool.admin(&["iostat", &pool.name]);
    assert!(
        report.contains("filesystem requests") && report.contains("CREATE"),
        "{report}"
    );
    stop_and_check(&mut pool);
}

#[test]
fn the_kernel_caches_names_absent_names_and_attributes_and_the_queue_depth_holds() {
    let (mut pool, mnt, _unmount) = served_filesystem("fscache");
    std::fs::write(mnt.join("present"), b"x").unwrap();
    std::fs::metadata(mnt.join("absent")).unwrap_err();
    std::fs::metadata(mnt.join("present")).unwrap();
    // Once looked up, a name, an absent name and attributes are the
    // kernel's to answer: a thousand stats cost (almost) no request.
    let before = requests_served(&pool);
    for _ in 0..1000 {
        assert_eq!(std::fs::metadata(mnt.join("present")).unwrap().len(), 1);
        let absent = std::fs::metadata(mnt.join("absent")).unwrap_err();
        assert_eq!(absent.kind(), std::io::ErrorKind::NotFound);
    }
    let asked = requests_served(&pool) - before;
    assert!(asked < 10, "{asked} requests for 2,000 cached stats");
    // What the kernel cached follows every change made through it: a
    // cached absent name is created, a write changes size and mtime, a
    // rename moves the name, a chmod the mode, an unlink the name.
    let mtime = std::fs::metadata(mnt.join("present")).unwrap().mtime_nsec();
    std::fs::write(mnt.join("absent"), b"now here").unwrap();
    assert_eq!(std::fs::metadata(mnt.join("absent")).unwrap().len(), 8);
    std::thread::sleep(Duration::from_millis(20));
    std::fs::OpenOptions::new()
        .append(true)
        .open(mnt.join("present"))
        .unwrap()
        .write_all(b"yz")
        .unwrap();
    let grown = std::fs::metadata(mnt.join("present")).unwrap();
    assert_eq!(grown.len(), 3);
    assert_ne!(grown.mtime_nsec(), mtime);
    std::fs::rename(mnt.join("absent"), mnt.join("moved")).unwrap();
    std::fs::metadata(mnt.join("absent")).unwrap_err();
    assert_eq!(std::fs::read(mnt.join("moved")).unwrap(), b"now here");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(mnt.join("moved"), std::fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(
        std::fs::metadata(mnt.join("moved")).unwrap().mode() & 0o777,
        0o600
    );
    std::fs::remove_file(mnt.join("moved")).unwrap();
    std::fs::metadata(mnt.join("moved")).unwrap_err();

    // fio at queue depth 64 with O_DIRECT on one file: the server keeps
    // most of the 64 in flight at once, over whichever transport serves.
    verify_at_depth_64(
        &pool,
        &[&format!("--filename={}", mnt.join("depth").display())],
    );
    stop_and_check(&mut pool);
}

/// A buffer aligned for `O_DIRECT` (4 KiB), freed when dropped.
struct Aligned {
    pointer: *mut u8,
    layout: std::alloc::Layout,
}

impl Aligned {
    fn new(bytes: usize) -> Aligned {
        let layout = std::alloc::Layout::from_size_align(bytes, 4096).unwrap();
        // SAFETY: a layout of non-zero size.
        let pointer = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!pointer.is_null());
        Aligned { pointer, layout }
    }

    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: `layout.size()` bytes allocated here, owned by self.
        unsafe { std::slice::from_raw_parts_mut(self.pointer, self.layout.size()) }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout in `new`.
        unsafe { std::alloc::dealloc(self.pointer, self.layout) };
    }
}

#[test]
fn buffered_and_direct_io_on_one_file_agree_and_fio_verifies_both() {
    let (mut pool, mnt, _unmount) = served_filesystem("fsmixed");
    // Buffered io_uring at queue depth 64, four jobs, every block verified.
    tool(
        "fio",
        &[
            "--name=buffered",
            &format!("--directory={}", mnt.display()),
            "--size=16M",
            "--rw=randwrite",
            "--bs=4k",
            "--ioengine=io_uring",
            "--direct=0",
            "--iodepth=64",
            "--numjobs=4",
            "--verify=crc32c",
            "--do_verify=1",
        ],
    );
    // A direct and a buffered writer on one file at once (each its own
    // half, each verifying what it wrote).
    let shared = mnt.join("shared");
    tool(
        "fio",
        &[
            &format!("--filename={}", shared.display()),
            "--rw=randwrite",
            "--bs=16k",
            "--ioengine=io_uring",
            "--iodepth=32",
            "--verify=crc32c",
            "--do_verify=1",
            "--name=direct",
            "--direct=1",
            "--offset=0",
            "--size=16M",
            "--name=buffered",
            "--direct=0",
            "--offset=16M",
            "--size=16M",
        ],
    );
    // Mixing on the same bytes: what one kind of I/O wrote, the other
    // reads, never a stale copy.
    use std::os::unix::fs::OpenOptionsExt;
    let path = mnt.join("mixed");
    let buffered = read_write_new(&path);
    let direct = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(&path)
        .unwrap();
    const SPAN: usize = 64 * 1024;
    let mut block = Aligned::new(SPAN);
    for round in 0..8u8 {
        let offset = (round as u64 % 4) * SPAN as u64;
        // Buffered write, direct read.
        let pattern = vec![b'a' + round; SPAN];
        buffered.write_all_at(&pattern, offset).unwrap();
        direct.read_exact_at(block.bytes(), offset).unwrap();
        assert!(
            block.bytes() == &pattern[..],
            "round {round}: direct read is stale"
        );
        // Direct write, buffered read (the page cache holds the old bytes).
        block.bytes().fill(b'A' + round);
        direct.write_all_at(block.bytes(), offset).unwrap();
        let mut back = vec![0u8; SPAN];
        buffered.read_exact_at(&mut back, offset).unwrap();
        assert!(
            back == block.bytes(),
            "round {round}: buffered read is stale"
        );
        // A small buffered write inside a block, then a direct read.
        buffered.write_all_at(b"0123456789", offset + 100).unwrap();
        direct.read_exact_at(block.bytes(), offset).unwrap();
        assert_eq!(&block.bytes()[100..110], b"0123456789", "round {round}");
        assert!(block.bytes()[..100]
            .iter()
            .all(|byte| *byte == b'A' + round));
    }
    // SIGTERM with the two files still open: the server unmounts, waits a
    // few seconds for them, aborts the connection and exports; the open
    // files answer ENOTCONN from then on (what the kernel has cached it
    // may still serve; a direct read asks the server).
    let started = Instant::now();
    stop_and_check(&mut pool);
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the stop took {:?}",
        started.elapsed()
    );
    assert!(pool.log().contains("connection aborted"), "{}", pool.log());
    let gone = direct.read_at(block.bytes(), 0).unwrap_err();
    assert_eq!(gone.raw_os_error(), Some(libc::ENOTCONN), "{gone}");
}

/// The names in directory `dir`, sorted.
fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Waits (10 s at most) until the tree at `root` is `expected` (a mount
/// replaced by the server takes a moment).
fn wait_tree(root: &Path, expected: &[(String, Option<Vec<u8>>)], what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = std::panic::catch_unwind(|| tree(root));
        if now.as_deref().ok() == Some(expected) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: the tree is not as expected"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn snapshots_show_under_dot_zfs_and_rollback_and_clone_are_mounted() {
    let (mut pool, mnt, _unmount) = served_filesystem("fssnap");
    let name = pool.name.clone();
    std::fs::create_dir(mnt.join("d")).unwrap();
    std::fs::write(mnt.join("d/a"), b"first").unwrap();
    std::fs::write(mnt.join("big"), distinct_bytes(3 << 20, 9)).unwrap();
    std::os::unix::fs::symlink("d/a", mnt.join("link")).unwrap();
    std::fs::hard_link(mnt.join("d/a"), mnt.join("hard")).unwrap();
    // A file fio writes with checksums, read back from the snapshot later.
    tool(
        "fio",
        &[
            "--name=snap",
            &format!("--filename={}", mnt.join("fio.bin").display()),
            "--size=8M",
            "--rw=randwrite",
            "--bs=16k",
            "--ioengine=io_uring",
            "--direct=1",
            "--iodepth=64",
            "--verify=crc32c",
            "--do_verify=0",
            "--randseed=7",
        ],
    );
    let one = tree(&mnt);
    pool.admin(&["snapshot", &format!("{name}/fs@one")]);
    std::fs::write(mnt.join("d/a"), b"second").unwrap();
    std::fs::remove_file(mnt.join("big")).unwrap();
    std::fs::write(mnt.join("new"), b"new").unwrap();
    std::fs::rename(mnt.join("link"), mnt.join("d/moved")).unwrap();
    std::fs::write(mnt.join("fio.bin"), distinct_bytes(1 << 20, 3)).unwrap();
    let two = tree(&mnt);
    pool.admin(&["snapshot", &format!("{name}/fs@two")]);
    std::fs::write(mnt.join("after"), b"after").unwrap();

    // `.zfs` is found by name, not listed; each snapshot is as it was.
    assert!(!names_in(&mnt).contains(&".zfs".to_string()));
    let snapshots = mnt.join(".zfs/snapshot");
    assert_eq!(names_in(&mnt.join(".zfs")), ["snapshot"]);
    assert_eq!(names_in(&snapshots), ["one", "two"]);
    assert_eq!(tree(&snapshots.join("one")), one, "@one");
    assert_eq!(tree(&snapshots.join("two")), two, "@two");
    tool(
        "fio",
        &[
            "--name=snap",
            &format!("--filename={}", snapshots.join("one/fio.bin").display()),
            "--size=8M",
            "--rw=randread",
            "--bs=16k",
            "--ioengine=io_uring",
            "--direct=1",
            "--iodepth=64",
            "--verify=crc32c",
            "--readonly",
        ],
    );
    // An fsync of a snapshot's file has nothing to make durable: it
    // succeeds at once.
    std::fs::File::open(snapshots.join("one/fio.bin"))
        .unwrap()
        .sync_all()
        .unwrap();
    // Read-only, and nothing crosses between a snapshot and the head.
    let refused = std::fs::write(snapshots.join("one/x"), b"x").unwrap_err();
    assert_eq!(refused.raw_os_error(), Some(libc::EROFS), "{refused}");
    let refused = std::fs::create_dir(mnt.join(".zfs")).unwrap_err();
    assert_eq!(refused.raw_os_error(), Some(libc::EEXIST), "{refused}");
    let refused = std::fs::hard_link(snapshots.join("one/d/a"), mnt.join("x")).unwrap_err();
    assert_eq!(refused.raw_os_error(), Some(libc::EXDEV), "{refused}");
    let listed = pool.admin(&["list", "-t", "snapshot", &name]);
    assert!(
        listed.contains("fs@one") && listed.contains("fs@two"),
        "{listed}"
    );
    // Root's mkdir in .zfs/snapshot takes a snapshot, rmdir destroys it.
    let now = tree(&mnt);
    std::fs::create_dir(snapshots.join("three")).unwrap();
    assert_eq!(names_in(&snapshots), ["one", "three", "two"]);
    assert_eq!(tree(&snapshots.join("three")), now, "@three");
    let listed = pool.admin(&["list", "-t", "snapshot", &name]);
    assert!(listed.contains("fs@three"), "{listed}");
    let refused = std::fs::create_dir(snapshots.join("three")).unwrap_err();
    assert_eq!(refused.raw_os_error(), Some(libc::EEXIST), "{refused}");
    std::fs::remove_dir(snapshots.join("three")).unwrap();
    assert_eq!(names_in(&snapshots), ["one", "two"]);
    let listed = pool.admin(&["list", "-t", "snapshot", &name]);
    assert!(!listed.contains("fs@three"), "{listed}");

    // A rollback past @two needs -r; then the server mounts @one's tree,
    // and a file open in the old tree fails instead of reading stale data.
    let open = std::fs::File::open(mnt.join("new")).unwrap();
    let control = pool.control().display().to_string();
    let refused = pool.fails(&["--control", &control, "rollback", &format!("{name}/fs@one")]);
    assert!(refused.contains("use -r"), "{refused}");
    pool.admin(&["rollback", "-r", &format!("{name}/fs@one")]);
    wait_tree(&mnt, &one, "after rollback");
    let mut buffer = [0u8; 3];
    assert!(
        open.read_at(&mut buffer, 0).is_err(),
        "stale read after rollback"
    );
    drop(open);
    assert_eq!(names_in(&snapshots), ["one"]);

    // A clone of @one mounts where it is told, and changes on its own.
    let clone_mnt = pool.path("clone");
    let _unmount_clone = Unmount(clone_mnt.clone());
    pool.admin(&[
        "clone",
        &format!("{name}/fs@one"),
        &format!("{name}/c"),
        "-o",
        &format!("mountpoint={}", clone_mnt.display()),
    ]);
    wait_mounted(&pool, &clone_mnt);
    assert_eq!(tree(&clone_mnt), one, "clone");
    std::fs::write(clone_mnt.join("d/a"), b"clone's").unwrap();
    assert_eq!(std::fs::read(mnt.join("d/a")).unwrap(), b"first");
    assert_eq!(std::fs::read(snapshots.join("one/d/a")).unwrap(), b"first");
    assert_check_clean(&pool);

    // After a restart, all of it is still there.
    pool.stop();
    pool.serve();
    wait_mounted(&pool, &mnt);
    wait_mounted(&pool, &clone_mnt);
    assert_eq!(tree(&snapshots.join("one")), one, "@one after a restart");
    assert_eq!(std::fs::read(clone_mnt.join("d/a")).unwrap(), b"clone's");
    // The clone holds @one, and so the filesystem, until it goes.
    let refused = pool.fails(&[
        "--control",
        &control,
        "destroy",
        "-r",
        &format!("{name}/fs"),
    ]);
    assert!(refused.contains("dependent clones"), "{refused}");
    pool.admin(&["destroy", &format!("{name}/c")]);
    wait_unmounted(&clone_mnt, "the destroyed clone is still mounted");
    pool.admin(&["destroy", "-r", &format!("{name}/fs")]);
    wait_unmounted(&mnt, "the destroyed filesystem is still mounted");
    stop_and_check(&mut pool);
}

/// Writers of the intent-log test at once (concurrent fsyncs share commits).
const LOG_WRITERS: u64 = 4;
/// The test's block: the filesystem's record size, so every write replaces
/// whole blocks and a block holds exactly one write's bytes.
const LOG_BLOCK: usize = 16 << 10;
/// Blocks of each file before the writers start, and at most after appends.
const LOG_PREFILLED_BLOCKS: u64 = 64;
const LOG_BLOCKS_MAX: u64 = 160;

/// Block bytes that say who wrote them: (writer + 1, sequence) repeated.
/// Never all zeros (writer 0's prefill, write 0, once read as zeros, so a
/// hole left by an append in flight passed for another writer's block):
/// a hole must be told from every write.
fn stamp(writer: u64, seq: u64) -> Vec<u8> {
    let mut unit = (writer + 1).to_le_bytes().to_vec();
    unit.extend_from_slice(&seq.to_le_bytes());
    unit.repeat(LOG_BLOCK / unit.len())
}

/// The (writer, sequence) a block's bytes were stamped with, if they were.
fn unstamp(bytes: &[u8]) -> Option<(u64, u64)> {
    let unit = bytes.get(..16)?;
    let writer = u64::from_le_bytes(unit[..8].try_into().unwrap()).checked_sub(1)?;
    (bytes.len() == LOG_BLOCK && bytes.chunks(16).all(|chunk| chunk == unit))
        .then(|| (writer, u64::from_le_bytes(unit[8..].try_into().unwrap())))
}

/// What one writer did: every sequence written into each block, the last
/// one acknowledged durable, and the size last acknowledged.
struct WriterLog {
    written: Vec<Vec<u64>>,
    acked: Vec<u64>,
    acked_bytes: u64,
    acknowledgements: u64,
}

/// One writer: random blocks of its file, overwrites and appends, each
/// made durable by `fdatasync` (writer 0), `fsync` (1), `O_DSYNC` (2) or
/// `O_DSYNC` with `O_DIRECT` (3: the kernel sends no FSYNC then, only the
/// flag in the write), until the server goes.
fn log_writer(path: PathBuf, writer: u64) -> WriterLog {
    use std::os::unix::fs::OpenOptionsExt;
    let flags = match writer {
        0 | 1 => 0,
        2 => libc::O_DSYNC,
        _ => libc::O_DSYNC | libc::O_DIRECT,
    };
    let file = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(flags)
        .open(&path)
        .unwrap();
    // O_DIRECT needs an aligned buffer.
    let mut buffer = vec![0u8; 2 * LOG_BLOCK];
    let aligned = buffer.as_ptr().align_offset(4096);
    let mut log = WriterLog {
        written: vec![vec![0]; LOG_BLOCKS_MAX as usize],
        acked: vec![0; LOG_BLOCKS_MAX as usize],
        acked_bytes: LOG_PREFILLED_BLOCKS * LOG_BLOCK as u64,
        acknowledgements: 0,
    };
    let mut blocks = LOG_PREFILLED_BLOCKS;
    let mut random = 0x9e37_79b9_7f4a_7c15u64.wrapping_mul(writer + 1);
    for seq in 1.. {
        random ^= random << 13;
        random ^= random >> 7;
        random ^= random << 17;
        // One write in eight appends (while there is room).
        let block = if random.is_multiple_of(8) && blocks < LOG_BLOCKS_MAX {
            blocks += 1;
            blocks - 1
        } else {
            random % blocks
        };
        log.written[block as usize].push(seq);
        let bytes = &mut buffer[aligned..aligned + LOG_BLOCK];
        bytes.copy_from_slice(&stamp(writer, seq));
        if file.write_all_at(bytes, block * LOG_BLOCK as u64).is_err() {
            break;
        }
        let synced = match writer {
            0 => file.sync_data(),
            1 => file.sync_all(),
            _ => Ok(()),
        };
        if synced.is_err() {
            break;
        }
        log.acked[block as usize] = seq;
        log.acked_bytes = log.acked_bytes.max((block + 1) * LOG_BLOCK as u64);
        log.acknowledgements += 1;
    }
    log
}

/// The stamp's writer number of the names writer.
const NAMES_WRITER: u64 = 99;

/// What the names writer did: each name it made durable with the stamp its
/// file holds, the names whose removal it made durable, and the names the
/// operation in flight when the server went may or may not have changed.
#[derive(Default)]
struct NamesLog {
    present: std::collections::BTreeMap<String, u64>,
    removed: std::collections::BTreeSet<String>,
    in_flight: Vec<String>,
    acknowledgements: u64,
}

/// Changes names in `dir`, each made durable by an `fsync` of the file and
/// of the directory: creates `fN` (one stamped block), renames every other
/// one over `current` (the atomic-replace idiom), unlinks the oldest `f`
/// name every fifth time; until the server goes.
fn names_writer(dir: PathBuf, progress: Arc<AtomicU64>) -> NamesLog {
    let mut log = NamesLog::default();
    let Ok(directory) = std::fs::File::open(&dir) else {
        return log;
    };
    for seq in 1.. {
        let name = format!("f{seq}");
        log.in_flight = vec![name.clone()];
        let made = std::fs::File::create(dir.join(&name)).and_then(|file| {
            file.write_all_at(&stamp(NAMES_WRITER, seq), 0)?;
            file.sync_all()?;
            directory.sync_all()
        });
        if made.is_err() {
            return log;
        }
        log.present.insert(name.clone(), seq);
        if seq % 2 == 1 {
            log.in_flight = vec![name.clone(), "current".into()];
            let renamed = std::fs::rename(dir.join(&name), dir.join("current"))
                .and_then(|()| directory.sync_all());
            if renamed.is_err() {
                return log;
            }
            log.present.remove(&name);
            log.removed.insert(name);
            log.present.insert("current".into(), seq);
        }
        if seq % 5 == 0 {
            let oldest = log
                .present
                .keys()
                .find(|name| name.starts_with('f'))
                .cloned();
            if let Some(oldest) = oldest {
                log.in_flight = vec![oldest.clone()];
                let removed =
                    std::fs::remove_file(dir.join(&oldest)).and_then(|()| directory.sync_all());
                if removed.is_err() {
                    return log;
                }
                log.present.remove(&oldest);
                log.removed.insert(oldest);
            }
        }
        log.in_flight.clear();
        log.acknowledgements += 1;
        progress.store(log.acknowledgements, Ordering::Relaxed);
    }
    log
}

/// One round of the intent-log test on the served pool mounted at `mnt`:
/// files `w*-ROUND.bin` made and made durable, writers that `fsync`,
/// `fdatasync` or write `O_DSYNC` started with a [`names_writer`], `during`
/// run while they write, then kill -9 and a restart; every block must hold
/// the bytes of its last acknowledged write or of a later one, every file be
/// at least as long as its last acknowledged size, and every name made
/// durable be there (every removal made durable hold).
fn log_round(pool: &mut TestPool, mnt: &Path, round: &str, during: impl FnOnce(&TestPool)) {
    let paths: Vec<PathBuf> = (0..LOG_WRITERS)
        .map(|writer| mnt.join(format!("w{writer}-{round}.bin")))
        .collect();
    for (writer, path) in paths.iter().enumerate() {
        let file = std::fs::File::create(path).unwrap();
        for block in 0..LOG_PREFILLED_BLOCKS {
            file.write_all_at(&stamp(writer as u64, 0), block * LOG_BLOCK as u64)
                .unwrap();
        }
        file.sync_all().unwrap();
    }
    let writers: Vec<_> = paths
        .iter()
        .cloned()
        .enumerate()
        .map(|(writer, path)| std::thread::spawn(move || log_writer(path, writer as u64)))
        .collect();
    let names_dir = mnt.join(format!("names-{round}"));
    std::fs::create_dir(&names_dir).unwrap();
    let progress = Arc::new(AtomicU64::new(0));
    let names = std::thread::spawn({
        let names_dir = names_dir.clone();
        let progress = progress.clone();
        move || names_writer(names_dir, progress)
    });
    std::thread::sleep(Duration::from_millis(700));
    during(pool);
    std::thread::sleep(Duration::from_millis(700));
    // On a loaded machine the names writer may need longer for enough
    // changes to check (each takes two fsyncs): it gets up to 20 s more.
    let deadline = Instant::now() + Duration::from_secs(20);
    while progress.load(Ordering::Relaxed) <= 50 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let stats: serde_json::Value =
        serde_json::from_str(&pool.admin(&["--json", "iostat", &pool.name])).unwrap();
    let log = &stats["filesystems"][0]["intent_log"];
    let commits = log["commits"].as_u64().unwrap_or(0);
    assert!(
        commits > 100,
        "{round}: fsync did not go through the intent log: {log}"
    );
    // 16K blocks written one at a time before each fsync: their bytes go
    // into the log (no flush of the devices holding them).
    assert!(
        log["copied_blocks"].as_u64().unwrap_or(0) > 100,
        "{round}: no small write was copied into the log: {log}"
    );
    // The names writer's creates, renames and unlinks (hundreds, each with
    // two fsyncs) go through the log too: a txg only for the first fsync
    // after each start (and, rarely, one that saw a block grow as it read).
    assert!(
        log["txg_fallbacks"].as_u64().unwrap_or(u64::MAX) <= 5,
        "{round}: changes of names went through txgs: {log}"
    );
    pool.kill9();
    let logs: Vec<WriterLog> = writers.into_iter().map(|w| w.join().unwrap()).collect();
    let names = names.join().unwrap();
    pool.serve();
    wait_mounted(pool, mnt);
    let notes = pool.status_json()["notes"].to_string();
    assert!(notes.contains("intent log: replayed"), "{round}: {notes}");
    // Every name made durable is there with its bytes; every removal made
    // durable holds (but for the operation in flight).
    assert!(
        names.acknowledgements > 50,
        "{round}: the names writer did little ({})",
        names.acknowledgements
    );
    for (name, seq) in &names.present {
        if names.in_flight.contains(name) {
            continue;
        }
        let data = std::fs::read(names_dir.join(name))
            .unwrap_or_else(|error| panic!("{round}: durable name {name}: {error}"));
        assert!(
            data == stamp(NAMES_WRITER, *seq),
            "{round}: {name} does not hold write {seq}"
        );
    }
    for name in &names.removed {
        if !names.in_flight.contains(name) {
            assert!(
                !names_dir.join(name).exists(),
                "{round}: {name} was removed durably, and is back"
            );
        }
    }
    for (writer, (path, log)) in paths.iter().zip(&logs).enumerate() {
        assert!(
            log.acknowledgements > 10,
            "{round}: writer {writer} wrote little"
        );
        let data = std::fs::read(path).unwrap();
        assert!(
            data.len() as u64 >= log.acked_bytes,
            "{round}: writer {writer}'s file is {} bytes, {} were acknowledged",
            data.len(),
            log.acked_bytes
        );
        for (block, bytes) in data.chunks(LOG_BLOCK).enumerate() {
            let Some((owner, seq)) = unstamp(bytes) else {
                // Past the last acknowledged size, an append in flight may
                // have left its size without its bytes (zeros).
                assert!(
                    (block as u64 + 1) * LOG_BLOCK as u64 > log.acked_bytes
                        && bytes.iter().all(|byte| *byte == 0),
                    "{round}: writer {writer} block {block} holds no write"
                );
                continue;
            };
            assert!(
                owner == writer as u64
                    && seq >= log.acked[block]
                    && log.written[block].contains(&seq),
                "{round}: writer {writer} block {block} holds write {seq} of writer {owner}; \
                 the last acknowledged was {}",
                log.acked[block]
            );
        }
    }
}

/// `fsync`, `fdatasync` and `O_DSYNC` writes by several writers at once,
/// and creates, renames and unlinks made durable by `fsync`s of their
/// directory, then kill -9 while they write ([`log_round`]). The acknowledgements went
/// through the filesystem's intent log (its commits counted before the
/// kill; the import replayed it), in the main devices and on a log device;
/// a log device removed while the writers write moves the log back to the
/// main devices and loses nothing; and the same with the kernel's
/// writeback cache holding the writes until they are synced.
#[test]
fn fsynced_writes_survive_kill_9_through_the_intent_log() {
    let layouts: [(&[&str], &str); 3] = [
        (&["mirror", "a.img", "b.img"], "writebackcache=off"),
        (
            &["mirror", "a.img", "b.img", "log", "c.img"],
            "writebackcache=off",
        ),
        (&["mirror", "a.img", "b.img"], "writebackcache=on"),
    ];
    for (layout, cache) in layouts {
        let mut pool = TestPool::new("fslog");
        pool.create("2G", layout);
        let mnt = pool.path("mnt");
        create_filesystem(&pool, "fs", &mnt, &["recordsize=16K", cache]);
        let _unmount = Unmount(mnt.clone());
        pool.serve();
        wait_mounted(&pool, &mnt);
        let with_log = layout.contains(&"log");
        log_round(&mut pool, &mnt, &format!("{layout:?} {cache}"), |_| {});
        if with_log {
            log_round(&mut pool, &mnt, "log device removed", |pool| {
                let removed = pool.admin(&["remove", "fslog", "c.img"]);
                assert!(removed.contains("ONLINE"), "{removed}");
            });
            let status = pool.status_json();
            assert_eq!(status["health"], "ONLINE", "{status}");
            assert!(!status.to_string().contains("c.img"), "{status}");
        }
        stop_and_check(&mut pool);
    }
}

/// fio's direct random writes at QD16 over 32 MiB of `file`, ending in an
/// `fsync`, each block's crc32c written in it; with `verify_only`, the
/// same job checks them instead. `extra`: the block size and more.
fn direct_random_writes_verified(file: &Path, name: &str, extra: &[&str], verify_only: bool) {
    let name = format!("--name={name}");
    let filename = format!("--filename={}", file.display());
    let mut args = vec![
        name.as_str(),
        filename.as_str(),
        "--size=32M",
        "--rw=randwrite",
        "--ioengine=io_uring",
        "--direct=1",
        "--iodepth=16",
        "--end_fsync=1",
        "--verify=crc32c",
        "--do_verify=0",
    ];
    args.extend_from_slice(extra);
    if verify_only {
        args.push("--verify_only");
    }
    tool("fio", &args);
}

/// fio's direct 16K random writes at QD16 with an `fsync` every 4, no txg
/// committing meanwhile: the writes are made durable before they are
/// answered and the `fsync`s find nothing to commit (both counted). Then a
/// file is created, written and fsynced (that `fsync` must commit), and the
/// server is killed -9; after the restart replays the intent log, fio
/// verifies every block it wrote and the file holds its bytes.
#[test]
fn direct_writes_made_durable_first_survive_kill_9() {
    let (mut pool, mnt, _unmount) = served_filesystem("fsdurable");
    // Only the intent log makes the writes durable until the kill.
    pool.admin(&["tune", &pool.name, "txg_timeout_ms", "600000"]);
    pool.admin(&["tune", &pool.name, "dirty_sync_bytes", "1G"]);
    let file = mnt.join("f");
    let fio = |verify_only: bool| {
        direct_random_writes_verified(&file, "durable", &["--bs=16k", "--fsync=4"], verify_only)
    };
    fio(false);
    let stats: serde_json::Value =
        serde_json::from_str(&pool.admin(&["--json", "iostat", &pool.name])).unwrap();
    // Then a file created and written buffered: answers that may rest on
    // changes not yet durable, which its `fsync` must commit.
    let tail = mnt.join("tail");
    std::fs::write(&tail, b"after the durable writes").unwrap();
    std::fs::File::open(&tail).unwrap().sync_all().unwrap();
    pool.kill9();
    let fs = &stats["filesystems"][0];
    let (first, found) = (
        fs["durable_first_ops"].as_u64().unwrap(),
        fs["fsyncs_found_durable"].as_u64().unwrap(),
    );
    assert!(
        first > 500,
        "{first} of 2048 writes made durable first: {fs}"
    );
    assert!(
        found > 100,
        "{found} fsyncs found every answer durable: {fs}"
    );
    pool.serve();
    wait_mounted(&pool, &mnt);
    let notes = pool.status_json()["notes"].to_string();
    assert!(notes.contains("intent log: replayed"), "{notes}");
    fio(true);
    assert_eq!(std::fs::read(&tail).unwrap(), b"after the durable writes");
    stop_and_check(&mut pool);
}

/// fio's direct 16K random writes at QD16 with no `fsync` but the last:
/// they are held in memory and answered, as a volume's WRITEs are, and go
/// to the devices in batches; one of 1 MiB goes through. The last `fsync`
/// makes them durable: after a kill -9 (no txg committing meanwhile) and
/// the intent log's replay, fio verifies every block, and `O_DIRECT` reads
/// of them found nothing of theirs in the read cache.
#[test]
fn direct_writes_held_behind_are_durable_at_fsync() {
    let (mut pool, mnt, _unmount) = served_filesystem("fsheld");
    pool.admin(&["tune", &pool.name, "txg_timeout_ms", "600000"]);
    pool.admin(&["tune", &pool.name, "dirty_sync_bytes", "1G"]);
    let file = mnt.join("f");
    let fio = |verify_only: bool, bs: &str| {
        let bs = format!("--bs={bs}");
        direct_random_writes_verified(&file, "held", &[&bs], verify_only)
    };
    let stats = |pool: &TestPool| -> serde_json::Value {
        let all: serde_json::Value =
            serde_json::from_str(&pool.admin(&["--json", "iostat", &pool.name])).unwrap();
        all["filesystems"][0].clone()
    };
    let count = |fs: &serde_json::Value, name: &str| fs[name].as_u64().unwrap();
    // 1 MiB writes first: long runs, written through.
    fio(false, "1M");
    let before = stats(&pool);
    assert!(
        count(&before, "through_write_ops") >= 32 && count(&before, "direct_write_ops") >= 32,
        "1 MiB direct writes were not written through: {before}"
    );
    assert_eq!(count(&before, "behind_write_ops"), 0, "{before}");
    fio(false, "16k");
    let after = stats(&pool);
    let held = count(&after, "behind_write_ops");
    let through = count(&after, "through_write_ops") - count(&before, "through_write_ops");
    let direct = count(&after, "direct_write_ops") - count(&before, "direct_write_ops");
    assert!(
        held >= 2000 && through < 48 && direct == 2048,
        "{held} of 2048 direct 16K writes held, {through} written through: {after}"
    );
    pool.kill9();
    pool.serve();
    wait_mounted(&pool, &mnt);
    let notes = pool.status_json()["notes"].to_string();
    assert!(notes.contains("intent log: replayed"), "{notes}");
    let cached = cached_data_bytes(&pool);
    fio(true, "16k");
    let read_in = cached_data_bytes(&pool).saturating_sub(cached);
    assert!(
        read_in < 4 << 20,
        "O_DIRECT reads filled the read cache by {read_in} bytes"
    );
    stop_and_check(&mut pool);
}

/// `copy_file_range(fd_in, offset_in, fd_out, offset_out, length)`: the
/// bytes copied, or the errno.
fn copy_file_range(
    from: &std::fs::File,
    offset_in: u64,
    to: &std::fs::File,
    offset_out: u64,
    length: usize,
) -> Result<usize, i32> {
    use std::os::fd::AsRawFd;
    let mut offset_in = offset_in as libc::loff_t;
    let mut offset_out = offset_out as libc::loff_t;
    // SAFETY: valid descriptors and offsets that live across the call.
    let copied = unsafe {
        libc::copy_file_range(
            from.as_raw_fd(),
            &mut offset_in,
            to.as_raw_fd(),
            &mut offset_out,
            length,
            0,
        )
    };
    if copied < 0 {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
    }
    Ok(copied as usize)
}

/// Block cloning: `cp` (which asks `copy_file_range`) of a 256 MiB file
/// clones its records: the copy reads the same and the pool allocates
/// nothing for it (how fast it is, is measured outside the tests). A
/// rewrite of the source leaves the copy as it was; a range that does not
/// line up with records is copied; a file of a snapshot is copied into the
/// head. After a restart the copy is the same, and the full check counts
/// every cloned block's references against the pool's table.
#[test]
fn cp_clones_records_and_the_copy_takes_no_space_until_rewritten() {
    const M: usize = 1 << 20;
    let (mut pool, mnt, _unmount) = served_filesystem("fsclone");
    let data = distinct_bytes(256 * M + 5000, 11);
    let source = mnt.join("source");
    std::fs::write(&source, &data).unwrap();
    std::fs::File::open(&source).unwrap().sync_all().unwrap();
    let allocated = |pool: &TestPool| pool.status_json()["allocated_bytes"].as_u64().unwrap();
    let before = allocated(&pool);
    let copy = mnt.join("copy");
    run_in(
        &mnt,
        "cp",
        &[source.to_str().unwrap(), copy.to_str().unwrap()],
    );
    std::fs::File::open(&copy).unwrap().sync_all().unwrap();
    assert!(std::fs::read(&copy).unwrap() == data, "the copy differs");
    let status = pool.status_json();
    let records = (data.len() as u64).div_ceil(16 << 10);
    assert_eq!(status["cloned_blocks"], records, "{status}");
    // (The last record, mostly zeros, may be stored compressed.)
    let saved = status["clone_saved_bytes"].as_u64().unwrap();
    assert!(saved >= (records - 1) * (16 << 10), "{status}");
    assert!(
        allocated(&pool) < before + (8 << 20) as u64,
        "a clone of {} bytes allocated {} bytes",
        data.len(),
        allocated(&pool) - before
    );

    // The source rewritten: the copy keeps its bytes.
    let source_file = std::fs::OpenOptions::new()
        .write(true)
        .open(&source)
        .unwrap();
    source_file
        .write_all_at(&distinct_bytes(64 << 10, 12), 1 << 20)
        .unwrap();
    source_file.sync_all().unwrap();
    assert!(std::fs::read(&copy).unwrap() == data, "the copy changed");

    // Not on record boundaries: copied, and the same.
    let partial = read_write_new(mnt.join("partial"));
    let from = std::fs::File::open(&copy).unwrap();
    let mut done = 0;
    while done < 3 * M {
        done += copy_file_range(
            &from,
            1000 + done as u64,
            &partial,
            7 + done as u64,
            3 * M - done,
        )
        .unwrap();
    }
    let mut read = vec![0u8; 3 * M];
    partial.read_exact_at(&mut read, 7).unwrap();
    assert!(
        read == data[1000..1000 + 3 * M],
        "the unaligned copy differs"
    );
    // A file of a snapshot copied into the head.
    pool.admin(&["snapshot", &format!("{}/fs@s", pool.name)]);
    let snapshot_copy = mnt.join(".zfs/snapshot/s/copy");
    let restored = read_write_new(mnt.join("restored"));
    let snapshot_file = std::fs::File::open(&snapshot_copy).unwrap();
    let mut done = 0;
    while done < 4 * M {
        done += copy_file_range(
            &snapshot_file,
            done as u64,
            &restored,
            done as u64,
            4 * M - done,
        )
        .unwrap();
    }
    let mut read = vec![0u8; 4 * M];
    restored.read_exact_at(&mut read, 0).unwrap();
    assert!(
        read == data[..4 * M],
        "the copy out of the snapshot differs"
    );
    drop((partial, from, restored, snapshot_file));

    pool.stop();
    pool.serve();
    wait_mounted(&pool, &mnt);
    assert!(
        std::fs::read(&copy).unwrap() == data,
        "the copy after a restart"
    );
    stop_and_check(&mut pool);
}
