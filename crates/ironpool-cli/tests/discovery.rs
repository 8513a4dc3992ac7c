//! Finding and moving pools: `import` lists the pools on the devices of some
//! directories, tells two pools of one name apart by guid (and renames one),
//! refuses a pool that was not exported without -f and one whose devices a
//! server holds; `export` of a served pool stops its server; `labelclear`
//! erases a device's labels only when no pool uses it.

mod common;

use std::process::Command;

use common::*;

/// `ironpool ARGS` with the environment of `pool` (its cache and run dir).
fn run(pool: &TestPool, args: &[&str]) -> (bool, String, String) {
    let output = pool.command().args(args).output().expect("run ironpool");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).to_string(),
        String::from_utf8_lossy(&output.stderr).to_string(),
    )
}

/// The pools `import --json -d A -d B` finds.
fn found(pool: &TestPool, dirs: &[&str]) -> Vec<serde_json::Value> {
    let mut args = vec!["--json", "import"];
    for dir in dirs {
        args.extend(["-d", dir]);
    }
    let (ok, stdout, stderr) = run(pool, &args);
    assert!(ok, "{stderr}");
    let listing: serde_json::Value = serde_json::from_str(&stdout).expect("import --json");
    listing["pools"].as_array().cloned().unwrap_or_default()
}

fn named<'a>(pools: &'a [serde_json::Value], name: &str) -> Vec<&'a serde_json::Value> {
    pools.iter().filter(|pool| pool["name"] == name).collect()
}

#[test]
fn two_pools_of_one_name_are_told_apart_by_guid_and_one_renamed() {
    let first = TestPool::new("dup");
    first.create("256M", &["mirror", "a.img", "b.img"]);
    first.create_volume("vol", "32M");
    let second = TestPool::new("dup");
    second.create("256M", &["c.img"]);
    let (a, b) = (dir(&first), dir(&second));
    let dirs = [a.as_str(), b.as_str()];

    let pools = found(&first, &dirs);
    let dups = named(&pools, "dup");
    assert_eq!(dups.len(), 2, "{pools:?}");
    for pool in &dups {
        assert_eq!(pool["exported_cleanly"], true, "{pool}");
        assert_eq!(pool["importable"], true, "{pool}");
    }
    let guid_of = |directory: &str| -> String {
        dups.iter()
            .find(|pool| {
                pool["devices"][0]
                    .as_str()
                    .is_some_and(|device| device.starts_with(directory))
            })
            .and_then(|pool| pool["guid"].as_str())
            .expect("a pool in the directory")
            .to_string()
    };
    let (first_guid, second_guid) = (guid_of(&a), guid_of(&b));
    assert_ne!(first_guid, second_guid);

    // By name it is ambiguous: both guids are named, nothing changes.
    let (ok, _, stderr) = run(&first, &["import", "-d", &a, "-d", &b, "dup"]);
    assert!(!ok);
    assert!(
        stderr.contains("more than one pool named 'dup'")
            && stderr.contains(&first_guid)
            && stderr.contains(&second_guid),
        "{stderr}"
    );
    // A new name that another pool has is refused.
    let (ok, _, stderr) = run(&first, &["import", "-d", &a, "-d", &b, &second_guid, "dup"]);
    assert!(
        !ok && stderr.contains("a pool named 'dup' is already there"),
        "{stderr}"
    );
    // By guid, under a new name.
    let (ok, stdout, stderr) = run(
        &first,
        &["import", "-d", &a, "-d", &b, &second_guid, "other"],
    );
    assert!(ok, "{stderr}");
    assert!(stdout.contains("imported pool 'other'"), "{stdout}");
    let pools = found(&first, &dirs);
    assert_eq!(named(&pools, "dup").len(), 1, "{pools:?}");
    let other = named(&pools, "other");
    assert_eq!(other.len(), 1, "{pools:?}");
    assert_eq!(other[0]["guid"], second_guid.as_str());
    // Now the name is unique, and the renamed pool opens by its new name.
    let (ok, _, stderr) = run(&first, &["import", "-d", &a, "-d", &b, "dup"]);
    assert!(ok, "{stderr}");
    let (ok, stdout, stderr) = run(&first, &["list"]);
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("dup") && stdout.contains("other"),
        "{stdout}"
    );
    let (ok, stdout, stderr) = run(&first, &["volume", "list", "dup"]);
    assert!(ok && stdout.contains("dup/vol"), "{stdout}{stderr}");
    // Bad input: a pool that is not there, a bad new name.
    let (ok, _, stderr) = run(&first, &["import", "-d", &a, "nothing"]);
    assert!(
        !ok && stderr.contains("no pool 'nothing' found"),
        "{stderr}"
    );
    let (ok, _, stderr) = run(&first, &["import", "-d", &b, "other", "bad/name"]);
    assert!(!ok && stderr.contains("not a valid pool name"), "{stderr}");
    let pools = found(&first, &[b.as_str()]);
    assert_eq!(
        named(&pools, "other").len(),
        1,
        "a refused rename changed the pool"
    );
}

#[test]
fn import_refuses_a_pool_in_use_or_not_exported_and_export_stops_its_server() {
    let mut pool = TestPool::new("mv");
    pool.create("256M", &["mirror", "a.img", "b.img"]);
    pool.create_volume("vol", "32M");
    let directory = dir(&pool);
    pool.serve();
    qemu_io(&pool.uri("vol"), &["write -P 0x3c 0 1M", "flush"]);

    // Served: the labels say it is in use, and its devices are held.
    let pools = found(&pool, &[&directory]);
    assert_eq!(pools[0]["exported_cleanly"], false, "{pools:?}");
    let (ok, _, stderr) = run(&pool, &["import", "-f", "-d", &directory, "mv"]);
    assert!(!ok && stderr.contains("in use"), "{stderr}");
    let device = pool.path("a.img").display().to_string();
    let (ok, _, stderr) = run(&pool, &["labelclear", "-f", &device]);
    assert!(!ok && stderr.contains("in use"), "{stderr}");

    // A server that dies leaves the pool not exported: -f is needed.
    pool.kill9();
    let (ok, _, stderr) = run(&pool, &["import", "-d", &directory, "mv"]);
    assert!(!ok, "imported a pool that was not exported without -f");
    assert!(
        stderr.contains("was not exported") && stderr.contains("import -f"),
        "{stderr}"
    );
    let (ok, _, stderr) = run(&pool, &["labelclear", &device]);
    assert!(!ok && stderr.contains("labelclear -f"), "{stderr}");
    let (ok, stdout, stderr) = run(&pool, &["import", "-f", "-d", &directory, "mv"]);
    assert!(
        ok && stdout.contains("imported pool 'mv'"),
        "{stdout}{stderr}"
    );
    assert_eq!(found(&pool, &[&directory])[0]["exported_cleanly"], true);

    // `export` of a served pool: its server finishes, exports and exits.
    pool.serve();
    let control = pool.control().display().to_string();
    let (ok, stdout, stderr) = run(&pool, &["--control", &control, "export", "mv"]);
    assert!(
        ok && stdout.contains("exported pool 'mv'"),
        "{stdout}{stderr}"
    );
    let mut server = pool.server.take().expect("the server");
    let status = server.wait().expect("the server exits");
    assert!(status.success(), "{status}: {}", pool.log());
    assert!(pool.log().contains("pool 'mv' exported"), "{}", pool.log());
    assert_eq!(found(&pool, &[&directory])[0]["exported_cleanly"], true);
    // Forgotten here: a command without -d does not find it any more.
    let (ok, _, stderr) = run(&pool, &["status", "mv"]);
    assert!(!ok && stderr.contains("pass -d DIR"), "{stderr}");
    // The data is all there after an import.
    let (ok, _, stderr) = run(&pool, &["import", "-d", &directory, "mv"]);
    assert!(ok, "{stderr}");
    pool.serve();
    let read = Command::new("qemu-io")
        .args(["-f", "raw", &pool.uri("vol"), "-c", "read -P 0x3c 0 1M"])
        .output()
        .expect("qemu-io");
    let text = String::from_utf8_lossy(&read.stdout);
    assert!(
        read.status.success() && !text.contains("Pattern verification failed"),
        "{text}"
    );
    pool.stop();

    // An exported pool's device: its labels go, and the pool is one device
    // short (a mirror still imports).
    let (ok, stdout, stderr) = run(&pool, &["labelclear", &device]);
    assert!(
        ok && stdout.contains("belonged to pool 'mv'"),
        "{stdout}{stderr}"
    );
    let pools = found(&pool, &[&directory]);
    assert_eq!(
        pools[0]["devices"].as_array().map(Vec::len),
        Some(1),
        "{pools:?}"
    );
    let (ok, _, stderr) = run(&pool, &["labelclear", &device]);
    assert!(!ok && stderr.contains("no ironpool label"), "{stderr}");
    let missing = pool.path("nothing.img").display().to_string();
    let (ok, _, stderr) = run(&pool, &["labelclear", &missing]);
    assert!(!ok && stderr.contains("no such file"), "{stderr}");
}
