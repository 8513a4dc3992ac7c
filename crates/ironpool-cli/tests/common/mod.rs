//! Helpers for tests that run the real `ironpool` binary against real clients
//! (nbdinfo, qemu-io, fio) on pools of real files.

#![allow(dead_code)]

pub mod fuse;

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
        let dir = tempfile::Builder::new()
            .prefix("ironpool-test-")
            .tempdir_in(test_root())
            .expect("temporary directory");
        TestPool {
            dir,
            name: name.to_string(),
            server: None,
        }
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
        format!(
            "nbd+unix:///{}/{}?socket={}",
            self.name,
            volume,
            self.socket().display()
        )
    }

    /// A command of the binary with this pool's environment.
    pub fn command(&self) -> Command {
        let mut command = Command::new(ironpool_binary());
        command
            .env("IRONPOOL_CACHE", self.path("cache.json"))
            .env("IRONPOOL_RUN_DIR", self.path("run"))
            .env_remove("IRONPOOL_CONTROL");
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
        assert!(
            output.status.success(),
            "ironpool {args:?} failed:\nstdout: {}\nstderr: {}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).to_string()
    }

    /// Runs `ironpool ARGS`, failing the test if it succeeds; returns stderr.
    pub fn fails(&self, args: &[&str]) -> String {
        let output = self.run(args);
        assert!(
            !output.status.success(),
            "ironpool {args:?} should have failed:\nstdout: {}",
            String::from_utf8_lossy(&output.stdout)
        );
        String::from_utf8_lossy(&output.stderr).to_string()
    }

    /// Creates the pool: `layout` like ["mirror", "a.img", "b.img"] or
    /// ["raidz2", ...] (file names are made relative to the pool directory).
    pub fn create(&self, size: &str, layout: &[&str]) {
        let mut args: Vec<String> = vec![
            "create".into(),
            "--size".into(),
            size.into(),
            self.name.clone(),
        ];
        for word in layout {
            if *word == "mirror" || *word == "log" || *word == "spare" || word.starts_with("raidz")
            {
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

    /// A sparse volume (`volume create -s`): no reservation, so a test can
    /// make a volume larger than the pool and fill the pool through it.
    pub fn create_sparse_volume(&self, volume: &str, size: &str) {
        let name = format!("{}/{}", self.name, volume);
        let dir = self.dir.path().display().to_string();
        self.ok(&["volume", "create", "-s", &name, size, "-d", &dir]);
    }

    /// `ironpool serve` on this pool's directory, NBD socket and control
    /// socket (the caller adds the rest and the pool name).
    pub fn serve_command(&self) -> Command {
        let mut command = self.command();
        command
            .args(["serve", "-d"])
            .arg(self.dir.path())
            .arg("--nbd")
            .arg(format!("unix:{}", self.socket().display()))
            .arg("--control")
            .arg(self.control());
        command
    }

    /// Starts `ironpool serve` and waits until it listens.
    pub fn serve(&mut self) {
        self.serve_with(&[]);
    }

    /// Starts `ironpool serve` with extra options and waits until it listens.
    pub fn serve_with(&mut self, options: &[&str]) {
        let mut command = self.serve_command();
        command.args(options).arg(&self.name);
        self.start_server(command);
    }

    /// Starts `command` (an `ironpool serve` the caller built, to which the
    /// pidfile option is added), logging to `serve.log`, and waits until it
    /// listens.
    pub fn start_server(&mut self, mut command: Command) {
        assert!(self.server.is_none(), "already serving");
        let _ = std::fs::remove_file(self.path("pid"));
        let log = std::fs::File::create(self.path("serve.log")).expect("log file");
        let child = command
            .arg("--pidfile")
            .arg(self.path("pid"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start ironpool serve");
        self.server = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.path("pid").exists() {
            if let Some(status) = self
                .server
                .as_mut()
                .and_then(|child| child.try_wait().ok().flatten())
            {
                panic!("ironpool serve exited with {status}: {}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "ironpool serve did not start: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Runs `ironpool serve` expecting it to refuse the pool: returns its
    /// error output.
    pub fn serve_refused(&self) -> String {
        let output = self
            .serve_command()
            .arg(&self.name)
            .output()
            .expect("run ironpool serve");
        assert!(
            !output.status.success(),
            "ironpool serve should have refused the pool"
        );
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
            assert!(
                status,
                "ironpool serve did not exit after SIGTERM: {}",
                self.log()
            );
        }
    }

    /// SIGKILL: the server dies on the spot.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.server.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// `get PROPERTY NAME ARGS...` (ARGS: `-d DIR`, `--control SOCKET`)
    /// as (value, source).
    pub fn property_with(&self, args: &[&str], name: &str, property: &str) -> (String, String) {
        let mut full = vec!["--json", "get", property, name];
        full.extend_from_slice(args);
        let text = self.ok(&full);
        let rows: serde_json::Value = serde_json::from_str(&text).expect("get JSON");
        let row = rows["properties"]
            .as_array()
            .and_then(|rows| rows.iter().find(|row| row["property"] == property))
            .unwrap_or_else(|| panic!("no {property} in {text}"))
            .clone();
        (
            row["value"].as_str().expect("a value").to_string(),
            row["source"].as_str().expect("a source").to_string(),
        )
    }

    /// [`TestPool::property_with`] of the running server's pool.
    pub fn property(&self, name: &str, property: &str) -> (String, String) {
        let control = self.control().display().to_string();
        self.property_with(&["--control", &control], name, property)
    }

    /// Runs an admin command against the running server's control socket.
    pub fn admin(&self, args: &[&str]) -> String {
        let control = self.control().display().to_string();
        let mut full = vec!["--control", control.as_str()];
        full.extend_from_slice(args);
        self.ok(&full)
    }

    /// `ironpool --control ... ARGS` against the running server, which must
    /// fail: its error output (the twin of [`TestPool::admin`]).
    pub fn admin_fails(&self, args: &[&str]) -> String {
        let control = self.control().display().to_string();
        let mut full = vec!["--control", control.as_str()];
        full.extend_from_slice(args);
        self.fails(&full)
    }

    /// Runs `ironpool ARGS > file` against the running server; returns stderr.
    pub fn send_to_file(&self, args: &[&str], file: &Path) -> String {
        let control = self.control().display().to_string();
        let output = self
            .command()
            .args(["--control", &control])
            .args(args)
            .stdout(std::fs::File::create(file).expect("stream file"))
            .output()
            .expect("run ironpool send");
        let stderr = String::from_utf8_lossy(&output.stderr).to_string();
        assert!(
            output.status.success(),
            "ironpool {args:?} failed: {stderr}"
        );
        stderr
    }

    /// Runs `ironpool ARGS < file` against the running server.
    pub fn receive_from_file(&self, args: &[&str], file: &Path) -> Output {
        let control = self.control().display().to_string();
        self.command()
            .args(["--control", &control])
            .args(args)
            .stdin(std::fs::File::open(file).expect("stream file"))
            .output()
            .expect("run ironpool receive")
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

/// The pool's directory as an argument (`-d DIR`).
pub fn dir(pool: &TestPool) -> String {
    pool.dir.path().display().to_string()
}

/// Reads `reads` distinct 16K blocks of the first `size` of the export at
/// `uri` in random order, one at a time (fio's nbd engine). Why: a mirror
/// keeps a sequential read on one side, so a test that damages one side
/// and wants a read to meet the damage reads at random, where each read
/// takes a side afresh.
pub fn random_reads(uri: &str, size: &str, reads: u64) {
    tool(
        "fio",
        &[
            "--name=random-reads",
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            "--rw=randread",
            "--bs=16k",
            &format!("--size={size}"),
            &format!("--number_ios={reads}"),
            "--iodepth=1",
        ],
    );
}

/// Runs `qemu-io -f raw URI -c COMMAND...`, failing the test if it fails.
pub fn qemu_io(uri: &str, commands: &[&str]) -> String {
    let mut args = vec!["-f", "raw", uri];
    for command in commands {
        args.push("-c");
        args.push(command);
    }
    tool("qemu-io", &args)
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
    let output = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|error| panic!("cannot run {program} (is it installed?): {error}"));
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
    let output = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|error| panic!("cannot run {program}: {error}"));
    assert!(
        !output.status.success(),
        "{program} {args:?} should have failed"
    );
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Overwrites `length` bytes at `offset` of a file with a garbage pattern.
pub fn corrupt_file(path: &Path, offset: u64, length: usize) {
    use std::io::{Seek, SeekFrom, Write};
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .expect("open device file");
    file.seek(SeekFrom::Start(offset)).expect("seek");
    let garbage: Vec<u8> = (0..length)
        .map(|index| (index as u8).wrapping_mul(73).wrapping_add(0x5a))
        .collect();
    file.write_all(&garbage).expect("write garbage");
    file.sync_all().expect("sync");
}

/// A minimal pipelined NBD client (fixed newstyle, simple replies) for tests
/// that need to know exactly which writes were acknowledged when.
pub struct NbdClient {
    pub stream: std::os::unix::net::UnixStream,
    pub size_bytes: u64,
}

/// NBD request magic and commands used by [`NbdClient`].
pub const NBD_REQUEST_MAGIC: u32 = 0x2560_9513;
pub const NBD_SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub const NBD_CMD_READ: u16 = 0;
pub const NBD_CMD_WRITE: u16 = 1;
pub const NBD_CMD_FLUSH: u16 = 3;

impl NbdClient {
    /// Connects to `export` on the unix socket and negotiates (OPT_GO).
    pub fn connect(socket: &Path, export: &str) -> NbdClient {
        use std::io::{Read, Write};
        let mut stream = std::os::unix::net::UnixStream::connect(socket).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        let mut greeting = [0u8; 18];
        stream.read_exact(&mut greeting).expect("greeting");
        assert_eq!(&greeting[..8], b"NBDMAGIC");
        stream.write_all(&1u32.to_be_bytes()).unwrap();
        let mut option = 0x4948_4156_454f_5054u64.to_be_bytes().to_vec();
        option.extend_from_slice(&7u32.to_be_bytes());
        option.extend_from_slice(&((export.len() + 6) as u32).to_be_bytes());
        option.extend_from_slice(&(export.len() as u32).to_be_bytes());
        option.extend_from_slice(export.as_bytes());
        option.extend_from_slice(&0u16.to_be_bytes());
        stream.write_all(&option).unwrap();
        let mut size_bytes = 0;
        loop {
            let mut header = [0u8; 20];
            stream.read_exact(&mut header).expect("option reply");
            let reply = u32::from_be_bytes(header[12..16].try_into().unwrap());
            let length = u32::from_be_bytes(header[16..20].try_into().unwrap()) as usize;
            let mut data = vec![0u8; length];
            stream.read_exact(&mut data).expect("option reply data");
            match reply {
                1 => break,
                3 if data.len() >= 12 && u16::from_be_bytes([data[0], data[1]]) == 0 => {
                    size_bytes = u64::from_be_bytes(data[2..10].try_into().unwrap())
                }
                3 => {}
                other => panic!(
                    "export {export} refused: reply {other:#x} {}",
                    String::from_utf8_lossy(&data)
                ),
            }
        }
        NbdClient { stream, size_bytes }
    }

    /// A request header.
    pub fn request(command: u16, cookie: u64, offset: u64, length: u32) -> Vec<u8> {
        let mut bytes = NBD_REQUEST_MAGIC.to_be_bytes().to_vec();
        bytes.extend_from_slice(&0u16.to_be_bytes());
        bytes.extend_from_slice(&command.to_be_bytes());
        bytes.extend_from_slice(&cookie.to_be_bytes());
        bytes.extend_from_slice(&offset.to_be_bytes());
        bytes.extend_from_slice(&length.to_be_bytes());
        bytes
    }

    /// Reads one simple reply header: (error, cookie).
    pub fn reply(stream: &mut std::os::unix::net::UnixStream) -> (u32, u64) {
        use std::io::Read;
        let mut header = [0u8; 16];
        stream.read_exact(&mut header).expect("reply");
        assert_eq!(
            u32::from_be_bytes(header[..4].try_into().unwrap()),
            NBD_SIMPLE_REPLY_MAGIC
        );
        (
            u32::from_be_bytes(header[4..8].try_into().unwrap()),
            u64::from_be_bytes(header[8..16].try_into().unwrap()),
        )
    }

    /// Reads `length` bytes at `offset` (one request at a time).
    pub fn read(&mut self, offset: u64, length: u32) -> Vec<u8> {
        use std::io::{Read, Write};
        self.stream
            .write_all(&NbdClient::request(NBD_CMD_READ, 1, offset, length))
            .unwrap();
        let (error, _) = NbdClient::reply(&mut self.stream);
        assert_eq!(error, 0, "read at {offset} failed");
        let mut data = vec![0u8; length as usize];
        self.stream.read_exact(&mut data).unwrap();
        data
    }

    /// One WRITE with its payload: the error replied (0 for success).
    pub fn write_at(&mut self, offset: u64, data: &[u8]) -> u32 {
        use std::io::Write;
        let mut bytes = NbdClient::request(NBD_CMD_WRITE, 9, offset, data.len() as u32);
        bytes.extend_from_slice(data);
        self.stream.write_all(&bytes).expect("send a write");
        let (error, cookie) = NbdClient::reply(&mut self.stream);
        assert_eq!(cookie, 9);
        error
    }

    /// One FLUSH: the error replied.
    pub fn flush(&mut self) -> u32 {
        use std::io::Write;
        let bytes = NbdClient::request(NBD_CMD_FLUSH, 11, 0, 0);
        self.stream.write_all(&bytes).expect("send a flush");
        let (error, cookie) = NbdClient::reply(&mut self.stream);
        assert_eq!(cookie, 11);
        error
    }
}

/// Bytes that differ from one 512-byte sector to the next and with `seed`.
pub fn distinct_bytes(length: usize, seed: u8) -> Vec<u8> {
    (0..length)
        .map(|index| (index / 512) as u8 ^ (index as u8).wrapping_mul(31) ^ seed)
        .collect()
}

/// `ironpool check` through the running server: no problems.
pub fn assert_check_clean(pool: &TestPool) {
    let report: serde_json::Value =
        serde_json::from_str(&pool.admin(&["--json", "check", &pool.name])).expect("check JSON");
    assert_eq!(
        report["problems"].as_array().map(Vec::len),
        Some(0),
        "check: {report}"
    );
    assert!(report["block_copies"].as_u64().unwrap_or(0) > 0, "{report}");
}

/// Stops the server and runs `ironpool check` on the exported pool.
pub fn stop_and_check(pool: &mut TestPool) {
    pool.stop();
    assert!(!pool.log().contains("panicked"), "{}", pool.log());
    let name = pool.name.clone();
    let output = pool.ok(&["check", &name, "-d", &dir(pool)]);
    assert!(!output.contains("problem"), "{output}");
}

/// A loop-mounted XFS filesystem of `size_mb`, unmounted and deleted on drop:
/// a host filesystem the tests can fill.
pub struct SmallFilesystem {
    pub mount_point: PathBuf,
}

impl SmallFilesystem {
    pub fn new(under: &Path, size_mb: u64) -> SmallFilesystem {
        let image = under.join("host.img");
        std::fs::File::create(&image)
            .unwrap()
            .set_len(size_mb << 20)
            .unwrap();
        tool("mkfs.xfs", &["-q", image.to_str().unwrap()]);
        let mount_point = under.join("host");
        std::fs::create_dir(&mount_point).unwrap();
        tool(
            "mount",
            &[
                "-o",
                "loop",
                image.to_str().unwrap(),
                mount_point.to_str().unwrap(),
            ],
        );
        SmallFilesystem { mount_point }
    }

    pub fn available_bytes(&self) -> u64 {
        space_of(&self.mount_point).1
    }
}

/// `statvfs` of `path`: (size, available to an unprivileged writer) in bytes.
pub fn space_of(path: &Path) -> (u64, u64) {
    let name = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: statvfs is plain old data; all zeroes is a valid value.
    let mut stats: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: statvfs fills the struct for a NUL-terminated path.
    let result = unsafe { libc::statvfs(name.as_ptr(), &mut stats) };
    assert_eq!(result, 0, "statvfs {}", path.display());
    let fragment = stats.f_frsize as u64;
    (
        stats.f_blocks as u64 * fragment,
        stats.f_bavail as u64 * fragment,
    )
}

impl SmallFilesystem {
    /// Shuts the filesystem down (XFS's `shutdown`): from now on every read,
    /// write and flush of a file on it fails with EIO, as a dead device's
    /// would, while the files stay open.
    pub fn shut_down(&self) {
        tool(
            "xfs_io",
            &["-x", "-c", "shutdown", self.mount_point.to_str().unwrap()],
        );
    }
}

impl Drop for SmallFilesystem {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(&self.mount_point)
            .status();
    }
}

/// `receive EXTRA... TARGET < stream`, which must succeed: its output.
pub fn receive_ok(pool: &TestPool, target: &str, stream: &Path, extra: &[&str]) -> String {
    let mut args = vec!["receive"];
    args.extend_from_slice(extra);
    args.push(target);
    let output = pool.receive_from_file(&args, stream);
    assert!(
        output.status.success(),
        "receive {extra:?} {target} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).to_string()
}

/// `receive EXTRA... TARGET < stream`, which must fail: its error.
pub fn receive_fails(pool: &TestPool, target: &str, stream: &Path, extra: &[&str]) -> String {
    let mut args = vec!["receive"];
    args.extend_from_slice(extra);
    args.push(target);
    let output = pool.receive_from_file(&args, stream);
    assert!(
        !output.status.success(),
        "receive {extra:?} {target} should have failed: {}",
        String::from_utf8_lossy(&output.stdout)
    );
    String::from_utf8_lossy(&output.stderr).to_string()
}
