//! Creates, stats and removes N empty files in one directory, one system call
//! after another, and prints the rate of each phase: the metadata half of
//! `scripts/bench-fs.sh`. A compiled loop, so the figure is the filesystem's
//! and not an interpreter's (fio's file engines spend more time on their own
//! bookkeeping than ext4 spends on a create).
//!
//!     cargo run --release -p ironpool-bench --example metadata -- DIR [FILES]
//!
//! Prints `create FILES/S`, `stat FILES/S` and `delete FILES/S`, one per line.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Instant;

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = args.next().expect("usage: metadata DIR [FILES]");
    let files: usize = args
        .next()
        .map_or(100_000, |n| n.parse().expect("FILES is a number"));
    let dir = Path::new(&dir).join("metadata");
    std::fs::create_dir_all(&dir).expect("the directory can be made");
    let names: Vec<CString> = (0..files)
        .map(|i| CString::new(dir.join(format!("f{i:08}")).as_os_str().as_bytes()).expect("no NUL"))
        .collect();
    let rate = |phase: &str, start: Instant| {
        let seconds = start.elapsed().as_secs_f64();
        println!("{phase} {:.0}", files as f64 / seconds);
    };
    let start = Instant::now();
    for name in &names {
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
    rate("create", start);
    let start = Instant::now();
    for name in &names {
        // SAFETY: all zeros is a valid `struct stat`.
        let mut stat: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: a NUL-terminated path and a stat buffer of the right type.
        let done = unsafe { libc::stat(name.as_ptr(), &mut stat) };
        assert!(
            done == 0,
            "stat {name:?}: {}",
            std::io::Error::last_os_error()
        );
    }
    rate("stat", start);
    let start = Instant::now();
    for name in &names {
        // SAFETY: a NUL-terminated path.
        let done = unsafe { libc::unlink(name.as_ptr()) };
        assert!(
            done == 0,
            "unlink {name:?}: {}",
            std::io::Error::last_os_error()
        );
    }
    rate("delete", start);
    std::fs::remove_dir(&dir).expect("the directory is empty again");
}
