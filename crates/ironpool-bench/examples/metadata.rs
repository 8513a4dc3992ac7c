//! Creates, stats and removes N empty files in one directory, one system call
//! after another, and prints the rate of each phase: the metadata half of
//! `scripts/bench-fs.sh`. A compiled loop, so the figure is the filesystem's
//! and not an interpreter's (fio's file engines spend more time on their own
//! bookkeeping than ext4 spends on a create).
//!
//!     cargo run --release -p ironpool-bench --example metadata -- DIR [FILES [PHASE...]]
//!
//! PHASE is `create`, `stat`, `absent` (a `stat` of N names that do not
//! exist: on FUSE, one LOOKUP round trip each, which is what a round trip
//! costs) or `delete`; by default `create stat delete`. Phases may run in
//! separate invocations (a script reads the server's counters between
//! them). Prints `PHASE FILES/S`, one line per phase.
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Instant;

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = args.next().expect("usage: metadata DIR [FILES [PHASE...]]");
    let files: usize = args
        .next()
        .map_or(100_000, |n| n.parse().expect("FILES is a number"));
    let phases: Vec<String> = args.collect();
    let phases = if phases.is_empty() {
        vec!["create".to_string(), "stat".into(), "delete".into()]
    } else {
        phases
    };
    let dir = Path::new(&dir).join("metadata");
    std::fs::create_dir_all(&dir).expect("the directory can be made");
    let paths = |prefix: &str| -> Vec<CString> {
        (0..files)
            .map(|i| {
                CString::new(dir.join(format!("{prefix}{i:08}")).as_os_str().as_bytes())
                    .expect("no NUL")
            })
            .collect()
    };
    let names = paths("f");
    for phase in phases {
        let start = Instant::now();
        match phase.as_str() {
            "create" => create(&names),
            "stat" => stat(&names, true),
            "absent" => stat(&paths("absent"), false),
            "delete" => {
                delete(&names);
                std::fs::remove_dir(&dir).expect("the directory is empty again");
            }
            other => panic!("unknown phase {other}: create, stat, absent or delete"),
        }
        println!(
            "{phase} {:.0}",
            files as f64 / start.elapsed().as_secs_f64()
        );
    }
}

fn create(names: &[CString]) {
    for name in names {
        // SAFETY: a NUL-terminated path.
        let fd = unsafe {
            libc::open(
                name.as_ptr(),
                libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_CLOEXEC,
                0o644,
            )
        };
        assert!(
            fd >= 0,
            "create {name:?}: {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: fd was just opened here.
        unsafe { libc::close(fd) };
    }
}

/// `stat` of every name: each exists (`exist`), or none does.
fn stat(names: &[CString], exist: bool) {
    for name in names {
        // SAFETY: all zeros is a valid `struct stat`.
        let mut stat: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: a NUL-terminated path and a stat buffer of the right type.
        let done = unsafe { libc::stat(name.as_ptr(), &mut stat) };
        let error = std::io::Error::last_os_error();
        if exist {
            assert!(done == 0, "stat {name:?}: {error}");
        } else {
            assert!(
                done != 0 && error.raw_os_error() == Some(libc::ENOENT),
                "stat {name:?} of a name never made: {done} {error}"
            );
        }
    }
}

fn delete(names: &[CString]) {
    for name in names {
        // SAFETY: a NUL-terminated path.
        let done = unsafe { libc::unlink(name.as_ptr()) };
        assert!(
            done == 0,
            "unlink {name:?}: {}",
            std::io::Error::last_os_error()
        );
    }
}
