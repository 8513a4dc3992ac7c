//! A scripted NBD peer over a real socket: malformed and hostile input gets the
//! protocol's error or a clean disconnect, never a crash, and never touches other
//! clients' data.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use common::{tool, TestPool};

const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
const REQUEST_MAGIC: u32 = 0x2560_9513;
const OPT_GO: u32 = 7;
const OPT_STRUCTURED_REPLY: u32 = 8;
const OPT_SET_META_CONTEXT: u32 = 10;

struct Peer {
    stream: UnixStream,
}

impl Peer {
    /// Connects and reads the greeting.
    fn connect(pool: &TestPool) -> Peer {
        let mut stream = UnixStream::connect(pool.socket()).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut greeting = [0u8; 18];
        stream.read_exact(&mut greeting).expect("greeting");
        assert_eq!(&greeting[..8], b"NBDMAGIC");
        Peer { stream }
    }

    fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("send");
    }

    fn option(&mut self, option: u32, data: &[u8]) {
        let mut bytes = IHAVEOPT.to_be_bytes().to_vec();
        bytes.extend_from_slice(&option.to_be_bytes());
        bytes.extend_from_slice(&(data.len() as u32).to_be_bytes());
        bytes.extend_from_slice(data);
        self.send(&bytes);
    }

    /// Reads one option reply: (reply type, data).
    fn option_reply(&mut self) -> (u32, Vec<u8>) {
        let mut header = [0u8; 20];
        self.stream.read_exact(&mut header).expect("option reply");
        assert_eq!(
            u64::from_be_bytes(header[..8].try_into().unwrap()),
            0x0003_e889_0455_65a9
        );
        let reply = u32::from_be_bytes(header[12..16].try_into().unwrap());
        let length = u32::from_be_bytes(header[16..20].try_into().unwrap()) as usize;
        let mut data = vec![0u8; length];
        self.stream
            .read_exact(&mut data)
            .expect("option reply data");
        (reply, data)
    }

    /// Fixed newstyle handshake to transmission on `export` (simple replies).
    fn go(pool: &TestPool, export: &str, structured: bool) -> Peer {
        let mut peer = Peer::connect(pool);
        peer.send(&1u32.to_be_bytes());
        if structured {
            peer.option(OPT_STRUCTURED_REPLY, &[]);
            assert_eq!(peer.option_reply().0, 1);
        }
        peer.option(OPT_GO, &info_data(export));
        loop {
            let (reply, _) = peer.option_reply();
            if reply == 1 {
                break;
            }
            assert_eq!(reply, 3, "expected INFO replies then ACK");
        }
        peer
    }

    fn request(&mut self, flags: u16, command: u16, cookie: u64, offset: u64, length: u32) {
        let mut bytes = REQUEST_MAGIC.to_be_bytes().to_vec();
        bytes.extend_from_slice(&flags.to_be_bytes());
        bytes.extend_from_slice(&command.to_be_bytes());
        bytes.extend_from_slice(&cookie.to_be_bytes());
        bytes.extend_from_slice(&offset.to_be_bytes());
        bytes.extend_from_slice(&length.to_be_bytes());
        self.send(&bytes);
    }

    /// Reads a simple reply: (error, cookie).
    fn simple_reply(&mut self) -> (u32, u64) {
        let mut header = [0u8; 16];
        self.stream.read_exact(&mut header).expect("simple reply");
        assert_eq!(
            u32::from_be_bytes(header[..4].try_into().unwrap()),
            0x6744_6698,
            "simple reply magic"
        );
        (
            u32::from_be_bytes(header[4..8].try_into().unwrap()),
            u64::from_be_bytes(header[8..16].try_into().unwrap()),
        )
    }

    /// True when the server closed the connection.
    fn closed(&mut self) -> bool {
        let mut byte = [0u8; 1];
        matches!(self.stream.read(&mut byte), Ok(0) | Err(_))
    }
}

fn info_data(export: &str) -> Vec<u8> {
    let mut data = (export.len() as u32).to_be_bytes().to_vec();
    data.extend_from_slice(export.as_bytes());
    data.extend_from_slice(&0u16.to_be_bytes());
    data
}

fn serving_pool() -> TestPool {
    let mut pool = TestPool::new("tank");
    pool.create("512M", &["mirror", "a.img", "b.img"]);
    pool.create_volume("vol", "64M");
    pool.serve();
    // A good client's data that no bad client may disturb.
    qemu_io(&pool, &["write -P 0x99 1M 1M", "flush"]);
    pool
}

fn good_data_intact(pool: &TestPool) {
    qemu_io(pool, &["read -P 0x99 1M 1M"]);
}

/// Runs `qemu-io` on the volume with `commands` (each a `-c`), which must
/// all succeed (a `read -P` fails on a byte that differs).
fn qemu_io(pool: &TestPool, commands: &[&str]) {
    let uri = pool.uri("vol");
    let mut args = vec!["-f", "raw", &uri];
    for command in commands {
        args.extend(["-c", command]);
    }
    tool("qemu-io", &args);
}

#[test]
fn handshake_garbage_is_refused_cleanly() {
    let mut pool = serving_pool();
    // Unknown client flags: disconnect.
    let mut peer = Peer::connect(&pool);
    peer.send(&0x8000_0001u32.to_be_bytes());
    assert!(peer.closed());
    // Bad option magic: disconnect.
    let mut peer = Peer::connect(&pool);
    peer.send(&1u32.to_be_bytes());
    peer.send(&[0xde; 16]);
    assert!(peer.closed());
    // Oversized option: ERR_TOO_BIG then disconnect.
    let mut peer = Peer::connect(&pool);
    peer.send(&1u32.to_be_bytes());
    let mut header = IHAVEOPT.to_be_bytes().to_vec();
    header.extend_from_slice(&OPT_GO.to_be_bytes());
    header.extend_from_slice(&(100u32 << 20).to_be_bytes());
    peer.send(&header);
    assert_eq!(peer.option_reply().0, 0x8000_0009);
    assert!(peer.closed());
    // Unknown option: ERR_UNSUP and the session goes on; unknown export:
    // ERR_UNKNOWN; malformed GO data: ERR_INVALID; then a good GO works.
    let mut peer = Peer::connect(&pool);
    peer.send(&1u32.to_be_bytes());
    peer.option(4242, b"whatever");
    assert_eq!(peer.option_reply().0, 0x8000_0001);
    peer.option(OPT_GO, &info_data("tank/nope"));
    assert_eq!(peer.option_reply().0, 0x8000_0006);
    peer.option(OPT_GO, &[0, 0, 0, 200, b'x']);
    assert_eq!(peer.option_reply().0, 0x8000_0003);
    // SET_META_CONTEXT before structured replies: ERR_INVALID.
    peer.option(OPT_SET_META_CONTEXT, &[0; 8]);
    assert_eq!(peer.option_reply().0, 0x8000_0003);
    peer.option(OPT_GO, &info_data("tank/vol"));
    let mut replies = Vec::new();
    loop {
        let (reply, _) = peer.option_reply();
        replies.push(reply);
        if reply == 1 {
            break;
        }
    }
    assert!(
        replies.len() >= 3,
        "INFO_EXPORT and INFO_BLOCK_SIZE before ACK: {replies:?}"
    );
    // Truncated handshake: half a header, then gone.
    let mut peer = Peer::connect(&pool);
    peer.send(&1u32.to_be_bytes());
    peer.send(&IHAVEOPT.to_be_bytes()[..5]);
    drop(peer);
    good_data_intact(&pool);
    pool.stop();
}

#[test]
fn transmission_errors_get_error_replies() {
    let mut pool = serving_pool();
    let mut peer = Peer::go(&pool, "tank/vol", false);
    // Unknown command: EINVAL.
    peer.request(0, 99, 1, 0, 0);
    assert_eq!(peer.simple_reply(), (22, 1));
    // Read past the end: EINVAL; write past the end: ENOSPC (payload consumed).
    peer.request(0, 0, 2, 64 << 20, 4096);
    assert_eq!(peer.simple_reply(), (22, 2));
    peer.request(0, 1, 3, (64 << 20) - 512, 4096);
    peer.send(&[7u8; 4096]);
    assert_eq!(peer.simple_reply(), (28, 3));
    // Misaligned: EINVAL.
    peer.request(0, 0, 4, 100, 512);
    assert_eq!(peer.simple_reply(), (22, 4));
    // An offset that overflows: EINVAL.
    peer.request(0, 0, 5, u64::MAX - 100, 4096);
    assert_eq!(peer.simple_reply(), (22, 5));
    // A flag that the command does not take: EINVAL (payload still consumed).
    peer.request(1 << 3, 1, 6, 0, 512);
    peer.send(&[1u8; 512]);
    assert_eq!(peer.simple_reply(), (22, 6));
    // Block status without structured replies: EINVAL.
    peer.request(0, 7, 7, 0, 4096);
    assert_eq!(peer.simple_reply(), (22, 7));
    // Flush with a range: EINVAL; a good flush: 0.
    peer.request(0, 3, 8, 0, 4096);
    assert_eq!(peer.simple_reply(), (22, 8));
    peer.request(0, 3, 9, 0, 0);
    assert_eq!(peer.simple_reply(), (0, 9));
    // A good write and read still work on this connection.
    peer.request(0, 1, 10, 8 << 20, 512);
    peer.send(&[0xa5u8; 512]);
    assert_eq!(peer.simple_reply(), (0, 10));
    peer.request(0, 0, 11, 8 << 20, 512);
    assert_eq!(peer.simple_reply(), (0, 11));
    let mut data = [0u8; 512];
    peer.stream.read_exact(&mut data).unwrap();
    assert!(data.iter().all(|byte| *byte == 0xa5));
    // Bad request magic: the stream is out of step, disconnect.
    peer.send(&[0xffu8; 28]);
    assert!(peer.closed());
    good_data_intact(&pool);
    pool.stop();
}

#[test]
fn hostile_lengths_and_vanishing_clients_do_not_hurt_the_server() {
    let mut pool = serving_pool();
    // A write announcing 1 GiB of payload: disconnect without reading it.
    let mut peer = Peer::go(&pool, "tank/vol", false);
    peer.request(0, 1, 1, 0, 1 << 30);
    assert!(peer.closed());
    // A read larger than the maximum payload: EOVERFLOW.
    let mut peer = Peer::go(&pool, "tank/vol", false);
    peer.request(0, 0, 2, 0, (32 << 20) + 512);
    assert_eq!(peer.simple_reply(), (75, 2));
    // A client that vanishes in the middle of a write payload.
    let mut peer = Peer::go(&pool, "tank/vol", false);
    peer.request(0, 1, 3, 4 << 20, 65536);
    peer.send(&[1u8; 1000]);
    drop(peer);
    // A client that vanishes with many reads in flight.
    let mut peer = Peer::go(&pool, "tank/vol", false);
    for cookie in 0..64 {
        peer.request(0, 0, cookie, cookie * 65536, 65536);
    }
    drop(peer);
    // A truncated request header.
    let mut peer = Peer::go(&pool, "tank/vol", false);
    peer.send(&REQUEST_MAGIC.to_be_bytes());
    peer.send(&[0u8; 10]);
    drop(peer);
    // A structured client asking for block status without a context: EINVAL as a
    // structured error chunk.
    let mut peer = Peer::go(&pool, "tank/vol", true);
    peer.request(0, 7, 4, 0, 4096);
    let mut header = [0u8; 20];
    peer.stream.read_exact(&mut header).unwrap();
    assert_eq!(
        u32::from_be_bytes(header[..4].try_into().unwrap()),
        0x668e_33ef
    );
    assert_eq!(
        u16::from_be_bytes(header[6..8].try_into().unwrap()),
        0x8001,
        "an ERROR chunk"
    );
    let length = u32::from_be_bytes(header[16..20].try_into().unwrap()) as usize;
    let mut payload = vec![0u8; length];
    peer.stream.read_exact(&mut payload).unwrap();
    assert_eq!(u32::from_be_bytes(payload[..4].try_into().unwrap()), 22);
    drop(peer);
    std::thread::sleep(Duration::from_millis(200));
    good_data_intact(&pool);
    // The server is healthy and the pool consistent.
    let status = pool.status_json();
    assert_eq!(status["health"], "ONLINE");
    pool.stop();
    pool.ok(&[
        "check",
        "tank",
        "-d",
        &pool.dir.path().display().to_string(),
    ]);
}

#[test]
fn disc_finishes_requests_in_flight() {
    let mut pool = serving_pool();
    let mut peer = Peer::go(&pool, "tank/vol", false);
    for cookie in 0..32u64 {
        peer.request(0, 1, cookie, (16 << 20) + cookie * 4096, 4096);
        peer.send(&[0x3cu8; 4096]);
    }
    peer.request(0, 2, 999, 0, 0);
    let mut cookies = Vec::new();
    for _ in 0..32 {
        let (error, cookie) = peer.simple_reply();
        assert_eq!(error, 0);
        cookies.push(cookie);
    }
    cookies.sort_unstable();
    assert_eq!(cookies, (0..32).collect::<Vec<_>>());
    assert!(peer.closed());
    qemu_io(&pool, &["read -P 0x3c 16M 128k"]);
    pool.stop();
}

/// A run of 16K writes has its payloads received apart from the stream
/// (each into a buffer of its own): broken by a read, a write of another
/// size, a flush and a payload that arrives in pieces, every byte still
/// lands where its request says, and other requests are answered.
#[test]
fn a_run_of_writes_received_apart_keeps_every_byte_when_broken() {
    const BLOCK: usize = 16 << 10;
    let mut pool = serving_pool();
    let mut peer = Peer::go(&pool, "tank/vol", false);
    let fill = |cookie: u64| (cookie as u8).wrapping_mul(37) | 1;
    let write = |cookie: u64, length: usize| {
        let mut bytes = REQUEST_MAGIC.to_be_bytes().to_vec();
        bytes.extend_from_slice(&0u16.to_be_bytes());
        bytes.extend_from_slice(&1u16.to_be_bytes());
        bytes.extend_from_slice(&cookie.to_be_bytes());
        bytes.extend_from_slice(&((8 << 20) + cookie * BLOCK as u64).to_be_bytes());
        bytes.extend_from_slice(&(length as u32).to_be_bytes());
        bytes.extend(std::iter::repeat_n(fill(cookie), length));
        bytes
    };
    let replies = |peer: &mut Peer, count: usize| {
        for _ in 0..count {
            let (error, cookie) = peer.simple_reply();
            assert_eq!(error, 0, "request {cookie}");
        }
    };
    // A run long enough to be received apart.
    let mut stream = Vec::new();
    for cookie in 0..12 {
        stream.extend(write(cookie, BLOCK));
    }
    peer.send(&stream);
    replies(&mut peer, 12);
    // The run goes on: these are received apart, and the next receive
    // lays out as many payloads again.
    let mut stream = Vec::new();
    for cookie in 12..16 {
        stream.extend(write(cookie, BLOCK));
    }
    peer.send(&stream);
    replies(&mut peer, 4);
    // More of the run, broken by a read, a write of 4K and a flush, sent
    // as one piece so they arrive in one receive: the read's header lands
    // where a payload was laid out.
    let mut stream = Vec::new();
    for cookie in 16..30 {
        stream.extend(write(cookie, BLOCK));
    }
    let mut read = REQUEST_MAGIC.to_be_bytes().to_vec();
    read.extend_from_slice(&[0, 0, 0, 0]);
    read.extend_from_slice(&1000u64.to_be_bytes());
    read.extend_from_slice(&(1u64 << 20).to_be_bytes());
    read.extend_from_slice(&(BLOCK as u32).to_be_bytes());
    stream.extend(&read);
    stream.extend(write(30, 4096));
    stream.extend(write(31, BLOCK));
    let mut flush = REQUEST_MAGIC.to_be_bytes().to_vec();
    flush.extend_from_slice(&[0, 0, 0, 3]);
    flush.extend_from_slice(&1001u64.to_be_bytes());
    flush.extend_from_slice(&[0; 12]);
    stream.extend(&flush);
    peer.send(&stream);
    // The read's reply carries its data after its header.
    let mut seen = 0;
    while seen < 18 {
        let (error, cookie) = peer.simple_reply();
        assert_eq!(error, 0, "request {cookie}");
        if cookie == 1000 {
            let mut data = vec![0u8; BLOCK];
            peer.stream.read_exact(&mut data).unwrap();
            assert!(
                data.iter().all(|byte| *byte == 0x99),
                "the good client's data"
            );
        }
        seen += 1;
    }
    // A run again (the read ended the last one), then a payload that
    // arrives in pieces, and a client that leaves in the middle of one.
    let mut stream = Vec::new();
    for cookie in 32..44 {
        stream.extend(write(cookie, BLOCK));
    }
    peer.send(&stream);
    replies(&mut peer, 12);
    let piece = write(44, BLOCK);
    peer.send(&piece[..28 + 5000]);
    std::thread::sleep(Duration::from_millis(100));
    peer.send(&piece[28 + 5000..]);
    replies(&mut peer, 1);
    let mut leaving = Peer::go(&pool, "tank/vol", false);
    let mut stream = Vec::new();
    for cookie in 100..112 {
        stream.extend(write(cookie, BLOCK));
    }
    leaving.send(&stream);
    replies(&mut leaving, 12);
    leaving.send(&write(112, BLOCK)[..28 + 100]);
    drop(leaving);
    // Every write landed whole, where it said.
    let reads: Vec<String> = (0..45u64)
        .map(|cookie| {
            let length = if cookie == 30 { 4096 } else { BLOCK };
            let offset = (8 << 20) + cookie * BLOCK as u64;
            format!("read -P {} {offset} {length}", fill(cookie))
        })
        .collect();
    qemu_io(&pool, &reads.iter().map(String::as_str).collect::<Vec<_>>());
    good_data_intact(&pool);
    // Payloads of the runs went straight into buffers of their own; the
    // first of a run (and the 4K write) were copied out of the receive
    // buffer.
    let iostat: serde_json::Value =
        serde_json::from_str(&pool.admin(&["--json", "iostat", &pool.name])).unwrap();
    let server = &iostat["server"];
    let apart = server["payloads_apart"].as_u64().unwrap();
    let copied = server["payloads_copied"].as_u64().unwrap();
    assert!(apart >= 1, "payloads received apart: {server}");
    assert!(copied >= 1, "payloads copied: {server}");
    pool.stop();
}
