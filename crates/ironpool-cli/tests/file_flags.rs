//! File flags and projects through a real mount, with the real tools:
//! `chattr` and `lsattr` (e2fsprogs) reach the server as FUSE_IOCTL
//! requests; what the flags forbid is refused with EPERM; a project set on
//! a directory with `chattr +P -p ID` is taken by what is made inside and
//! bounded by `projectquota@ID`; flags and projects survive a restart and,
//! fsynced, a kill -9 (the intent log's extended object record).

mod common;

use std::io::Write;
use std::path::Path;

use common::fuse::*;
use common::*;

/// `lsattr -d` (with `-p`: the project first) of `path`: its fields.
fn lsattr(path: &Path, project: bool) -> Vec<String> {
    let mut args = vec!["-d"];
    if project {
        args.push("-p");
    }
    let path = path.display().to_string();
    args.push(&path);
    tool("lsattr", &args)
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// The errno of `result`.
fn errno<T: std::fmt::Debug>(result: std::io::Result<T>) -> Option<i32> {
    result.expect_err("refused").raw_os_error()
}

#[test]
fn file_flags_are_kept_and_enforced_and_projects_bound_their_trees() {
    let (mut pool, mnt, _unmount) = served_filesystem("fsflags");
    let fs = format!("{}/fs", pool.name);

    // Immutable: nothing changes it, until the flag goes.
    let fixed = mnt.join("fixed");
    std::fs::write(&fixed, b"kept").unwrap();
    tool("chattr", &["+i", &fixed.display().to_string()]);
    assert!(
        lsattr(&fixed, false)[0].contains('i'),
        "{:?}",
        lsattr(&fixed, false)
    );
    let open_append = || std::fs::OpenOptions::new().append(true).open(&fixed);
    assert_eq!(
        errno(open_append()),
        Some(libc::EPERM),
        "append to an immutable file"
    );
    assert_eq!(errno(std::fs::write(&fixed, b"x")), Some(libc::EPERM));
    assert_eq!(errno(std::fs::remove_file(&fixed)), Some(libc::EPERM));
    assert_eq!(
        errno(std::fs::rename(&fixed, mnt.join("moved"))),
        Some(libc::EPERM)
    );
    assert_eq!(
        errno(std::fs::hard_link(&fixed, mnt.join("linked"))),
        Some(libc::EPERM)
    );
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        errno(std::fs::set_permissions(
            &fixed,
            std::fs::Permissions::from_mode(0o600)
        )),
        Some(libc::EPERM)
    );
    assert_eq!(set_xattr(&fixed, "user.tag", b"v", 0), Err(libc::EPERM));
    assert_eq!(std::fs::read(&fixed).unwrap(), b"kept");
    tool("chattr", &["-i", &fixed.display().to_string()]);
    std::fs::write(&fixed, b"changed").unwrap();

    // Append-only: written only at its end, never truncated or removed.
    let log = mnt.join("log");
    std::fs::write(&log, b"first\n").unwrap();
    tool("chattr", &["+a", &log.display().to_string()]);
    std::fs::OpenOptions::new()
        .append(true)
        .open(&log)
        .unwrap()
        .write_all(b"second\n")
        .unwrap();
    let open_write = std::fs::OpenOptions::new().write(true).open(&log);
    assert_eq!(
        errno(open_write),
        Some(libc::EPERM),
        "write without O_APPEND"
    );
    assert_eq!(
        errno(std::fs::write(&log, b"over")),
        Some(libc::EPERM),
        "O_TRUNC"
    );
    assert_eq!(errno(std::fs::remove_file(&log)), Some(libc::EPERM));
    assert_eq!(std::fs::read(&log).unwrap(), b"first\nsecond\n");
    // No dump is only kept; a flag this filesystem does not keep is refused.
    tool("chattr", &["-a", "+d", &log.display().to_string()]);
    assert!(
        lsattr(&log, false)[0].contains('d'),
        "{:?}",
        lsattr(&log, false)
    );
    let refused = tool_fails("chattr", &["+c", &log.display().to_string()]);
    assert!(refused.contains("not supported"), "{refused}");
    std::fs::remove_file(&log).unwrap();

    // A project tree: what is made inside takes the project (directories
    // the inherit flag too), and the project's quota binds it.
    let tree = mnt.join("tree");
    std::fs::create_dir(&tree).unwrap();
    tool("chattr", &["+P", "-p", "42", &tree.display().to_string()]);
    std::fs::create_dir(tree.join("sub")).unwrap();
    let sub = lsattr(&tree.join("sub"), true);
    assert_eq!(sub[0], "42", "{sub:?}");
    assert!(sub[1].contains('P'), "{sub:?}");
    pool.admin(&["set", "projectquota@42=8M", &fs]);
    let written = fill_until_edquot(&tree.join("sub/data"));
    assert!(
        (6 << 20..=8 << 20).contains(&written),
        "{written} bytes written under a project quota of 8M"
    );
    assert_eq!(lsattr(&tree.join("sub/data"), true)[0], "42");
    let used: u64 = pool.property(&fs, "projectused@42").0.parse().unwrap();
    assert!((6 << 20..=9 << 20).contains(&used), "projectused@42 {used}");
    let listed = pool.admin(&["projectspace", &fs]);
    assert!(listed.contains("42") && listed.contains("8.0M"), "{listed}");
    // A file of another project does not move into the tree by rename
    // (`mv` copies it, and the copy takes the project).
    let outside = mnt.join("outside");
    std::fs::write(&outside, b"other project").unwrap();
    assert_eq!(
        errno(std::fs::rename(&outside, tree.join("outside"))),
        Some(libc::EXDEV)
    );
    // Given another project, the file's space leaves project 42: it
    // writes again.
    tool(
        "chattr",
        &["-p", "7", &tree.join("sub/data").display().to_string()],
    );
    std::thread::sleep(std::time::Duration::from_millis(1100));
    std::fs::write(tree.join("more"), distinct_bytes(2 << 20, 9)).unwrap();
    let refused = pool.fails(&[
        "--control",
        &pool.control().display().to_string(),
        "set",
        "projectquota@web=1M",
        &fs,
    ]);
    assert!(refused.contains("number"), "{refused}");

    // Flags and projects are kept: fsynced, through the intent log and a
    // kill -9; then through a clean restart.
    let logged = mnt.join("logged");
    std::fs::create_dir(&logged).unwrap();
    let fsync = |path: &Path| std::fs::File::open(path).unwrap().sync_all().unwrap();
    fsync(&logged);
    let before = fs_log_stats(&pool);
    tool("chattr", &["+P", "-p", "5", &logged.display().to_string()]);
    tool("chattr", &["+i", &fixed.display().to_string()]);
    fsync(&logged);
    fsync(&fixed);
    assert_eq!(
        fs_log_stats(&pool).1,
        before.1,
        "the flags' fsyncs went through txgs, not the intent log"
    );
    pool.kill9();
    pool.serve();
    wait_mounted(&pool, &mnt);
    let kept = lsattr(&logged, true);
    assert_eq!(kept[0], "5", "{kept:?}");
    assert!(kept[1].contains('P'), "{kept:?}");
    assert!(lsattr(&fixed, false)[0].contains('i'));
    pool.stop();
    pool.serve();
    wait_mounted(&pool, &mnt);
    assert_eq!(lsattr(&tree.join("sub"), true)[0], "42");
    assert!(lsattr(&fixed, false)[0].contains('i'));
    assert_eq!(errno(std::fs::remove_file(&fixed)), Some(libc::EPERM));
    tool("chattr", &["-i", &fixed.display().to_string()]);
    stop_and_check(&mut pool);
}

/// Appends 1 MiB pieces to `path` until EDQUOT; returns what was written
/// (all of it read back).
fn fill_until_edquot(path: &Path) -> u64 {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    let mut written = 0u64;
    loop {
        let piece = distinct_bytes(1 << 20, (written >> 20) as u8);
        match file.write_all(&piece) {
            Ok(()) => written += piece.len() as u64,
            Err(error) if error.raw_os_error() == Some(libc::EDQUOT) => break,
            Err(error) => panic!("{}: {error} after {written} bytes", path.display()),
        }
    }
    file.sync_data().unwrap();
    let data = std::fs::read(path).unwrap();
    assert_eq!(data.len() as u64, written);
    for (index, piece) in data.chunks(1 << 20).enumerate() {
        assert!(piece == &distinct_bytes(1 << 20, index as u8)[..piece.len()]);
    }
    written
}
