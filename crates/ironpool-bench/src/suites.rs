//! The suites of BENCHMARKS.md ("The suites") as lists of fio workloads.
//!
//! A suite is data: a list of [`TestSpec`]s. How a test reaches a target
//! (ioengine, file or URI) is the fio runner's business.

use serde::{Deserialize, Serialize};

use crate::units::{size_short, KIB, MIB};

/// Queue depths of the qd-scaling suite: the OpenZFS async complaint is that
/// IOPS stay flat from QD1 to QD64.
pub const QD_SCALING_DEPTHS: [u32; 4] = [1, 4, 16, 64];
/// Job counts of the qd-scaling suite: one submitter, and four (more
/// submitters than this machine's 2 cores, to show contention).
pub const QD_SCALING_JOBS: [u32; 2] = [1, 4];
/// Writes per flush of the durable suite's batched row: a database's group
/// commit keeps many writes in flight per flush, and 32 at QD64 is the row
/// the issues and `scripts/bench-durable.sh` have quoted since issue 17.
pub const DURABLE_WRITES_PER_FLUSH: u32 = 32;
/// Queue depth of the durable suite's deep rows: the seeds' QD64.
pub const DURABLE_DEEP_IODEPTH: u32 = 64;
/// Fill levels of the fill suite, percent of the pool or filesystem.
pub const FILL_LEVELS_PERCENT: [u32; 4] = [10, 50, 80, 90];

/// A named suite. The order of the variants is the order suites run in.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum Suite {
    /// 16K random writes and 4K random reads at QD 1..64, 1 and 4 jobs.
    QdScaling,
    /// The five-test pool report.
    PoolReport,
    /// Random writes with a flush or FUA after each write.
    Durable,
    /// The pool report repeated at rising fill levels.
    Fill,
    /// A filesystem as programs use it (the table of
    /// `scripts/bench-fs.sh`): direct data at QD1 and QD64 through io_uring
    /// and libaio, durable writes, buffered writes, metadata (create, stat,
    /// absent names, delete) and durable changes of names (sqlite commits,
    /// new files, atomic replaces). Its limit for the data rows is the raw
    /// file (or pair), for the others ext4 on a loop device (`ext4`).
    Fs,
    /// A filesystem's snapshot (the table of `scripts/bench-snapshot.sh`):
    /// 4K random reads at QD64 and 1 MiB sequential reads at QD16 of the
    /// working set through `MOUNTPOINT/.zfs/snapshot/NAME` beside the same
    /// reads of the head (the limit of the snapshot's rows), then the time
    /// `ironpool snapshot` takes once the filesystem holds `--files` more
    /// files, and a listing of them in that snapshot. Runs on
    /// `ironpool-fs` targets.
    Snapshot,
    /// Replication (the table of `scripts/bench-send.sh`): `send |
    /// receive` of the working set's dataset into a copy in the same pool,
    /// then of an incremental stream after 1% of its records changed, onto
    /// that copy. Runs on ironpool volumes and filesystems; its limit on
    /// the raw file is a copy of the working set into a second file.
    Send,
    /// The read cache (the table of `scripts/bench-cache.sh`): 4K random
    /// reads at QD64 and QD1 of what the cache holds (held to nbdkit's
    /// memory plugin, the same transport with its data in RAM), a 1 MiB
    /// sequential read at QD1 with the cache emptied first, and the same
    /// three with `primarycache=none` on an ironpool dataset (held to the
    /// raw file's reads).
    Cache,
    /// The engine's poll window (the table of `scripts/bench-poll.sh`), run
    /// on targets that differ in `poll_us`: creates, stats and deletes of
    /// `--files` files, 16K random writes at QD1 and QD64, 4K random reads
    /// at QD64 and QD1, 16K writes with a flush after each at QD1, and the
    /// server's CPU while no client asks (`idle`).
    Poll,
    /// Writes through a layout (the table of `bench/raidz.sh`): 16K random
    /// writes at QD64 over the prefilled working set (overwrites) and 1 MiB
    /// sequential writes at QD16, with the write amplification and device
    /// write size the target's counters give (data, parity, padding and
    /// metadata on the devices per byte written).
    Raidz,
    /// The I/O scheduler (the table of `bench/scheduler.sh`): 4K random
    /// reads at QD64 (the device queue depth they reach), 16K random
    /// writes at QD64 and 4K sequential reads at QD16 (what aggregation
    /// makes of them), and 4K random reads at QD1 beside a QD64 16K
    /// random-write load (fairness: their latency). Settings are targets
    /// (`tune.aggregation_limit_bytes=1`, `tune.classes=off`).
    Scheduler,
    /// Datasets under load (the tables of `bench/datasets.sh` beside the
    /// send suite's): 16K random writes at QD64 over a region of
    /// [`SNAPSHOT_LOAD_REGION_BYTES`] with a snapshot every
    /// [`SNAPSHOT_EVERY_SECONDS`], held to the same writes without, and 16K
    /// random writes at QD64 with `compression=lz4` held to
    /// `compression=off`, on random and on compressible data. On other
    /// targets the same writes (their property ignored) are the limit.
    Datasets,
    /// A stress run (the table of `bench/soak.sh`): [`SOAK_JOBS`] clients
    /// at QD64 doing 16K random reads and writes (70/30) with crc32c
    /// verification of what they read, each in a region of its own, for
    /// `--runtime`; the server's memory, CPU and the pool's free space are
    /// sampled through it, and memory still growing in the second half is
    /// a warning.
    Soak,
    /// A pool grown while in use (the table of `bench/grow.sh`): 16K random
    /// writes at QD64 on the prefilled working set, then `ironpool add` of
    /// a vdev like the pool's first (same layout, disk count and size),
    /// then the same writes again: the new vdev must take its share
    /// without taking every write. The per-vdev allocation before and
    /// after is in the notes. Other targets run the writes twice (the
    /// disk's drift). Runs after the other suites but the stall suite: the
    /// pool keeps its new shape.
    Grow,
    /// How long an administrative action holds the pool's other clients
    /// (the table of `scripts/bench-stall.sh`): a QD1 4K read probe of
    /// another dataset of the pool for `--runtime` (at least
    /// [`STALL_PROBE_MIN_SECONDS`]), the action started a quarter of the
    /// way into it: none, `list`, `scrub`, `send`, the destroy of a
    /// snapshot that holds the whole working set, a rollback, `rm -rf` of
    /// many files, a truncate and an `rm` of the working set's file, and
    /// last the `destroy -r` of its dataset. The read cache is emptied
    /// before each action (the probe read back in), so that the action
    /// meets its metadata on the devices as on a pool imported afresh.
    /// Each row is held to `stall-none`. Runs last of the suites: it takes
    /// the working set away.
    Stall,
}

impl Suite {
    /// The name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Suite::QdScaling => "qd-scaling",
            Suite::PoolReport => "pool-report",
            Suite::Durable => "durable",
            Suite::Fill => "fill",
            Suite::Fs => "fs",
            Suite::Snapshot => "snapshot",
            Suite::Send => "send",
            Suite::Cache => "cache",
            Suite::Poll => "poll",
            Suite::Raidz => "raidz",
            Suite::Scheduler => "scheduler",
            Suite::Datasets => "datasets",
            Suite::Soak => "soak",
            Suite::Grow => "grow",
            Suite::Stall => "stall",
        }
    }
}

/// The access pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Pattern {
    /// Sequential reads.
    SeqRead,
    /// Sequential writes.
    SeqWrite,
    /// Random reads.
    RandRead,
    /// Random writes.
    RandWrite,
    /// Random mixed reads and writes.
    RandRw,
}

impl Pattern {
    /// fio's `--rw` value.
    pub fn fio_rw(self) -> &'static str {
        match self {
            Pattern::SeqRead => "read",
            Pattern::SeqWrite => "write",
            Pattern::RandRead => "randread",
            Pattern::RandWrite => "randwrite",
            Pattern::RandRw => "randrw",
        }
    }

    /// Whether the workload reads anything (and so needs a prefilled target).
    pub fn reads(self) -> bool {
        matches!(self, Pattern::SeqRead | Pattern::RandRead | Pattern::RandRw)
    }

    /// Whether the workload writes anything.
    pub fn writes(self) -> bool {
        matches!(
            self,
            Pattern::SeqWrite | Pattern::RandWrite | Pattern::RandRw
        )
    }

    /// Sequential workloads are judged by bandwidth, random ones by IOPS.
    pub fn is_sequential(self) -> bool {
        matches!(self, Pattern::SeqRead | Pattern::SeqWrite)
    }
}

/// A setting of an ironpool dataset's `compression` property.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Compression {
    /// No compression: what `lz4` is held to.
    Off,
    /// LZ4, OpenZFS's `compression=on`: cheap, and it gives up early on
    /// data that does not compress.
    Lz4,
}

impl Compression {
    /// The property's value (and the test name's suffix).
    pub fn value(self) -> &'static str {
        match self {
            Compression::Off => "off",
            Compression::Lz4 => "lz4",
        }
    }
}

/// How a write is made durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Durability {
    /// No flushes: the device's write cache may hold the data.
    #[default]
    None,
    /// A flush after each write (`--fsync=1`; NBD_CMD_FLUSH over NBD).
    Fsync,
    /// A flush after every N writes (`--fsync=N`): a database's group
    /// commit, many writes in flight per flush.
    FsyncEvery(u32),
    /// Every write durable when it completes: files opened O_DSYNC
    /// (`--sync=dsync`, FUA writes on a block device); an ironpool volume
    /// with `sync=always` (fio's nbd engine sends no FUA).
    Dsync,
    /// The classic durable baseline: `psync` with `--fdatasync=1`.
    PsyncFdatasync,
}

impl Durability {
    /// The suffix of test names.
    fn suffix(self) -> String {
        match self {
            Durability::None => String::new(),
            Durability::Fsync => "-fsync".to_string(),
            Durability::FsyncEvery(writes) => format!("-fsync{writes}"),
            Durability::Dsync => "-dsync".to_string(),
            Durability::PsyncFdatasync => "-psync-fdatasync".to_string(),
        }
    }
}

/// The fio engine of a file target's test (a volume over NBD always uses
/// fio's nbd engine).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Engine {
    /// io_uring: the seeds' engine.
    #[default]
    IoUring,
    /// Linux AIO, which databases and qemu still use: its QD64 must scale
    /// as io_uring's does.
    Libaio,
    /// One synchronous `pwrite`/`pread` at a time.
    Psync,
}

impl Engine {
    /// fio's `--ioengine` value.
    pub fn fio_name(self) -> &'static str {
        match self {
            Engine::IoUring => "io_uring",
            Engine::Libaio => "libaio",
            Engine::Psync => "psync",
        }
    }

    fn is_default(&self) -> bool {
        *self == Engine::IoUring
    }
}

/// A test that is not fio's: a compiled loop of system calls on a
/// directory of the target's filesystem (see `ops`), measured in
/// operations per second.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OpsTest {
    /// Create empty files in one directory (`open(O_CREAT|O_EXCL)` and
    /// `close`).
    FilesCreate,
    /// `stat` each of them.
    FilesStat,
    /// `stat` names that do not exist: on FUSE one LOOKUP each, a round
    /// trip's cost.
    FilesAbsent,
    /// Unlink them all.
    FilesDelete,
    /// sqlite transactions with the default rollback journal and
    /// `synchronous=FULL`: the journal is created, fsynced and deleted per
    /// commit (python3's sqlite3).
    NamesSqlite,
    /// New files: create, write 4 KiB, fsync the file and the directory.
    NamesCreate,
    /// Atomic replaces: write a temporary file, fsync, rename it over the
    /// target, fsync the directory.
    NamesReplace,
    /// `ironpool snapshot` of the filesystem once a new directory of it
    /// holds `--files` empty files (made first, not timed): one operation,
    /// whose time is the snapshot's.
    SnapshotTake,
    /// A listing (`readdir` and `stat` of each name, as `ls -l`) of that
    /// directory in the snapshot just taken: one operation per name.
    SnapshotList,
    /// `ironpool send DATASET@SNAP | ironpool receive COPY` of the working
    /// set's dataset (a snapshot of it taken first), in bytes of stream per
    /// second; on a file target, a copy of the working set into a second
    /// file with `dd` (O_DIRECT, 1 MiB): the disk's cost of reading and
    /// writing the same bytes once.
    SendReceive,
    /// After every 100th record of the working set is rewritten, a second
    /// snapshot and `send -i @FIRST | receive -F COPY` onto the copy
    /// `send-receive` made.
    SendIncremental,
    /// `--files` files of 4 KiB in 20 directories (made first, not timed:
    /// on an ironpool filesystem target, in a filesystem of their own),
    /// copied through the mount with `tar c | tar x` into a directory of
    /// the target's filesystem: files per second, the limit of
    /// `send-files`.
    FilesTar,
    /// The same files sent as a stream: a snapshot of their filesystem,
    /// `send | receive` into a copy, in files per second.
    SendFiles,
    /// Nothing, for [`IDLE_SECONDS`]: the server's CPU while no client
    /// asks anything (what a polling loop costs when there is nothing to
    /// find).
    Idle,
    /// The stall suite's probe with no action: what the others are held to.
    StallNone,
    /// `ironpool list -t all POOL` during the probe.
    StallList,
    /// `ironpool scrub POOL` (the scrub runs on after the command returns).
    StallScrub,
    /// `ironpool send` of a snapshot of the working set's dataset, to
    /// nowhere.
    StallSend,
    /// `ironpool destroy` of a snapshot taken before the working set was
    /// written again: its destroy frees the whole working set.
    StallDestroySnapshot,
    /// `ironpool rollback` to a snapshot taken before the working set was
    /// written again: the rollback frees the whole working set's new
    /// blocks.
    StallRollback,
    /// `rm -rf` of a directory of `--files` empty files (made first, not
    /// timed) on a filesystem; skipped on a volume.
    StallRemoveTree,
    /// `truncate` of a file of the working set's size to nothing (written
    /// afresh first, so its blocks are its own); skipped on a volume.
    StallTruncate,
    /// `rm` of the working set's file (written afresh first); skipped on a
    /// volume.
    StallRemove,
    /// The working set's dataset destroyed: `destroy -r` of the volume, or
    /// of the filesystem with the working set's file written afresh first.
    StallDestroy,
}

impl OpsTest {
    /// The test name.
    pub fn name(self) -> &'static str {
        match self {
            OpsTest::FilesCreate => "files-create",
            OpsTest::FilesStat => "files-stat",
            OpsTest::FilesAbsent => "files-absent",
            OpsTest::FilesDelete => "files-delete",
            OpsTest::NamesSqlite => "names-sqlite",
            OpsTest::NamesCreate => "names-create",
            OpsTest::NamesReplace => "names-replace",
            OpsTest::SnapshotTake => "snapshot-take",
            OpsTest::SnapshotList => "snapshot-list",
            OpsTest::SendReceive => "send-receive",
            OpsTest::SendIncremental => "send-incremental",
            OpsTest::FilesTar => "files-tar",
            OpsTest::SendFiles => "send-files",
            OpsTest::Idle => "idle",
            OpsTest::StallNone => "stall-none",
            OpsTest::StallList => "stall-list",
            OpsTest::StallScrub => "stall-scrub",
            OpsTest::StallSend => "stall-send",
            OpsTest::StallDestroySnapshot => "stall-destroy-snapshot",
            OpsTest::StallRollback => "stall-rollback",
            OpsTest::StallRemoveTree => "stall-remove-tree",
            OpsTest::StallTruncate => "stall-truncate",
            OpsTest::StallRemove => "stall-remove",
            OpsTest::StallDestroy => "stall-destroy",
        }
    }

    /// Whether the test is a probe of the stall suite (a fio test of the
    /// probe dataset, with an action beside it).
    pub fn of_stall(self) -> bool {
        matches!(
            self,
            OpsTest::StallNone
                | OpsTest::StallList
                | OpsTest::StallScrub
                | OpsTest::StallSend
                | OpsTest::StallDestroySnapshot
                | OpsTest::StallRollback
                | OpsTest::StallRemoveTree
                | OpsTest::StallTruncate
                | OpsTest::StallRemove
                | OpsTest::StallDestroy
        )
    }

    /// Whether the runner runs the test itself (it needs the pool's
    /// commands or fio), not [`crate::ops::run`]'s loops of system calls.
    pub fn runner_only(self) -> bool {
        !matches!(
            self,
            OpsTest::FilesCreate
                | OpsTest::FilesStat
                | OpsTest::FilesAbsent
                | OpsTest::FilesDelete
                | OpsTest::NamesSqlite
                | OpsTest::NamesCreate
                | OpsTest::NamesReplace
        )
    }

    /// Whether the test copies the send suite's many small files (the
    /// runner, not `ops`, runs it: it needs the pool's commands).
    pub fn of_small_files(self) -> bool {
        matches!(self, OpsTest::FilesTar | OpsTest::SendFiles)
    }

    /// Whether the test moves a stream of `send` (measured in bytes per
    /// second, reported as a read of that many bytes).
    pub fn of_send(self) -> bool {
        matches!(self, OpsTest::SendReceive | OpsTest::SendIncremental)
    }

    /// Whether the test is about a snapshot of an ironpool filesystem
    /// (the runner, not `ops`, runs it: it needs the pool's commands).
    pub fn of_snapshot(self) -> bool {
        matches!(self, OpsTest::SnapshotTake | OpsTest::SnapshotList)
    }

    /// The metadata phases run over a fixed count of files; the names
    /// tests for the test's runtime.
    pub fn counted(self) -> bool {
        matches!(
            self,
            OpsTest::FilesCreate
                | OpsTest::FilesStat
                | OpsTest::FilesAbsent
                | OpsTest::FilesDelete
                | OpsTest::SnapshotTake
                | OpsTest::SnapshotList
                | OpsTest::FilesTar
                | OpsTest::SendFiles
        )
    }
}

/// One fio workload (or, with `ops`, a test of system calls).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Workload {
    /// Access pattern.
    pub pattern: Pattern,
    /// Block size of each I/O.
    pub block_size_bytes: u64,
    /// Outstanding I/Os per job.
    pub iodepth: u32,
    /// Parallel jobs (fio processes; NBD connections over NBD).
    pub numjobs: u32,
    /// Percent of reads in a mixed workload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_mix_percent: Option<u32>,
    /// Flush or FUA behaviour.
    #[serde(default)]
    pub durability: Durability,
    /// The fio engine on file targets.
    #[serde(default, skip_serializing_if = "Engine::is_default")]
    pub engine: Engine,
    /// Through the page cache (`--direct=0`, an fsync at the end, which
    /// the figure includes) rather than O_DIRECT.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub buffered: bool,
    /// Read from the target's cache: the runner reads the working set
    /// once through the cache first (a buffered read of a file; a volume
    /// caches what it serves), so the test measures the path to the cache
    /// (request, copies, reply) with no device in the way.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cached: bool,
    /// Read from the snapshot of the target's filesystem
    /// ([`SNAPSHOT_READ_NAME`], taken before the first such test): the
    /// working set as it was then, through `.zfs/snapshot`. Its limit is
    /// the same reads of the head.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub snapshot: bool,
    /// Read with the target's cache emptied first (`ironpool tune POOL
    /// arc_drop 1` on an ironpool target; a file read with O_DIRECT has no
    /// cache in the way), in one pass over the working set (not for the
    /// runtime: a second pass would read what the first left cached).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cold: bool,
    /// On an ironpool dataset with `primarycache=none` for the test (put
    /// back after): every read goes to the devices. Held to the limit
    /// target's same reads without it; skipped on other targets.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub nocache: bool,
    /// Beside a background job of [`LOAD_BLOCK_BYTES`] random writes at
    /// [`LOAD_IODEPTH`] on the same target for the whole test (the
    /// scheduler's fairness): the figures are this job's alone.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub under_load: bool,
    /// Only the first this many bytes of the working set (fio's `--size`):
    /// a load whose snapshots the pool must hold (each keeps what the load
    /// overwrote since the one before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region_bytes: Option<u64>,
    /// A snapshot of the target's dataset every [`SNAPSHOT_EVERY_SECONDS`]
    /// while the test runs (ironpool targets; destroyed after): what
    /// taking them costs a writer. Held to the same test without.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub snapshots: bool,
    /// fio's buffers compress to about [`COMPRESSIBLE_PERCENT`] percent
    /// (fio's `buffer_compress_percentage`), refilled for every write;
    /// without it a test with `compression` writes random buffers,
    /// refilled too.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub compressible: bool,
    /// The `compression` property of an ironpool dataset for the test (put
    /// back after); other targets ignore it. `lz4` is held to `off`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression: Option<Compression>,
    /// Every job writes its own region (the working set split evenly) and
    /// checks each block it reads back against the crc32c it wrote (fio's
    /// `verify`): a wrong byte fails the test.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub verify: bool,
    /// After the target grew: on an ironpool pool, `ironpool add` of a vdev
    /// like its first before the first such test. Held to the same test
    /// before.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub grown: bool,
    /// Not fio: a loop of system calls (the other fields are ignored).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ops: Option<OpsTest>,
}

impl Workload {
    /// A workload with no flushes.
    pub fn new(pattern: Pattern, block_size_bytes: u64, iodepth: u32, numjobs: u32) -> Self {
        Workload {
            pattern,
            block_size_bytes,
            iodepth,
            numjobs,
            read_mix_percent: None,
            durability: Durability::None,
            engine: Engine::IoUring,
            buffered: false,
            cached: false,
            snapshot: false,
            cold: false,
            nocache: false,
            under_load: false,
            region_bytes: None,
            snapshots: false,
            compressible: false,
            compression: None,
            verify: false,
            grown: false,
            ops: None,
        }
    }

    /// A test of system calls (see [`OpsTest`]).
    pub fn ops(test: OpsTest) -> Self {
        Workload {
            ops: Some(test),
            ..Workload::new(Pattern::RandWrite, 0, 1, 1)
        }
    }

    /// A test a filesystem answers on its own (system calls, or the page
    /// cache): its limit is another filesystem (ext4), not the raw file.
    pub fn is_filesystem_test(&self) -> bool {
        self.ops
            .is_some_and(|ops| !ops.of_send() && !ops.of_stall())
            || self.buffered
    }

    /// The test on the same target this one is held to, when that is its
    /// limit rather than another target's same test: a snapshot's reads to
    /// the head's, a stream of many small files to copying them with tar
    /// through the mount, a stall probe to the probe with no action,
    /// writes beside snapshots to the same writes without, `lz4` to `off`,
    /// and writes after the pool grew to the same writes before.
    pub fn own_limit(&self) -> Option<Workload> {
        if self.snapshot {
            return Some(Workload {
                snapshot: false,
                ..*self
            });
        }
        if self.snapshots {
            return Some(Workload {
                snapshots: false,
                ..*self
            });
        }
        if self.compression == Some(Compression::Lz4) {
            return Some(Workload {
                compression: Some(Compression::Off),
                ..*self
            });
        }
        if self.grown {
            return Some(Workload {
                grown: false,
                ..*self
            });
        }
        match self.ops? {
            OpsTest::SendFiles => Some(Workload::ops(OpsTest::FilesTar)),
            ops if ops.of_stall() && ops != OpsTest::StallNone => Some(Workload {
                ops: Some(OpsTest::StallNone),
                ..*self
            }),
            _ => None,
        }
    }

    /// The test name: `randwrite-16k-qd64-4j`, `randrw70-256k-qd16-4j`,
    /// `randwrite-16k-qd1-1j-fsync`.
    pub fn name(&self) -> String {
        if let Some(ops) = self.ops {
            return ops.name().to_string();
        }
        let engine = match self.engine {
            Engine::IoUring => "",
            Engine::Libaio => "-aio",
            Engine::Psync => "-psync",
        };
        let buffered = if self.buffered { "-buffered" } else { "" };
        let cached = if self.cached { "-cached" } else { "" };
        let snapshot = if self.snapshot { "-snapshot" } else { "" };
        let cold = if self.cold { "-cold" } else { "" };
        let nocache = if self.nocache { "-nocache" } else { "" };
        let under_load = if self.under_load { "-underload" } else { "" };
        let region = self
            .region_bytes
            .map(|bytes| format!("-in{}", size_short(bytes).to_lowercase()))
            .unwrap_or_default();
        let snapshots = if self.snapshots { "-snapshots" } else { "" };
        let compressible = if self.compressible {
            "-compressible"
        } else {
            ""
        };
        let compression = self
            .compression
            .map(|c| format!("-{}", c.value()))
            .unwrap_or_default();
        let verify = if self.verify { "-verify" } else { "" };
        let grown = if self.grown { "-grown" } else { "" };
        let mix = self
            .read_mix_percent
            .map(|p| p.to_string())
            .unwrap_or_default();
        format!(
            "{}{}-{}-qd{}-{}j{}{engine}{buffered}{cached}{snapshot}{cold}{nocache}{under_load}\
             {region}{snapshots}{compressible}{compression}{verify}{grown}",
            self.pattern.fio_rw(),
            mix,
            size_short(self.block_size_bytes).to_lowercase(),
            self.iodepth,
            self.numjobs,
            self.durability.suffix()
        )
    }
}

/// One test of a suite.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TestSpec {
    /// The suite it belongs to.
    pub suite: Suite,
    /// The workload.
    pub workload: Workload,
    /// For the fill suite: the pool or filesystem fill level to reach first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fill_percent: Option<u32>,
}

impl TestSpec {
    /// The workload's name (unique within a suite and fill level).
    pub fn name(&self) -> String {
        self.workload.name()
    }
}

/// What to run, after defaults and `--quick`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SuiteOptions {
    /// Queue depths of qd-scaling.
    pub depths: Vec<u32>,
    /// Job counts of qd-scaling.
    pub jobs: Vec<u32>,
    /// Fill levels of the fill suite.
    pub fill_levels_percent: Vec<u32>,
}

/// The tests of one suite, in run order. The fill suite repeats the pool
/// report at each level; targets that cannot be filled run the pool report
/// once with no level (see the runner).
pub fn tests_of(suite: Suite, options: &SuiteOptions) -> Vec<TestSpec> {
    let plain = |workload| TestSpec {
        suite,
        workload,
        fill_percent: None,
    };
    match suite {
        Suite::QdScaling => {
            let mut tests = Vec::new();
            for (pattern, block_size_bytes) in
                [(Pattern::RandWrite, 16 * KIB), (Pattern::RandRead, 4 * KIB)]
            {
                for &numjobs in &options.jobs {
                    for &iodepth in &options.depths {
                        tests.push(plain(Workload::new(
                            pattern,
                            block_size_bytes,
                            iodepth,
                            numjobs,
                        )));
                    }
                }
            }
            tests
        }
        Suite::PoolReport => pool_report_workloads().into_iter().map(plain).collect(),
        Suite::Durable => durable_workloads().into_iter().map(plain).collect(),
        Suite::Fs => fs_workloads().into_iter().map(plain).collect(),
        Suite::Snapshot => snapshot_workloads().into_iter().map(plain).collect(),
        Suite::Send => send_workloads().into_iter().map(plain).collect(),
        Suite::Cache => cache_workloads().into_iter().map(plain).collect(),
        Suite::Poll => poll_workloads().into_iter().map(plain).collect(),
        Suite::Scheduler => [
            Workload::new(Pattern::RandRead, 4 * KIB, 64, 1),
            Workload::new(Pattern::RandWrite, 16 * KIB, 64, 1),
            Workload::new(Pattern::SeqRead, 4 * KIB, 16, 1),
            Workload {
                under_load: true,
                ..Workload::new(Pattern::RandRead, 4 * KIB, 1, 1)
            },
        ]
        .map(plain)
        .to_vec(),
        Suite::Raidz => [
            Workload::new(Pattern::RandWrite, 16 * KIB, 64, 1),
            Workload::new(Pattern::SeqWrite, MIB, 16, 1),
        ]
        .map(plain)
        .to_vec(),
        Suite::Datasets => datasets_workloads().into_iter().map(plain).collect(),
        Suite::Soak => [Workload {
            read_mix_percent: Some(SOAK_READ_PERCENT),
            verify: true,
            ..Workload::new(Pattern::RandRw, 16 * KIB, 64, SOAK_JOBS)
        }]
        .map(plain)
        .to_vec(),
        Suite::Grow => {
            let before = Workload::new(Pattern::RandWrite, 16 * KIB, 64, 1);
            [
                before,
                Workload {
                    grown: true,
                    ..before
                },
            ]
            .map(plain)
            .to_vec()
        }
        Suite::Stall => stall_workloads().into_iter().map(plain).collect(),
        Suite::Fill => options
            .fill_levels_percent
            .iter()
            .flat_map(|&level| {
                pool_report_workloads()
                    .into_iter()
                    .map(move |workload| TestSpec {
                        suite,
                        workload,
                        fill_percent: Some(level),
                    })
            })
            .collect(),
    }
}

/// The five tests of the pool report (BENCHMARKS.md suite 2).
pub fn pool_report_workloads() -> Vec<Workload> {
    let mut mixed = Workload::new(Pattern::RandRw, 256 * KIB, 16, 4);
    mixed.read_mix_percent = Some(70);
    vec![
        Workload::new(Pattern::SeqWrite, MIB, 1, 1),
        Workload::new(Pattern::SeqRead, MIB, 1, 1),
        Workload::new(Pattern::RandRead, 4 * KIB, 32, 4),
        Workload::new(Pattern::RandWrite, 4 * KIB, 32, 4),
        mixed,
    ]
}

/// The durable-write tests (BENCHMARKS.md suite 3, the table of
/// `scripts/bench-durable.sh`): 16K random writes with a flush after each
/// write at QD1 (the latency of one durable write), a flush after every 32
/// at QD64 (does the target batch flushes?), every write durable at QD64
/// (O_DSYNC, or `sync=always` on a volume), the same writes with no flush
/// (what durability costs), and the raw psync + fdatasync baseline.
pub fn durable_workloads() -> Vec<Workload> {
    let with = |iodepth, durability| Workload {
        durability,
        ..Workload::new(Pattern::RandWrite, 16 * KIB, iodepth, 1)
    };
    vec![
        with(1, Durability::Fsync),
        with(
            DURABLE_DEEP_IODEPTH,
            Durability::FsyncEvery(DURABLE_WRITES_PER_FLUSH),
        ),
        with(DURABLE_DEEP_IODEPTH, Durability::Dsync),
        with(DURABLE_DEEP_IODEPTH, Durability::None),
        with(1, Durability::PsyncFdatasync),
    ]
}

/// The fs suite (the table of `scripts/bench-fs.sh`), in run order:
/// - data: 16K random writes at QD1 and QD64 through io_uring and libaio
///   (QD64 should scale as the seeds' workload asks), 4K random reads at
///   QD64, 1 MiB sequential writes and reads at QD16;
/// - sync: 16K random writes with an fsync after each at QD1, after every
///   32 at QD64, and O_DSYNC at QD1 (psync);
/// - buffered: through the page cache, an fsync at the end: 4K random at
///   QD1 (psync) and QD64 (io_uring), 128K sequential (psync);
/// - cached: random reads of 1 MiB, 128K and 4K at QD16 that the target's
///   cache holds (the FUSE path's own cost beside a volume's over NBD);
/// - metadata: create, stat, stat of absent names, delete;
/// - names: sqlite commits, new files, atomic replaces.
pub fn fs_workloads() -> Vec<Workload> {
    let on = |engine, workload: Workload| Workload { engine, ..workload };
    let buffered = |workload: Workload| Workload {
        buffered: true,
        ..workload
    };
    let durable = |iodepth, durability, engine| Workload {
        durability,
        engine,
        ..Workload::new(Pattern::RandWrite, 16 * KIB, iodepth, 1)
    };
    let mut workloads = vec![
        Workload::new(Pattern::RandWrite, 16 * KIB, 1, 1),
        Workload::new(Pattern::RandWrite, 16 * KIB, 64, 1),
        on(
            Engine::Libaio,
            Workload::new(Pattern::RandWrite, 16 * KIB, 1, 1),
        ),
        on(
            Engine::Libaio,
            Workload::new(Pattern::RandWrite, 16 * KIB, 64, 1),
        ),
        Workload::new(Pattern::RandRead, 4 * KIB, 64, 1),
        Workload::new(Pattern::SeqWrite, MIB, 16, 1),
        Workload::new(Pattern::SeqRead, MIB, 16, 1),
        durable(1, Durability::Fsync, Engine::IoUring),
        durable(
            DURABLE_DEEP_IODEPTH,
            Durability::FsyncEvery(DURABLE_WRITES_PER_FLUSH),
            Engine::IoUring,
        ),
        durable(1, Durability::Dsync, Engine::Psync),
        buffered(on(
            Engine::Psync,
            Workload::new(Pattern::RandWrite, 4 * KIB, 1, 1),
        )),
        buffered(Workload::new(Pattern::RandWrite, 4 * KIB, 64, 1)),
        buffered(on(
            Engine::Psync,
            Workload::new(Pattern::SeqWrite, 128 * KIB, 1, 1),
        )),
    ];
    workloads.extend([MIB, 128 * KIB, 4 * KIB].map(|block_size_bytes| Workload {
        cached: true,
        ..Workload::new(Pattern::RandRead, block_size_bytes, 16, 1)
    }));
    workloads.extend(
        [
            OpsTest::FilesCreate,
            OpsTest::FilesStat,
            OpsTest::FilesAbsent,
            OpsTest::FilesDelete,
            OpsTest::NamesSqlite,
            OpsTest::NamesCreate,
            OpsTest::NamesReplace,
        ]
        .map(Workload::ops),
    );
    workloads
}

/// The snapshot the snapshot suite's reads go through.
pub const SNAPSHOT_READ_NAME: &str = "bench-read";
/// The snapshot `snapshot-take` makes (and `snapshot-list` lists).
pub const SNAPSHOT_FILES_NAME: &str = "bench-files";

/// The snapshot suite (the table of `scripts/bench-snapshot.sh`), in run
/// order: each read of the head, then the same of the snapshot (so the two
/// are measured minutes apart at most), then the snapshot's cost with
/// many files.
pub fn snapshot_workloads() -> Vec<Workload> {
    let mut workloads = Vec::new();
    for head in [
        Workload::new(Pattern::RandRead, 4 * KIB, 64, 1),
        Workload::new(Pattern::SeqRead, MIB, 16, 1),
    ] {
        workloads.push(head);
        workloads.push(Workload {
            snapshot: true,
            ..head
        });
    }
    workloads.extend([OpsTest::SnapshotTake, OpsTest::SnapshotList].map(Workload::ops));
    workloads
}

/// The snapshot `send-receive` sends in full.
pub const SEND_FIRST_NAME: &str = "bench-send";
/// The snapshot `send-incremental` sends from [`SEND_FIRST_NAME`].
pub const SEND_SECOND_NAME: &str = "bench-send-2";
/// The dataset `send-receive` receives into (in the target's pool).
pub const SEND_COPY_NAME: &str = "send-copy";
/// `send-incremental` rewrites one record in this many before its
/// snapshot: 1% of the working set, a day's change of many datasets.
pub const SEND_CHANGE_EVERY_RECORDS: u64 = 100;

/// The send suite (the table of `scripts/bench-send.sh`): a full stream
/// and an incremental one, each judged by its bandwidth (a sequential
/// read of the stream's bytes).
pub fn send_workloads() -> Vec<Workload> {
    let mut workloads: Vec<Workload> = [OpsTest::SendReceive, OpsTest::SendIncremental]
        .map(|test| Workload {
            pattern: Pattern::SeqRead,
            block_size_bytes: MIB,
            ..Workload::ops(test)
        })
        .to_vec();
    workloads.extend([OpsTest::FilesTar, OpsTest::SendFiles].map(Workload::ops));
    workloads
}

/// The cache suite (the table of `scripts/bench-cache.sh`): 4K random
/// reads at QD64 and QD1 from the cache (the working set read once first),
/// a 1 MiB sequential read at QD1 from a cold cache, then the three with
/// the cache off.
pub fn cache_workloads() -> Vec<Workload> {
    let cached = |iodepth| Workload {
        cached: true,
        ..Workload::new(Pattern::RandRead, 4 * KIB, iodepth, 1)
    };
    let cold = Workload {
        cold: true,
        ..Workload::new(Pattern::SeqRead, MIB, 1, 1)
    };
    let with_cache = [cached(64), cached(1), cold];
    let mut workloads = with_cache.to_vec();
    workloads.extend(with_cache.map(|workload| Workload {
        cached: false,
        cold: false,
        nocache: true,
        ..workload
    }));
    workloads
}

/// The shortest probe of the stall suite (seconds): each probe runs for
/// `--runtime`, at least this, so that there is time before the action
/// and after it.
pub const STALL_PROBE_MIN_SECONDS: u64 = 2;
/// The action starts this fraction of the probe in (a quarter: the
/// probe's reads before it are the row's own baseline).
pub const STALL_ACTION_AT_DIVISOR: u64 = 4;
/// Size of the probe's dataset (a volume, or a file in a filesystem of
/// its own): small, so that it stays in the cache and the probe measures
/// the engine, not the disk.
pub const STALL_PROBE_BYTES: u64 = 64 * MIB;
/// A probe whose longest read is this many times stall-none's longest is
/// a stall the report warns about.
pub const STALL_WARN_RATIO: f64 = 10.0;

/// The stall suite, in run order (the removal last).
pub fn stall_workloads() -> Vec<Workload> {
    [
        OpsTest::StallNone,
        OpsTest::StallList,
        OpsTest::StallScrub,
        OpsTest::StallSend,
        OpsTest::StallDestroySnapshot,
        OpsTest::StallRollback,
        OpsTest::StallRemoveTree,
        OpsTest::StallTruncate,
        OpsTest::StallRemove,
        OpsTest::StallDestroy,
    ]
    .map(|test| Workload {
        ops: Some(test),
        ..Workload::new(Pattern::RandRead, 4 * KIB, 1, 1)
    })
    .to_vec()
}

/// Seconds between the snapshots of a `snapshots` test: `bench/datasets.sh`'s
/// rhythm, a snapshot schedule far denser than any operator's.
pub const SNAPSHOT_EVERY_SECONDS: u64 = 2;
/// The region the datasets suite's snapshot load writes: every snapshot
/// keeps what the load overwrote since the one before, at most this much,
/// so a pool of a few GiB holds a snapshot every 2 s of a fast writer.
pub const SNAPSHOT_LOAD_REGION_BYTES: u64 = 256 * MIB;
/// Percent to which a `compressible` test's buffers compress (fio's
/// `buffer_compress_percentage`): `bench/datasets.sh`'s 60, about what
/// lz4 gets from databases and logs.
pub const COMPRESSIBLE_PERCENT: u32 = 60;
/// fio's `buffer_compress_chunk` of those buffers: each 4 KiB is
/// compressible on its own, as in real files.
pub const COMPRESSIBLE_CHUNK_BYTES: u64 = 4 * KIB;

/// The datasets suite, in run order: the snapshot load without and with
/// snapshots, then compression off and lz4 on random data, then on
/// compressible data.
pub fn datasets_workloads() -> Vec<Workload> {
    let load = Workload {
        region_bytes: Some(SNAPSHOT_LOAD_REGION_BYTES),
        ..Workload::new(Pattern::RandWrite, 16 * KIB, 64, 1)
    };
    let mut workloads = vec![
        load,
        Workload {
            snapshots: true,
            ..load
        },
    ];
    for compressible in [false, true] {
        for compression in [Compression::Off, Compression::Lz4] {
            workloads.push(Workload {
                compressible,
                compression: Some(compression),
                ..Workload::new(Pattern::RandWrite, 16 * KIB, 64, 1)
            });
        }
    }
    workloads
}

/// Clients of the soak suite: `bench/soak.sh`'s 8 NBD connections, more
/// submitters than this machine has cores.
pub const SOAK_JOBS: u32 = 8;
/// Percent of the soak's I/Os that are reads (70/30, a database's mix).
pub const SOAK_READ_PERCENT: u32 = 70;
/// Samples of the server's memory, CPU and the pool's free space a soak
/// takes over its runtime (one per second at least apart).
pub const SOAK_SAMPLES: u64 = 20;
/// A soak whose server memory grew by more than this percent over the
/// second half of the run gets a warning: a bounded server levels off
/// once its caches are full.
pub const SOAK_RSS_GROWTH_WARN_PERCENT: f64 = 10.0;

/// A grow test on a pool filled less than this (percent) gets a note: the
/// question is whether writes to a full pool collapse onto the new, empty
/// vdev, and a pool with room on its first vdev does not ask it.
pub const GROW_FULL_PERCENT: f64 = 50.0;

/// Block size of the background load of an `under_load` test.
pub const LOAD_BLOCK_BYTES: u64 = 16 * KIB;
/// Queue depth of that load: the seeds' QD64.
pub const LOAD_IODEPTH: u32 = 64;

/// Seconds of the poll suite's `idle` test: long enough for the server's
/// CPU ticks (10 ms each) to say whether it sleeps or spins.
pub const IDLE_SECONDS: u64 = 5;

/// The poll suite (the table of `scripts/bench-poll.sh`): what a client
/// that waits for each answer pays (metadata, QD1), what a deep queue
/// gets, and what the server burns with no client.
pub fn poll_workloads() -> Vec<Workload> {
    let mut workloads: Vec<Workload> = [
        OpsTest::FilesCreate,
        OpsTest::FilesStat,
        OpsTest::FilesDelete,
    ]
    .map(Workload::ops)
    .to_vec();
    workloads.extend([
        Workload::new(Pattern::RandWrite, 16 * KIB, 1, 1),
        Workload::new(Pattern::RandWrite, 16 * KIB, 64, 1),
        Workload::new(Pattern::RandRead, 4 * KIB, 64, 1),
        Workload::new(Pattern::RandRead, 4 * KIB, 1, 1),
        Workload {
            durability: Durability::Fsync,
            ..Workload::new(Pattern::RandWrite, 16 * KIB, 1, 1)
        },
        Workload::ops(OpsTest::Idle),
    ]);
    workloads
}

/// The filesystem `files-tar` makes its files in, on an ironpool
/// filesystem target (and `send-files` sends).
pub const SEND_FILES_FS_NAME: &str = "files";
/// The copy `send-files` receives.
pub const SEND_FILES_COPY_NAME: &str = "files-copy";
/// Bytes of each of those files: a mail spool's, a source tree's.
pub const SEND_FILES_BYTES: usize = 4096;
/// Directories they are spread over.
pub const SEND_FILES_DIRECTORIES: u64 = 20;

#[cfg(test)]
mod tests {
    use super::*;

    /// The test names of `suite` with the default options, in run order.
    fn names(suite: Suite) -> Vec<String> {
        tests_of(suite, &options())
            .iter()
            .map(TestSpec::name)
            .collect()
    }

    fn options() -> SuiteOptions {
        SuiteOptions {
            depths: QD_SCALING_DEPTHS.to_vec(),
            jobs: QD_SCALING_JOBS.to_vec(),
            fill_levels_percent: FILL_LEVELS_PERCENT.to_vec(),
        }
    }

    #[test]
    fn names_tests() {
        let listed = names(Suite::PoolReport);
        assert_eq!(
            listed,
            [
                "write-1m-qd1-1j",
                "read-1m-qd1-1j",
                "randread-4k-qd32-4j",
                "randwrite-4k-qd32-4j",
                "randrw70-256k-qd16-4j"
            ]
        );
        let durable = names(Suite::Durable);
        assert_eq!(
            durable,
            [
                "randwrite-16k-qd1-1j-fsync",
                "randwrite-16k-qd64-1j-fsync32",
                "randwrite-16k-qd64-1j-dsync",
                "randwrite-16k-qd64-1j",
                "randwrite-16k-qd1-1j-psync-fdatasync"
            ]
        );
    }

    #[test]
    fn names_the_fs_suite() {
        let listed = names(Suite::Fs);
        assert_eq!(
            listed,
            [
                "randwrite-16k-qd1-1j",
                "randwrite-16k-qd64-1j",
                "randwrite-16k-qd1-1j-aio",
                "randwrite-16k-qd64-1j-aio",
                "randread-4k-qd64-1j",
                "write-1m-qd16-1j",
                "read-1m-qd16-1j",
                "randwrite-16k-qd1-1j-fsync",
                "randwrite-16k-qd64-1j-fsync32",
                "randwrite-16k-qd1-1j-dsync-psync",
                "randwrite-4k-qd1-1j-psync-buffered",
                "randwrite-4k-qd64-1j-buffered",
                "write-128k-qd1-1j-psync-buffered",
                "randread-1m-qd16-1j-cached",
                "randread-128k-qd16-1j-cached",
                "randread-4k-qd16-1j-cached",
                "files-create",
                "files-stat",
                "files-absent",
                "files-delete",
                "names-sqlite",
                "names-create",
                "names-replace"
            ]
        );
        // Names are the results' keys: no two alike.
        let mut unique = listed.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), listed.len());
    }

    #[test]
    fn names_the_snapshot_suite() {
        let listed = names(Suite::Snapshot);
        assert_eq!(
            listed,
            [
                "randread-4k-qd64-1j",
                "randread-4k-qd64-1j-snapshot",
                "read-1m-qd16-1j",
                "read-1m-qd16-1j-snapshot",
                "snapshot-take",
                "snapshot-list"
            ]
        );
    }

    #[test]
    fn names_the_send_suite() {
        let tests = tests_of(Suite::Send, &options());
        let names: Vec<String> = tests.iter().map(TestSpec::name).collect();
        assert_eq!(
            names,
            [
                "send-receive",
                "send-incremental",
                "files-tar",
                "send-files"
            ]
        );
        // The streams are judged by bandwidth, and held to the raw file,
        // not ext4.
        for test in &tests[..2] {
            assert!(test.workload.pattern.is_sequential());
            assert!(!test.workload.is_filesystem_test());
        }
    }

    #[test]
    fn names_the_cache_suite() {
        let listed = names(Suite::Cache);
        assert_eq!(
            listed,
            [
                "randread-4k-qd64-1j-cached",
                "randread-4k-qd1-1j-cached",
                "read-1m-qd1-1j-cold",
                "randread-4k-qd64-1j-nocache",
                "randread-4k-qd1-1j-nocache",
                "read-1m-qd1-1j-nocache"
            ]
        );
    }

    #[test]
    fn names_the_poll_suite() {
        let listed = names(Suite::Poll);
        assert_eq!(
            listed,
            [
                "files-create",
                "files-stat",
                "files-delete",
                "randwrite-16k-qd1-1j",
                "randwrite-16k-qd64-1j",
                "randread-4k-qd64-1j",
                "randread-4k-qd1-1j",
                "randwrite-16k-qd1-1j-fsync",
                "idle"
            ]
        );
    }

    #[test]
    fn names_the_stall_suite() {
        let tests = tests_of(Suite::Stall, &options());
        let names: Vec<String> = tests.iter().map(TestSpec::name).collect();
        assert_eq!(
            names,
            [
                "stall-none",
                "stall-list",
                "stall-scrub",
                "stall-send",
                "stall-destroy-snapshot",
                "stall-rollback",
                "stall-remove-tree",
                "stall-truncate",
                "stall-remove",
                "stall-destroy"
            ]
        );
        assert!(tests.iter().all(|t| !t.workload.is_filesystem_test()));
        // It runs last: its last row takes the working set away.
        assert_eq!(
            Suite::Stall,
            *[Suite::Stall, Suite::Fs, Suite::Poll].iter().max().unwrap()
        );
    }

    #[test]
    fn names_the_scheduler_suite() {
        let listed = names(Suite::Scheduler);
        assert_eq!(
            listed,
            [
                "randread-4k-qd64-1j",
                "randwrite-16k-qd64-1j",
                "read-4k-qd16-1j",
                "randread-4k-qd1-1j-underload"
            ]
        );
    }

    #[test]
    fn names_the_datasets_grow_and_soak_suites() {
        assert_eq!(
            names(Suite::Datasets),
            [
                "randwrite-16k-qd64-1j-in256m",
                "randwrite-16k-qd64-1j-in256m-snapshots",
                "randwrite-16k-qd64-1j-off",
                "randwrite-16k-qd64-1j-lz4",
                "randwrite-16k-qd64-1j-compressible-off",
                "randwrite-16k-qd64-1j-compressible-lz4"
            ]
        );
        assert_eq!(
            names(Suite::Grow),
            ["randwrite-16k-qd64-1j", "randwrite-16k-qd64-1j-grown"]
        );
        assert_eq!(names(Suite::Soak), ["randrw70-16k-qd64-8j-verify"]);
        // The pool keeps its new shape and its working set: the grow suite
        // runs after all others but the stall suite.
        let mut order = [
            Suite::Stall,
            Suite::Grow,
            Suite::Soak,
            Suite::Datasets,
            Suite::Fs,
        ];
        order.sort();
        assert_eq!(order[3..], [Suite::Grow, Suite::Stall]);
    }

    #[test]
    fn holds_tests_to_their_own_reference() {
        let held = |suite| -> Vec<(String, Option<String>)> {
            tests_of(suite, &options())
                .iter()
                .map(|t| (t.name(), t.workload.own_limit().map(|w| w.name())))
                .collect()
        };
        let datasets = held(Suite::Datasets);
        assert_eq!(datasets[0].1, None);
        assert_eq!(
            datasets[1].1.as_deref(),
            Some("randwrite-16k-qd64-1j-in256m")
        );
        assert_eq!(datasets[2].1, None);
        assert_eq!(datasets[3].1.as_deref(), Some("randwrite-16k-qd64-1j-off"));
        assert_eq!(
            datasets[5].1.as_deref(),
            Some("randwrite-16k-qd64-1j-compressible-off")
        );
        let grow = held(Suite::Grow);
        assert_eq!(grow[1].1.as_deref(), Some("randwrite-16k-qd64-1j"));
        let stall = held(Suite::Stall);
        assert_eq!(stall[0].1, None);
        assert!(stall[1..]
            .iter()
            .all(|(_, held)| held.as_deref() == Some("stall-none")));
        let snapshot = held(Suite::Snapshot);
        assert_eq!(snapshot[1].1.as_deref(), Some("randread-4k-qd64-1j"));
        let send = held(Suite::Send);
        assert_eq!(send[3].1.as_deref(), Some("files-tar"));
        assert_eq!(held(Suite::Soak)[0].1, None);
    }

    #[test]
    fn sizes_suites() {
        assert_eq!(tests_of(Suite::QdScaling, &options()).len(), 16);
        assert_eq!(tests_of(Suite::Fill, &options()).len(), 20);
    }
}
