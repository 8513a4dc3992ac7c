//! POSIX ACLs with `acltype=posix`, through a real mount with the real
//! tools (`setfacl`, `getfacl` from the acl package) and the kernel's own
//! access checks: an ACL set is kept and read back, lets in the user it
//! names and no one else, follows a `chmod`, and a directory's default
//! ACL is what is made inside starts with (the umask applying where there
//! is none). Off (the default), the ACL attributes are refused, as by a
//! filesystem mounted `noacl`. Kept across a restart, and through the
//! intent log across a kill -9.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use common::fuse::*;
use common::*;

/// `getfacl` of `path` (`-c`: no header; `-n`: numeric ids), one entry a
/// line.
fn getfacl(path: &Path) -> Vec<String> {
    tool("getfacl", &["-c", "-n", &path.display().to_string()])
        .lines()
        .map(str::to_string)
        .filter(|line| !line.is_empty())
        .collect()
}

/// Runs `sh -c script` as user and group `id` with no other groups.
fn as_user(id: u32, script: &str) -> std::process::Output {
    std::process::Command::new("setpriv")
        .args([
            &format!("--reuid={id}"),
            &format!("--regid={id}"),
            "--clear-groups",
            "sh",
            "-c",
            script,
        ])
        .output()
        .expect("setpriv (util-linux) runs")
}

#[test]
fn posix_acls_are_kept_checked_by_the_kernel_and_inherited() {
    let (mut pool, mnt, _unmount) = served_filesystem("fsacl");
    let fs = format!("{}/fs", pool.name);
    let file = mnt.join("shared");
    std::fs::write(&file, b"secret").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let path = file.display().to_string();

    // Off by default: refused, so tools fall back to the mode.
    let refused = tool_fails("setfacl", &["-m", "u:4321:r", &path]);
    assert!(refused.contains("not supported"), "{refused}");
    pool.admin(&["set", "acltype=posix", &fs]);
    assert_eq!(pool.property(&fs, "acltype").0, "posix");
    // The mount is made again with ACLs checked.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::process::Command::new("setfacl")
        .args(["-m", "u:4321:r", &path])
        .output()
        .map(|output| !output.status.success())
        .unwrap_or(true)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "setfacl after acltype=posix"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let acl = getfacl(&file);
    assert!(acl.contains(&"user:4321:r--".to_string()), "{acl:?}");
    assert!(acl.contains(&"mask::r--".to_string()), "{acl:?}");
    // The mode's group bits are the mask.
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o640
    );

    // The kernel checks it: the user named reads, another does not.
    let cat = format!("cat {path}");
    let named = as_user(4321, &cat);
    assert!(
        named.status.success(),
        "{}",
        String::from_utf8_lossy(&named.stderr)
    );
    assert_eq!(named.stdout, b"secret");
    let other = as_user(4322, &cat);
    assert!(
        !other.status.success(),
        "a user the ACL does not name read the file"
    );
    assert!(!as_user(4321, &format!("echo x >> {path}")).status.success());

    // A chmod sets the mask: the named user loses what the mask takes.
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let acl = getfacl(&file);
    assert!(
        acl.iter().any(|line| line.starts_with("mask::---")),
        "{acl:?}"
    );
    assert!(
        !as_user(4321, &cat).status.success(),
        "the mask should shut the user out"
    );
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).unwrap();
    assert!(as_user(4321, &cat).status.success());
    // An ACL the mode says all of is not kept, only the mode: `setfacl -b`
    // leaves the owning group's entry as the group bits.
    tool("setfacl", &["-b", &path]);
    assert_eq!(getfacl(&file), ["user::rw-", "group::---", "other::---"]);
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );

    // A default ACL: what is made inside starts from it (a directory keeps
    // it too), limited by the mode asked for, not by the umask.
    let dir = mnt.join("project");
    std::fs::create_dir(&dir).unwrap();
    let dir_path = dir.display().to_string();
    tool("setfacl", &["-d", "-m", "u:4321:rwx", &dir_path]);
    tool(
        "sh",
        &[
            "-c",
            &format!("umask 077 && touch {dir_path}/new && mkdir {dir_path}/sub"),
        ],
    );
    let inherited = getfacl(&dir.join("new"));
    assert!(
        inherited
            .iter()
            .any(|line| line.starts_with("user:4321:rwx")),
        "{inherited:?}"
    );
    assert!(
        inherited.contains(&"mask::rw-".to_string()),
        "{inherited:?}"
    );
    let sub = getfacl(&dir.join("sub"));
    assert!(
        sub.iter().any(|line| line == "default:user:4321:rwx"),
        "{sub:?}"
    );
    assert!(as_user(4321, &format!("echo hi > {dir_path}/new"))
        .status
        .success());
    // Without a default ACL the umask applies.
    tool(
        "sh",
        &["-c", &format!("umask 027 && touch {}/plain", mnt.display())],
    );
    let plain = std::fs::metadata(mnt.join("plain"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(plain & 0o777, 0o640);
    // A default ACL is a directory's (user::rw- group::r-- other::---).
    let mut value = 2u32.to_le_bytes().to_vec();
    for (tag, perm) in [(1u16, 6u16), (4, 4), (0x20, 0)] {
        value.extend_from_slice(&tag.to_le_bytes());
        value.extend_from_slice(&perm.to_le_bytes());
        value.extend_from_slice(&u32::MAX.to_le_bytes());
    }
    assert!(
        set_xattr(&file, "system.posix_acl_default", &value, 0).is_err(),
        "a default ACL on a file"
    );
    set_xattr(&dir, "system.posix_acl_default", &value, 0).unwrap();
    assert_eq!(
        tool("getfacl", &["-c", "-d", &dir_path])
            .lines()
            .filter(|line| !line.is_empty())
            .collect::<Vec<_>>(),
        ["user::rw-", "group::r--", "other::---"],
        "the default ACL set through the attribute"
    );

    // Through the intent log and a kill -9, then a restart.
    tool("setfacl", &["-m", "u:4321:rw", &path]);
    std::fs::File::open(&file).unwrap().sync_all().unwrap();
    pool.kill9();
    pool.serve();
    wait_mounted(&pool, &mnt);
    assert!(getfacl(&file).contains(&"user:4321:rw-".to_string()));
    pool.stop();
    pool.serve();
    wait_mounted(&pool, &mnt);
    assert!(getfacl(&dir.join("new"))
        .iter()
        .any(|line| line.starts_with("user:4321:rwx")));
    assert!(as_user(4321, &cat).status.success());
    stop_and_check(&mut pool);
}
