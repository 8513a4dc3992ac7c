//! What an operator runs ironpool with: the Prometheus endpoint (checked by
//! promtool and scraped by a real Prometheus server), readiness and stopping
//! told to a service manager by the sd_notify protocol, and the systemd unit
//! in `packaging/systemd`, whose command line is run as systemd would.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// A TCP port free on 127.0.0.1 a moment ago.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port()
}

/// Sends `request` to 127.0.0.1:`port` and returns the whole response.
fn http(port: u16, request: &[u8]) -> String {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect to the endpoint");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    // A server that stops reading (an endless head) may reset the
    // connection under the write: what it answered is what counts.
    let _ = stream.write_all(request);
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    String::from_utf8_lossy(&response).to_string()
}

/// The body of a successful `GET /metrics`.
fn scrape(port: u16) -> String {
    let response = http(port, b"GET /metrics HTTP/1.1\r\nHost: test\r\n\r\n");
    let (head, body) = response
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP head: {response:?}"));
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
    assert!(
        head.contains("Content-Type: text/plain; version=0.0.4"),
        "{head}"
    );
    body.to_string()
}

/// The value of the sample `name{...volume="VOLUME"...}` in `text`.
fn sample(text: &str, name: &str, volume: &str) -> f64 {
    let prefix = format!("{name}{{");
    let label = format!("volume=\"{volume}\"");
    text.lines()
        .find(|line| line.starts_with(&prefix) && line.contains(&label))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("no {name} for {volume} in:\n{text}"))
}

/// A Prometheus server scraping `target` every second, killed on drop.
struct Prometheus {
    child: Child,
    port: u16,
}

impl Prometheus {
    fn start(dir: &Path, target: u16) -> Prometheus {
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n\
                 scrape_configs:\n  - job_name: ironpool\n    static_configs:\n      - targets: ['127.0.0.1:{target}']\n"
            ),
        )
        .expect("write the Prometheus config");
        let port = free_port();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("prometheus.log")).expect("Prometheus log file"))
            .spawn()
            .expect("start prometheus (Debian package prometheus)");
        Prometheus { child, port }
    }

    /// The instant value of `query` (one series), once Prometheus has one.
    fn query(&self, query: &str) -> Option<f64> {
        let request = format!(
            "GET /api/v1/query?query={query} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        );
        let response = TcpStream::connect(("127.0.0.1", self.port))
            .ok()
            .map(|mut stream| {
                let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
                let _ = stream.write_all(request.as_bytes());
                let mut bytes = Vec::new();
                let _ = stream.read_to_end(&mut bytes);
                String::from_utf8_lossy(&bytes).to_string()
            })?;
        let body = response.split_once("\r\n\r\n")?.1;
        // A chunked body: the JSON starts at the first brace.
        let json = &body[body.find('{')?..=body.rfind('}')?];
        let value: serde_json::Value = serde_json::from_str(json).ok()?;
        value["data"]["result"][0]["value"][1]
            .as_str()
            .and_then(|text| text.parse().ok())
    }

    /// Waits until `query`'s value is at least `floor`; returns it.
    fn wait_for(&self, query: &str, floor: f64, log: &Path) -> f64 {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            if let Some(value) = self.query(query) {
                if value >= floor {
                    return value;
                }
            }
            assert!(
                Instant::now() < deadline,
                "Prometheus never saw {query} >= {floor} (last {:?}):\n{}",
                self.query(query),
                std::fs::read_to_string(log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn metrics_pass_promtool_and_a_prometheus_server_sees_the_write_counter_rise() {
    let mut pool = TestPool::new("pm");
    pool.create("256M", &["mirror", "a.img", "b.img"]);
    pool.create_volume("vol", "64M");
    let port = free_port();
    pool.serve_with(&["--metrics", &format!("tcp:127.0.0.1:{port}")]);
    let uri = pool.uri("vol");
    qemu_io(&uri, &["write -P 0x5a 0 1M", "flush"]);

    // The text format, checked by Prometheus's own linter.
    let text = scrape(port);
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool (Debian package prometheus)");
    promtool
        .stdin
        .take()
        .expect("promtool stdin")
        .write_all(text.as_bytes())
        .expect("feed promtool");
    let checked = promtool.wait_with_output().expect("promtool output");
    assert!(
        checked.status.success() && checked.stdout.is_empty() && checked.stderr.is_empty(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );
    assert!(sample(&text, "ironpool_volume_write_bytes_total", "pm/vol") >= 1048576.0);
    assert!(sample(&text, "ironpool_volume_flush_ops_total", "pm/vol") >= 1.0);
    for family in [
        "ironpool_pool_health{pool=\"pm\",state=\"ONLINE\"} 1",
        "ironpool_device_write_bytes_total{pool=\"pm\",vdev=\"mirror-0\",device=",
        "ironpool_device_class_latency_seconds_bucket{",
        "ironpool_txg_commits_total{pool=\"pm\"}",
        "ironpool_writeback_dirty_bytes{pool=\"pm\"}",
        "ironpool_volume_log_commit_seconds_count{pool=\"pm\",volume=\"pm/vol\"}",
        "ironpool_nbd_connections_accepted_total{pool=\"pm\"}",
        "ironpool_scrub_running{pool=\"pm\"} 0",
        "ironpool_events_total{pool=\"pm\",class=\"pool_import\"} 1",
        "ironpool_events_total{pool=\"pm\",class=\"checksum_error\"} 0",
        "ironpool_events_suppressed_total{pool=\"pm\"} 0",
    ] {
        assert!(text.contains(family), "no {family} in:\n{text}");
    }

    // Bad requests get an answer or a closed connection, and harm nothing.
    let not_found = http(port, b"GET /nothing HTTP/1.1\r\n\r\n");
    assert!(not_found.starts_with("HTTP/1.1 404"), "{not_found}");
    let wrong_method = http(port, b"DELETE /metrics HTTP/1.1\r\n\r\n");
    assert!(wrong_method.starts_with("HTTP/1.1 405"), "{wrong_method}");
    let garbage = http(port, b"\x16\x03\x01 not http at all\r\n\r\n");
    assert!(garbage.starts_with("HTTP/1.1 400"), "{garbage}");
    let endless = http(port, &vec![b'A'; 64 * 1024]);
    assert!(
        endless.is_empty(),
        "an endless head was answered: {endless}"
    );
    let head = http(port, b"HEAD /metrics HTTP/1.1\r\n\r\n");
    assert!(
        head.starts_with("HTTP/1.1 200") && head.ends_with("\r\n\r\n"),
        "{head}"
    );

    // A real Prometheus server scrapes it, and its query API sees the
    // volume's write counter rise with more writes.
    let prometheus = Prometheus::start(pool.dir.path(), port);
    let log = pool.path("prometheus.log");
    let query = "ironpool_volume_write_bytes_total";
    let first = prometheus.wait_for(query, 1048576.0, &log);
    qemu_io(&uri, &["write -P 0x6b 1M 4M", "flush"]);
    let later = prometheus.wait_for(query, first + 4.0 * 1048576.0, &log);
    assert!(later >= first + 4194304.0, "{first} -> {later}");
    let up = prometheus.wait_for("up", 1.0, &log);
    assert_eq!(up, 1.0);
    drop(prometheus);
    pool.stop();
    assert!(!pool.log().contains("panicked"), "{}", pool.log());
}

#[test]
fn a_metrics_address_in_use_or_malformed_is_refused_with_a_clear_error() {
    let mut pool = TestPool::new("pb");
    pool.create("128M", &["a.img"]);
    let held = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = held.local_addr().expect("address").port();
    let output = pool
        .serve_command()
        .args(["--metrics", &format!("tcp:127.0.0.1:{port}"), "pb"])
        .output()
        .expect("run serve");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("--metrics: cannot listen"), "{stderr}");
    let output = pool
        .serve_command()
        .args(["--metrics", "http://nowhere", "pb"])
        .output()
        .expect("run serve");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("--metrics: 'http://nowhere'"), "{stderr}");
    // The pool was left exported and intact: it serves afterwards.
    pool.serve();
    pool.stop();
}

/// A datagram socket standing for the service manager's notify socket.
struct NotifySocket {
    socket: UnixDatagram,
    /// What NOTIFY_SOCKET says: a path, or `@name` for an abstract name.
    address: String,
}

impl NotifySocket {
    fn at_path(path: PathBuf) -> NotifySocket {
        let socket = UnixDatagram::bind(&path).expect("bind the notify socket");
        NotifySocket {
            socket,
            address: path.display().to_string(),
        }
    }

    fn abstract_named(name: &str) -> NotifySocket {
        let address = SocketAddr::from_abstract_name(name.as_bytes()).expect("abstract name");
        let socket = UnixDatagram::bind_addr(&address).expect("bind the abstract notify socket");
        NotifySocket {
            socket,
            address: format!("@{name}"),
        }
    }

    /// The next message, or None after `timeout`.
    fn receive(&self, timeout: Duration) -> Option<String> {
        self.socket
            .set_read_timeout(Some(timeout))
            .expect("timeout");
        let mut buffer = vec![0u8; 4096];
        let length = self.socket.recv(&mut buffer).ok()?;
        Some(String::from_utf8_lossy(&buffer[..length]).to_string())
    }
}

/// Starts `command` (a serve) with NOTIFY_SOCKET set, waits for its READY=1
/// and checks, the moment it arrives, that the volume is served and the
/// control socket answers; then SIGTERM must bring STOPPING=1 and a clean
/// exit.
fn ready_then_stopping(pool: &TestPool, mut command: Command, notify: &NotifySocket) {
    let mut child = command
        .env("NOTIFY_SOCKET", &notify.address)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(pool.path("serve.log")).expect("log"))
        .spawn()
        .expect("start serve");
    let ready = notify.receive(Duration::from_secs(60));
    let Some(ready) = ready else {
        let _ = child.kill();
        panic!("no readiness message: {}", pool.log());
    };
    assert!(ready.contains("READY=1"), "{ready}");
    assert!(
        ready.contains(&format!("MAINPID={}", child.id())),
        "{ready}"
    );
    // Ready means listening: no retry, no wait.
    let info = tool("nbdinfo", &["--size", &pool.uri("vol")]);
    assert_eq!(info.trim(), "67108864");
    let status = pool.admin(&["status", &pool.name]);
    assert!(status.contains("ONLINE"), "{status}");
    // SAFETY: kill(2) on a child we started.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let stopping = notify.receive(Duration::from_secs(60));
    assert!(
        stopping
            .as_deref()
            .is_some_and(|text| text.contains("STOPPING=1")),
        "{stopping:?}"
    );
    let status = child.wait().expect("serve exits");
    assert!(status.success(), "{status}: {}", pool.log());
    assert!(pool.log().contains("exported"), "{}", pool.log());
}

#[test]
fn serve_tells_the_service_manager_it_is_ready_once_listening_and_when_it_stops() {
    let pool = TestPool::new("sn");
    pool.create("128M", &["a.img"]);
    pool.create_volume("vol", "64M");
    let by_path = NotifySocket::at_path(pool.path("notify.sock"));
    let mut command = pool.serve_command();
    command.arg("sn");
    ready_then_stopping(&pool, command, &by_path);
    let name = format!("ironpool-test-notify-{}", std::process::id());
    let by_name = NotifySocket::abstract_named(&name);
    let mut command = pool.serve_command();
    command.arg("sn");
    ready_then_stopping(&pool, command, &by_name);
    // A pool that cannot be served is never announced ready.
    let output = pool
        .serve_command()
        .arg("no-such-pool")
        .env("NOTIFY_SOCKET", &by_path.address)
        .output()
        .expect("run serve");
    assert!(!output.status.success());
    assert_eq!(by_path.receive(Duration::from_millis(500)), None);
}

/// The unit in the repository: `systemd-analyze verify` finds nothing to
/// say about it, and its ExecStart, run as systemd would (instance name and
/// options from the environment file substituted), serves the pool and
/// notifies readiness, as Type=notify needs.
#[test]
fn the_systemd_unit_verifies_and_its_command_serves_the_pool() {
    let unit_path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../packaging/systemd/ironpool@.service");
    let unit = std::fs::read_to_string(&unit_path).expect("the unit file");
    for line in [
        "Type=notify",
        "KillSignal=SIGTERM",
        "Restart=on-failure",
        "EnvironmentFile=-/etc/ironpool/%i.env",
    ] {
        assert!(unit.lines().any(|unit_line| unit_line == line), "{line}");
    }
    let binary = ironpool_binary().display().to_string();
    let pool = TestPool::new("unit");
    pool.create("128M", &["a.img"]);
    pool.create_volume("vol", "64M");
    // The unit as installed, but pointing at the binary under test.
    let installed = pool.path("ironpool@unit.service");
    std::fs::write(&installed, unit.replace("/usr/local/bin/ironpool", &binary))
        .expect("write the unit");
    let verify = Command::new("systemd-analyze")
        .args(["verify"])
        .arg(&installed)
        .output()
        .expect("run systemd-analyze (Debian package systemd)");
    assert!(
        verify.status.success() && verify.stdout.is_empty() && verify.stderr.is_empty(),
        "systemd-analyze verify: {}{}",
        String::from_utf8_lossy(&verify.stdout),
        String::from_utf8_lossy(&verify.stderr)
    );
    let exec_start = unit
        .lines()
        .find_map(|line| line.strip_prefix("ExecStart="))
        .expect("an ExecStart line");
    let options = format!(
        "-d {} --nbd unix:{} --control {}",
        pool.dir.path().display(),
        pool.socket().display(),
        pool.control().display()
    );
    let words: Vec<String> = exec_start
        .split_whitespace()
        .flat_map(|word| match word {
            "/usr/local/bin/ironpool" => vec![binary.clone()],
            "$IRONPOOL_SERVE_OPTIONS" => options.split(' ').map(str::to_string).collect(),
            "%i" => vec!["unit".to_string()],
            other => vec![other.to_string()],
        })
        .collect();
    let mut command = Command::new(&words[0]);
    command
        .args(&words[1..])
        .env("IRONPOOL_CACHE", pool.path("cache.json"))
        .env("IRONPOOL_RUN_DIR", pool.path("run"))
        .env_remove("IRONPOOL_CONTROL");
    let notify = NotifySocket::at_path(pool.path("notify.sock"));
    ready_then_stopping(&pool, command, &notify);
}

/// Bytes the file takes on its filesystem (what `du` shows).
fn allocated_bytes(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).expect("device file").blocks() * 512
}

fn allocated(pool: &TestPool) -> u64 {
    allocated_bytes(&pool.path("a.img")) + allocated_bytes(&pool.path("b.img"))
}

/// Waits until the device files take less than `limit` bytes.
fn wait_for_allocated_below(pool: &TestPool, limit: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while allocated(pool) >= limit {
        assert!(
            Instant::now() < deadline,
            "the device files still take {} bytes (want < {limit}): {}",
            allocated(pool),
            pool.admin(&["status", &pool.name])
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Autotrim gives a destroyed volume's space back to the filesystem holding
/// the sparse device files; with autotrim off it stays until `trim -w`.
/// Bad input changes nothing.
#[test]
fn freed_space_goes_back_to_the_host_filesystem_by_autotrim_or_trim() {
    let mut pool = TestPool::new("tr");
    pool.create("512M", &["mirror", "a.img", "b.img"]);
    pool.serve_with(&["-o", "txg_timeout_ms=200"]);
    // Off by default (its discards cost overwrites IOPS).
    let value = pool.admin(&["get", "autotrim", "tr"]);
    assert!(
        value.contains("off") && value.contains("default"),
        "{value}"
    );
    pool.admin(&["set", "autotrim=on", "tr"]);
    let empty = allocated(&pool);
    pool.admin(&["volume", "create", "tr/v", "128M"]);
    qemu_io(&pool.uri("v"), &["write -P 0x5a 0 96M", "flush"]);
    let written = allocated(&pool);
    assert!(
        written >= empty + 2 * (96 << 20),
        "{empty} -> {written}: the writes did not land in the files"
    );
    pool.admin(&["destroy", "tr/v"]);
    wait_for_allocated_below(&pool, empty + (16 << 20));
    let status = pool.status_json();
    assert_eq!(status["trim"]["autotrim"], true, "{status}");
    assert!(
        status["trim"]["autotrim_trimmed_bytes"]
            .as_u64()
            .unwrap_or(0)
            >= 2 * (96 << 20),
        "{status}"
    );

    // Autotrim off: a destroy leaves the files as large as they were, past
    // the commits that make its frees allocatable.
    pool.admin(&["set", "autotrim=off", "tr"]);
    let free = |pool: &TestPool| pool.status_json()["free_bytes"].as_u64().unwrap_or(0);
    let free_before = free(&pool);
    pool.admin(&["volume", "create", "tr/w", "128M"]);
    qemu_io(&pool.uri("w"), &["write -P 0x6b 0 96M", "flush"]);
    pool.admin(&["destroy", "tr/w"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while free(&pool) + (4 << 20) < free_before {
        assert!(
            Instant::now() < deadline,
            "the destroyed volume's space never came back"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let kept = allocated(&pool);
    assert!(
        kept >= empty + 2 * (90 << 20),
        "autotrim=off trimmed: {kept}"
    );
    let output = pool.admin(&["trim", "-w", "tr"]);
    assert!(output.contains("trim discarded"), "{output}");
    assert!(
        allocated(&pool) < empty + (16 << 20),
        "trim -w left {} bytes",
        allocated(&pool)
    );
    let status = pool.status_json();
    assert_eq!(status["trim"]["state"], "finished", "{status}");
    assert_eq!(status["trim"]["unsupported_devices"], serde_json::json!([]));
    let text = pool.admin(&["status", "tr"]);
    assert!(
        text.contains("trim: autotrim off; trim discarded"),
        "{text}"
    );

    // `trim -w` right after a destroy covers what the destroy freed: the
    // frees are let out of the defer window first (a trim begun at once
    // found them still deferred and left the files full).
    pool.admin(&["volume", "create", "tr/y", "128M"]);
    qemu_io(&pool.uri("y"), &["write -P 0x7c 0 96M", "flush"]);
    let full = allocated(&pool);
    assert!(
        full >= empty + 2 * (90 << 20),
        "the writes did not land: {full}"
    );
    pool.admin(&["destroy", "tr/y"]);
    let output = pool.admin(&["trim", "-w", "tr"]);
    assert!(output.contains("trim discarded"), "{output}");
    assert!(
        allocated(&pool) < empty + (16 << 20),
        "trim -w right after a destroy left {} bytes",
        allocated(&pool)
    );

    // Bad input: a clear error, nothing changed.
    let control = pool.control().display().to_string();
    let error = pool.fails(&["--control", &control, "set", "autotrim=sometimes", "tr"]);
    assert!(
        error.contains("autotrim 'sometimes': use on or off"),
        "{error}"
    );
    pool.admin(&["volume", "create", "tr/x", "16M"]);
    let error = pool.fails(&["--control", &control, "set", "autotrim=on", "tr/x"]);
    assert!(error.contains("autotrim is a pool property"), "{error}");
    let value = pool.admin(&["get", "autotrim", "tr"]);
    assert!(value.contains("off"), "{value}");
    pool.admin(&["set", "autotrim=on", "tr"]);
    pool.admin(&["inherit", "autotrim", "tr"]);
    let value = pool.admin(&["get", "autotrim", "tr"]);
    assert!(
        value.contains("off") && value.contains("default"),
        "{value}"
    );
    stop_and_check(&mut pool);
    assert!(!pool.log().contains("panicked"), "{}", pool.log());
}

// ---------------------------------------------------------------------------
// Pool shape

/// The vdevs of `status --json`: (name, log, size, allocated).
fn vdev_space(pool: &TestPool) -> Vec<(String, bool, u64, u64)> {
    pool.status_json()["vdevs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|vdev| {
            (
                vdev["name"].as_str().unwrap().to_string(),
                vdev["log"] == true,
                vdev["size_bytes"].as_u64().unwrap(),
                vdev["allocated_bytes"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// Reads `length` at `offset` of `uri`, which must all be `pattern`.
fn verify(uri: &str, pattern: u8, offset: &str, length: &str) {
    let output = qemu_io(uri, &[&format!("read -P {pattern:#x} {offset} {length}")]);
    assert!(!output.contains("verification failed"), "{output}");
}

/// `add` grows a served pool by a data vdev: new writes go mostly, not
/// only, to the empty vdev; everything written before and after reads
/// back, across a restart, and scrub and check find nothing wrong. A log
/// device added before a data vdev cannot be removed (vdevs are numbered
/// by position), and says so.
#[test]
fn a_data_vdev_added_to_a_served_pool_takes_most_new_writes() {
    let mut pool = TestPool::new("grow");
    pool.create("256M", &["a.img"]);
    pool.serve();
    // Larger than the pool until a vdev is added: sparse.
    pool.admin(&["volume", "create", "-s", "grow/v", "400M"]);
    let uri = pool.uri("v");
    qemu_io(&uri, &["write -P 0x11 0 96M", "flush"]);
    let before = vdev_space(&pool);
    assert_eq!(before.len(), 1, "{before:?}");
    let size_before = pool.status_json()["size_bytes"].as_u64().unwrap();

    let new_device = pool.path("b.img").display().to_string();
    pool.admin(&["add", "--size", "256M", "grow", &new_device]);
    let size_after = pool.status_json()["size_bytes"].as_u64().unwrap();
    assert!(
        size_after > size_before * 19 / 10,
        "{size_before} -> {size_after}"
    );
    qemu_io(&uri, &["write -P 0x22 96M 144M", "flush"]);
    let after = vdev_space(&pool);
    assert_eq!(after.len(), 2, "{after:?}");
    let old_took = after[0].3 - before[0].3;
    let new_took = after[1].3;
    assert!(
        new_took > old_took && old_took > 16 << 20,
        "of the writes after the add, the old vdev took {old_took}, the new one {new_took}"
    );
    let text = pool.admin(&["status", "grow"]);
    assert!(text.contains("FRAG") && text.contains("disk-1"), "{text}");
    let listed = pool.admin(&["list", "-v", "grow"]);
    assert!(
        listed.contains("  disk-0") && listed.contains("  disk-1") && listed.contains("frag"),
        "{listed}"
    );
    verify(&uri, 0x11, "0", "96M");
    verify(&uri, 0x22, "96M", "144M");

    // Bad input changes nothing.
    let control = pool.control().display().to_string();
    let error = pool.fails(&["--control", &control, "add", "grow", &new_device]);
    assert!(error.contains("b.img"), "{error}");
    let missing = pool.path("missing.img").display().to_string();
    let error = pool.fails(&["--control", &control, "add", "grow", &missing]);
    assert!(error.contains("missing.img"), "{error}");
    assert_eq!(vdev_space(&pool).len(), 2);

    // A log device added before a data vdev stays: ids are positions.
    let log = pool.path("log.img").display().to_string();
    pool.admin(&["add", "--size", "64M", "grow", "log", &log]);
    let third = pool.path("c.img").display().to_string();
    pool.admin(&["add", "--size", "256M", "grow", &third]);
    let error = pool.fails(&["--control", &control, "remove", "grow", &log]);
    assert!(error.contains("was added before data vdevs"), "{error}");
    let shape: Vec<bool> = vdev_space(&pool).iter().map(|vdev| vdev.1).collect();
    assert_eq!(shape, [false, false, true, false]);
    qemu_io(&uri, &["write -P 0x33 240M 64M", "flush"]);

    pool.stop();
    pool.serve();
    verify(&uri, 0x11, "0", "96M");
    verify(&uri, 0x22, "96M", "144M");
    verify(&uri, 0x33, "240M", "64M");
    let scrub = pool.admin(&["scrub", "-w", "grow"]);
    assert!(scrub.contains("with 0 errors"), "{scrub}");
    let history = pool.admin(&["history", "grow"]);
    assert!(
        history.contains(&format!("add grow {new_device}")),
        "{history}"
    );
    stop_and_check(&mut pool);
}

/// The vdevs of `status --json` as (name, [device file names]).
fn vdev_shape(pool: &TestPool) -> Vec<(String, Vec<String>)> {
    pool.status_json()["vdevs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|vdev| {
            let children = vdev["children"]
                .as_array()
                .unwrap()
                .iter()
                .map(|child| {
                    let path = child["path"].as_str().unwrap();
                    path.rsplit('/').next().unwrap().to_string()
                })
                .collect();
            (vdev["name"].as_str().unwrap().to_string(), children)
        })
        .collect()
}

/// `attach` makes a disk a mirror (resilvering the new side, which takes
/// writes at once) and `detach` takes a side out, turning a lone side back
/// into a disk; every byte written before, during and after reads back from
/// what is left, across a kill -9, and the detached device is no longer the
/// pool's. Bad requests change nothing.
#[test]
fn attach_makes_a_mirror_and_detach_takes_a_side_out() {
    let mut pool = TestPool::new("att");
    pool.create("256M", &["a.img"]);
    pool.serve();
    pool.admin(&["volume", "create", "att/v", "200M"]);
    let uri = pool.uri("v");
    qemu_io(&uri, &["write -P 0x41 0 64M", "flush"]);
    let dir = pool.dir.path().to_path_buf();
    let path = |name: &str| dir.join(name).display().to_string();

    let output = pool.admin(&[
        "attach",
        "-w",
        "--size",
        "256M",
        "att",
        "a.img",
        &path("b.img"),
    ]);
    assert!(output.contains("mirror-0"), "{output}");
    assert_eq!(
        vdev_shape(&pool),
        [(
            "mirror-0".to_string(),
            vec!["a.img".to_string(), "b.img".to_string()]
        )]
    );
    let status = pool.status_json();
    assert_eq!(status["resilver"]["state"], "finished", "{status}");
    assert!(
        status["resilver"]["rewritten_bytes"].as_u64().unwrap_or(0) >= 64 << 20,
        "{}",
        status["resilver"]
    );

    // The first side leaves: everything is read from the new one alone.
    pool.admin(&["detach", "att", "a.img"]);
    assert_eq!(
        vdev_shape(&pool),
        [("disk-0".to_string(), vec!["b.img".to_string()])]
    );
    verify(&uri, 0x41, "0", "64M");

    // A third device attached, written while it resilvers, then a kill -9
    // before anything else: the import resumes the resilver, and the last
    // original side can leave.
    pool.admin(&["attach", "--size", "256M", "att", "b.img", &path("c.img")]);
    qemu_io(&uri, &["write -P 0x42 64M 32M", "flush"]);
    pool.kill9();
    pool.serve();
    let deadline = Instant::now() + Duration::from_secs(60);
    while pool.status_json()["resilver"]["state"] == "resilvering" {
        assert!(Instant::now() < deadline, "the resilver never ended");
        std::thread::sleep(Duration::from_millis(100));
    }
    pool.admin(&["detach", "att", "b.img"]);
    assert_eq!(
        vdev_shape(&pool),
        [("disk-0".to_string(), vec!["c.img".to_string()])]
    );
    verify(&uri, 0x41, "0", "64M");
    verify(&uri, 0x42, "64M", "32M");
    let scrub = pool.admin(&["scrub", "-w", "att"]);
    assert!(scrub.contains("with 0 errors"), "{scrub}");

    // Bad requests: a clear error, the shape unchanged.
    let control = pool.control().display().to_string();
    let error = pool.fails(&["--control", &control, "detach", "att", "c.img"]);
    assert!(
        error.contains("only a mirror's side can be detached"),
        "{error}"
    );
    let error = pool.fails(&[
        "--control",
        &control,
        "attach",
        "att",
        "c.img",
        &path("c.img"),
    ]);
    // The server holds its devices open exclusively: the new one is found
    // in use before it is found to be the pool's.
    assert!(error.contains("in use"), "{error}");
    let error = pool.fails(&[
        "--control",
        &control,
        "attach",
        "att",
        "nope.img",
        &path("b.img"),
    ]);
    assert!(error.contains("nope.img"), "{error}");
    std::fs::write(pool.path("tiny.img"), vec![0u8; 64 << 20]).unwrap();
    let error = pool.fails(&[
        "--control",
        &control,
        "attach",
        "att",
        "c.img",
        &path("tiny.img"),
    ]);
    assert!(error.contains("too small"), "{error}");
    assert_eq!(
        vdev_shape(&pool),
        [("disk-0".to_string(), vec!["c.img".to_string()])]
    );
    let history = pool.admin(&["history", "att"]);
    assert!(
        history.contains("attach att a.img") && history.contains("detach att b.img"),
        "{history}"
    );
    stop_and_check(&mut pool);
    // The detached devices hold no label of the pool any more.
    let error = pool.fails(&["labelclear", &path("a.img")]);
    assert!(error.contains("no ironpool label"), "{error}");
}

/// `split` makes a new pool of one side of every mirror: the original
/// keeps the other sides and goes on taking writes; the new pool is left
/// exported, imports by its name with the data acknowledged before the
/// split (a snapshot included) and none written after, and scrubs clean.
/// Pools it cannot split, and bad names, are refused with nothing changed.
#[test]
fn split_makes_a_new_pool_of_one_side_of_every_mirror() {
    let mut pool = TestPool::new("spl");
    pool.create(
        "256M",
        &["mirror", "a.img", "b.img", "mirror", "c.img", "d.img"],
    );
    pool.serve();
    pool.admin(&["volume", "create", "spl/v", "200M"]);
    let uri = pool.uri("v");
    qemu_io(&uri, &["write -P 0x41 0 96M", "flush"]);
    pool.admin(&["snapshot", "spl/v@before"]);
    // Acknowledged by a FLUSH only: the split's first commit takes it.
    qemu_io(&uri, &["write -P 0x42 96M 16M", "flush"]);
    let control = pool.control().display().to_string();
    let split_fails = |args: &[&str]| {
        let mut all = vec!["--control", control.as_str(), "split", "spl"];
        all.extend_from_slice(args);
        pool.fails(&all)
    };
    assert!(split_fails(&["spl"]).contains("a name other than"));
    assert!(split_fails(&["b@d"]).contains("not a valid pool name"));
    let error = split_fails(&["spl2", "a.img", "b.img"]);
    assert!(error.contains("another device of mirror-0"), "{error}");
    assert!(split_fails(&["spl2", "nope.img"]).contains("nope.img"));
    let whole = vec![
        (
            "mirror-0".to_string(),
            vec!["a.img".to_string(), "b.img".to_string()],
        ),
        (
            "mirror-1".to_string(),
            vec!["c.img".to_string(), "d.img".to_string()],
        ),
    ];
    assert_eq!(vdev_shape(&pool), whole);

    // a.img named; mirror-1 gives its last side.
    let output = pool.admin(&["split", "spl", "spl2", "a.img"]);
    assert!(output.contains("split off: pool 'spl2'"), "{output}");
    assert!(
        output.contains("a.img") && output.contains("d.img"),
        "{output}"
    );
    assert_eq!(
        vdev_shape(&pool),
        [
            ("disk-0".to_string(), vec!["b.img".to_string()]),
            ("disk-1".to_string(), vec!["c.img".to_string()]),
        ]
    );
    // The original goes on; what it takes now is not the new pool's.
    qemu_io(&uri, &["write -P 0x43 0 8M", "flush"]);
    let error = split_fails(&["spl3"]);
    assert!(error.contains("is not a mirror"), "{error}");
    let history = pool.admin(&["history", "spl"]);
    assert!(history.contains("split spl spl2 a.img"), "{history}");
    stop_and_check(&mut pool);
    // A name taken by a pool beside this one's devices is refused.
    let dir = pool.dir.path().display().to_string();
    let error = pool.fails(&["split", "-d", &dir, "spl", "spl2"]);
    assert!(error.contains("already exists"), "{error}");

    // The new pool, by its name: the data as of the split.
    pool.name = "spl2".to_string();
    pool.serve();
    let uri2 = pool.uri("v");
    verify(&uri2, 0x41, "8M", "88M");
    verify(&uri2, 0x41, "0", "8M");
    verify(&uri2, 0x42, "96M", "16M");
    let snapshots = pool.admin(&["list", "-t", "snapshot", "spl2"]);
    assert!(snapshots.contains("spl2/v@before"), "{snapshots}");
    assert_eq!(
        vdev_shape(&pool),
        [
            ("disk-0".to_string(), vec!["a.img".to_string()]),
            ("disk-1".to_string(), vec!["d.img".to_string()]),
        ]
    );
    let scrub = pool.admin(&["scrub", "-w", "spl2"]);
    assert!(scrub.contains("with 0 errors"), "{scrub}");
    qemu_io(&uri2, &["write -P 0x44 112M 8M", "flush"]);
    stop_and_check(&mut pool);

    // The original, imported again: its writes after the split, not the
    // new pool's.
    pool.name = "spl".to_string();
    pool.serve();
    verify(&uri, 0x43, "0", "8M");
    verify(&uri, 0x41, "8M", "88M");
    verify(&uri, 0x42, "96M", "16M");
    verify(&uri, 0, "112M", "8M");
    let scrub = pool.admin(&["scrub", "-w", "spl"]);
    assert!(scrub.contains("with 0 errors"), "{scrub}");
    stop_and_check(&mut pool);
}

/// The spares of a status: (file name, state, file name it stands in for).
fn spares(pool: &TestPool) -> Vec<(String, String, Option<String>)> {
    let file = |path: &str| path.rsplit('/').next().unwrap().to_string();
    pool.status_json()["spares"]
        .as_array()
        .unwrap()
        .iter()
        .map(|spare| {
            (
                file(spare["path"].as_str().unwrap()),
                spare["state"].as_str().unwrap().to_string(),
                spare["replacing"].as_str().map(file),
            )
        })
        .collect()
}

/// Waits for the resilver a spare's activation started, then for the
/// status to show it.
fn wait_resilvered(pool: &TestPool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status = pool.status_json();
        let done = status["resilver"]["state"] != "resilvering"
            && status["vdevs"].as_array().unwrap().iter().all(|vdev| {
                vdev["children"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .all(|child| child["needs_resilver"] == false)
            });
        if done {
            return;
        }
        assert!(Instant::now() < deadline, "never resilvered: {status}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Hot spares: made at `create`, added and removed; a device missing at
/// import is replaced by a spare without the operator (resilvered, the
/// data whole), `detach` of the missing device keeps the spare, and
/// `replace` of it puts a new device in the spare's place and gives the
/// spare back. Bad spares are refused with nothing changed.
#[test]
fn a_hot_spare_takes_the_place_of_a_missing_device() {
    let mut pool = TestPool::new("hs");
    // A spare too small is refused before anything is written: the same
    // devices then make a pool without -f.
    std::fs::write(pool.path("tiny.img"), vec![0u8; 64 << 20]).unwrap();
    let error = pool.fails(&[
        "create",
        "--size",
        "256M",
        "hs",
        "mirror",
        &pool.path("a.img").display().to_string(),
        &pool.path("b.img").display().to_string(),
        "spare",
        &pool.path("tiny.img").display().to_string(),
    ]);
    assert!(error.contains("smaller"), "{error}");
    pool.create("256M", &["mirror", "a.img", "b.img", "spare", "s.img"]);
    let dir = pool.dir.path().to_path_buf();
    let path = |name: &str| dir.join(name).display().to_string();
    pool.serve();
    assert_eq!(spares(&pool), [("s.img".into(), "available".into(), None)]);
    let output = pool.admin(&["status", "hs"]);
    assert!(
        output.contains("spares") && output.contains("AVAIL"),
        "{output}"
    );
    pool.admin(&["volume", "create", "hs/v", "200M"]);
    let uri = pool.uri("v");
    qemu_io(&uri, &["write -P 0x41 0 64M", "flush"]);

    // Refused: a device of the pool, a small one, a group after spare.
    let control = pool.control().display().to_string();
    let error = pool.fails(&["--control", &control, "add", "hs", "spare", &path("a.img")]);
    assert!(error.contains("a.img"), "{error}");
    std::fs::write(pool.path("tiny.img"), vec![0u8; 64 << 20]).unwrap();
    let error = pool.fails(&[
        "--control",
        &control,
        "add",
        "hs",
        "spare",
        &path("tiny.img"),
    ]);
    assert!(error.contains("too small"), "{error}");
    let error = pool.fails(&[
        "--control",
        &control,
        "add",
        "hs",
        "spare",
        "mirror",
        &path("t.img"),
    ]);
    assert!(error.contains("a spare is one device"), "{error}");
    // Added and removed: its label goes with it.
    pool.admin(&["add", "--size", "256M", "hs", "spare", &path("t.img")]);
    assert_eq!(spares(&pool).len(), 2);
    pool.admin(&["remove", "hs", "t.img"]);
    assert_eq!(spares(&pool), [("s.img".into(), "available".into(), None)]);
    let error = pool.fails(&["labelclear", &path("t.img")]);
    assert!(error.contains("no ironpool label"), "{error}");

    // b.img gone while the server is down: the import puts s.img in its
    // place and resilvers it.
    pool.stop();
    // Out of the directory the import searches.
    std::fs::create_dir(pool.path("away")).unwrap();
    std::fs::rename(pool.path("b.img"), pool.path("away/b.img")).unwrap();
    pool.serve();
    wait_resilvered(&pool);
    assert_eq!(
        vdev_shape(&pool),
        [(
            "mirror-0".to_string(),
            vec!["a.img".to_string(), "s.img".to_string()]
        )]
    );
    assert_eq!(
        spares(&pool),
        [("s.img".into(), "in use".into(), Some("b.img".into()))]
    );
    let output = pool.admin(&["status", "hs"]);
    assert!(output.contains("spare in place of"), "{output}");
    let events = pool.admin(&["events", "hs"]);
    assert!(
        events.contains("hot spare activated in place of"),
        "{events}"
    );
    verify(&uri, 0x41, "0", "64M");
    // a.img alone would not do: the spare holds everything (scrub, then
    // the data read with a.img taken offline).
    let scrub = pool.admin(&["scrub", "-w", "hs"]);
    assert!(scrub.contains("with 0 errors"), "{scrub}");
    pool.admin(&["offline", "hs", "a.img"]);
    verify(&uri, 0x41, "0", "64M");
    pool.admin(&["online", "hs", "a.img"]);
    wait_resilvered(&pool);

    // Kept: detach of the device it replaced.
    pool.admin(&["detach", "hs", "b.img"]);
    assert!(spares(&pool).is_empty());
    assert_eq!(
        vdev_shape(&pool),
        [(
            "mirror-0".to_string(),
            vec!["a.img".to_string(), "s.img".to_string()]
        )]
    );

    // A second spare stands in for a.img, then `replace a.img c.img`
    // puts c.img in the spare's place and gives the spare back.
    pool.admin(&["add", "--size", "256M", "hs", "spare", &path("u.img")]);
    qemu_io(&uri, &["write -P 0x42 64M 16M", "flush"]);
    pool.stop();
    std::fs::rename(pool.path("a.img"), pool.path("away/a.img")).unwrap();
    pool.serve();
    wait_resilvered(&pool);
    assert_eq!(
        spares(&pool),
        [("u.img".into(), "in use".into(), Some("a.img".into()))]
    );
    pool.admin(&[
        "replace",
        "-w",
        "--size",
        "256M",
        "hs",
        "a.img",
        &path("c.img"),
    ]);
    wait_resilvered(&pool);
    assert_eq!(
        vdev_shape(&pool),
        [(
            "mirror-0".to_string(),
            vec!["c.img".to_string(), "s.img".to_string()]
        )]
    );
    assert_eq!(spares(&pool), [("u.img".into(), "available".into(), None)]);
    verify(&uri, 0x41, "0", "64M");
    verify(&uri, 0x42, "64M", "16M");
    stop_and_check(&mut pool);
    // Across an import the spare is found again, available.
    pool.serve();
    assert_eq!(spares(&pool), [("u.img".into(), "available".into(), None)]);
    let history = pool.admin(&["history", "hs"]);
    assert!(history.contains("add hs spare"), "{history}");
    stop_and_check(&mut pool);
}

// ---------------------------------------------------------------------------
// Events and history

/// Reads lines a child prints on stdout, on a thread, into a channel.
fn lines_of(child: &mut Child) -> std::sync::mpsc::Receiver<String> {
    use std::io::BufRead;
    let stdout = child.stdout.take().expect("piped stdout");
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if sender.send(line).is_err() {
                break;
            }
        }
    });
    receiver
}

/// Waits up to `timeout` for a line containing every one of `words`.
fn wait_for_line(
    lines: &std::sync::mpsc::Receiver<String>,
    words: &[&str],
    timeout: Duration,
) -> String {
    let deadline = Instant::now() + timeout;
    let mut seen = Vec::new();
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match lines.recv_timeout(left) {
            Ok(line) if words.iter().all(|word| line.contains(word)) => return line,
            Ok(line) => seen.push(line),
            Err(_) => break,
        }
    }
    panic!("no line with {words:?} within {timeout:?}; saw {seen:#?}");
}

/// A mirror side damaged under a written volume: the scrub's checksum
/// errors are events naming that device and the damaged range; a follower
/// (`events -f`) sees an offline device as it happens; `--json` gives one
/// parseable object per line; a pool nobody serves has no events to show.
#[test]
fn events_name_the_damaged_device_and_a_follower_sees_state_changes_live() {
    let mut pool = TestPool::new("ev");
    pool.create("512M", &["mirror", "a.img", "b.img"]);
    pool.create_volume("vol", "64M");
    pool.serve();
    qemu_io(&pool.uri("vol"), &["write -P 0x5c 0 48M", "flush"]);
    pool.stop();
    // Most of b's data area (its labels at the ends left alone).
    corrupt_file(&pool.path("b.img"), 1 << 20, 100 << 20);
    pool.serve();

    let mut follower = pool
        .command()
        .args(["--control"])
        .arg(pool.control())
        .args(["events", "-f", "ev"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start events -f");
    let lines = lines_of(&mut follower);
    wait_for_line(&lines, &["pool_import", "at txg"], Duration::from_secs(30));

    pool.admin(&["scrub", "-w", "ev"]);
    let b = std::fs::canonicalize(pool.path("b.img"))
        .unwrap()
        .display()
        .to_string();
    let a = std::fs::canonicalize(pool.path("a.img"))
        .unwrap()
        .display()
        .to_string();
    let text = pool.admin(&["events", "ev"]);
    let checksum: Vec<&str> = text
        .lines()
        .filter(|line| line.contains("checksum_error"))
        .collect();
    assert!(!checksum.is_empty(), "{text}");
    assert!(
        checksum
            .iter()
            .all(|line| line.contains(&b) && !line.contains(&a)),
        "{text}"
    );
    assert!(
        text.contains("scrub_start") && text.contains("scrub_finish"),
        "{text}"
    );

    let json = pool.admin(&["--json", "events", "ev"]);
    let events: Vec<serde_json::Value> = json
        .lines()
        .map(|line| serde_json::from_str(line).expect("one JSON object per line"))
        .collect();
    let damaged = events
        .iter()
        .find(|event| event["class"] == "checksum_error")
        .expect("a checksum event");
    assert_eq!(damaged["device"], b.as_str(), "{damaged}");
    let offset = damaged["offset"].as_u64().unwrap();
    assert!(
        (1 << 20..101 << 20).contains(&offset),
        "the event's range {offset:#x} is outside the damage"
    );
    assert!(events
        .windows(2)
        .all(|pair| pair[0]["seq"].as_u64() < pair[1]["seq"].as_u64()));
    assert!(events
        .iter()
        .all(|event| event["time_unix_ns"].as_u64().unwrap() > 0));

    // Live: the follower sees the device go offline and come back.
    pool.admin(&["offline", "ev", &b]);
    wait_for_line(
        &lines,
        &["device_state", &b, "ONLINE -> OFFLINE"],
        Duration::from_secs(30),
    );
    pool.admin(&["online", "-w", "ev", &b]);
    wait_for_line(
        &lines,
        &["device_state", &b, "OFFLINE -> ONLINE"],
        Duration::from_secs(30),
    );
    wait_for_line(&lines, &["resilver_finish"], Duration::from_secs(60));
    let _ = follower.kill();
    let _ = follower.wait();
    stop_and_check(&mut pool);

    // Nobody serves it now: a clear error, not an empty list.
    let error = pool.fails(&["events", "ev"]);
    assert!(error.contains("no server serves pool 'ev'"), "{error}");
    assert!(!pool.log().contains("panicked"), "{}", pool.log());
}

/// Every command that changed the pool, served or not, in order with its
/// time, read back from the pool after its server stopped; commands that
/// only looked, or failed, are not in it.
#[test]
fn history_lists_every_change_in_order_from_the_pool_itself() {
    let mut pool = TestPool::new("hi");
    pool.create("256M", &["a.img"]);
    pool.create_volume("vol", "32M");
    pool.serve();
    pool.admin(&["set", "compression=zstd", "hi/vol"]);
    pool.admin(&["snapshot", "hi/vol@one"]);
    pool.admin(&["status", "hi"]);
    let control = pool.control().display().to_string();
    pool.fails(&["--control", &control, "set", "compression=bogus", "hi/vol"]);
    pool.admin(&["scrub", "-w", "hi"]);
    pool.stop();
    let dir = dir(&pool);
    pool.ok(&["export", "hi", "-d", &dir]);
    pool.ok(&["import", "-d", &dir, "hi"]);

    let text = pool.ok(&["history", "hi"]);
    let a = std::fs::canonicalize(pool.path("a.img"))
        .unwrap()
        .display()
        .to_string();
    let commands: Vec<&str> = text
        .lines()
        .skip(1)
        .map(|line| {
            // "2026-11-25 08:50:02 UTC command..."
            let (time, command) = line.split_at(24);
            assert!(time.starts_with("20") && time.ends_with("UTC "), "{line}");
            command
        })
        .collect();
    let create = format!("create hi {a}");
    assert_eq!(
        commands[..6],
        [
            create.as_str(),
            "volume create hi/vol 33554432",
            "set compression=zstd hi/vol",
            "snapshot hi/vol@one",
            "scrub hi",
            "export hi",
        ],
        "{text}"
    );
    assert_eq!(commands.len(), 7, "{text}");
    assert!(commands[6].starts_with("import 0x"), "{text}");
    let long = pool.ok(&["history", "-l", "hi"]);
    assert!(long.contains("[txg ") && long.contains(" on "), "{long}");
    let json: serde_json::Value =
        serde_json::from_str(&pool.ok(&["--json", "history", "hi"])).unwrap();
    assert_eq!(json["history"].as_array().map(Vec::len), Some(7), "{json}");

    // Bad input: a clear error.
    let error = pool.fails(&["history", "nosuchpool", "-d", &dir]);
    assert!(error.contains("nosuchpool"), "{error}");
}

/// The line of `/proc/PID/status` (or `self`) that says whether transparent
/// huge pages are allowed for the process.
fn thp_line(process: &str) -> String {
    std::fs::read_to_string(format!("/proc/{process}/status"))
        .expect("read the process status")
        .lines()
        .find(|line| line.starts_with("THP_enabled:"))
        .expect("a THP_enabled line (Linux 5.0 or later)")
        .to_string()
}

#[test]
fn serve_no_huge_pages_runs_the_server_without_transparent_huge_pages() {
    // The line reads 1 for a process that did not turn them off, as this
    // test's own does: the check below is not passed by every process.
    assert_eq!(thp_line("self"), "THP_enabled:\t1");
    let mut pool = TestPool::new("nothp");
    pool.create("1G", &["a.img"]);
    pool.create_volume("v", "64M");
    pool.serve_with(&["--no-huge-pages"]);
    let pid = std::fs::read_to_string(pool.path("pid")).unwrap();
    assert_eq!(thp_line(pid.trim()), "THP_enabled:\t0");
    // And it serves as ever.
    let uri = pool.uri("v");
    qemu_io(&uri, &["write -P 0x3c 0 4M", "flush"]);
    qemu_io(&uri, &["read -P 0x3c 0 4M"]);
}

/// A volume's `quota` as OpenZFS's: writes past it get ENOSPC over NBD
/// (NBD has no EDQUOT), within a block of the limit, and what was written
/// before reads back; `get` shows the limit and `available` what is left
/// of it; a quota under what the volume uses is refused; raised, writes
/// go on.
#[test]
fn a_volume_quota_refuses_writes_past_it_with_enospc() {
    let mut pool = TestPool::new("volquota");
    pool.create("1G", &["a.img"]);
    pool.create_volume("v", "256M");
    pool.serve();
    pool.admin(&["set", "quota=16M", "volquota/v"]);
    let get = |name: &str| -> String {
        let rows: serde_json::Value =
            serde_json::from_str(&pool.admin(&["--json", "get", name, "volquota/v"])).unwrap();
        rows["properties"][0]["value"].as_str().unwrap().to_string()
    };
    assert_eq!(get("quota"), (16u64 << 20).to_string());
    assert!(get("available").parse::<u64>().unwrap() <= 16 << 20);
    let mut client = NbdClient::connect(&pool.socket(), "volquota/v");
    let mut written = 0u64;
    let error = loop {
        let piece = distinct_bytes(1 << 20, (written >> 20) as u8);
        match client.write_at(written, &piece) {
            0 => written += 1 << 20,
            error => break error,
        }
        assert!(written <= 32 << 20, "no quota: {written} bytes written");
    };
    assert_eq!(error, libc::ENOSPC as u32, "{written} bytes written");
    assert!(
        (14 << 20..=16 << 20).contains(&written),
        "{written} bytes written under a 16M quota"
    );
    assert_eq!(client.flush(), 0);
    for piece in 0..written >> 20 {
        assert!(
            client.read(piece << 20, 1 << 20) == distinct_bytes(1 << 20, piece as u8),
            "piece {piece}"
        );
    }
    let control = pool.control().display().to_string();
    let refused = pool.fails(&["--control", &control, "set", "quota=4M", "volquota/v"]);
    assert!(refused.contains("less than"), "{refused}");
    pool.admin(&["set", "quota=none", "volquota/v"]);
    assert_eq!(client.write_at(written, &distinct_bytes(1 << 20, 99)), 0);
    drop(client);
    stop_and_check(&mut pool);
}

/// A volume is thick by default, as in OpenZFS: its refreservation holds
/// its size and indirect blocks, what it has not written is out of the
/// other datasets' reach, it follows `volsize` as it grows, and `-s` (or
/// `refreservation=none`) makes a volume sparse.
#[test]
fn volumes_are_thick_unless_made_sparse() {
    let mut pool = TestPool::new("thick");
    pool.create("1G", &["a.img"]);
    pool.create_volume("v", "256M");
    pool.create_sparse_volume("s", "256M");
    pool.serve();
    let get = |name: &str, dataset: &str| -> (String, String) {
        let rows: serde_json::Value = serde_json::from_str(&pool.admin(&[
            "--json",
            "get",
            name,
            &format!("thick/{dataset}"),
        ]))
        .unwrap();
        let row = &rows["properties"][0];
        (
            row["value"].as_str().unwrap().to_string(),
            row["source"].as_str().unwrap().to_string(),
        )
    };
    let thick: u64 = get("refreservation", "v").0.parse().unwrap();
    // 256 MiB of 16K blocks: 64 indirect blocks of 32K under one more,
    // two copies each.
    assert_eq!(thick, (256 << 20) + 65 * 2 * (32 << 10));
    assert_eq!(get("refreservation", "v").1, "local");
    assert_eq!(get("refreservation", "s").0, "none");
    // What it holds back counts in its `used`, as in OpenZFS, until written.
    let number = |name: &str, dataset: &str| -> u64 { get(name, dataset).0.parse().unwrap() };
    assert_eq!(number("usedbyrefreservation", "v"), thick);
    assert!(number("used", "v") >= thick);
    assert_eq!(number("usedbyrefreservation", "s"), 0);
    assert_eq!(number("usedbychildren", "v"), 0);
    qemu_io(&pool.uri("v"), &["write -P 0x5a 0 64M", "flush"]);
    let referenced = number("referenced", "v");
    assert!(referenced >= 64 << 20);
    assert_eq!(number("usedbyrefreservation", "v"), thick - referenced);
    // The sparse volume sees the thick one's unwritten space set aside.
    let available = |dataset: &str| -> u64 { get("available", dataset).0.parse().unwrap() };
    let pool_free: u64 = {
        let rows: serde_json::Value =
            serde_json::from_str(&pool.admin(&["--json", "list", "thick"])).unwrap();
        rows["pools"][0]["free_bytes"].as_u64().unwrap()
    };
    let held = number("usedbyrefreservation", "v");
    assert!(
        available("s") + held <= pool_free + (8 << 20),
        "the sparse volume may write {} of {pool_free} free with {held} held back",
        available("s")
    );
    assert!(
        available("v") >= 256 << 20,
        "the thick volume can be written in full"
    );
    // Growing it grows what it holds; `auto` says the same; none drops it.
    pool.admin(&["set", "volsize=512M", "thick/v"]);
    let grown: u64 = get("refreservation", "v").0.parse().unwrap();
    assert_eq!(grown, (512 << 20) + 129 * 2 * (32 << 10));
    pool.admin(&["set", "refreservation=none", "thick/v"]);
    assert_eq!(get("refreservation", "v").0, "none");
    pool.admin(&["set", "refreservation=auto", "thick/v"]);
    assert_eq!(get("refreservation", "v").0, grown.to_string());
    // A thick volume the pool cannot hold beside it is refused.
    let control = pool.control().display().to_string();
    let refused = pool.fails(&[
        "--control",
        &control,
        "volume",
        "create",
        "thick/big",
        "700M",
    ]);
    assert!(refused.contains("cannot reserve"), "{refused}");
    pool.admin(&["volume", "create", "-s", "thick/big", "700M"]);
    stop_and_check(&mut pool);
}

/// A clone's quota bounds what the clone itself writes: the blocks it
/// shares with its origin are the origin snapshot's (OpenZFS's `used` of a
/// clone). A 32 MiB volume cloned under a 16 MiB quota takes about 16 MiB
/// of new writes, not none (the quota bit at once when the clone's `used`
/// counted its origin's blocks).
#[test]
fn a_clone_quota_counts_only_what_the_clone_writes() {
    let mut pool = TestPool::new("clonequota");
    pool.create("1G", &["a.img"]);
    pool.create_volume("v", "32M");
    pool.serve();
    let mut origin = NbdClient::connect(&pool.socket(), "clonequota/v");
    for piece in 0..32u64 {
        assert_eq!(
            origin.write_at(piece << 20, &distinct_bytes(1 << 20, piece as u8)),
            0
        );
    }
    assert_eq!(origin.flush(), 0);
    drop(origin);
    pool.admin(&["snapshot", "clonequota/v@s"]);
    pool.admin(&["clone", "clonequota/v@s", "clonequota/c"]);
    pool.admin(&["set", "quota=16M", "clonequota/c"]);
    let mut clone = NbdClient::connect(&pool.socket(), "clonequota/c");
    let mut written = 0u64;
    let error = loop {
        let piece = distinct_bytes(1 << 20, 100 + (written >> 20) as u8);
        match clone.write_at(written, &piece) {
            0 => written += 1 << 20,
            error => break error,
        }
        assert!(written < 32 << 20, "no quota: {written} bytes written");
    };
    assert_eq!(error, libc::ENOSPC as u32, "{written} bytes written");
    assert!(
        (14 << 20..=16 << 20).contains(&written),
        "{written} bytes of new writes under the clone's 16M quota"
    );
    assert_eq!(clone.flush(), 0);
    // What it wrote reads back, and past it the origin's bytes.
    for piece in 0..32u64 {
        let expected = if piece < written >> 20 {
            100 + piece
        } else {
            piece
        };
        assert!(
            clone.read(piece << 20, 1 << 20) == distinct_bytes(1 << 20, expected as u8),
            "piece {piece}"
        );
    }
    drop(clone);
    stop_and_check(&mut pool);
}

/// `scripts/operator-day.sh`, the operator's day of issue 71, runs clean
/// with this build: one disk becomes a mirror, the pool grows by a second
/// mirror, a side that fails for real (its file's XFS is shut down, so
/// every I/O to it gets EIO) is replaced by the hot spare on its own and
/// detached, the first mirror is removed (its blocks move to a third) while
/// the server runs, and a scrub, `check`, fio's verification and the
/// files' checksums find nothing lost.
#[test]
fn an_operators_day_loses_nothing() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/operator-day.sh");
    let output = Command::new("bash")
        .arg(&script)
        .env("IRONPOOL_BIN", ironpool_binary())
        .output()
        .expect("run scripts/operator-day.sh");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.contains("operator's day: nothing lost"),
        "scripts/operator-day.sh failed:\nstdout: {stdout}\nstderr: {stderr}"
    );
    // The spare took the failed side's place on its own.
    assert!(stdout.contains("spare"), "{stdout}");
}
