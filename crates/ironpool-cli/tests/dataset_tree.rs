//! Nested datasets, as `zfs create -p`, `zfs get`'s SOURCE, `zfs list -r`
//! and `zfs destroy -r` have them: names as deep as OpenZFS allows, parents
//! that must exist (or `-p`), properties and mountpoints inherited down the
//! tree, and filesystems mounted inside their parents' mounts by the one
//! server that serves both.

mod common;

use std::path::Path;

use common::fuse::*;
use common::*;

/// `get PROPERTY NAME` as (value, source).
fn property(pool: &TestPool, args: &[&str], name: &str, property: &str) -> (String, String) {
    let mut full = vec!["--json", "get", property, name];
    full.extend_from_slice(args);
    let text = pool.ok(&full);
    let rows: serde_json::Value = serde_json::from_str(&text).expect("get JSON");
    let row = rows["properties"]
        .as_array()
        .and_then(|rows| rows.iter().find(|row| row["property"] == property))
        .unwrap_or_else(|| panic!("no {property} in {text}"))
        .clone();
    (
        row["value"].as_str().unwrap_or_default().to_string(),
        row["source"].as_str().unwrap_or_default().to_string(),
    )
}

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
        property(&pool, &d, "tree/a/b/c", "compression"),
        ("lz4".into(), "inherited from tree/a".into())
    );
    assert_eq!(
        property(&pool, &d, "tree/a/d/vol", "compression"),
        ("lz4".into(), "inherited from tree/a".into())
    );
    assert_eq!(
        property(&pool, &d, "tree/vol", "compression"),
        ("zstd".into(), "inherited from tree".into())
    );
    assert_eq!(
        property(&pool, &d, "tree/a/b/c", "atime"),
        ("off".into(), "inherited from tree/a".into())
    );
    assert_eq!(
        property(&pool, &d, "tree/a/b/c", "recordsize"),
        ("16384".into(), "inherited from tree/a/b".into())
    );
    assert_eq!(
        property(&pool, &d, "tree/a/b/c", "org.example:owner"),
        ("ops".into(), "inherited from tree".into())
    );
    // Space limits bind the dataset they are set on only.
    run(&["set", "quota=100M", "tree/a"]);
    assert_eq!(
        property(&pool, &d, "tree/a/b", "quota"),
        ("none".into(), "default".into())
    );
    // A mountpoint passes down with the rest of the name appended.
    assert_eq!(
        property(&pool, &d, "tree/a/b/c", "mountpoint"),
        ("/tree/a/b/c".into(), "default".into())
    );
    run(&["set", "mountpoint=/srv/area", "tree/a"]);
    assert_eq!(
        property(&pool, &d, "tree/a/b/c", "mountpoint"),
        ("/srv/area/b/c".into(), "inherited from tree/a".into())
    );
    run(&["inherit", "compression", "tree/a"]);
    assert_eq!(
        property(&pool, &d, "tree/a/b/c", "compression"),
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
        property(&pool, &d, "tree/x/y/a/b/c", "compression"),
        ("lz4".into(), "inherited from tree/x".into())
    );
    assert_eq!(
        property(&pool, &d, "tree/x/y/a/b/c", "recordsize"),
        ("16384".into(), "inherited from tree/x/y/a/b".into())
    );
    assert_eq!(
        property(&pool, &d, "tree/copy", "origin"),
        ("tree/x/y/a/b@s1".into(), "-".into())
    );
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
