//! Nested datasets, as `zfs create -p`, `zfs get`'s SOURCE, `zfs list -r`
//! and `zfs destroy -r` have them: names as deep as OpenZFS allows, parents
//! that must exist (or `-p`), properties and mountpoints inherited down the
//! tree, and filesystems mounted inside their parents' mounts by the one
//! server that serves both.

mod common;

use std::path::Path;

use common::fuse::*;
use common::*;

/// The names `list -t all [-r] TARGET` prints, in its order.
fn listed(pool: &TestPool, args: &[&str]) -> Vec<String> {
    let mut full = vec!["--json", "list", "-t", "all"];
    full.extend_from_slice(args);
    let text = pool.ok(&full);
    let list: serde_json::Value = serde_json::from_str(&text).expect("list JSON");
    list["datasets"]
        .as_array()
        .expect("datasets")
        .iter()
        .map(|row| row["name"].as_str().unwrap_or_default().to_string())
        .collect()
}

#[test]
fn nested_datasets_need_a_parent_inherit_from_it_and_go_with_destroy_r() {
    let pool = TestPool::new("tree");
    pool.create("1G", &["mirror", "a.img", "b.img"]);
    let directory = dir(&pool);
    let d = ["-d", directory.as_str()];
    let run = |args: &[&str]| {
        let mut full = args.to_vec();
        full.extend_from_slice(&d);
        pool.ok(&full)
    };
    let fail = |args: &[&str]| {
        let mut full = args.to_vec();
        full.extend_from_slice(&d);
        pool.fails(&full)
    };

    // A parent must exist, and be a filesystem.
    let refused = fail(&["fs", "create", "tree/a/b"]);
    assert!(
        refused.contains("parent tree/a does not exist") && refused.contains("-p"),
        "{refused}"
    );
    run(&["fs", "create", "-p", "tree/a/b/c"]);
    run(&["volume", "create", "-s", "tree/vol", "64M"]);
    let refused = fail(&["fs", "create", "tree/vol/x"]);
    assert!(refused.contains("is a volume"), "{refused}");
    run(&["volume", "create", "-s", "-p", "tree/a/d/vol", "64M"]);
    // As deep as OpenZFS allows, and no deeper.
    let deep: Vec<&str> = std::iter::repeat_n("n", 49).collect();
    run(&["fs", "create", "-p", &format!("tree/{}", deep.join("/"))]);
    let refused = fail(&["fs", "create", &format!("tree/{}/n", deep.join("/"))]);
    assert!(refused.contains("fewer than 50 levels deep"), "{refused}");
    run(&["destroy", "-r", "tree/n"]);

    // Settings pass down, the nearest set one winning, with their source.
    run(&["set", "compression=zstd", "org.example:owner=ops", "tree"]);
    run(&["set", "compression=lz4", "atime=off", "tree/a"]);
    run(&["set", "recordsize=16K", "tree/a/b"]);
    assert_eq!(
        pool.property_with(&d, "tree/a/b/c", "compression"),
        ("lz4".into(), "inherited from tree/a".into())
    );
    assert_eq!(
        pool.property_with(&d, "tree/a/d/vol", "compression"),
        ("lz4".into(), "inherited from tree/a".into())
    );
    assert_eq!(
        pool.property_with(&d, "tree/vol", "compression"),
        ("zstd".into(), "inherited from tree".into())
    );
    assert_eq!(
        pool.property_with(&d, "tree/a/b/c", "atime"),
        ("off".into(), "inherited from tree/a".into())
    );
    assert_eq!(
        pool.property_with(&d, "tree/a/b/c", "recordsize"),
        ("16384".into(), "inherited from tree/a/b".into())
    );
    assert_eq!(
        pool.property_with(&d, "tree/a/b/c", "org.example:owner"),
        ("ops".into(), "inherited from tree".into())
    );
    // Space limits bind the dataset they are set on only.
    run(&["set", "quota=100M", "tree/a"]);
    let refused = fail(&["set", "refreservation=auto", "tree/a"]);
    assert!(
        refused.contains("only a volume's refreservation"),
        "{refused}"
    );
    assert_eq!(
        pool.property_with(&d, "tree/a/b", "quota"),
        ("none".into(), "default".into())
    );
    // A mountpoint passes down with the rest of the name appended.
    assert_eq!(
        pool.property_with(&d, "tree/a/b/c", "mountpoint"),
        ("/tree/a/b/c".into(), "default".into())
    );
    run(&["set", "mountpoint=/srv/area", "tree/a"]);
    assert_eq!(
        pool.property_with(&d, "tree/a/b/c", "mountpoint"),
        ("/srv/area/b/c".into(), "inherited from tree/a".into())
    );
    run(&["inherit", "compression", "tree/a"]);
    assert_eq!(
        pool.property_with(&d, "tree/a/b/c", "compression"),
        ("zstd".into(), "inherited from tree".into())
    );

    // `list -r` shows a subtree, a dataset's snapshots right after it.
    run(&["snapshot", "-r", "tree/a/b@s1"]);
    let mut args = vec!["-r", "tree/a"];
    args.extend_from_slice(&d);
    assert_eq!(
        listed(&pool, &args),
        [
            "tree/a",
            "tree/a/b",
            "tree/a/b@s1",
            "tree/a/b/c",
            "tree/a/b/c@s1",
            "tree/a/d",
            "tree/a/d/vol"
        ]
    );
    let mut args = vec!["tree/a/b"];
    args.extend_from_slice(&d);
    assert_eq!(listed(&pool, &args), ["tree/a/b", "tree/a/b@s1"]);

    // A rename moves the subtree, and what it inherits changes with its
    // new parent; a clone's origin follows it.
    run(&["clone", "tree/a/b@s1", "tree/copy"]);
    run(&["fs", "create", "tree/x"]);
    run(&["set", "compression=lz4", "tree/x"]);
    let refused = fail(&["rename", "tree/a", "tree/a/b/z"]);
    assert!(refused.contains("below itself"), "{refused}");
    let refused = fail(&["rename", "tree/a", "tree/x/y/a"]);
    assert!(refused.contains("does not exist"), "{refused}");
    let refused = fail(&["rename", "tree/a", "tree/vol"]);
    assert!(refused.contains("exists"), "{refused}");
    let refused = fail(&["rename", "tree/a", "other/a"]);
    assert!(refused.contains("stays in its pool"), "{refused}");
    run(&["rename", "-p", "tree/a", "tree/x/y/a"]);
    let mut args = vec!["-r", "tree/x"];
    args.extend_from_slice(&d);
    assert_eq!(
        listed(&pool, &args),
        [
            "tree/x",
            "tree/x/y",
            "tree/x/y/a",
            "tree/x/y/a/b",
            "tree/x/y/a/b@s1",
            "tree/x/y/a/b/c",
            "tree/x/y/a/b/c@s1",
            "tree/x/y/a/d",
            "tree/x/y/a/d/vol"
        ]
    );
    assert_eq!(
        pool.property_with(&d, "tree/x/y/a/b/c", "compression"),
        ("lz4".into(), "inherited from tree/x".into())
    );
    assert_eq!(
        pool.property_with(&d, "tree/x/y/a/b/c", "recordsize"),
        ("16384".into(), "inherited from tree/x/y/a/b".into())
    );
    assert_eq!(
        pool.property_with(&d, "tree/copy", "origin"),
        ("tree/x/y/a/b@s1".into(), "-".into())
    );
    // A snapshot is renamed within its dataset; with -r, the snapshot of
    // that name of every dataset below too; a clone's origin follows.
    let refused = fail(&["rename", "tree/x/y/a/b@s1", "tree/x/y/a/b/c@s2"]);
    assert!(refused.contains("stays with its dataset"), "{refused}");
    let refused = fail(&["rename", "-r", "tree/x", "tree/z"]);
    assert!(refused.contains("renames snapshots"), "{refused}");
    let refused = fail(&["rename", "tree/x/y/a/b@nope", "@s2"]);
    assert!(refused.contains("nope"), "{refused}");
    run(&["rename", "-r", "tree/x/y/a/b@s1", "@s2"]);
    let mut args = vec!["-r", "tree/x/y/a/b"];
    args.extend_from_slice(&d);
    assert_eq!(
        listed(&pool, &args),
        [
            "tree/x/y/a/b",
            "tree/x/y/a/b@s2",
            "tree/x/y/a/b/c",
            "tree/x/y/a/b/c@s2"
        ]
    );
    assert_eq!(
        pool.property_with(&d, "tree/copy", "origin"),
        ("tree/x/y/a/b@s2".into(), "-".into())
    );
    run(&["snapshot", "tree/x/y/a/b/c@s3"]);
    let refused = fail(&["rename", "tree/x/y/a/b/c@s2", "tree/x/y/a/b/c@s3"]);
    assert!(refused.contains("exists"), "{refused}");
    run(&["destroy", "tree/x/y/a/b/c@s3"]);
    run(&["rename", "tree/x/y/a/b/c@s2", "tree/x/y/a/b/c@s1"]);
    run(&["rename", "tree/x/y/a/b@s2", "s1"]);
    let refused = fail(&["destroy", "tree/x/y/a/b@s1"]);
    assert!(refused.contains("clone"), "{refused}");
    run(&["destroy", "tree/copy"]);
    run(&["rename", "tree/x/y/a", "tree/a"]);
    run(&["destroy", "-r", "tree/x"]);

    // A parent goes only with its children, and they with -r.
    let refused = fail(&["destroy", "tree/a"]);
    assert!(
        refused.contains("has children") && refused.contains("-r"),
        "{refused}"
    );
    let refused = fail(&["fs", "destroy", "tree/a/b"]);
    assert!(refused.contains("has children"), "{refused}");
    run(&["destroy", "-r", "tree/a"]);
    let mut args = vec!["tree"];
    args.extend_from_slice(&d);
    assert_eq!(listed(&pool, &args), ["tree/vol"]);
    let report = run(&["check", "tree"]);
    assert!(!report.contains("problem"), "{report}");
}

#[test]
fn a_child_filesystem_mounts_inside_its_parent_served_by_the_same_server() {
    let mut pool = TestPool::new("nest");
    pool.create("2G", &["mirror", "a.img", "b.img"]);
    let mnt = pool.path("mnt");
    let child = mnt.join("child");
    let made_served = mnt.join("child/later");
    // Inner mounts first on the way out.
    let _parent_guard = Unmount(mnt.clone());
    let _child_guard = Unmount(child.clone());
    let _later_guard = Unmount(made_served.clone());
    let directory = dir(&pool);
    let mountpoint = format!("mountpoint={}", mnt.display());
    pool.ok(&[
        "fs",
        "create",
        "nest/top",
        "-o",
        &mountpoint,
        "-d",
        &directory,
    ]);
    pool.ok(&["fs", "create", "nest/top/child", "-d", &directory]);
    pool.serve();
    wait_mounted(&pool, &mnt);
    wait_mounted(&pool, &child);
    std::fs::write(mnt.join("in-parent"), b"parent").unwrap();
    std::fs::write(child.join("in-child"), b"child").unwrap();
    // A child made while its parent is served mounts inside the parent's
    // mount: the server looks the path up through its own mount, so it
    // must not do so on the thread that serves it.
    pool.admin(&["fs", "create", "nest/top/child/later"]);
    wait_mounted(&pool, &made_served);
    std::fs::write(made_served.join("deep"), b"deep").unwrap();
    let listed = pool.admin(&["--json", "fs", "list", "nest"]);
    let list: serde_json::Value = serde_json::from_str(&listed).unwrap();
    let mounted_at = |name: &str| {
        list["filesystems"]
            .as_array()
            .unwrap()
            .iter()
            .find(|fs| fs["name"] == name)
            .map(|fs| fs["mounted"].as_str().unwrap_or_default().to_string())
    };
    assert_eq!(
        mounted_at("nest/top/child/later").as_deref(),
        Some(made_served.to_str().unwrap())
    );
    // Each file is in its own filesystem: the parent holds only the
    // directories the children mount on.
    let names = |path: &Path| {
        let mut names: Vec<String> = std::fs::read_dir(path)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    assert_eq!(names(&child), ["in-child", "later"]);
    assert_eq!(names(&made_served), ["deep"]);
    // A rename moves a served filesystem's mount (and its children's) to
    // the new mountpoint; a volume answers to its new export name.
    pool.admin(&["volume", "create", "-s", "nest/top/vol", "64M"]);
    qemu_io(&pool.uri("top/vol"), &["write -P 0x5a 0 1M", "flush"]);
    pool.admin(&["rename", "nest/top/child", "nest/top/moved"]);
    let moved = mnt.join("moved");
    let _moved_guard = Unmount(moved.join("later"));
    let _moved_top_guard = Unmount(moved.clone());
    wait_mounted(&pool, &moved);
    wait_mounted(&pool, &moved.join("later"));
    wait_unmounted(
        &child,
        "the renamed filesystem is still at its old mountpoint",
    );
    assert_eq!(std::fs::read(moved.join("in-child")).unwrap(), b"child");
    assert_eq!(std::fs::read(moved.join("later/deep")).unwrap(), b"deep");
    pool.admin(&["rename", "nest/top/vol", "nest/vol"]);
    qemu_io(&pool.uri("vol"), &["read -P 0x5a 0 1M"]);
    pool.admin(&["rename", "nest/top/moved", "nest/top/child"]);
    wait_mounted(&pool, &child);
    wait_mounted(&pool, &made_served);
    // Destroying a served child unmounts it; the others stay.
    let held = pool.fails(&[
        "--control",
        pool.control().to_str().unwrap(),
        "destroy",
        "nest/top",
    ]);
    assert!(held.contains("has children"), "{held}");
    pool.admin(&["destroy", "nest/top/child/later"]);
    wait_unmounted(&made_served, "the destroyed child is still mounted");
    assert!(mounted(&child) && mounted(&mnt));
    // A clean stop unmounts them all; the next server mounts them again,
    // parents first.
    stop_and_check(&mut pool);
    assert!(!mounted(&child) && !mounted(&mnt));
    pool.serve();
    wait_mounted(&pool, &mnt);
    wait_mounted(&pool, &child);
    assert_eq!(std::fs::read(child.join("in-child")).unwrap(), b"child");
    assert_eq!(std::fs::read(mnt.join("in-parent")).unwrap(), b"parent");
    stop_and_check(&mut pool);
}

/// Appends 1 MiB pieces to `path` until a write fails with `errno`;
/// returns the bytes written (all of which read back).
fn fill_until(path: &Path, errno: i32) -> u64 {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    let start = file.metadata().unwrap().len();
    let mut written = 0u64;
    loop {
        let piece = distinct_bytes(1 << 20, (written >> 20) as u8);
        match file.write_all(&piece) {
            Ok(()) => written += piece.len() as u64,
            Err(error) if error.raw_os_error() == Some(errno) => break,
            Err(error) => panic!("{}: {error} after {written} bytes", path.display()),
        }
        assert!(written < 1 << 30, "{}: never refused", path.display());
    }
    file.sync_data().unwrap();
    let data = std::fs::read(path).unwrap();
    assert_eq!(data.len() as u64, start + written, "{}", path.display());
    written
}

#[test]
fn a_quota_on_a_parent_bounds_its_whole_subtree() {
    const MIB: u64 = 1 << 20;
    let mut pool = TestPool::new("treequota");
    pool.create("1G", &["a.img"]);
    let mnt = pool.path("mnt");
    let (a, b) = (mnt.join("a"), mnt.join("b"));
    let _guards = [Unmount(mnt.clone()), Unmount(a.clone()), Unmount(b.clone())];
    let directory = dir(&pool);
    let mountpoint = format!("mountpoint={}", mnt.display());
    pool.ok(&[
        "fs",
        "create",
        "treequota/home",
        "-o",
        &mountpoint,
        "-o",
        "quota=100M",
        "-d",
        &directory,
    ]);
    pool.ok(&["fs", "create", "treequota/home/a", "-d", &directory]);
    pool.ok(&["fs", "create", "treequota/home/b", "-d", &directory]);
    pool.serve();
    for path in [&mnt, &a, &b] {
        wait_mounted(&pool, path);
    }
    // 60 MiB in one child leaves the other what is left of the parent's
    // 100 MiB, not a quota of its own.
    let mut file = std::fs::File::create(a.join("big")).unwrap();
    for index in 0..60 {
        std::io::Write::write_all(&mut file, &distinct_bytes(MIB as usize, index)).unwrap();
    }
    file.sync_all().unwrap();
    drop(file);
    let written = fill_until(&b.join("rest"), libc::EDQUOT);
    assert!(
        (25 * MIB..=41 * MIB).contains(&written),
        "the second child wrote {} MiB under a 100 MiB parent quota with 60 MiB used",
        written / MIB
    );
    let used = pool
        .property("treequota/home", "used")
        .0
        .parse::<u64>()
        .unwrap();
    let children = pool
        .property("treequota/home", "usedbychildren")
        .0
        .parse::<u64>()
        .unwrap();
    assert!(
        children >= 85 * MIB && used >= children && used <= 102 * MIB,
        "used {used}, usedbychildren {children}"
    );
    assert!(
        pool.property("treequota/home/b", "available")
            .0
            .parse::<u64>()
            .unwrap()
            < 5 * MIB
    );
    // Space freed below the parent can be written again.
    std::fs::remove_file(a.join("big")).unwrap();
    pool.admin(&["sync", "treequota"]);
    pool.admin(&["sync", "treequota"]);
    let more = fill_until(&b.join("more"), libc::EDQUOT);
    assert!(
        more >= 40 * MIB,
        "only {} MiB after 60 MiB were freed",
        more / MIB
    );
    stop_and_check(&mut pool);
}

#[test]
fn send_r_replicates_a_subtree_with_its_properties_and_snapshots() {
    const MIB: usize = 1 << 20;
    let mut source = TestPool::new("src");
    source.create("1G", &["a.img"]);
    let mut target = TestPool::new("dst");
    target.create("1G", &["a.img"]);
    let src_mnt = source.path("mnt");
    let (dst_mnt, piped_mnt) = (target.path("copy"), target.path("piped"));
    let _guards = [
        Unmount(src_mnt.join("late")),
        Unmount(src_mnt.join("b")),
        Unmount(src_mnt.clone()),
        Unmount(dst_mnt.join("late")),
        Unmount(dst_mnt.join("b")),
        Unmount(dst_mnt.clone()),
        Unmount(piped_mnt.join("b")),
        Unmount(piped_mnt.clone()),
    ];
    let directory = dir(&source);
    let mountpoint = format!("mountpoint={}", src_mnt.display());
    source.ok(&[
        "fs",
        "create",
        "src/a",
        "-o",
        &mountpoint,
        "-o",
        "atime=off",
        "-o",
        "org.example:tier=gold",
        "-d",
        &directory,
    ]);
    source.ok(&[
        "fs",
        "create",
        "src/a/b",
        "-o",
        "recordsize=16K",
        "-d",
        &directory,
    ]);
    source.ok(&["volume", "create", "-s", "src/a/v", "16M", "-d", &directory]);
    source.serve();
    wait_mounted(&source, &src_mnt);
    wait_mounted(&source, &src_mnt.join("b"));
    std::fs::write(src_mnt.join("top"), distinct_bytes(3 * MIB, 1)).unwrap();
    std::fs::write(src_mnt.join("b/first"), distinct_bytes(MIB, 2)).unwrap();
    qemu_io(&source.uri("a/v"), &["write -P 0x11 0 4M", "flush"]);
    source.admin(&["snapshot", "-r", "src/a@one"]);
    std::fs::write(src_mnt.join("b/second"), distinct_bytes(2 * MIB, 3)).unwrap();
    std::fs::remove_file(src_mnt.join("top")).unwrap();
    qemu_io(&source.uri("a/v"), &["write -P 0x22 1M 1M", "flush"]);
    source.admin(&["snapshot", "-r", "src/a@two"]);
    // A dataset without the snapshot is left out, with what is below it.
    source.admin(&["fs", "create", "src/a/late"]);
    let package = source.path("package");
    let said = source.send_to_file(&["send", "-R", "src/a@two"], &package);
    assert!(said.contains("src/a/late has no snapshot @two"), "{said}");

    target.serve();
    // From a file (read where it is without consuming it).
    let mountpoint = format!("mountpoint={}", dst_mnt.display());
    receive_ok(&target, "dst/copy", &package, &["-o", &mountpoint]);
    // And through a pipe, as `send -R | receive` runs.
    let pipeline = format!(
        "{bin} --control {src} send -R src/a@two | {bin} --control {dst} receive -o mountpoint={mnt} dst/piped",
        bin = ironpool_binary().display(),
        src = source.control().display(),
        dst = target.control().display(),
        mnt = piped_mnt.display()
    );
    let piped = std::process::Command::new("sh")
        .args(["-c", &pipeline])
        .output()
        .unwrap();
    assert!(
        piped.status.success(),
        "{}",
        String::from_utf8_lossy(&piped.stderr)
    );
    for (top, mnt) in [("dst/copy", &dst_mnt), ("dst/piped", &piped_mnt)] {
        let mut args = vec!["-r", top];
        let control = target.control().display().to_string();
        args.extend(["--control", &control]);
        assert_eq!(
            listed(&target, &args),
            [
                top.to_string(),
                format!("{top}@one"),
                format!("{top}@two"),
                format!("{top}/b"),
                format!("{top}/b@one"),
                format!("{top}/b@two"),
                format!("{top}/v"),
                format!("{top}/v@one"),
                format!("{top}/v@two"),
            ]
        );
        let control = ["--control", control.as_str()];
        assert_eq!(target.property_with(&control, top, "atime").0, "off");
        assert_eq!(
            target.property_with(&control, top, "org.example:tier").0,
            "gold"
        );
        // What the package carries is received (a copy's own `set` would
        // win over it); `-o` is set locally.
        assert_eq!(
            target.property_with(&control, &format!("{top}/b"), "recordsize"),
            ("16384".into(), "received".into())
        );
        assert_eq!(
            target.property_with(&control, top, "atime"),
            ("off".into(), "received".into())
        );
        assert_eq!(
            target.property_with(&control, top, "mountpoint"),
            (mnt.display().to_string(), "local".into())
        );
        wait_mounted(&target, mnt);
        wait_mounted(&target, &mnt.join("b"));
        assert!(!mnt.join("top").exists());
        assert!(std::fs::read(mnt.join("b/first")).unwrap() == distinct_bytes(MIB, 2));
        assert!(std::fs::read(mnt.join("b/second")).unwrap() == distinct_bytes(2 * MIB, 3));
        let volume = target.uri(&format!("{}/v", &top["dst/".len()..]));
        qemu_io(
            &volume,
            &[
                "read -P 0x11 0 1M",
                "read -P 0x22 1M 1M",
                "read -P 0x11 2M 2M",
            ],
        );
    }

    // An incremental package (-i @two) updates the copy that has @two, and
    // brings the dataset made since whole; -I sends every snapshot between.
    std::fs::write(src_mnt.join("b/third"), distinct_bytes(MIB, 4)).unwrap();
    qemu_io(&source.uri("a/v"), &["write -P 0x33 2M 1M", "flush"]);
    source.admin(&["snapshot", "-r", "src/a@three"]);
    let incremental = source.path("incremental");
    let refused = source.fails(&[
        "--control",
        &source.control().display().to_string(),
        "send",
        "-R",
        "-i",
        "@nope",
        "src/a@three",
    ]);
    assert!(refused.contains("no snapshot @nope"), "{refused}");
    source.send_to_file(&["send", "-R", "-i", "@two", "src/a@three"], &incremental);
    receive_ok(&target, "dst/copy", &incremental, &[]);
    std::fs::write(src_mnt.join("b/fourth"), distinct_bytes(MIB, 5)).unwrap();
    source.admin(&["set", "org.example:tier=silver", "src/a"]);
    source.admin(&["snapshot", "-r", "src/a@four"]);
    source.admin(&["snapshot", "-r", "src/a@five"]);
    let between = source.path("between");
    source.send_to_file(&["send", "-R", "-I", "@three", "src/a@five"], &between);
    receive_ok(&target, "dst/copy", &between, &[]);
    let control = target.control().display().to_string();
    assert_eq!(
        listed(&target, &["-r", "dst/copy", "--control", &control]),
        [
            "dst/copy",
            "dst/copy@one",
            "dst/copy@two",
            "dst/copy@three",
            "dst/copy@four",
            "dst/copy@five",
            "dst/copy/b",
            "dst/copy/b@one",
            "dst/copy/b@two",
            "dst/copy/b@three",
            "dst/copy/b@four",
            "dst/copy/b@five",
            "dst/copy/late",
            "dst/copy/late@three",
            "dst/copy/late@four",
            "dst/copy/late@five",
            "dst/copy/v",
            "dst/copy/v@one",
            "dst/copy/v@two",
            "dst/copy/v@three",
            "dst/copy/v@four",
            "dst/copy/v@five",
        ]
    );
    // The copy's own mountpoint (-o) stays; what the source changed since
    // is received again.
    assert_eq!(
        target.property_with(&["--control", &control], "dst/copy", "mountpoint"),
        (dst_mnt.display().to_string(), "local".into())
    );
    assert!(std::fs::read(dst_mnt.join("b/third")).unwrap() == distinct_bytes(MIB, 4));
    assert!(std::fs::read(dst_mnt.join("b/fourth")).unwrap() == distinct_bytes(MIB, 5));
    assert_eq!(
        target.property_with(&["--control", &control], "dst/copy", "org.example:tier"),
        ("silver".into(), "received".into())
    );
    qemu_io(
        &target.uri("copy/v"),
        &["read -P 0x22 1M 1M", "read -P 0x33 2M 1M"],
    );

    // What the sender destroys, and what only the copy has, stays on the
    // copy through a plain receive, and goes with `receive -F`, as `zfs
    // receive -F` of a replication stream mirrors its sender.
    source.admin(&["destroy", "src/a/b@three"]);
    source.admin(&["destroy", "-r", "src/a/late"]);
    source.admin(&["snapshot", "-r", "src/a@six"]);
    target.admin(&["volume", "create", "-s", "dst/copy/mine", "16M"]);
    let six = source.path("six");
    source.send_to_file(&["send", "-R", "-i", "@five", "src/a@six"], &six);
    receive_ok(&target, "dst/copy", &six, &[]);
    let kept = listed(&target, &["-r", "dst/copy", "--control", &control]);
    for still in ["dst/copy/b@three", "dst/copy/late", "dst/copy/mine"] {
        assert!(kept.iter().any(|name| name == still), "{still}: {kept:?}");
    }
    source.admin(&["snapshot", "-r", "src/a@seven"]);
    let seven = source.path("seven");
    source.send_to_file(&["send", "-R", "-i", "@six", "src/a@seven"], &seven);
    let said = receive_ok(&target, "dst/copy", &seven, &["-F"]);
    for gone in ["dst/copy/b@three", "dst/copy/late", "dst/copy/mine"] {
        assert!(
            said.contains(&format!("destroyed {gone} (gone on the sender)")),
            "{said}"
        );
    }
    let mirrored = listed(&target, &["-r", "dst/copy", "--control", &control]);
    let source_control = source.control().display().to_string();
    let expected: Vec<String> = listed(&source, &["-r", "src/a", "--control", &source_control])
        .iter()
        .map(|name| name.replacen("src/a", "dst/copy", 1))
        .collect();
    assert_eq!(mirrored, expected);
    assert!(std::fs::read(dst_mnt.join("b/fourth")).unwrap() == distinct_bytes(MIB, 5));
    stop_and_check(&mut target);
    stop_and_check(&mut source);
}
