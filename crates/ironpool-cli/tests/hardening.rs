//! Faults found by trying to break a running server as a hostile client or a
//! careless operator would: each test drives the real binary with real clients
//! (fio, qemu-io, nbdinfo, a raw NBD client) on pools of real files, and fails
//! on the behaviour it guards against.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{dir, tool, NbdClient, SmallFilesystem, TestPool, NBD_CMD_READ, NBD_CMD_WRITE};

fn server_alive(pool: &mut TestPool) -> bool {
    pool.server
        .as_mut()
        .is_some_and(|child| child.try_wait().ok().flatten().is_none())
}

/// `volume destroy` while a client writes to that volume: the destroy wins,
/// the client's later requests fail, and the server, its other volumes and
/// the pool's space accounting are unharmed (it panicked in the txg build
/// after writes that waited behind the destroy went on into the freed tree).
#[test]
fn destroying_a_volume_under_a_writing_client_keeps_the_server_and_other_volumes() {
    let mut pool = TestPool::new("vd");
    pool.create("1G", &["a.img"]);
    pool.create_volume("v", "128M");
    pool.create_volume("keep", "32M");
    pool.serve();
    tool(
        "qemu-io",
        &[
            "-f",
            "raw",
            &pool.uri("keep"),
            "-c",
            "write -P 0x5a 0 8M",
            "-c",
            "flush",
        ],
    );
    for round in 0..3 {
        if round > 0 {
            pool.admin(&["volume", "create", "vd/v", "128M"]);
        }
        let uri = pool.uri("v");
        let writer = std::thread::spawn(move || {
            // fio fails once the volume is gone: only the server's survival matters.
            Command::new("fio")
                .args([
                    "--name=w",
                    "--ioengine=nbd",
                    &format!("--uri={uri}"),
                    "--rw=randwrite",
                    "--bs=16k",
                    "--iodepth=1",
                    "--size=128M",
                    "--time_based",
                    "--runtime=4",
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .expect("run fio")
        });
        std::thread::sleep(Duration::from_millis(1500));
        pool.admin(&["volume", "destroy", "vd/v"]);
        writer.join().expect("fio thread");
        // Past the next txg commits (the panic came from the build of one).
        std::thread::sleep(Duration::from_millis(1500));
        assert!(
            server_alive(&mut pool),
            "the server died after the destroy: {}",
            pool.log()
        );
    }
    let volumes = pool.admin(&["volume", "list", "vd"]);
    assert!(
        !volumes.contains("vd/v ") && volumes.contains("vd/keep"),
        "{volumes}"
    );
    tool(
        "qemu-io",
        &[
            "-f",
            "raw",
            &pool.uri("keep"),
            "-c",
            "read -P 0x5a 0 8M",
            "-c",
            "write -P 0x6b 8M 1M",
            "-c",
            "flush",
        ],
    );
    let check = pool.admin(&["check", "vd"]);
    assert!(
        check.contains("checked") && !check.contains("problem"),
        "{check}"
    );
    assert!(!pool.log().contains("panicked"), "{}", pool.log());
    pool.stop();
}

/// A client that pipelines large READs and never reads a reply holds only
/// its own share of the server's payload budget: another client's read on
/// another volume is served meanwhile (it waited for as long as the first
/// client stayed connected).
#[test]
fn a_client_that_never_reads_its_replies_does_not_stall_other_clients() {
    let mut pool = TestPool::new("stall");
    pool.create("1G", &["a.img"]);
    pool.create_volume("big", "640M");
    pool.create_volume("other", "32M");
    pool.serve();
    tool(
        "qemu-io",
        &[
            "-f",
            "raw",
            &pool.uri("other"),
            "-c",
            "write -P 0x42 0 1M",
            "-c",
            "flush",
        ],
    );
    // 20 reads of 32 MiB: 640 MiB of replies, over twice the server's budget.
    let mut hostile = NbdClient::connect(&pool.socket(), "stall/big");
    let mut requests = Vec::new();
    for cookie in 0..20u64 {
        requests.extend(NbdClient::request(
            NBD_CMD_READ,
            cookie,
            cookie * (32 << 20),
            32 << 20,
        ));
    }
    hostile.stream.write_all(&requests).expect("send the reads");
    // And a writer that sends 1 MiB WRITEs until the server stops taking them,
    // never reading a reply either.
    let mut writer = NbdClient::connect(&pool.socket(), "stall/big").stream;
    writer
        .set_write_timeout(Some(Duration::from_secs(3)))
        .unwrap();
    let payload = vec![0x77u8; 1 << 20];
    for cookie in 0..2000u64 {
        let mut request = NbdClient::request(NBD_CMD_WRITE, cookie, (cookie % 600) << 20, 1 << 20);
        request.extend_from_slice(&payload);
        if writer.write_all(&request).is_err() {
            break;
        }
    }
    std::thread::sleep(Duration::from_secs(1));
    let started = Instant::now();
    let output = Command::new("timeout")
        .args([
            "20",
            "qemu-io",
            "-f",
            "raw",
            &pool.uri("other"),
            "-c",
            "read -P 0x42 0 64k",
        ])
        .output()
        .expect("run qemu-io");
    assert!(
        output.status.success(),
        "a read on another volume failed or timed out while a client held its replies: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "the read took {:?}",
        started.elapsed()
    );
    drop(hostile);
    drop(writer);
    pool.stop();
}

/// Connections that never finish their handshake cost a small buffer each,
/// not the 1 MiB receive buffer of a served connection.
#[test]
fn idle_connections_before_the_handshake_cost_little_memory() {
    let mut pool = TestPool::new("idle");
    pool.create("256M", &["a.img"]);
    pool.create_volume("v", "16M");
    pool.serve();
    let pid = pool.server.as_ref().expect("server").id();
    let rss = || -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("server status");
        let line = status
            .lines()
            .find(|line| line.starts_with("VmRSS:"))
            .expect("VmRSS");
        line.split_whitespace()
            .nth(1)
            .expect("kB")
            .parse::<u64>()
            .expect("number")
            * 1024
    };
    let before = rss();
    let mut idle = Vec::new();
    for _ in 0..400 {
        let mut stream = UnixStream::connect(pool.socket()).expect("connect");
        let mut greeting = [0u8; 18];
        stream.read_exact(&mut greeting).expect("greeting");
        // Client flags, then nothing: the server waits for an option.
        stream.write_all(&1u32.to_be_bytes()).unwrap();
        idle.push(stream);
    }
    std::thread::sleep(Duration::from_millis(500));
    let grown = rss().saturating_sub(before);
    assert!(
        grown < 64 << 20,
        "400 idle connections grew the server by {} MiB",
        grown >> 20
    );
    tool("nbdinfo", &[&pool.uri("v")]);
    drop(idle);
    pool.stop();
}

/// `ironpool serve` on the default control socket (`$IRONPOOL_RUN_DIR/POOL.ctl`),
/// as a user runs it: the CLI then finds the server without `--control`.
fn serve_on_default_control(pool: &mut TestPool) {
    let mut command = pool.command();
    command
        .args(["serve", "-d"])
        .arg(pool.dir.path())
        .arg("--nbd")
        .arg(format!("unix:{}", pool.socket().display()))
        .arg(&pool.name);
    pool.start_server(command);
}

/// A server that dies in the middle of a command: the CLI reports it and
/// fails, and never runs the command again against the pool itself (a
/// `send` appended a second full stream to the partial one and exited 0).
#[test]
fn a_command_whose_server_dies_fails_and_is_not_run_again() {
    let mut pool = TestPool::new("bk");
    pool.create("512M", &["a.img"]);
    pool.create_volume("v", "256M");
    serve_on_default_control(&mut pool);
    tool(
        "qemu-io",
        &[
            "-f",
            "raw",
            &pool.uri("v"),
            "-c",
            "write -P 0x33 0 200M",
            "-c",
            "flush",
        ],
    );
    tool(common::ironpool_binary().to_str().unwrap(), &["--version"]);
    let snapshot = pool
        .command()
        .args(["snapshot", "bk/v@s"])
        .output()
        .expect("snapshot");
    assert!(
        snapshot.status.success(),
        "{}",
        String::from_utf8_lossy(&snapshot.stderr)
    );
    // The stream goes into a pipe nobody reads yet: the server blocks on it.
    let mut send = pool
        .command()
        .args(["send", "bk/v@s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start send");
    // The stream's first bytes show the send is under way (a fixed sleep
    // could kill the server before a loaded machine started it).
    let mut stdout = send.stdout.take().expect("stdout");
    let mut stream = vec![0u8; 4096];
    stdout.read_exact(&mut stream).expect("the stream starts");
    pool.kill9();
    stdout.read_to_end(&mut stream).expect("read the stream");
    let mut errors = String::new();
    send.stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut errors)
        .unwrap();
    let status = send.wait().expect("send exits");
    assert!(
        !status.success(),
        "send exited 0 after its server died ({} stream bytes): {errors}",
        stream.len()
    );
    assert!(
        errors.contains("may have run") || errors.contains("without an answer"),
        "{errors}"
    );
    assert!(!errors.contains("sent "), "{errors}");
    assert!(
        (stream.len() as u64) < (200 << 20),
        "a whole stream was written after the server died ({} bytes)",
        stream.len()
    );
    // With no server at all, the CLI still opens the pool itself.
    let status = pool
        .command()
        .args(["status", "bk", "-d", &dir(&pool)])
        .output()
        .expect("status");
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
}

/// Device directories given relative are remembered absolute: later commands
/// from another directory find the pool.
#[test]
fn relative_device_paths_are_remembered_absolute() {
    let mut pool = TestPool::new("m3");
    std::fs::create_dir(pool.path("m3")).unwrap();
    let output = pool
        .command()
        .current_dir(pool.dir.path())
        .args([
            "create", "--size", "256M", "m3", "mirror", "m3/a.img", "m3/b.img",
        ])
        .output()
        .expect("create");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let cache = std::fs::read_to_string(pool.path("cache.json")).expect("pool cache");
    let expected = std::fs::canonicalize(pool.path("m3")).unwrap();
    assert!(cache.contains(&expected.display().to_string()), "{cache}");
    let output = pool
        .command()
        .current_dir("/")
        .args(["status", "m3"])
        .output()
        .expect("status");
    assert!(
        output.status.success(),
        "status from / failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    // serve -d with a relative directory too.
    let mut served = pool.command();
    served.current_dir(pool.dir.path()).args([
        "serve",
        "-d",
        "m3",
        "--nbd",
        &format!("unix:{}", pool.socket().display()),
        "m3",
    ]);
    pool.start_server(served);
    pool.stop();
    let cache: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(pool.path("cache.json")).expect("pool cache"),
    )
    .expect("cache JSON");
    for directory in cache["m3"].as_array().expect("m3's directories") {
        let directory = directory.as_str().expect("a path");
        assert!(
            directory.starts_with('/'),
            "a relative directory was remembered: {cache}"
        );
    }
}

/// Small command-line faults: a failed create leaves no files behind, sizes
/// are parsed exactly, errors name snapshots as snapshots, and a reader that
/// goes away ends `iostat` quietly.
#[test]
fn command_line_details() {
    let pool = TestPool::new("cl");
    // Created files are removed when create fails (here: a device too small).
    let small = pool.path("small.img").display().to_string();
    let fresh = pool.path("fresh.img").display().to_string();
    std::fs::File::create(&small)
        .unwrap()
        .set_len(4 << 20)
        .unwrap();
    let error = pool.fails(&["create", "--size", "256M", "cl", &fresh, &small]);
    assert!(error.contains("at least"), "{error}");
    assert!(!Path::new(&fresh).exists(), "a failed create left {fresh}");
    assert!(
        Path::new(&small).exists(),
        "a failed create removed a file it did not make"
    );
    pool.create("256M", &["a.img"]);
    let d = dir(&pool);
    pool.create_volume("v", "16M");
    let error = pool.fails(&[
        "tune",
        "cl",
        "dirty_max_bytes",
        "99999999999999999999",
        "-d",
        &d,
    ]);
    assert!(error.contains("too large"), "{error}");
    let error = pool.fails(&["set", "volblocksize=8K", "cl/v", "-d", &d]);
    assert!(
        !error.contains("-b") && error.contains("volblocksize="),
        "{error}"
    );
    let error = pool.fails(&["destroy", "cl/v@nothere", "-d", &d]);
    assert!(error.contains("no snapshot 'cl/v@nothere'"), "{error}");
    // iostat into a pipe closed early: no panic, no exit code 101.
    let mut iostat = pool
        .command()
        .args(["iostat", "cl", "0.1", "50", "-d", &d])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("iostat");
    let mut first = [0u8; 16];
    iostat
        .stdout
        .as_mut()
        .unwrap()
        .read_exact(&mut first)
        .expect("iostat output");
    drop(iostat.stdout.take());
    let output = iostat.wait_with_output().expect("iostat exits");
    let errors = String::from_utf8_lossy(&output.stderr);
    assert!(
        !errors.contains("panicked") && output.status.code() != Some(101),
        "{:?}: {errors}",
        output.status
    );
}

/// The filesystem holding the device files fills up: the writer gets ENOSPC
/// (not EIO), no device is faulted, data flushed before stays readable,
/// `status` names the device and the cause, and once space is freed
/// `ironpool clear` resumes the pool.
#[test]
fn a_full_host_filesystem_is_enospc_and_clear_resumes_once_space_is_back() {
    let mut pool = TestPool::new("hf");
    let host = SmallFilesystem::new(pool.dir.path(), 600);
    let a = host.mount_point.join("a.img").display().to_string();
    let b = host.mount_point.join("b.img").display().to_string();
    pool.ok(&["create", "--size", "1G", "hf", "mirror", &a, &b]);
    let host_dir = host.mount_point.display().to_string();
    pool.ok(&["volume", "create", "hf/v", "768M", "-d", &host_dir]);
    // Serve from the small filesystem's directory.
    let mut command = pool.command();
    command.args([
        "serve",
        "-d",
        &host_dir,
        "--nbd",
        &format!("unix:{}", pool.socket().display()),
        "--control",
        &pool.control().display().to_string(),
        "hf",
    ]);
    pool.start_server(command);
    let uri = pool.uri("v");
    tool(
        "qemu-io",
        &[
            "-f",
            "raw",
            &uri,
            "-c",
            "write -P 0x11 0 64M",
            "-c",
            "flush",
        ],
    );
    // Leave 24 MiB on the host filesystem, then write far more than that.
    let filler = host.mount_point.join("filler");
    let fill = host.available_bytes().saturating_sub(24 << 20);
    tool(
        "fallocate",
        &["-l", &fill.to_string(), filler.to_str().unwrap()],
    );
    let output = Command::new("qemu-io")
        .args([
            "-f",
            "raw",
            &uri,
            "-c",
            "write -P 0x22 128M 256M",
            "-c",
            "flush",
        ])
        .output()
        .expect("qemu-io");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        text.contains("No space left on device"),
        "the writer did not get ENOSPC: {text}"
    );
    assert!(
        !text.contains("Input/output error"),
        "the writer got EIO: {text}"
    );
    let status = pool.status_json();
    let full: Vec<&str> = status["host_full_devices"]
        .as_array()
        .expect("host_full_devices")
        .iter()
        .filter_map(|device| device.as_str())
        .collect();
    assert!(
        !full.is_empty(),
        "status does not name the full filesystem's devices: {status}"
    );
    for child in status["vdevs"][0]["children"].as_array().unwrap() {
        assert_ne!(
            child["state"], "FAULTED",
            "a full host filesystem faulted a device: {status}"
        );
    }
    let text_status = pool.admin(&["status", "hf"]);
    assert!(
        text_status.contains("is full") && text_status.contains("ironpool clear hf"),
        "{text_status}"
    );
    assert!(
        pool.log().contains("no space left on device"),
        "the server log does not say why: {}",
        pool.log()
    );
    // Data flushed before the filesystem filled is still readable.
    tool("qemu-io", &["-f", "raw", &uri, "-c", "read -P 0x11 0 64M"]);
    // Space comes back; clear resumes.
    std::fs::remove_file(&filler).unwrap();
    pool.admin(&["clear", "hf"]);
    tool(
        "qemu-io",
        &[
            "-f",
            "raw",
            &uri,
            "-c",
            "write -P 0x33 128M 128M",
            "-c",
            "flush",
            "-c",
            "read -P 0x33 128M 128M",
            "-c",
            "read -P 0x11 0 64M",
        ],
    );
    let status = pool.status_json();
    assert!(status["suspended"].is_null(), "{status}");
    assert!(
        status["host_full_devices"].as_array().unwrap().is_empty(),
        "{status}"
    );
    pool.stop();
    drop(host);
}

/// A client that stops reading its replies is disconnected once they have
/// waited `--nbd-reply-timeout` on its socket, which releases the payload
/// budget they held; a client that reads keeps its connection.
#[test]
fn a_client_that_stops_reading_its_replies_is_disconnected_after_the_reply_timeout() {
    let mut pool = TestPool::new("rto");
    pool.create("1G", &["a.img"]);
    pool.create_volume("big", "640M");
    pool.serve_with(&["--nbd-reply-timeout", "2"]);
    let mut patient = NbdClient::connect(&pool.socket(), "rto/big");
    // 20 reads of 32 MiB: far more than the socket buffers hold.
    let mut hostile = NbdClient::connect(&pool.socket(), "rto/big");
    let mut requests = Vec::new();
    for cookie in 0..20u64 {
        requests.extend(NbdClient::request(
            NBD_CMD_READ,
            cookie,
            cookie * (32 << 20),
            32 << 20,
        ));
    }
    hostile.stream.write_all(&requests).expect("send the reads");
    std::thread::sleep(Duration::from_secs(6));
    // What the socket buffered is still readable; then the server's close.
    hostile
        .stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut received = 0u64;
    let mut buffer = vec![0u8; 1 << 20];
    let ended = loop {
        match hostile.stream.read(&mut buffer) {
            Ok(0) => break "eof",
            Ok(count) => received += count as u64,
            Err(error) if error.kind() == std::io::ErrorKind::ConnectionReset => break "reset",
            Err(error) => panic!("the stalled client was not disconnected: {error}"),
        }
    };
    let all_replies = 20 * ((32u64 << 20) + 16);
    assert!(
        received < all_replies,
        "the connection was closed before its replies were all sent ({ended} after {received} bytes)"
    );
    // The patient client, idle all along, is still served.
    assert_eq!(patient.read(0, 4096).len(), 4096);
    pool.stop();
}
