//! Helpers for tests that run the real `ironpool` binary against real clients
//! (nbdinfo, qemu-io, fio) on pools of real files.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub fn ironpool_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_ironpool"))
}

/// A pool in a temporary directory, with its own cache and run directories so
/// tests never touch the system's.
pub struct TestPool {
    pub dir: tempfile::TempDir,
    pub name: String,
    pub server: Option<Child>,
}

impl TestPool {
    pub fn new(name: &str) -> TestPool {
        let dir = tempfile::Builder::new().prefix("ironpool-test-").tempdir_in(test_root()).expect("temporary directory");
        TestPool { dir, name: name.to_string(), server: None }
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    pub fn socket(&self) -> PathBuf {
        self.path("nbd.sock")
    }

    pub fn control(&self) -> PathBuf {
        self.path("control.sock")
    }

    pub fn uri(&self, volume: &str) -> String {
        format!("nbd+unix:///{}/{}?socket={}", self.name, volume, self.socket().display())
    }

    /// A command of the binary with this pool's environment.
    pub fn command(&self) -> Command {
        let mut command = Command::new(ironpool_binary());
        command.env("IRONPOOL_CACHE", self.path("cache.json")).env("IRONPOOL_RUN_DIR", self.path("run")).env_remove("IRONPOOL_CONTROL");
        command
    }

    /// Runs `ironpool ARGS` and returns its output.
    pub fn run(&self, args: &[&str]) -> Output {
        let output = self.command().args(args).output().expect("run ironpool");
        output
    }

    /// Runs `ironpool ARGS`, failing the test if it fails.
    pub fn ok(&self, args: &[&str]) -> String {
        let output = self.run(args);
        assert!(output.status.success(), "ironpool {args:?} failed:\nstdout: {}\nstderr: {}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        String::from_utf8_lossy(&output.stdout).to_string()
    }

    /// Runs `ironpool ARGS`, failing the test if it succeeds; returns stderr.
    pub fn fails(&self, args: &[&str]) -> String {
        let output = self.run(args);
        assert!(!output.status.success(), "ironpool {args:?} should have failed:\nstdout: {}", String::from_utf8_lossy(&output.stdout));
        String::from_utf8_lossy(&output.stderr).to_string()
    }

    /// Creates the pool: `layout` like ["mirror", "a.img", "b.img"] or
    /// ["raidz2", ...] (file names are made relative to the pool directory).
    pub fn create(&self, size: &str, layout: &[&str]) {
        let mut args: Vec<String> = vec!["create".into(), "--size".into(), size.into(), self.name.clone()];
        for word in layout {
            if *word == "mirror" || word.starts_with("raidz") {
                args.push(word.to_string());
            } else {
                args.push(self.path(word).display().to_string());
            }
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.ok(&args);
    }

    pub fn create_volume(&self, volume: &str, size: &str) {
        let name = format!("{}/{}", self.name, volume);
        let dir = self.dir.path().display().to_string();
        self.ok(&["volume", "create", &name, size, "-d", &dir]);
    }

    /// Starts `ironpool serve` and waits until it listens.
    pub fn serve(&mut self) {
        assert!(self.server.is_none(), "already serving");
        let _ = std::fs::remove_file(self.path("pid"));
        let log = std::fs::File::create(self.path("serve.log")).expect("log file");
        let child = self
            .command()
            .args(["serve", "-d"])
            .arg(self.dir.path())
            .arg("--nbd")
            .arg(format!("unix:{}", self.socket().display()))
            .arg("--control")
            .arg(self.control())
            .arg("--pidfile")
            .arg(self.path("pid"))
            .arg(&self.name)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start ironpool serve");
        self.server = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.path("pid").exists() {
            if let Some(status) = self.server.as_mut().and_then(|child| child.try_wait().ok().flatten()) {
                panic!("ironpool serve exited with {status}: {}", self.log());
            }
            assert!(Instant::now() < deadline, "ironpool serve did not start: {}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Runs `ironpool serve` expecting it to refuse the pool: returns its
    /// error output.
    pub fn serve_refused(&self) -> String {
        let output = self
            .command()
            .args(["serve", "-d"])
            .arg(self.dir.path())
            .arg("--nbd")
            .arg(format!("unix:{}", self.socket().display()))
            .arg("--control")
            .arg(self.control())
            .arg(&self.name)
            .output()
            .expect("run ironpool serve");
        assert!(!output.status.success(), "ironpool serve should have refused the pool");
        String::from_utf8_lossy(&output.stderr).to_string()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.path("serve.log")).unwrap_or_default()
    }

    /// SIGTERM and wait: the server finishes requests and exports the pool.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.server.take() {
            // SAFETY: kill(2) on a child we started.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let status = wait_with_timeout(&mut child, Duration::from_secs(60));
            assert!(status, "ironpool serve did not exit after SIGTERM: {}", self.log());
        }
    }

    /// SIGKILL: the server dies on the spot.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.server.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Runs an admin command against the running server's control socket.
    pub fn admin(&self, args: &[&str]) -> String {
        let control = self.control().display().to_string();
        let mut full = vec!["--control", control.as_str()];
        full.extend_from_slice(args);
        self.ok(&full)
    }

    pub fn status_json(&self) -> serde_json::Value {
        let text = self.admin(&["--json", "status", &self.name]);
        serde_json::from_str(&text).expect("status JSON")
    }
}

impl Drop for TestPool {
    fn drop(&mut self) {
        if let Some(mut child) = self.server.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn wait_with_timeout(child: &mut Child, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(Some(_)) = child.try_wait() {
            return true;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Where test pools live: under the target directory (a real filesystem with
/// O_DIRECT), not /tmp (which may be tmpfs).
pub fn test_root() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(&root).expect("test root");
    root
}

/// Runs an external client program, failing the test with its output if it fails.
pub fn tool(program: &str, args: &[&str]) -> String {
    let output = Command::new(program).args(args).output().unwrap_or_else(|error| panic!("cannot run {program} (is it installed?): {error}"));
    assert!(
        output.status.success(),
        "{program} {args:?} failed ({}):\nstdout: {}\nstderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).to_string()
}

/// Runs a program expected to fail; returns stdout+stderr.
pub fn tool_fails(program: &str, args: &[&str]) -> String {
    let output = Command::new(program).args(args).output().unwrap_or_else(|error| panic!("cannot run {program}: {error}"));
    assert!(!output.status.success(), "{program} {args:?} should have failed");
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

/// Overwrites `length` bytes at `offset` of a file with a garbage pattern.
pub fn corrupt_file(path: &Path, offset: u64, length: usize) {
    use std::io::{Seek, SeekFrom, Write};
    let mut file = std::fs::OpenOptions::new().write(true).open(path).expect("open device file");
    file.seek(SeekFrom::Start(offset)).expect("seek");
    let garbage: Vec<u8> = (0..length).map(|index| (index as u8).wrapping_mul(73).wrapping_add(0x5a)).collect();
    file.write_all(&garbage).expect("write garbage");
    file.sync_all().expect("sync");
}
