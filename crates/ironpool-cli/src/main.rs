//! The `ironpool` command: create and serve pools, manage volumes, watch I/O.

mod cli;

/// mimalloc instead of glibc's allocator: the request path allocates small and
/// medium objects (task frames, reply headers) at a high rate, and glibc's
/// arena bookkeeping showed up at 6-9% of the server's CPU in profiles.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use ironpool::pool::filesystem::id_space::IdKind;

/// ironpool: a copy-on-write, checksummed storage pool with an asynchronous
/// io_uring I/O path, serving volumes over NBD.
#[derive(Parser)]
#[command(name = "ironpool", version, about, long_about = None)]
struct Cli {
    /// Control socket of a running server (default: /run/ironpool/POOL.ctl when it exists).
    #[arg(long, global = true, env = "IRONPOOL_CONTROL")]
    control: Option<PathBuf>,
    /// Print machine-readable JSON.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

// Parsed once per process: boxing the large variants would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Create a pool: `create [-f] [--size SIZE] POOL [mirror|raidz|raidz2|raidz3] DEV... [mirror|raidzN DEV...] [log [mirror] DEV...] [spare DEV...]`.
    Create {
        /// Overwrite devices that belong to another pool.
        #[arg(short, long)]
        force: bool,
        /// Create missing device files of this size (sparse), e.g. 2G.
        #[arg(long)]
        size: Option<String>,
        pool: String,
        /// Devices, each group optionally introduced by `mirror`, `raidz` (= `raidz1`), `raidz2` or `raidz3`; after `log`, log devices (disks or mirrors); after `spare`, hot spares.
        #[arg(required = true, num_args = 1..)]
        devices: Vec<String>,
    },
    /// Import a pool and serve its volumes over NBD until SIGINT/SIGTERM.
    Serve {
        /// Directory to look for the pool's devices in (repeatable).
        #[arg(short = 'd', long = "dir")]
        dirs: Vec<PathBuf>,
        /// Where to listen: unix:PATH or tcp:HOST:PORT (repeatable; default unix:/run/ironpool/POOL.sock).
        #[arg(long)]
        nbd: Vec<String>,
        /// Write the server's PID here once it is listening.
        #[arg(long)]
        pidfile: Option<PathBuf>,
        /// Set a tunable at start (repeatable), as `tune` would: -o NAME=VALUE.
        #[arg(short = 'o')]
        tunables: Vec<String>,
        /// Run the NBD front end (sockets, parsing, replies) on a thread of its
        /// own instead of the engine's. One thread is faster on a small machine
        /// (no cross-thread wakeup per request: 4K reads +26% on 2 cores); a
        /// second one helps only when the engine's thread is saturated.
        #[arg(long)]
        nbd_thread: bool,
        /// Close an NBD connection whose replies have waited this many seconds
        /// on a socket that accepts no bytes (a client that stopped reading
        /// them holds its share of the server's payload budget until then).
        /// At least 1: with none, a reply the socket does not take at once
        /// would close its connection.
        #[arg(long, default_value_t = ironpool::nbd::server::REPLY_STALL_TIMEOUT.as_secs(),
              value_parser = clap::value_parser!(u64).range(1..))]
        nbd_reply_timeout: u64,
        /// Serve Prometheus metrics over HTTP at /metrics: tcp:HOST:PORT
        /// (tcp:PORT means 127.0.0.1) or unix:PATH.
        #[arg(long, value_name = "LISTEN")]
        metrics: Option<String>,
        /// Import although a log device is missing from a pool that was not
        /// exported: flushed writes not yet in a txg that were on it are lost.
        #[arg(short = 'm')]
        missing_log: bool,
        /// Run without transparent huge pages (the system's setting is kept
        /// by default). Each first touch of fresh heap memory then zeroes
        /// 4 KiB instead of 2 MiB while the engine's loop waits: fewer and
        /// shorter stalls of every client when a large file is freed, and
        /// about half the memory; random 16K writes at QD64 measured about
        /// 5% slower. See README, "Memory and latency: `--no-huge-pages`".
        #[arg(long)]
        no_huge_pages: bool,
        /// Load the key of every encrypted volume whose keylocation is a
        /// file (file:///PATH) before serving; the others wait for load-key.
        #[arg(long)]
        load_keys: bool,
        pool: String,
    },
    /// Manage volumes.
    Volume {
        #[command(subcommand)]
        command: VolumeCommand,
    },
    /// Manage filesystems (served over FUSE by `serve`).
    Fs {
        #[command(subcommand)]
        command: FsCommand,
    },
    /// Show pool health, devices, error counters and scrub state.
    Status {
        #[arg(short = 'd', long = "dir")]
        dirs: Vec<PathBuf>,
        pool: String,
    },
    /// List pools (default), volumes, filesystems, snapshots or bookmarks: `list [-t pool|volume|filesystem|snapshot|bookmark|all] [POOL[/NAME]]`.
    List {
        /// What to list.
        #[arg(short = 't', default_value = "pool")]
        kind: String,
        /// With pools: each vdev's size, allocated, free and fragmentation too.
        #[arg(short = 'v')]
        verbose: bool,
        /// With POOL/NAME: the datasets (and their snapshots) below it too.
        #[arg(short = 'r')]
        recursive: bool,
        #[arg(short = 'd', long = "dir")]
        dirs: Vec<PathBuf>,
        pool: Option<String>,
    },
    /// Snapshot volumes atomically: `snapshot POOL/VOL@NAME...`, or `-r POOL@NAME` for every volume.
    Snapshot {
        #[arg(short = 'r')]
        recursive: bool,
        #[arg(short = 'd', long = "dir")]
        dirs: Vec<PathBuf>,
        #[arg(required = true, num_args = 1..)]
        names: Vec<String>,
    },
    /// Destroy a snapshot (POOL/VOL@NAME), a bookmark (POOL/VOL#NAME), a volume (POOL/VOL; -r with its snapshots) or a filesystem (POOL/FS).
    Destroy {
        #[arg(short = 'r')]
        recursive: bool,
        #[arg(short = 'd', long = "dir")]
        dirs: Vec<PathBuf>,
        name: String,
    },
    /// Place a user hold on snapshots, so they cannot be destroyed until
    /// released: `hold [-r] TAG POOL/DATASET@SNAP...` (-r with POOL@SNAP:
    /// that snapshot of every dataset that has it).
    Hold {
        #[arg(short = 'r')]
        recursive: bool,
        #[arg(short = 'd', long = "dir")]
        dirs: Vec<PathBuf>,
        tag: String,
        #[arg(required = true, num_args = 1..)]
        snapshots: Vec<String>,
    },
    /// Take a user hold off snapshots: `release [-r] TAG POOL/DATASET@SNAP...`.
    Release {
        #[arg(short = 'r')]
        recursive: bool,
        #[arg(short = 'd', long = "dir")]
        dirs: Vec<PathBuf>,
        tag: String,
        #[arg(required = true, num_args = 1..)]
        snapshots: Vec<String>,
    },
    /// List the user holds of snapshots: `holds [-r] POOL/DATASET@SNAP...`.
    Holds {
        #[arg(short = 'r')]
        recursive: bool,
        #[arg(short = 'd', long = "dir")]
        dirs: Vec<PathBuf>,
        #[arg(required = true, num_args = 1..)]
        snapshots: Vec<String>,
    },
    /// Bookmark a snapshot, so that incrementals can be sent from it after it
    /// is destroyed: `bookmark POOL/DATASET@SNAP POOL/DATASET#NAME` (or #NAME).
    Bookmark {
        #[arg(short = 'd', long = "dir")]
        dirs: Vec<PathBuf>,
        /// The snapshot (or another bookmark, POOL/DATASET#NAME).
        source: String,
        bookmark: String,
    },
    /// The space each user owning files of a filesystem uses, and their
    /// quotas (`userquota@NAME`), as `zfs userspace`: `userspace POOL/FS`.
    Userspace {
        #[arg(short = 'd', long = "dir")]
        dirs: Vec<PathBuf>,
        name: String,
    },
    /// The same per group (`groupquota@NAME`): `groupspace POOL/FS`.
    Groupspace {
        #[arg(short = 'd', long = "dir")]
        dirs: Vec<PathBuf>,
        name: String,
    },
    /// The same per project (`projectquota@ID`; a file's project is set
    /// with `chattr -p ID`, and `chattr +P` on a directory gives it to
    /// what is made inside): `projectspace POOL/FS`.
    Projectspace {
        #[arg(short = 'd', long = "dir")]
        dirs: Vec<PathBuf>,
        name: String,
    },
    /// What changed in a filesystem since a snapshot, as `zfs diff`:
    /// `diff [-F] POOL/FS@SNAP [POOL/FS@LATER|POOL/FS]` prints `+` created,
    /// `-` removed, `M` modified, `R` renamed (`R OLD -> NEW`), with paths
    /// under the mountpoint.
    Diff {
        /// Show each file's type (F file, / directory, @ link, | FIFO, = socket, B/C devices).
        #[arg(short = 'F')]
        types: bool,
        #[arg(short = 'd', long = "dir")]
        dirs: Vec<PathBuf>,
        from: String,
        /// A later snapshot, or the filesystem (the default).
        to: Option<String>,
    },
    /// Mount a filesystem the running server unmounted (`unmount`): `mount POOL/FS`.
    Mount {
        #[arg(short = 'd', long = "dir")]
        dirs: Vec<PathBuf>,
        name: String,
    },
    /// Unmount a filesystem until `mount` or the next `serve` (lazily: files
    /// open on it keep working until closed): `unmount POOL/FS`.
    #[command(alias = "umount")]
    Unmount {
        #[arg(short = 'd', long = "dir")]
        dirs: Vec<PathBuf>,
        name: String,
    },
    /// Create a writable volume or filesystem from a snapshot, sharing its blocks: `clone POOL/DATASET@SNAP POOL/NEW [-o key=value]`. A filesystem clone mounts at /POOL/NEW unless given a mountpoint.
    Clone {
        #[arg(short = 'd', long = "dir")]
        dirs: Vec<PathBuf>,
        origin: String,
        name: String,
        /// Properties of the clone, as `set` takes them (mountpoint=DIR for a filesystem).
        #[arg(short = 'o')]
        options: Vec<String>,
    },
    /// Rename a volume or a filesystem, moving it and every dataset below it: `rename [-p] POOL/OLD POOL/NEW`;
    /// or a snapshot: `rename [-r] POOL/DS@OLD POOL/DS@NEW` (or `@NEW`).
    /// A running server mounts moved filesystems at their new mountpoints.
    Rename {
        /// Create the missing parents of the new name.
        #[arg(short = 'p')]
        parents: bool,
        /// Of a snapshot: rename the snapshot of that name of every dataset below too, in one txg.
        #[arg(short = 'r')]
        recursive: bool,
        #[arg(short = 'd', long = "dir")]
        dirs: Vec<PathBuf>,
        from: String,
        to: String,
    },
    /// Make a clone independent of its origin volume.
    Promote {
        #[arg(short = 'd', long = "dir")]
        dirs: Vec<PathBuf>,
        name: String,
    },
    /// Roll a volume back to a snapshot (-r: destroying later snapshots).
    Rollback {
        #[arg(short = 'r')]
        recursive: bool,
        #[arg(short = 'd', long = "dir")]
        dirs: Vec<PathBuf>,
        name: String,
    },
    /// Show properties: `get [PROP[,PROP...]|all] NAME` (NAME: POOL, POOL/VOL, POOL/FS or POOL/VOL@SNAP).
    Get {
        #[arg(short = 'd', long = "dir")]
        dirs: Vec<PathBuf>,
        /// Comma-separated properties, or `all`.
        properties: String,
        name: String,
    },
    /// Set properties: `set PROP=VALUE... NAME` (compression, checksum, sync, readonly, volsize; on filesystems recordsize, mountpoint, atime, xattr; module:key).
    Set {
        #[arg(short = 'd', long = "dir")]
        dirs: Vec<PathBuf>,
        #[arg(required = true, num_args = 1..)]
        assignments: Vec<String>,
        /// POOL (volumes and filesystems inherit it), POOL/VOL or POOL/FS; given last.
        name: String,
    },
    /// Remove a volume's (or the pool's) own setting so that it is inherited again.
    Inherit {
        #[arg(short = 'd', long = "dir")]
        dirs: Vec<PathBuf>,
        property: String,
        name: String,
    },
    /// Write a snapshot of a volume or a filesystem as a stream to stdout: `send [-i @EARLIER|#BOOKMARK] POOL/DATASET@SNAP`, `send -t TOKEN`, or `send -R POOL/DATASET@SNAP` for the subtree.
    Send {
        /// Incremental from this earlier snapshot (@SNAP, or the origin of a clone), or from a bookmark (#NAME) of one.
        #[arg(short = 'i')]
        from: Option<String>,
        /// Resume an interrupted stream with the receiver's resume token.
        #[arg(short = 't')]
        token: Option<String>,
        /// With -R: an incremental package from this snapshot (@SNAP) of every dataset, with
        /// every snapshot between (-i sends only the last).
        #[arg(short = 'I', requires = "replicate", conflicts_with = "from")]
        from_all: Option<String>,
        /// A replication package: the dataset and every one below it, with their properties
        /// and snapshots up to this one (`receive` recreates the subtree; with -i or -I,
        /// updates a copy that has the base snapshot).
        #[arg(short = 'R', conflicts_with = "token")]
        replicate: bool,
        /// Raw: an encrypted dataset's blocks as stored, still sealed, with its key wrapped as it
        /// is (the key need not be loaded; the receiver keeps it encrypted, and the same user key
        /// opens it there). Other datasets are sent as without it.
        #[arg(short = 'w', conflicts_with = "token")]
        raw: bool,
        #[arg(short = 'd', long = "dir")]
        dirs: Vec<PathBuf>,
        snapshot: Option<String>,
    },
    /// Apply a stream from stdin to POOL/DATASET (a volume or a filesystem): a full stream creates it, an incremental one updates it, a package of `send -R` recreates the subtree.
    Receive {
        /// Roll the target back to the stream's source snapshot first (destroying later changes and snapshots); with a package of `send -R`, also destroy the copies' snapshots and datasets gone on the sender.
        #[arg(short = 'F')]
        force: bool,
        /// Keep a partial receive if the stream breaks, so it can be resumed (see `send -t`).
        #[arg(short = 's')]
        save_partial: bool,
        /// Discard an interrupted receive into POOL/DATASET.
        #[arg(short = 'A')]
        abort: bool,
        /// Set a property of the received dataset: `-o mountpoint=DIR` (repeatable).
        #[arg(short = 'o')]
        options: Vec<String>,
        #[arg(short = 'd', long = "dir")]
        dirs: Vec<PathBuf>,
        target: String,
    },
    /// Verify every copy of every block and repair bad ones.
    Scrub {
        /// Wait until the scrub ends, showing progress.
        #[arg(short = 'w')]
        wait: bool,
        /// Stop a running scrub.
        #[arg(short = 's')]
        stop: bool,
        #[arg(short = 'd', long = "dir")]
        dirs: Vec<PathBuf>,
        pool: String,
    },
    /// Find pools on devices, or import one: `import [-d DIR]...` lists the
    /// pools found (default: the directories pools were remembered in, and
    /// /dev); `import [-f] [-d DIR]... POOL|GUID [NEWNAME]` imports one.
    Import {
        #[arg(short = 'd', long = "dir")]
        dirs: Vec<PathBuf>,
        /// Import a pool that was not exported (in use on another host, or
        /// its server stopped without exporting it).
        #[arg(short = 'f')]
        force: bool,
        /// Import although a log device is missing from a pool that was not
        /// exported: flushed writes not yet in a txg that were on it are lost.
        #[arg(short = 'm')]
        missing_log: bool,
        /// The pool's name or guid (0x...).
        pool: Option<String>,
        /// A new name for it (also to tell two pools of one name apart).
        new_name: Option<String>,
    },
    /// Export a pool: a running server stops serving it; it is committed,
    /// marked exported, and forgotten here until imported again.
    Export {
        #[arg(short = 'd', long = "dir")]
        dirs: Vec<PathBuf>,
        pool: String,
    },
    /// Erase the labels of a device no pool uses: `labelclear [-f] DEV`.
    Labelclear {
        /// Also when its pool was not exported (it may be in use elsewhere).
        #[arg(short = 'f')]
        force: bool,
        device: PathBuf,
    },
    /// Discard all free space on the devices (sparse files shrink, SSDs and
    /// thin volumes get their space back): `trim [-w] [-s] POOL`.
    Trim {
        /// Wait until the trim ends, showing progress.
        #[arg(short = 'w')]
        wait: bool,
        /// Stop a running trim.
        #[arg(short = 's')]
        stop: bool,
        #[arg(short = 'd', long = "dir")]
        dirs: Vec<PathBuf>,
        pool: String,
    },
    /// What happened to a served pool and its devices: I/O and checksum
    /// errors (device and range), device state changes, scrub, resilver
    /// and trim starts and ends, suspension: `events [-f] POOL`. With
    /// --json, one JSON object per line.
    Events {
        /// Keep printing new events as they happen, until interrupted.
        #[arg(short = 'f')]
        follow: bool,
        pool: String,
    },
    /// The commands that changed a pool, with their times, from the pool
    /// itself: `history [-l] POOL`.
    History {
        /// Also the txg each was written in and the host it ran on.
        #[arg(short = 'l')]
        long: bool,
        #[arg(short = 'd', long = "dir")]
        dirs: Vec<PathBuf>,
        pool: String,
    },
    /// Clear device errors and faults and retry failed writes now (after a
    /// full host filesystem was given space, or a device came back).
    Clear {
        #[arg(short = 'd', long = "dir")]
        dirs: Vec<PathBuf>,
        pool: String,
    },
    /// Make every change answered so far durable, as `zpool sync`: `sync
    /// POOL|POOL/NAME...` (a pool through a transaction group; a filesystem
    /// through its intent log, as an `fsync` of all of it; a volume as a
    /// client's FLUSH). Linux's `sync` and `syncfs` do not reach a FUSE
    /// server, so this is what makes a mounted filesystem's changes durable
    /// without `fsync`.
    Sync {
        #[arg(short = 'd', long = "dir")]
        dirs: Vec<PathBuf>,
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// Load the key of an encrypted volume or filesystem, so that it can be
    /// served (a filesystem is mounted): `load-key [-L prompt|file:///PATH]
    /// POOL/NAME`, or `load-key -a POOL`
    /// for every key kept in a file. A key at `prompt` is read from the
    /// terminal, or from standard input. A wrong key is refused.
    LoadKey {
        #[arg(short = 'd', long = "dir")]
        dirs: Vec<PathBuf>,
        /// Every encrypted dataset whose keylocation is a file (NAME: the pool)
        #[arg(short = 'a')]
        all: bool,
        /// Where to read the key this time, instead of its keylocation
        #[arg(short = 'L')]
        location: Option<String>,
        name: String,
    },
    /// Unload the key of an encrypted volume or filesystem: a volume's NBD
    /// clients are disconnected, held writes written, and the key leaves
    /// memory; a filesystem must be unmounted first: `unload-key POOL/NAME`
    UnloadKey {
        #[arg(short = 'd', long = "dir")]
        dirs: Vec<PathBuf>,
        name: String,
    },
    /// Wrap an encrypted dataset's master key under a new key (its data is
    /// not rewritten; the old key no longer opens it): `change-key [-o
    /// keyformat=raw|hex|passphrase] [-o keylocation=prompt|file:///PATH]
    /// [-o pbkdf2iters=N] POOL/NAME`. The key must be loaded.
    ChangeKey {
        #[arg(short = 'd', long = "dir")]
        dirs: Vec<PathBuf>,
        #[arg(short = 'o')]
        options: Vec<String>,
        name: String,
    },
    /// Take a device out of service: `offline POOL DEV` (DEV: path, file name or guid).
    Offline {
        #[arg(short = 'd', long = "dir")]
        dirs: Vec<PathBuf>,
        pool: String,
        device: String,
    },
    /// Put a device back in service; it resilvers what it missed: `online [-w] POOL DEV`.
    Online {
        /// Wait until the resilver ends, showing progress.
        #[arg(short = 'w')]
        wait: bool,
        #[arg(short = 'd', long = "dir")]
        dirs: Vec<PathBuf>,
        pool: String,
        device: String,
    },
    /// Put a new device in the place of another and resilver it: `replace [-f] [-w] [--size SIZE] POOL OLD NEW`.
    Replace {
        /// Overwrite a device that belongs to another pool.
        #[arg(short, long)]
        force: bool,
        /// Wait until the resilver ends, showing progress.
        #[arg(short = 'w')]
        wait: bool,
        /// Create NEW as a sparse file of this size when it does not exist.
        #[arg(long)]
        size: Option<String>,
        #[arg(short = 'd', long = "dir")]
        dirs: Vec<PathBuf>,
        pool: String,
        old: String,
        new: String,
    },
    /// Attach NEW beside EXISTING, resilvering it: a disk becomes a mirror, a
    /// mirror one side wider: `attach [-f] [-w] [--size SIZE] POOL EXISTING NEW`.
    Attach {
        /// Overwrite a device that belongs to another pool.
        #[arg(short, long)]
        force: bool,
        /// Wait until the resilver ends, showing progress.
        #[arg(short = 'w')]
        wait: bool,
        /// Create NEW as a sparse file of this size when it does not exist.
        #[arg(long)]
        size: Option<String>,
        #[arg(short = 'd', long = "dir")]
        dirs: Vec<PathBuf>,
        pool: String,
        existing: String,
        new: String,
    },
    /// Detach a side of a mirror (another side must hold every block): `detach POOL DEV`.
    Detach {
        #[arg(short = 'd', long = "dir")]
        dirs: Vec<PathBuf>,
        pool: String,
        device: String,
    },
    /// Split one side of every mirror off into a new pool, left exported:
    /// `split POOL NEWPOOL [DEV...]` (DEV: the side to take of its mirror;
    /// the last side of a mirror not named). Then `import NEWPOOL`.
    Split {
        #[arg(short = 'd', long = "dir")]
        dirs: Vec<PathBuf>,
        pool: String,
        new_pool: String,
        devices: Vec<String>,
    },
    /// Add data vdevs, log devices or hot spares to a pool: `add [-f] [--size
    /// SIZE] POOL [mirror|raidzN] DEV...`, `add POOL log [mirror] DEV...`,
    /// `add POOL spare DEV...`.
    Add {
        /// Overwrite devices that belong to another pool.
        #[arg(short, long)]
        force: bool,
        /// Create missing device files of this size (sparse), e.g. 1G.
        #[arg(long)]
        size: Option<String>,
        #[arg(short = 'd', long = "dir")]
        dirs: Vec<PathBuf>,
        pool: String,
        /// The vdevs, as at `create`: disks, `mirror`, `raidzN` groups;
        /// after `log`, log devices; after `spare`, hot spares.
        #[arg(required = true, num_args = 1..)]
        devices: Vec<String>,
    },
    /// Remove a vdev (by its name, `mirror-1`, or one of its devices) or
    /// an available hot spare: `remove POOL DEV`. A log device's records
    /// move to the main devices first, so no flushed write depends on it.
    /// A data vdev (a disk or a mirror) is emptied in the background: its
    /// blocks are copied to the other vdevs, and it leaves the pool once
    /// all are (`status` shows the progress); `-w` waits for that, `-s`
    /// stops a removal in progress. A pool that is not served waits.
    Remove {
        #[arg(short = 'd', long = "dir")]
        dirs: Vec<PathBuf>,
        /// Wait until the vdev is removed (or its removal stops).
        #[arg(short = 'w')]
        wait: bool,
        /// Stop the removal in progress: what it copied is freed and the
        /// vdev stays.
        #[arg(short = 's', conflicts_with = "wait")]
        stop: bool,
        pool: String,
        #[arg(required_unless_present = "stop")]
        device: Option<String>,
    },
    /// Per-device I/O statistics: `iostat [-q] [-l] [-r] POOL [INTERVAL [COUNT]]`.
    Iostat {
        /// Queued and active I/Os per priority class.
        #[arg(short = 'q')]
        queues: bool,
        /// Average latencies per class.
        #[arg(short = 'l')]
        latency: bool,
        /// Request size histograms (individual and aggregated).
        #[arg(short = 'r')]
        sizes: bool,
        #[arg(short = 'd', long = "dir")]
        dirs: Vec<PathBuf>,
        pool: String,
        /// Seconds between reports.
        interval: Option<f64>,
        /// Number of reports.
        count: Option<u64>,
    },
    /// The read cache: hits, misses, size and lists: `arcstat POOL
    /// [INTERVAL [COUNT]]` (`--json` for the counters).
    Arcstat {
        #[arg(short = 'd', long = "dir")]
        dirs: Vec<PathBuf>,
        pool: String,
        /// Seconds between reports.
        interval: Option<f64>,
        /// Number of reports.
        count: Option<u64>,
    },
    /// Check space accounting against a walk of every block (like zdb -b).
    Check {
        #[arg(short = 'd', long = "dir")]
        dirs: Vec<PathBuf>,
        pool: String,
    },
    /// Show or set I/O queue and txg tunables: `tune POOL [NAME VALUE]`.
    Tune {
        #[arg(short = 'd', long = "dir")]
        dirs: Vec<PathBuf>,
        pool: String,
        name: Option<String>,
        value: Option<String>,
    },
    /// Run the storage benchmark suites and write a report.
    Bench(ironpool_bench::BenchArgs),
}

#[derive(Subcommand)]
enum FsCommand {
    /// Create a filesystem: `fs create [-p] POOL/NAME[/CHILD...] [-o mountpoint=DIR] [-o recordsize=SIZE]`.
    /// A nested filesystem inherits its parent's properties and mounts under its mountpoint.
    Create {
        name: String,
        /// Create the missing parent filesystems too.
        #[arg(short = 'p')]
        parents: bool,
        /// Properties: mountpoint=DIR|none|legacy (default /POOL/NAME), recordsize=4K..1M (default 128K), atime=on|off, xattr=on|off, and compression, checksum, sync, readonly, primarycache, direct as volumes have.
        #[arg(short = 'o')]
        options: Vec<String>,
        #[arg(short = 'd', long = "dir")]
        dirs: Vec<PathBuf>,
    },
    /// List a pool's filesystems.
    List {
        pool: String,
        #[arg(short = 'd', long = "dir")]
        dirs: Vec<PathBuf>,
    },
    /// Destroy a filesystem and everything in it.
    Destroy {
        name: String,
        /// Its snapshots and every dataset below it too.
        #[arg(short = 'r')]
        recursive: bool,
        #[arg(short = 'd', long = "dir")]
        dirs: Vec<PathBuf>,
    },
}

#[derive(Subcommand)]
enum VolumeCommand {
    /// Create a volume: `volume create [-s] [-p] POOL/[FS/...]NAME SIZE [-o volblocksize=16K]`. A volume is
    /// thick (its refreservation holds its whole size) unless -s makes it sparse.
    Create {
        name: String,
        size: String,
        /// Create the missing parent filesystems too.
        #[arg(short = 'p')]
        parents: bool,
        /// Sparse: no refreservation, space is taken as the volume is written (a full pool can
        /// then refuse its writes).
        #[arg(short = 's', long = "sparse")]
        sparse: bool,
        /// Properties: volblocksize=SIZE, compression=off|lz4|zstd[-N], checksum=xxh3|blake3|fletcher4, sync=standard|always|disabled, readonly=on|off, module:key=value.
        #[arg(short = 'o')]
        options: Vec<String>,
        #[arg(short = 'd', long = "dir")]
        dirs: Vec<PathBuf>,
    },
    /// List a pool's volumes.
    List {
        pool: String,
        #[arg(short = 'd', long = "dir")]
        dirs: Vec<PathBuf>,
    },
    /// Destroy a volume and free its space.
    Destroy {
        name: String,
        /// Destroy its snapshots too.
        #[arg(short = 'r')]
        recursive: bool,
        #[arg(short = 'd', long = "dir")]
        dirs: Vec<PathBuf>,
    },
}

fn main() -> ExitCode {
    // A reader that goes away (`ironpool iostat ... | head`) ends the command
    // quietly, as for any Unix filter, instead of a panic on a broken pipe.
    // `serve` ignores SIGPIPE again for its sockets.
    // SAFETY: setting a signal's disposition before any thread starts.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let cli = Cli::parse();
    let context = cli::Context {
        control: cli.control.clone(),
        json: cli.json,
    };
    let result = match cli.command {
        Command::Create {
            force,
            size,
            pool,
            devices,
        } => cli::create(&context, &pool, &devices, force, size.as_deref()),
        Command::Serve {
            dirs,
            nbd,
            pidfile,
            tunables,
            nbd_thread,
            nbd_reply_timeout,
            metrics,
            missing_log,
            no_huge_pages,
            load_keys,
            pool,
        } => cli::serve::serve(
            &context,
            &pool,
            &dirs,
            &cli::serve::NbdOptions {
                listen: nbd,
                thread: nbd_thread,
                reply_timeout: std::time::Duration::from_secs(nbd_reply_timeout),
                metrics,
                missing_log,
                no_huge_pages,
                load_keys,
            },
            pidfile.as_deref(),
            &tunables,
        ),
        Command::Fs { command } => match command {
            FsCommand::Create {
                name,
                parents,
                options,
                dirs,
            } => cli::fs_create(&context, &name, parents, &options, &dirs),
            FsCommand::List { pool, dirs } => cli::fs_list(&context, &pool, &dirs),
            FsCommand::Destroy {
                name,
                recursive,
                dirs,
            } => cli::fs_destroy(&context, &name, recursive, &dirs),
        },
        Command::Volume { command } => match command {
            VolumeCommand::Create {
                name,
                size,
                parents,
                sparse,
                options,
                dirs,
            } => cli::volume_create(&context, &name, &size, sparse, parents, &options, &dirs),
            VolumeCommand::List { pool, dirs } => cli::volume_list(&context, &pool, &dirs),
            VolumeCommand::Destroy {
                name,
                recursive,
                dirs,
            } => cli::volume_destroy(&context, &name, &dirs, recursive),
        },
        Command::Status { dirs, pool } => cli::status(&context, &pool, &dirs),
        Command::List {
            kind,
            verbose,
            recursive,
            dirs,
            pool,
        } => cli::datasets::list(&context, &kind, verbose, recursive, pool.as_deref(), &dirs),
        Command::Snapshot {
            recursive,
            dirs,
            names,
        } => cli::datasets::snapshot(&context, &names, recursive, &dirs),
        Command::Destroy {
            recursive,
            dirs,
            name,
        } => cli::datasets::destroy(&context, &name, recursive, &dirs),
        Command::Hold {
            recursive,
            dirs,
            tag,
            snapshots,
        } => cli::datasets::hold(&context, &tag, &snapshots, recursive, true, &dirs),
        Command::Release {
            recursive,
            dirs,
            tag,
            snapshots,
        } => cli::datasets::hold(&context, &tag, &snapshots, recursive, false, &dirs),
        Command::Holds {
            recursive,
            dirs,
            snapshots,
        } => cli::datasets::holds(&context, &snapshots, recursive, &dirs),
        Command::Bookmark {
            dirs,
            source,
            bookmark,
        } => cli::datasets::bookmark(&context, &source, &bookmark, &dirs),
        Command::Diff {
            types,
            dirs,
            from,
            to,
        } => cli::datasets::diff(&context, &from, to.as_deref(), types, &dirs),
        Command::Userspace { dirs, name } => {
            cli::datasets::id_space(&context, &name, IdKind::User, &dirs)
        }
        Command::Groupspace { dirs, name } => {
            cli::datasets::id_space(&context, &name, IdKind::Group, &dirs)
        }
        Command::Projectspace { dirs, name } => {
            cli::datasets::id_space(&context, &name, IdKind::Project, &dirs)
        }
        Command::Mount { dirs, name } => cli::datasets::mount(&context, &name, true, &dirs),
        Command::Unmount { dirs, name } => cli::datasets::mount(&context, &name, false, &dirs),
        Command::Clone {
            dirs,
            origin,
            name,
            options,
        } => cli::datasets::clone(&context, &origin, &name, &options, &dirs),
        Command::Promote { dirs, name } => cli::datasets::promote(&context, &name, &dirs),
        Command::Rename {
            parents,
            recursive,
            dirs,
            from,
            to,
        } => cli::datasets::rename(&context, &from, &to, parents, recursive, &dirs),
        Command::Rollback {
            recursive,
            dirs,
            name,
        } => cli::datasets::rollback(&context, &name, recursive, &dirs),
        Command::Get {
            dirs,
            properties,
            name,
        } => cli::replication::get(&context, &properties, &name, &dirs),
        Command::Set {
            dirs,
            assignments,
            name,
        } => cli::replication::set(&context, &assignments, &name, &dirs),
        Command::Inherit {
            dirs,
            property,
            name,
        } => cli::replication::inherit(&context, &property, &name, &dirs),
        Command::Send {
            replicate: true,
            dirs,
            snapshot,
            from,
            from_all,
            raw,
            ..
        } => {
            use cli::replication::Between;
            let base = match (&from, &from_all) {
                (Some(from), _) => Some((from.as_str(), Between::Last)),
                (None, Some(from)) => Some((from.as_str(), Between::All)),
                (None, None) => None,
            };
            match snapshot {
                Some(snapshot) => {
                    cli::replication::send_replication(&context, &snapshot, base, raw, &dirs)
                }
                None => Err("send -R takes POOL/DATASET@SNAP".into()),
            }
        }
        Command::Send {
            from,
            token,
            dirs,
            snapshot,
            raw,
            ..
        } => cli::replication::send(
            &context,
            snapshot.as_deref(),
            from.as_deref(),
            token.as_deref(),
            raw,
            &dirs,
        ),
        Command::Receive {
            force,
            save_partial,
            abort,
            options,
            dirs,
            target,
        } => cli::replication::receive(
            &context,
            &target,
            cli::replication::ReceiveFlags {
                force,
                save_partial,
                abort,
            },
            &options,
            &dirs,
        ),
        Command::Scrub {
            wait,
            stop,
            dirs,
            pool,
        } => cli::scrub(&context, &pool, &dirs, wait, stop),
        Command::Trim {
            wait,
            stop,
            dirs,
            pool,
        } => cli::trim(&context, &pool, &dirs, wait, stop),
        Command::Import {
            dirs,
            force,
            missing_log,
            pool,
            new_name,
        } => cli::discovery::import(
            &context,
            &dirs,
            force,
            missing_log,
            pool.as_deref(),
            new_name.as_deref(),
        ),
        Command::Export { dirs, pool } => cli::discovery::export(&context, &pool, &dirs),
        Command::Labelclear { force, device } => {
            cli::discovery::labelclear(&context, &device, force)
        }
        Command::Iostat {
            queues,
            latency,
            sizes,
            dirs,
            pool,
            interval,
            count,
        } => cli::iostat::run(
            &context,
            &pool,
            &dirs,
            cli::iostat::Options {
                queues,
                latency,
                sizes,
                interval,
                count,
            },
        ),
        Command::Arcstat {
            dirs,
            pool,
            interval,
            count,
        } => cli::arcstat::run(&context, &pool, &dirs, interval, count),
        Command::Check { dirs, pool } => cli::check(&context, &pool, &dirs),
        Command::Events { follow, pool } => cli::events::events(&context, &pool, follow),
        Command::History { long, dirs, pool } => cli::events::history(&context, &pool, &dirs, long),
        Command::Clear { dirs, pool } => cli::device_command(
            &context,
            &pool,
            &dirs,
            ironpool::control::commands::Command::Clear,
            false,
        ),
        Command::Sync { dirs, names } => cli::sync(&context, &dirs, &names),
        Command::LoadKey {
            dirs,
            all,
            location,
            name,
        } => cli::keys::load_key(&context, all, location.as_deref(), &name, &dirs),
        Command::UnloadKey { dirs, name } => cli::keys::unload_key(&context, &name, &dirs),
        Command::ChangeKey {
            dirs,
            options,
            name,
        } => cli::keys::change_key(&context, &name, &options, &dirs),
        Command::Offline { dirs, pool, device } => cli::device_command(
            &context,
            &pool,
            &dirs,
            ironpool::control::commands::Command::Offline { device },
            false,
        ),
        Command::Online {
            wait,
            dirs,
            pool,
            device,
        } => cli::device_command(
            &context,
            &pool,
            &dirs,
            ironpool::control::commands::Command::Online { device },
            wait,
        ),
        Command::Replace {
            force,
            wait,
            size,
            dirs,
            pool,
            old,
            new,
        } => cli::replace(
            &context,
            &pool,
            &dirs,
            &old,
            &new,
            force,
            wait,
            size.as_deref(),
        ),
        Command::Attach {
            force,
            wait,
            size,
            dirs,
            pool,
            existing,
            new,
        } => cli::attach(
            &context,
            &pool,
            &dirs,
            &existing,
            &new,
            force,
            wait,
            size.as_deref(),
        ),
        Command::Detach { dirs, pool, device } => cli::detach(&context, &pool, &dirs, &device),
        Command::Split {
            dirs,
            pool,
            new_pool,
            devices,
        } => cli::split(&context, &pool, &dirs, &new_pool, &devices),
        Command::Add {
            force,
            size,
            dirs,
            pool,
            devices,
        } => cli::add(&context, &pool, &dirs, &devices, force, size.as_deref()),
        Command::Remove {
            dirs,
            wait,
            stop,
            pool,
            device,
        } => cli::remove(&context, &pool, &dirs, device, wait, stop),
        Command::Tune {
            dirs,
            pool,
            name,
            value,
        } => cli::tune(&context, &pool, &dirs, name, value),
        Command::Bench(args) => match std::env::current_exe() {
            Ok(exe) => ironpool_bench::run(args, &exe).map_err(|error| format!("{error:#}")),
            Err(error) => Err(format!("cannot find the ironpool executable: {error}")),
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("ironpool: {message}");
            ExitCode::FAILURE
        }
    }
}
