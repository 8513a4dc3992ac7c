//! Tests that are not fio's: loops of system calls on a directory of the
//! target's filesystem, measured in operations per second (the metadata
//! and names parts of the fs suite). A compiled loop, so that the figure is
//! the filesystem's: fio's file engines spend more time on their own
//! bookkeeping than ext4 spends on a create.
//!
//! The metadata phases share one directory: `files-create` makes the
//! files, `files-stat` and `files-absent` look names up, `files-delete`
//! removes them and the directory. Run out of order, a phase fails with the
//! system's error rather than measuring something else.

use std::ffi::CString;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::interrupt;
use crate::suites::{OpsTest, SEND_FILES_BYTES, SEND_FILES_DIRECTORIES};

/// Bytes each names test writes per file: a small file, as a mail spool,
/// a package manager or an editor's atomic save writes.
const NAMES_FILE_BYTES: usize = 4096;
/// Operations between two calls of the progress callback: often enough to
/// keep the display moving, rarely enough to cost nothing.
const TICK_EVERY: u64 = 256;
/// The sqlite test, in python3's sqlite3 module (the library a program
/// links; no sqlite crate is needed for it): rows inserted, one commit
/// each, for the given seconds; prints the commits and the seconds.
const SQLITE_SCRIPT: &str = r#"
import os, sqlite3, sys, time
path, seconds = sys.argv[1], float(sys.argv[2])
db = sqlite3.connect(path, isolation_level=None)
db.execute("pragma journal_mode=delete")
db.execute("pragma synchronous=full")
db.execute("create table t(id integer primary key, v blob)")
row = os.urandom(100)
done = 0
start = time.monotonic()
while time.monotonic() - start < seconds:
    db.execute("begin")
    db.execute("insert into t(v) values (?)", (row,))
    db.execute("commit")
    done += 1
print(done, time.monotonic() - start)
"#;

/// What a test did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OpsRun {
    /// Operations completed.
    pub operations: u64,
    /// Seconds they took.
    pub seconds: f64,
}

impl OpsRun {
    /// Operations per second.
    pub fn rate(&self) -> f64 {
        if self.seconds > 0.0 {
            self.operations as f64 / self.seconds
        } else {
            0.0
        }
    }
}

/// The directory the metadata phases share.
fn metadata_dir(root: &Path) -> PathBuf {
    root.join("ironpool-bench-metadata")
}

/// Runs `test` in `root` (a directory of the filesystem under test):
/// `files` files for the metadata phases, `runtime` for the names tests.
/// `tick` is called now and then, for a progress display.
pub fn run(
    test: OpsTest,
    root: &Path,
    files: u64,
    runtime: Duration,
    tick: &mut dyn FnMut(),
) -> Result<OpsRun> {
    let dir = metadata_dir(root);
    let names = |prefix: &str| file_names(&dir, prefix, files);
    let timed = |body: &mut dyn FnMut() -> Result<u64>| -> Result<OpsRun> {
        let start = Instant::now();
        let operations = body()?;
        Ok(OpsRun {
            operations,
            seconds: start.elapsed().as_secs_f64(),
        })
    };
    match test {
        OpsTest::FilesCreate => {
            if dir.exists() {
                std::fs::remove_dir_all(&dir)
                    .with_context(|| format!("removing an old {}", dir.display()))?;
            }
            std::fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
            let names = names("f")?;
            timed(&mut || each(&names, tick, create))
        }
        OpsTest::FilesStat => {
            let names = names("f")?;
            timed(&mut || each(&names, tick, |name| stat(name, true)))
        }
        OpsTest::FilesAbsent => {
            let names = names("absent")?;
            timed(&mut || each(&names, tick, |name| stat(name, false)))
        }
        OpsTest::FilesDelete => {
            let names = names("f")?;
            let run = timed(&mut || each(&names, tick, unlink))?;
            std::fs::remove_dir(&dir)
                .with_context(|| format!("{} is not empty after the deletes", dir.display()))?;
            Ok(run)
        }
        OpsTest::NamesSqlite => in_fresh_dir(root, test, |work| sqlite(work, runtime)),
        OpsTest::NamesCreate => in_fresh_dir(root, test, |work| {
            names_loop(work, runtime, tick, |work, dir, index| {
                let path = work.join(format!("f{index}"));
                write_synced(&path)?;
                sync_dir(dir)
            })
        }),
        OpsTest::NamesReplace => in_fresh_dir(root, test, |work| {
            let target = work.join("target");
            let temporary = work.join("target.tmp");
            names_loop(work, runtime, tick, |_, dir, _| {
                write_synced(&temporary)?;
                std::fs::rename(&temporary, &target)
                    .with_context(|| format!("renaming {} over its target", temporary.display()))?;
                sync_dir(dir)
            })
        }),
        // The suites' tests that need the pool's commands (see
        // `OpsTest::runner_only`).
        other => bail!(
            "{} needs the target's commands: the runner runs it",
            other.name()
        ),
    }
}

/// The directory of `root` that `snapshot-take` fills before its
/// snapshot, and `snapshot-list` lists in the snapshot.
pub fn snapshot_files_dir(root: &Path) -> PathBuf {
    root.join("ironpool-bench-snapshot")
}

/// `snapshot-take`: makes `files` empty files in a fresh
/// [`snapshot_files_dir`] of `root` (not timed), then times `take` (the
/// snapshot's command) as one operation.
pub fn snapshot_take(
    root: &Path,
    files: u64,
    tick: &mut dyn FnMut(),
    take: &mut dyn FnMut() -> Result<()>,
) -> Result<OpsRun> {
    let dir = snapshot_files_dir(root);
    if dir.exists() {
        std::fs::remove_dir_all(&dir)
            .with_context(|| format!("removing an old {}", dir.display()))?;
    }
    create_empty_files(&dir, files, tick)?;
    let start = Instant::now();
    take()?;
    Ok(OpsRun {
        operations: 1,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// Makes `files` empty files in a new directory `dir` (not timed: the
/// stall suite's tree to remove).
pub fn create_empty_files(dir: &Path, files: u64, tick: &mut dyn FnMut()) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    each(&file_names(dir, "f", files)?, tick, create)?;
    Ok(())
}

/// The paths `dir/PREFIX00000000` to `dir/PREFIX{count - 1}`, for the
/// system calls of the loops that make, look up and remove them.
fn file_names(dir: &Path, prefix: &str, count: u64) -> Result<Vec<CString>> {
    (0..count)
        .map(|i| {
            CString::new(dir.join(format!("{prefix}{i:08}")).as_os_str().as_bytes())
                .context("a path with a NUL byte")
        })
        .collect()
}

/// `snapshot-list`: reads directory `dir` (of a snapshot) and `stat`s each
/// name in it, as `ls -l` does; one operation per name. A directory with
/// no names is an error: the listing measured nothing.
pub fn snapshot_list(dir: &Path, tick: &mut dyn FnMut()) -> Result<OpsRun> {
    let start = Instant::now();
    let mut operations = 0;
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let entry = entry.with_context(|| format!("listing {}", dir.display()))?;
        entry
            .metadata()
            .with_context(|| format!("stat of {}", entry.path().display()))?;
        operations += 1;
        if operations % TICK_EVERY == 0 {
            tick();
        }
    }
    if operations == 0 {
        bail!("{} lists no names", dir.display());
    }
    Ok(OpsRun {
        operations,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// Makes `files` files of [`SEND_FILES_BYTES`] in
/// [`SEND_FILES_DIRECTORIES`] directories of `root`: each a rotation of one
/// block of pseudo-random bytes, so that no two are alike and none
/// compresses.
pub fn make_small_files(root: &Path, files: u64, tick: &mut dyn FnMut()) -> Result<()> {
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let block: Vec<u8> = (0..SEND_FILES_BYTES)
        .map(|_| {
            // xorshift64: cheap bytes no compressor shrinks.
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    for index in 0..files {
        if interrupt::requested() {
            bail!("interrupted (Ctrl-C)");
        }
        let dir = root.join(format!("d{}", index % SEND_FILES_DIRECTORIES));
        if index < SEND_FILES_DIRECTORIES {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let turn = (index as usize) % SEND_FILES_BYTES;
        let mut bytes = block[turn..].to_vec();
        bytes.extend_from_slice(&block[..turn]);
        let path = dir.join(format!("f{index}"));
        std::fs::write(&path, &bytes).with_context(|| format!("writing {}", path.display()))?;
        if (index + 1) % TICK_EVERY == 0 {
            tick();
        }
    }
    Ok(())
}

/// `tar -C FROM -cf - . | tar -C TO -xf -` (TO made first), timed; returns
/// the seconds and the command line.
pub fn tar_copy(from: &Path, to: &Path) -> Result<(f64, Vec<String>)> {
    std::fs::create_dir_all(to).with_context(|| format!("creating {}", to.display()))?;
    let line = format!(
        "set -o pipefail; tar -C '{}' -cf - . | tar -C '{}' -xf -",
        from.display(),
        to.display()
    );
    let argv = vec!["bash".to_string(), "-c".to_string(), line];
    let start = Instant::now();
    let output = Command::new(&argv[0])
        .args(&argv[1..])
        .output()
        .context("running tar")?;
    let seconds = start.elapsed().as_secs_f64();
    if !output.status.success() {
        bail!(
            "{} exited with {}: {}",
            argv[2],
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok((seconds, argv))
}

/// Runs `body` in a new directory `root/names-TEST`, removed afterwards.
fn in_fresh_dir(
    root: &Path,
    test: OpsTest,
    body: impl FnOnce(&Path) -> Result<OpsRun>,
) -> Result<OpsRun> {
    let work = root.join(format!("ironpool-bench-{}", test.name()));
    if work.exists() {
        std::fs::remove_dir_all(&work)
            .with_context(|| format!("removing an old {}", work.display()))?;
    }
    std::fs::create_dir(&work).with_context(|| format!("creating {}", work.display()))?;
    let run = body(&work);
    let removed =
        std::fs::remove_dir_all(&work).with_context(|| format!("removing {}", work.display()));
    let run = run?;
    removed?;
    Ok(run)
}

/// Runs `step(work, directory, index)` until `runtime` has passed (or
/// Ctrl-C), with the directory open for its fsyncs.
fn names_loop(
    work: &Path,
    runtime: Duration,
    tick: &mut dyn FnMut(),
    mut step: impl FnMut(&Path, &std::fs::File, u64) -> Result<()>,
) -> Result<OpsRun> {
    let dir = std::fs::File::open(work).with_context(|| format!("opening {}", work.display()))?;
    let start = Instant::now();
    let mut operations = 0;
    while start.elapsed() < runtime && !interrupt::requested() {
        step(work, &dir, operations)?;
        operations += 1;
        if operations % TICK_EVERY == 0 {
            tick();
        }
    }
    Ok(OpsRun {
        operations,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// Creates (or truncates) `path`, writes a small file and fsyncs it.
fn write_synced(path: &Path) -> Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    file.write_all(&[0x5a; NAMES_FILE_BYTES])
        .and_then(|()| file.sync_all())
        .with_context(|| format!("writing and syncing {}", path.display()))
}

fn sync_dir(dir: &std::fs::File) -> Result<()> {
    dir.sync_all().context("fsync of the directory")
}

/// The sqlite test through python3 (see [`SQLITE_SCRIPT`]).
fn sqlite(work: &Path, runtime: Duration) -> Result<OpsRun> {
    let output = Command::new("python3")
        .arg("-c")
        .arg(SQLITE_SCRIPT)
        .arg(work.join("t.db"))
        .arg(runtime.as_secs_f64().to_string())
        .output()
        .context("running python3 for the sqlite test (apt-get install python3)")?;
    if !output.status.success() {
        bail!(
            "the sqlite test failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let mut words = text.split_whitespace();
    let (Some(operations), Some(seconds)) = (words.next(), words.next()) else {
        bail!("the sqlite test printed {text:?}, not its commits and seconds");
    };
    Ok(OpsRun {
        operations: operations.parse().context("the sqlite test's commits")?,
        seconds: seconds.parse().context("the sqlite test's seconds")?,
    })
}

/// Calls `op` on every name, stopping at the first error; returns how many.
fn each(
    names: &[CString],
    tick: &mut dyn FnMut(),
    mut op: impl FnMut(&CString) -> Result<()>,
) -> Result<u64> {
    let mut done = 0;
    for name in names {
        if interrupt::requested() {
            bail!("interrupted (Ctrl-C)");
        }
        op(name)?;
        done += 1;
        if done % TICK_EVERY == 0 {
            tick();
        }
    }
    Ok(done)
}

fn create(name: &CString) -> Result<()> {
    // SAFETY: a NUL-terminated path.
    let fd = unsafe {
        libc::open(
            name.as_ptr(),
            libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_CLOEXEC,
            0o644,
        )
    };
    if fd < 0 {
        bail!("create {name:?}: {}", std::io::Error::last_os_error());
    }
    // SAFETY: fd was just opened here and is closed once.
    unsafe { libc::close(fd) };
    Ok(())
}

/// `stat` of a name that exists (`exist`) or must not.
fn stat(name: &CString, exist: bool) -> Result<()> {
    // SAFETY: all zeros is a valid `struct stat`.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a stat buffer of the right type.
    let done = unsafe { libc::stat(name.as_ptr(), &mut stat) };
    let error = std::io::Error::last_os_error();
    match (exist, done == 0) {
        (true, true) => Ok(()),
        (true, false) => bail!("stat {name:?}: {error} (files-create runs first)"),
        (false, false) if error.raw_os_error() == Some(libc::ENOENT) => Ok(()),
        (false, _) => bail!("stat {name:?} of a name never made: {done} {error}"),
    }
}

fn unlink(name: &CString) -> Result<()> {
    // SAFETY: a NUL-terminated path.
    if unsafe { libc::unlink(name.as_ptr()) } != 0 {
        bail!("unlink {name:?}: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("ironpool-bench-ops-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn metadata_phases_count_their_files_and_clean_up() {
        let root = scratch("metadata");
        let mut ticks = 0;
        let mut tick = || ticks += 1;
        for test in [
            OpsTest::FilesCreate,
            OpsTest::FilesStat,
            OpsTest::FilesAbsent,
            OpsTest::FilesDelete,
        ] {
            let run = run(test, &root, 600, Duration::ZERO, &mut tick).unwrap();
            assert_eq!(run.operations, 600, "{test:?}");
            assert!(run.rate() > 0.0);
        }
        assert!(ticks >= 8, "{ticks}");
        assert_eq!(std::fs::read_dir(&root).unwrap().count(), 0);
        // Out of order, a phase says what is missing.
        let error = run(OpsTest::FilesStat, &root, 1, Duration::ZERO, &mut || {}).unwrap_err();
        assert!(
            format!("{error:#}").contains("files-create runs first"),
            "{error:#}"
        );
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn names_tests_run_for_their_time_and_leave_nothing() {
        let root = scratch("names");
        for test in [OpsTest::NamesCreate, OpsTest::NamesReplace] {
            let run = run(test, &root, 0, Duration::from_millis(200), &mut || {}).unwrap();
            assert!(run.operations > 0 && run.seconds >= 0.2, "{test:?} {run:?}");
        }
        assert_eq!(std::fs::read_dir(&root).unwrap().count(), 0);
        std::fs::remove_dir_all(&root).unwrap();
    }
}
