//! The Prometheus endpoint of a running server (`serve --metrics
//! tcp:HOST:PORT`): `GET /metrics` answers the text exposition format
//! (version 0.0.4) with the pool's figures as they are at that moment, from
//! the same counters `status` and `iostat --json` show.
//!
//! It runs on the engine's loop like the control socket, so a scrape reads
//! the pool's state without locks; rendering walks the devices and volumes
//! once (microseconds for a pool of tens of devices). The HTTP side is the
//! least a scraper needs: one request per connection, answered and closed.
//! No HTTP crate fits a single-threaded io_uring loop without bringing a
//! second runtime, and this endpoint reads one line and writes one body.

use std::fmt::Write as _;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use crate::nbd::engine::SharedStats;
use crate::nbd::server::{BoundListener, Listen, ServerStats};
use crate::pool::Pool;
use crate::queue::stats::Histogram;
use crate::queue::IoClass;
use crate::rt::sync::Semaphore;
use crate::rt::{self, uring};

/// Largest request head read: a scraper's GET with its headers is a few
/// hundred bytes; anything longer is not a scrape.
pub const METRICS_REQUEST_BYTES_MAX: usize = 8 * 1024;
/// Time a client has to send its request head (Prometheus's own scrape
/// timeout defaults to 10 s).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Scrapes answered at once; more wait in the listen backlog. Each holds a
/// rendered body (tens of KiB), so this bounds the endpoint's memory.
const CONNECTIONS_MAX: u64 = 8;
/// Smallest latency bucket exported (2^10 ns, about 1 us): faster device
/// I/Os are not told apart.
const LATENCY_BUCKET_FIRST: usize = 9;
/// Largest latency bucket exported with a bound (up to 2^35 ns, 34 s); the
/// rest count in +Inf.
const LATENCY_BUCKET_LAST: usize = 34;

/// A listening metrics endpoint.
pub struct MetricsServer {
    listener: BoundListener,
}

impl MetricsServer {
    /// Binds `listen` and answers scrapes of `pool` (and of the NBD
    /// server's counters when there is one).
    pub fn start(
        listen: &Listen,
        pool: Rc<Pool>,
        nbd: Option<Arc<SharedStats>>,
    ) -> std::io::Result<Rc<MetricsServer>> {
        let listener = BoundListener::bind(listen)?;
        let raw = listener.raw_fd();
        let slots = Semaphore::new(CONNECTIONS_MAX);
        rt::spawn(async move {
            loop {
                let slot = slots.acquire(1).await;
                let Ok(socket) = uring::accept(raw).await else {
                    return;
                };
                let pool = pool.clone();
                let nbd = nbd.clone();
                rt::spawn(async move {
                    answer(socket, &pool, nbd.as_deref()).await;
                    drop(slot);
                });
            }
        });
        Ok(Rc::new(MetricsServer { listener }))
    }

    /// Stops accepting scrapes.
    pub fn stop(&self) {
        // SAFETY: shutting down our own listening socket ends the accept loop.
        unsafe { libc::shutdown(self.listener.raw_fd(), libc::SHUT_RDWR) };
    }
}

/// Reads the request head (up to the blank line), bounded in size.
async fn read_head(fd: RawFd) -> Result<Vec<u8>, &'static str> {
    let mut buffer = vec![0u8; METRICS_REQUEST_BYTES_MAX];
    let mut length = 0;
    loop {
        if buffer[..length]
            .windows(4)
            .any(|window| window == b"\r\n\r\n")
            || buffer[..length].windows(2).any(|window| window == b"\n\n")
        {
            buffer.truncate(length);
            return Ok(buffer);
        }
        if length == buffer.len() {
            return Err("request head too large");
        }
        let (result, returned) = uring::recv_into(fd, buffer, length).await;
        buffer = returned;
        match result {
            Ok(0) | Err(_) => return Err("connection closed before the request head ended"),
            Ok(count) => length += count,
        }
    }
}

/// What a request head asks for.
#[derive(Debug, PartialEq, Eq)]
enum Route {
    Metrics { head_only: bool },
    NotFound,
    MethodNotAllowed,
    BadRequest,
}

fn route(head: &[u8]) -> Route {
    let line = head.split(|byte| *byte == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.trim_end().split(' ');
    let (Some(method), Some(target), Some(version)) = (parts.next(), parts.next(), parts.next())
    else {
        return Route::BadRequest;
    };
    if !version.starts_with("HTTP/1.") || parts.next().is_some() {
        return Route::BadRequest;
    }
    let head_only = match method {
        "GET" => false,
        "HEAD" => true,
        _ => return Route::MethodNotAllowed,
    };
    let path = target.split('?').next().unwrap_or_default();
    match path {
        "/metrics" | "/" => Route::Metrics { head_only },
        _ => Route::NotFound,
    }
}

async fn answer(socket: OwnedFd, pool: &Pool, nbd: Option<&SharedStats>) {
    let fd = socket.as_raw_fd();
    let route = match rt::timeout(REQUEST_TIMEOUT, read_head(fd)).await {
        Some(Ok(head)) => route(&head),
        // Nobody to answer, or nobody who sent a request.
        _ => return,
    };
    let (status, content_type, body, head_only) = match route {
        Route::Metrics { head_only } => (
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            render(pool, nbd.map(SharedStats::snapshot).as_ref()),
            head_only,
        ),
        Route::NotFound => (
            "404 Not Found",
            "text/plain",
            "metrics are at /metrics\n".into(),
            false,
        ),
        Route::MethodNotAllowed => (
            "405 Method Not Allowed",
            "text/plain",
            "GET or HEAD\n".into(),
            false,
        ),
        Route::BadRequest => (
            "400 Bad Request",
            "text/plain",
            "bad request\n".into(),
            false,
        ),
    };
    let mut response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if !head_only {
        response.extend_from_slice(body.as_bytes());
    }
    // A scraper gone before its answer has nothing left to be told.
    let _ = uring::send_all(fd, response).await;
}

/// Escapes a label value: backslash, double quote and newline.
fn escape(value: &str) -> String {
    let mut escaped = String::with_capacity(value.len());
    for character in value.chars() {
        match character {
            '\\' => escaped.push_str("\\\\"),
            '"' => escaped.push_str("\\\""),
            '\n' => escaped.push_str("\\n"),
            other => escaped.push(other),
        }
    }
    escaped
}

/// A sample's labels, built per row.
type Labels = Vec<(&'static str, String)>;

/// A volume's name and figures.
type VolumeRow = (
    String,
    crate::pool::volume::VolumeStats,
    crate::pool::dataset::intent_log::LogStats,
);

/// The exposition text being written: families in order, each with its
/// HELP and TYPE lines before its samples.
struct Exposition {
    text: String,
}

impl Exposition {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.text, "# HELP {name} {help}");
        let _ = writeln!(self.text, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.text.push_str(name);
        if !labels.is_empty() {
            self.text.push('{');
            for (index, (key, label)) in labels.iter().enumerate() {
                if index > 0 {
                    self.text.push(',');
                }
                let _ = write!(self.text, "{key}=\"{}\"", escape(label));
            }
            self.text.push('}');
        }
        let _ = writeln!(self.text, " {value}");
    }

    /// One family with one sample per row.
    fn each<T>(
        &mut self,
        name: &str,
        kind: &str,
        help: &str,
        rows: &[T],
        labels: impl Fn(&T) -> Labels,
        value: impl Fn(&T) -> f64,
    ) {
        self.family(name, kind, help);
        for row in rows {
            let owned = labels(row);
            let borrowed: Vec<(&str, &str)> = owned
                .iter()
                .map(|(key, label)| (*key, label.as_str()))
                .collect();
            self.sample(name, &borrowed, value(row));
        }
    }

    /// The samples of one histogram from a log2 histogram: bucket i holds
    /// values in [2^i, 2^(i+1)) of the unit, `scale` converts a unit to the
    /// exported one (ns or us to seconds); buckets `first..=last` get a
    /// bound, the rest count in +Inf.
    #[allow(clippy::too_many_arguments)]
    fn histogram(
        &mut self,
        name: &str,
        labels: &[(&str, &str)],
        buckets: &[u64],
        sum: u64,
        scale: f64,
        first: usize,
        last: usize,
    ) {
        let bucket_name = format!("{name}_bucket");
        let mut cumulative = 0u64;
        for (index, count) in buckets.iter().enumerate() {
            cumulative += count;
            if index < first || index > last || index + 1 >= buckets.len() {
                continue;
            }
            let bound = format!("{}", (1u64 << (index + 1)) as f64 * scale);
            let mut with_bound = labels.to_vec();
            with_bound.push(("le", &bound));
            self.sample(&bucket_name, &with_bound, cumulative as f64);
        }
        let mut with_bound = labels.to_vec();
        with_bound.push(("le", "+Inf"));
        self.sample(&bucket_name, &with_bound, cumulative as f64);
        self.sample(&format!("{name}_sum"), labels, sum as f64 * scale);
        self.sample(&format!("{name}_count"), labels, cumulative as f64);
    }
}

/// The pool's metrics in the Prometheus text format.
pub fn render(pool: &Pool, nbd: Option<&ServerStats>) -> String {
    let mut out = Exposition {
        text: String::with_capacity(64 * 1024),
    };
    let name = pool.name().to_string();
    let pool_label = [("pool", name.as_str())];
    let gauge = |out: &mut Exposition, metric: &str, help: &str, value: f64| {
        out.family(metric, "gauge", help);
        out.sample(metric, &pool_label, value);
    };
    let counter = |out: &mut Exposition, metric: &str, help: &str, value: f64| {
        out.family(metric, "counter", help);
        out.sample(metric, &pool_label, value);
    };

    // The pool.
    let (size, free) = pool.space();
    let health = pool.health();
    out.family(
        "ironpool_pool_health",
        "gauge",
        "1 for the pool's health state, 0 for the others.",
    );
    for state in ["ONLINE", "DEGRADED", "UNAVAIL", "SUSPENDED"] {
        let value = if state == health { 1.0 } else { 0.0 };
        out.sample(
            "ironpool_pool_health",
            &[("pool", &name), ("state", state)],
            value,
        );
    }
    gauge(
        &mut out,
        "ironpool_pool_size_bytes",
        "Usable space of the pool.",
        size as f64,
    );
    gauge(
        &mut out,
        "ironpool_pool_allocated_bytes",
        "Space allocated to blocks.",
        (size - free) as f64,
    );
    gauge(
        &mut out,
        "ironpool_pool_free_bytes",
        "Space not allocated.",
        free as f64,
    );
    let (cloned_blocks, clone_saved) = pool.clone_figures();
    gauge(
        &mut out,
        "ironpool_pool_cloned_blocks",
        "Blocks linked more than once by block cloning (copy_file_range).",
        cloned_blocks as f64,
    );
    gauge(
        &mut out,
        "ironpool_pool_clone_saved_bytes",
        "Space the clones of cloned blocks would have taken as copies.",
        clone_saved as f64,
    );
    let txg = pool.txg().stats();
    gauge(
        &mut out,
        "ironpool_txg_open",
        "The txg taking changes.",
        pool.txg().open() as f64,
    );
    gauge(
        &mut out,
        "ironpool_txg_durable",
        "The newest txg on disk.",
        pool.txg().durable() as f64,
    );
    counter(
        &mut out,
        "ironpool_txg_commits_total",
        "Txgs committed.",
        txg.commits as f64,
    );
    counter(
        &mut out,
        "ironpool_txg_failed_commits_total",
        "Txg writes that failed (the pool suspends and retries).",
        txg.failed_commits as f64,
    );
    counter(
        &mut out,
        "ironpool_txg_commit_seconds_total",
        "Time spent committing txgs (with the commits, the mean commit time).",
        txg.commit_time_us as f64 / 1e6,
    );
    gauge(
        &mut out,
        "ironpool_txg_last_commit_seconds",
        "How long the last txg commit took.",
        txg.last_commit_us as f64 / 1e6,
    );
    gauge(
        &mut out,
        "ironpool_txg_last_commit_metadata_bytes",
        "Metadata the last txg wrote.",
        txg.last_commit_metadata_bytes as f64,
    );
    let blocks = pool.store().stats();
    counter(
        &mut out,
        "ironpool_healed_reads_total",
        "Blocks read whose first copy was bad and another good (self-heal).",
        blocks.healed_reads as f64,
    );
    counter(
        &mut out,
        "ironpool_repair_writes_total",
        "Repair writes issued (self-heal and scrub).",
        blocks.repair_writes as f64,
    );
    counter(
        &mut out,
        "ironpool_unrecoverable_reads_total",
        "Blocks for which no copy verified.",
        blocks.unrecoverable_reads as f64,
    );
    gauge(
        &mut out,
        "ironpool_metadata_cache_bytes",
        "Metadata cached in memory.",
        pool.objects().cached_bytes() as f64,
    );
    let cache = pool.store().cache.stats();
    gauge(
        &mut out,
        "ironpool_arc_size_bytes",
        "Bytes the read cache holds.",
        cache.size_bytes as f64,
    );
    gauge(
        &mut out,
        "ironpool_arc_target_bytes",
        "Bytes the read cache may hold now (arc_max_bytes, lowered while memory is short).",
        cache.target_bytes as f64,
    );
    out.each(
        "ironpool_arc_reads_total",
        "counter",
        "Reads the read cache was asked for, by kind and result.",
        &[
            ("demand_data", "hit", cache.demand_data.hits),
            ("demand_data", "miss", cache.demand_data.misses),
            ("demand_metadata", "hit", cache.demand_metadata.hits),
            ("demand_metadata", "miss", cache.demand_metadata.misses),
            ("prefetch_data", "hit", cache.prefetch_data.hits),
            ("prefetch_data", "miss", cache.prefetch_data.misses),
        ],
        |(kind, result, _)| vec![("kind", kind.to_string()), ("result", result.to_string())],
        |(_, _, value)| *value as f64,
    );
    counter(
        &mut out,
        "ironpool_arc_evictions_total",
        "Blocks evicted from the read cache.",
        cache.policy.evictions as f64,
    );
    counter(
        &mut out,
        "ironpool_arc_prefetch_unused_bytes_total",
        "Bytes read ahead and evicted before any reader used them.",
        cache.policy.prefetch_unused_bytes as f64,
    );
    let (waiting, waits) = pool.writeback_waits();
    gauge(
        &mut out,
        "ironpool_writeback_dirty_bytes",
        "Volume data held in memory, acknowledged and not yet written out.",
        pool.dirty_data_bytes() as f64,
    );
    gauge(
        &mut out,
        "ironpool_writeback_dirty_max_bytes",
        "Dirty data held before writers wait (the dirty_data_max_bytes tunable).",
        pool.tunables().dirty_data_max_bytes as f64,
    );
    gauge(
        &mut out,
        "ironpool_writeback_waiting_writers",
        "Writes waiting for room under the dirty data limit.",
        waiting as f64,
    );
    counter(
        &mut out,
        "ironpool_writeback_waits_total",
        "Times a write waited for room under the dirty data limit.",
        waits as f64,
    );

    // Events (`ironpool events`), counted whether or not the ring still
    // holds them.
    out.family(
        "ironpool_events_total",
        "counter",
        "Events posted since the pool was opened, by class (see `ironpool events`).",
    );
    for (class, count) in pool.events().counts() {
        out.sample(
            "ironpool_events_total",
            &[("pool", &name), ("class", class.name())],
            count as f64,
        );
    }
    counter(
        &mut out,
        "ironpool_events_suppressed_total",
        "Device error events over the per-device rate limit, not kept.",
        pool.events().suppressed() as f64,
    );

    // Scans.
    let scrub = pool.scrub_status();
    let resilver = pool.resilver_status();
    gauge(
        &mut out,
        "ironpool_scrub_running",
        "1 while a scrub runs.",
        f64::from(u8::from(scrub.state == "scanning")),
    );
    gauge(
        &mut out,
        "ironpool_scrub_examined_bytes",
        "Bytes the running or last scrub examined.",
        scrub.examined_bytes as f64,
    );
    gauge(
        &mut out,
        "ironpool_scrub_to_examine_bytes",
        "Bytes allocated when the running or last scrub started.",
        scrub.total_bytes as f64,
    );
    gauge(
        &mut out,
        "ironpool_scrub_errors",
        "Unrecoverable errors the running or last scrub found.",
        scrub.errors as f64,
    );
    gauge(
        &mut out,
        "ironpool_resilver_running",
        "1 while a resilver runs.",
        f64::from(u8::from(resilver.state == "resilvering")),
    );
    gauge(
        &mut out,
        "ironpool_resilver_examined_bytes",
        "Bytes the running or last resilver pass examined.",
        resilver.examined_bytes as f64,
    );
    gauge(
        &mut out,
        "ironpool_resilver_to_examine_bytes",
        "Bytes allocated when the running or last resilver pass began.",
        resilver.total_bytes as f64,
    );
    gauge(
        &mut out,
        "ironpool_resilver_errors",
        "Blocks the running or last resilver could not rebuild.",
        resilver.errors as f64,
    );

    let trim = pool.trim_status();
    gauge(
        &mut out,
        "ironpool_trim_running",
        "1 while a trim of all free space runs.",
        f64::from(u8::from(trim.state == "trimming")),
    );
    gauge(
        &mut out,
        "ironpool_trim_examined_bytes",
        "Free bytes the running or last trim of all free space went through.",
        trim.examined_bytes as f64,
    );
    gauge(
        &mut out,
        "ironpool_trim_to_examine_bytes",
        "Free bytes when the running or last trim of all free space started.",
        trim.total_bytes as f64,
    );
    counter(
        &mut out,
        "ironpool_autotrim_discarded_bytes_total",
        "Device bytes autotrim discarded since import.",
        trim.autotrim_trimmed_bytes as f64,
    );

    // Devices.
    struct Device {
        vdev: String,
        path: String,
        state: String,
        stats: crate::queue::stats::LeafStats,
    }
    let devices: Vec<Device> = pool
        .store()
        .vdevs()
        .iter()
        .flat_map(|top| {
            let vdev = top.kind.vdev_name(top.id);
            top.children.iter().map(move |leaf| Device {
                vdev: vdev.clone(),
                path: leaf.path.borrow().clone(),
                state: serde_json::to_value(leaf.state())
                    .ok()
                    .and_then(|value| value.as_str().map(str::to_string))
                    .unwrap_or_default(),
                stats: leaf.queue.stats(),
            })
        })
        .collect();
    let device_labels = |device: &Device| -> Labels {
        vec![
            ("pool", name.clone()),
            ("vdev", device.vdev.clone()),
            ("device", device.path.clone()),
        ]
    };
    out.each(
        "ironpool_device_state",
        "gauge",
        "1, labelled with the device's state (ONLINE, MISSING, OFFLINE, FAULTED).",
        &devices,
        |device| {
            let mut labels = device_labels(device);
            labels.push(("state", device.state.clone()));
            labels
        },
        |_| 1.0,
    );
    type Figure = (
        &'static str,
        &'static str,
        fn(&crate::queue::stats::LeafStats) -> u64,
    );
    let device_counters: [Figure; 11] = [
        (
            "ironpool_device_read_ops_total",
            "Reads issued to the device (after aggregation).",
            |stats| stats.read_ops,
        ),
        (
            "ironpool_device_write_ops_total",
            "Writes issued to the device (after aggregation).",
            |stats| stats.write_ops,
        ),
        (
            "ironpool_device_read_bytes_total",
            "Bytes read from the device.",
            |stats| stats.read_bytes,
        ),
        (
            "ironpool_device_write_bytes_total",
            "Bytes written to the device.",
            |stats| stats.write_bytes,
        ),
        (
            "ironpool_device_flush_ops_total",
            "Cache flushes issued to the device.",
            |stats| stats.flush_ops,
        ),
        (
            "ironpool_device_durable_write_ops_total",
            "Writes durable on completion (FUA: intent-log blocks), which need no flush.",
            |stats| stats.durable_write_ops,
        ),
        (
            "ironpool_device_flushes_skipped_total",
            "Flushes not sent: no write had completed on the device since the last.",
            |stats| stats.flushes_skipped,
        ),
        (
            "ironpool_device_trim_ops_total",
            "Discards issued to the device.",
            |stats| stats.trim_ops,
        ),
        (
            "ironpool_device_trim_bytes_total",
            "Bytes the device was told to discard.",
            |stats| stats.trim_bytes,
        ),
        (
            "ironpool_device_repaired_bytes_total",
            "Bytes rewritten to repair bad copies.",
            |stats| stats.repaired_bytes,
        ),
        (
            "ironpool_device_busy_seconds_total",
            "Time with at least one I/O active (ns, exported in seconds).",
            |stats| stats.busy_ns,
        ),
    ];
    for (metric, help, figure) in device_counters {
        let scale = if metric.ends_with("_seconds_total") {
            1e-9
        } else {
            1.0
        };
        out.each(metric, "counter", help, &devices, device_labels, |device| {
            figure(&device.stats) as f64 * scale
        });
    }
    out.family(
        "ironpool_device_errors_total",
        "counter",
        "I/O errors by kind: read, write, checksum (a copy that did not verify), no_space (the host filesystem was full).",
    );
    for device in &devices {
        let labels = device_labels(device);
        for (kind, value) in [
            ("read", device.stats.read_errors),
            ("write", device.stats.write_errors),
            ("checksum", device.stats.checksum_errors),
            ("no_space", device.stats.no_space_errors),
        ] {
            let mut borrowed: Vec<(&str, &str)> = labels
                .iter()
                .map(|(key, label)| (*key, label.as_str()))
                .collect();
            borrowed.push(("kind", kind));
            out.sample("ironpool_device_errors_total", &borrowed, value as f64);
        }
    }
    out.each(
        "ironpool_device_active_requests",
        "gauge",
        "Client requests inside the device I/Os active now (the queue depth reaching the device).",
        &devices,
        device_labels,
        |device| device.stats.active_requests as f64,
    );
    let class_rows: Vec<(&Device, IoClass)> = devices
        .iter()
        .flat_map(|device| IoClass::ALL.iter().map(move |class| (device, *class)))
        .collect();
    let class_labels = |(device, class): &(&Device, IoClass)| -> Labels {
        let mut labels = device_labels(device);
        labels.push(("class", class.name().to_string()));
        labels
    };
    type ClassFigure = (
        &'static str,
        &'static str,
        &'static str,
        fn(&crate::queue::stats::ClassStats) -> u64,
    );
    let class_figures: [ClassFigure; 4] = [
        (
            "ironpool_device_class_requests_total",
            "counter",
            "Requests of the class completed.",
            |stats| stats.completed_requests,
        ),
        (
            "ironpool_device_class_bytes_total",
            "counter",
            "Bytes of the class's completed requests.",
            |stats| stats.completed_bytes,
        ),
        (
            "ironpool_device_class_queued",
            "gauge",
            "Requests of the class waiting in the queue.",
            |stats| stats.queued,
        ),
        (
            "ironpool_device_class_active",
            "gauge",
            "Requests of the class issued to the device.",
            |stats| stats.active,
        ),
    ];
    for (metric, kind, help, figure) in class_figures {
        out.each(
            metric,
            kind,
            help,
            &class_rows,
            class_labels,
            |(device, class)| figure(&device.stats.classes[*class as usize]) as f64,
        );
    }
    out.family(
        "ironpool_device_class_latency_seconds",
        "histogram",
        "Time from a request's queueing to its completion, by class.",
    );
    for row in &class_rows {
        let labels = class_labels(row);
        let borrowed: Vec<(&str, &str)> = labels
            .iter()
            .map(|(key, label)| (*key, label.as_str()))
            .collect();
        let histogram: &Histogram = &row.0.stats.classes[row.1 as usize].total_latency_ns;
        out.histogram(
            "ironpool_device_class_latency_seconds",
            &borrowed,
            &histogram.buckets,
            histogram.sum,
            1e-9,
            LATENCY_BUCKET_FIRST,
            LATENCY_BUCKET_LAST,
        );
    }

    // Volumes.
    let volumes: Vec<VolumeRow> = pool
        .open_volumes()
        .iter()
        .map(|(_, volume)| (volume.name(), volume.stats(), volume.log_stats()))
        .collect();
    let volume_labels =
        |row: &VolumeRow| -> Labels { vec![("pool", name.clone()), ("volume", row.0.clone())] };
    type VolumeFigure = (
        &'static str,
        &'static str,
        fn(&crate::pool::volume::VolumeStats) -> u64,
    );
    let volume_figures: [VolumeFigure; 7] = [
        ("ironpool_volume_read_ops_total", "Client reads.", |stats| {
            stats.read_ops
        }),
        (
            "ironpool_volume_write_ops_total",
            "Client writes.",
            |stats| stats.write_ops,
        ),
        (
            "ironpool_volume_read_bytes_total",
            "Bytes clients read.",
            |stats| stats.read_bytes,
        ),
        (
            "ironpool_volume_write_bytes_total",
            "Bytes clients wrote.",
            |stats| stats.write_bytes,
        ),
        (
            "ironpool_volume_flush_ops_total",
            "Client FLUSHes.",
            |stats| stats.flush_ops,
        ),
        ("ironpool_volume_trim_ops_total", "Client TRIMs.", |stats| {
            stats.trim_ops
        }),
        (
            "ironpool_volume_zero_ops_total",
            "Client WRITE_ZEROES.",
            |stats| stats.zero_ops,
        ),
    ];
    for (metric, help, figure) in volume_figures {
        out.each(metric, "counter", help, &volumes, volume_labels, |row| {
            figure(&row.1) as f64
        });
    }
    type LogFigure = (
        &'static str,
        &'static str,
        fn(&crate::pool::dataset::intent_log::LogStats) -> u64,
    );
    let log_figures: [LogFigure; 6] = [
        (
            "ironpool_volume_log_commits_total",
            "Intent log commits that wrote log blocks (each one device flush).",
            |stats| stats.commits,
        ),
        (
            "ironpool_volume_log_shared_commits_total",
            "FLUSHes whose writes an earlier log commit had logged (group commit).",
            |stats| stats.shared_commits,
        ),
        (
            "ironpool_volume_log_ahead_commits_total",
            "Log commits started as a WRITE was answered, ahead of the FLUSH its client sends after each write.",
            |stats| stats.ahead_commits,
        ),
        (
            "ironpool_volume_log_group_commit_waits_total",
            "Log commits that first waited for more FLUSHes to share them.",
            |stats| stats.group_commit_waits,
        ),
        (
            "ironpool_volume_log_txg_fallbacks_total",
            "FLUSHes that committed a txg instead of writing the log.",
            |stats| stats.txg_fallbacks,
        ),
        (
            "ironpool_volume_log_written_bytes_total",
            "Intent log bytes written.",
            |stats| stats.bytes_written,
        ),
    ];
    for (metric, help, figure) in log_figures {
        out.each(metric, "counter", help, &volumes, volume_labels, |row| {
            figure(&row.2) as f64
        });
    }
    out.family(
        "ironpool_volume_log_commit_seconds",
        "histogram",
        "Time an intent log commit took to write its blocks and flush the devices.",
    );
    for row in &volumes {
        let labels = [("pool", name.as_str()), ("volume", row.0.as_str())];
        let buckets = &row.2.commit_latency_us_log2;
        out.histogram(
            "ironpool_volume_log_commit_seconds",
            &labels,
            buckets,
            row.2.commit_time_us,
            1e-6,
            0,
            buckets.len(),
        );
    }

    // The NBD server.
    if let Some(nbd) = nbd {
        gauge(
            &mut out,
            "ironpool_nbd_connections_open",
            "NBD connections open.",
            nbd.connections_open as f64,
        );
        gauge(
            &mut out,
            "ironpool_nbd_requests_in_flight",
            "NBD requests read and not yet answered.",
            nbd.requests_in_flight as f64,
        );
        counter(
            &mut out,
            "ironpool_nbd_connections_accepted_total",
            "NBD connections accepted.",
            nbd.connections_accepted as f64,
        );
        counter(
            &mut out,
            "ironpool_nbd_connections_refused_total",
            "NBD connections refused (too many, or a bad handshake).",
            nbd.connections_refused as f64,
        );
        counter(
            &mut out,
            "ironpool_nbd_requests_total",
            "NBD requests read.",
            nbd.requests as f64,
        );
        counter(
            &mut out,
            "ironpool_nbd_request_errors_total",
            "NBD requests answered with an error.",
            nbd.request_errors as f64,
        );
        counter(
            &mut out,
            "ironpool_nbd_protocol_errors_total",
            "NBD connections ended by a protocol violation.",
            nbd.protocol_errors as f64,
        );
        counter(
            &mut out,
            "ironpool_nbd_write_payloads_apart_total",
            "NBD WRITE payloads received straight into a buffer of their own.",
            nbd.payloads_apart as f64,
        );
        counter(
            &mut out,
            "ironpool_nbd_write_payloads_copied_total",
            "NBD WRITE payloads copied out of a connection's receive buffer.",
            nbd.payloads_copied as f64,
        );
    }
    out.text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_take_get_and_head_of_metrics_only() {
        assert_eq!(
            route(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            Route::Metrics { head_only: false }
        );
        assert_eq!(
            route(b"HEAD /metrics?x=1 HTTP/1.0\r\n\r\n"),
            Route::Metrics { head_only: true }
        );
        assert_eq!(route(b"GET /other HTTP/1.1\r\n\r\n"), Route::NotFound);
        assert_eq!(
            route(b"POST /metrics HTTP/1.1\r\n\r\n"),
            Route::MethodNotAllowed
        );
        assert_eq!(route(b"GET /metrics\r\n\r\n"), Route::BadRequest);
        assert_eq!(route(b"\x00\xff garbage\r\n\r\n"), Route::BadRequest);
        assert_eq!(route(b""), Route::BadRequest);
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }

    #[test]
    fn a_log2_histogram_becomes_cumulative_buckets_with_inf_sum_and_count() {
        let mut out = Exposition {
            text: String::new(),
        };
        // Values 1 (bucket 0), 3 (bucket 1) and 2^40 (the last, unbounded).
        let mut buckets = vec![0u64; 4];
        buckets[0] = 1;
        buckets[1] = 1;
        buckets[3] = 1;
        out.histogram("h", &[("a", "b")], &buckets, 4 + (1 << 40), 1.0, 0, 10);
        let expected = "h_bucket{a=\"b\",le=\"2\"} 1\n\
                        h_bucket{a=\"b\",le=\"4\"} 2\n\
                        h_bucket{a=\"b\",le=\"8\"} 2\n\
                        h_bucket{a=\"b\",le=\"+Inf\"} 3\n\
                        h_sum{a=\"b\"} 1099511627780\n\
                        h_count{a=\"b\"} 3\n";
        assert_eq!(out.text, expected);
    }
}
