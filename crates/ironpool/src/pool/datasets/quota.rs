//! Quotas and reservations over the dataset tree: the admission of a
//! write against its dataset's limits and those above it, the figures
//! computed again at a limit, and the reservations others hold back. The
//! figures each dataset keeps, and the limits its properties set, are
//! [`crate::pool::dataset::quota`]'s; see there for how they are kept.

use std::rc::Rc;

use crate::pool::dataset::directory::ancestors;
use crate::pool::dataset::quota::{exceeded, Admitted, SpaceLimits, UsageEstimate};
use crate::pool::filesystem::Filesystem;
use crate::pool::volume::Volume;
use crate::pool::{Owner, Pool, PoolError};

/// Times the figures of a dataset are computed again when the dead lists
/// move under the computation (a snapshot destroyed meanwhile) before the
/// last known figure of its snapshots is used instead: the check runs in a
/// write, which must not wait for the admin lock that would stop them.
const USAGE_ATTEMPTS: usize = 3;

impl Pool {
    /// Admits a write of `blocks` blocks of `block_bytes` to `owner` (a
    /// filesystem's: the caller holds its lock shared, as a write does),
    /// counted at the space they take once allocated (parity and rounding
    /// included, as `used` counts them): refused with
    /// [`PoolError::QuotaExceeded`] past its quota or refquota, with
    /// [`PoolError::NoSpace`] when the space left once other datasets'
    /// reservations are set aside is short. Nothing is taken: the caller
    /// claims the space from the pool next, as any write does, and keeps
    /// the guard until its blocks are linked or held.
    ///
    /// At a limit, blocks held in memory that the write may replace count
    /// twice (the held version beside the tree's): they are written out
    /// and the figures computed again before the write is refused.
    pub(crate) async fn admit_to_dataset<'a>(
        self: &Rc<Self>,
        owner: Owner<'a>,
        blocks: u64,
        block_bytes: u64,
    ) -> Result<Admitted<'a>, PoolError> {
        if blocks == 0 {
            return Ok(Admitted {
                estimate: None,
                bytes: 0,
            });
        }
        let bytes = self.held_space_bytes(block_bytes).saturating_mul(blocks);
        let limits = owner_limits(owner);
        let estimate = usage_of(owner);
        if limits.has_quota() {
            let over = || exceeded(&owner.name(), &limits, estimate.bound(), bytes);
            if !estimate.usage.get().known || over().is_some() {
                self.compute_usage(owner).await?;
            }
            if over().is_some() && self.held_bytes(owner) > 0 {
                self.settle_held(owner).await?;
                self.compute_usage(owner).await?;
            }
            if let Some(why) = over() {
                return Err(PoolError::QuotaExceeded(why));
            }
        }
        self.check_tree_quotas(owner, bytes).await?;
        // After the quota's awaits: what the others reserved, as of now.
        let elsewhere = self.reserved_elsewhere(owner);
        // (Its own reservation is in the pool's free space already.)
        if elsewhere > 0 && bytes > self.data_available_bytes().saturating_sub(elsewhere) {
            return Err(PoolError::NoSpace);
        }
        Ok(estimate.admitted(bytes))
    }

    /// [`Pool::admit_to_dataset`] for the metadata a change of names or
    /// attributes may add (`bytes`), counted until the txg it goes into is
    /// durable (its blocks are written, and counted, only when that txg is
    /// built).
    pub(crate) async fn admit_metadata<'a>(
        self: &Rc<Self>,
        owner: Owner<'a>,
        bytes: u64,
    ) -> Result<Admitted<'a>, PoolError> {
        let admitted = self.admit_to_dataset(owner, 1, bytes).await?;
        let estimate = usage_of(owner);
        let mut metadata = estimate.metadata.borrow_mut();
        let entry = metadata.entry(self.txg.open()).or_insert(0);
        *entry = entry.saturating_add(admitted.bytes());
        Ok(admitted)
    }

    /// The space of the blocks held in memory for `owner`.
    fn held_bytes(&self, owner: Owner<'_>) -> u64 {
        match owner {
            Owner::Volume(volume) => volume.writeback.held_bytes(),
            Owner::Filesystem(fs) => fs.held_behind_bytes(),
        }
    }

    /// Writes out and links the blocks held in memory for `owner`.
    async fn settle_held(self: &Rc<Self>, owner: Owner<'_>) -> Result<(), PoolError> {
        match owner {
            Owner::Volume(volume) => {
                let volume = self.volume(&volume.short_name())?;
                self.drain_volume(&volume).await
            }
            Owner::Filesystem(fs) => {
                fs.settle_writes(None).await;
                Ok(())
            }
        }
    }

    /// The space datasets other than `owner` and the filesystems above it
    /// have reserved and not used, by their figures as last computed: the
    /// total less those shares, all kept by [`Pool::recount_reservations`]
    /// (no walk per write; the ancestors are looked at only when something
    /// else is reserved).
    pub(crate) fn reserved_elsewhere(&self, owner: Owner<'_>) -> u64 {
        let mut elsewhere = self
            .reserved_unused
            .get()
            .saturating_sub(usage_of(owner).unused_reserved.get());
        if elsewhere == 0 {
            return 0;
        }
        for (_, fs) in self.filesystems_above(&owner_short(owner)) {
            elsewhere = elsewhere.saturating_sub(fs.usage.unused_reserved.get());
        }
        elsewhere
    }

    /// The open filesystems above `short`, nearest first, by short name.
    fn filesystems_above<'a>(
        &'a self,
        short: &'a str,
    ) -> impl Iterator<Item = (&'a str, Rc<Filesystem>)> + 'a {
        ancestors(short)
            .filter_map(|ancestor| Some((ancestor, self.datasets.filesystems.get(ancestor)?)))
    }

    /// Whether a filesystem above `short` has a quota or a reservation,
    /// which its figures count towards.
    fn has_limited_ancestor(&self, short: &str) -> bool {
        self.filesystems_above(short).any(|(_, fs)| {
            let limits = fs.settings().limits;
            limits.quota != 0 || limits.reservation != 0
        })
    }

    /// The room the quotas of the filesystems above `owner` leave it, by
    /// their subtrees' figures as last computed (None: no such quota).
    fn ancestor_quota_room(&self, owner: Owner<'_>) -> Option<u64> {
        let short = owner_short(owner);
        self.filesystems_above(&short)
            .filter_map(|(ancestor, fs)| {
                let quota = fs.settings().limits.quota;
                (quota != 0).then(|| quota.saturating_sub(self.subtree_used(ancestor).0))
            })
            .min()
    }

    /// The open volumes and filesystems at and below `short`.
    fn subtree(&self, short: &str) -> (Vec<Rc<Volume>>, Vec<Rc<Filesystem>>) {
        (
            self.datasets.volumes.within(short),
            self.datasets.filesystems.within(short),
        )
    }

    /// What `short` and the datasets below it use at most now, by their
    /// figures as last computed and the writes admitted since; and
    /// whether every one of them was computed.
    fn subtree_used(&self, short: &str) -> (u64, bool) {
        let (volumes, filesystems) = self.subtree(short);
        let estimates = volumes
            .iter()
            .map(|volume| &volume.usage)
            .chain(filesystems.iter().map(|fs| &fs.usage));
        let mut used = 0u64;
        let mut known = true;
        for estimate in estimates {
            used = used.saturating_add(estimate.bound().0);
            known &= estimate.usage.get().known;
        }
        (used, known)
    }

    /// Computes again the figures of `short` and the datasets below it,
    /// for a check at an ancestor's quota during a write to `writer`
    /// (whose lock the caller holds). Another filesystem is computed only
    /// if its lock is free now: a write never waits for another dataset,
    /// and one skipped keeps its last figures.
    async fn compute_subtree(
        self: &Rc<Self>,
        short: &str,
        writer: Owner<'_>,
    ) -> Result<(), PoolError> {
        let (volumes, filesystems) = self.subtree(short);
        for volume in &volumes {
            self.compute_usage(Owner::Volume(volume)).await?;
        }
        for fs in &filesystems {
            let own = matches!(writer, Owner::Filesystem(writing) if std::ptr::eq(writing, &**fs));
            if own {
                self.compute_usage(writer).await?;
                continue;
            }
            let Some(_shared) = fs.try_shared() else {
                self.bound_busy(fs).await?;
                continue;
            };
            if !fs.is_retired() {
                self.compute_usage(Owner::Filesystem(fs)).await?;
            }
        }
        Ok(())
    }

    /// What the snapshots of dataset `short` alone hold (their dead lists,
    /// born after its origin), or None when the dead lists moved under
    /// every one of [`USAGE_ATTEMPTS`] computations (snapshots destroyed
    /// meanwhile). Needs no lock of the dataset.
    async fn snapshots_alone(self: &Rc<Self>, short: &str) -> Result<Option<u64>, PoolError> {
        for _ in 0..USAGE_ATTEMPTS {
            // The record and head of this attempt: a snapshot destroyed
            // meanwhile drops dead lists the last one named.
            let epoch = Some(self.datasets.dead_space.epoch());
            let record = self.record(short)?;
            let head = self.head_object(short)?;
            if let Some((_, dead)) = self.all_dead_space(&head, &record, epoch).await? {
                return Ok(Some(dead.allocated_after(head.dnode().origin_txg)));
            }
        }
        Ok(None)
    }

    /// Gives `fs`, whose lock another holds, figures for a check at an
    /// ancestor's quota when it has none yet, without its lock: what it
    /// referred to when the last txg was built (its header's sums) and what
    /// its snapshots hold, to which [`UsageEstimate::bound`] adds the
    /// writes admitted to it since import. A filesystem is in that state
    /// from its import until the refresh after it computes its figures,
    /// and the refresh waits for the same lock (a rollback, a receive or a
    /// rename of it holding the lock for long). Counted as nothing there,
    /// it let the datasets beside it write past their parent's quota.
    ///
    /// An upper bound, never less than the truth: what was freed since the
    /// txg, the blocks a clone shares with its origin, and writes linked
    /// before the txg count (the last twice). The figures stay unknown, so
    /// the next check that gets the lock computes them exactly. A header
    /// without sums (walked at import) gives nothing to bound with, and the
    /// filesystem keeps counting only what was admitted to it.
    async fn bound_busy(self: &Rc<Self>, fs: &Filesystem) -> Result<(), PoolError> {
        if fs.usage.usage.get().known || fs.is_retired() {
            return Ok(());
        }
        let Some(referenced) = fs.referenced_at_last_build() else {
            return Ok(());
        };
        let snapshots = self.snapshots_alone(&fs.short_name()).await?;
        let mut usage = fs.usage.usage.get();
        if usage.known {
            // Computed exactly meanwhile.
            return Ok(());
        }
        let snapshots = snapshots.unwrap_or(usage.snapshots);
        usage.snapshots = snapshots;
        usage.referenced = referenced;
        usage.used = referenced.saturating_add(snapshots);
        fs.usage.usage.set(usage);
        Ok(())
    }

    /// Refuses a write of `bytes` to `owner` that would take it (a
    /// filesystem, with what is below it) or a filesystem above it past
    /// its `quota`, which bounds the whole subtree (see the module
    /// documentation). Costs a walk up the name only, unless one of them
    /// has a quota.
    async fn check_tree_quotas(
        self: &Rc<Self>,
        owner: Owner<'_>,
        bytes: u64,
    ) -> Result<(), PoolError> {
        let short = owner_short(owner);
        // A filesystem's own quota over its subtree first (a volume has
        // none below it), then those above it; none allocates nothing.
        let own = matches!(owner, Owner::Filesystem(_)).then_some(short.as_str());
        let limited: Vec<(String, u64)> = own
            .into_iter()
            .chain(ancestors(&short))
            .filter_map(|name| {
                let quota = self.datasets.filesystems.get(name)?.settings().limits.quota;
                (quota != 0).then(|| (name.to_string(), quota))
            })
            .collect();
        for (ancestor, quota) in limited {
            let over = |pool: &Pool| {
                let (used, known) = pool.subtree_used(&ancestor);
                (!known || used.saturating_add(bytes) > quota).then_some(used)
            };
            if over(self).is_none() {
                continue;
            }
            self.compute_subtree(&ancestor, owner).await?;
            if over(self).is_some() && self.held_bytes(owner) > 0 {
                // Blocks held for the writer that it may replace count
                // twice at the limit, as in its own check.
                self.settle_held(owner).await?;
                self.compute_usage(owner).await?;
            }
            let (used, _) = self.subtree_used(&ancestor);
            if used.saturating_add(bytes) > quota {
                return Err(PoolError::QuotaExceeded(format!(
                    "{}/{ancestor}: a write of {bytes} bytes to {} would pass its quota of {quota} ({used} used by it and the datasets below it)",
                    self.name,
                    owner.name()
                )));
            }
        }
        Ok(())
    }

    /// Counts again the space every open dataset reserved and does not
    /// use (after its figures or its limits changed).
    pub(crate) fn recount_reservations(&self) {
        let mut total = 0u64;
        let mut count = |limits: SpaceLimits, estimate: &UsageEstimate, below: u64| {
            // Never computed yet (the refresh will): all of it is held back.
            let (used, referenced) = estimate.last().unwrap_or((0, 0));
            let unused = limits.unused_reservation(used.saturating_add(below), referenced);
            estimate.unused_reserved.set(unused);
            total = total.saturating_add(unused);
        };
        for volume in self.datasets.volumes.all() {
            count(volume.settings().limits, &volume.usage, 0);
        }
        for (short, fs) in self.datasets.filesystems.named() {
            let limits = fs.settings().limits;
            // A reservation covers what the datasets below it use too.
            let below = if limits.reservation != 0 {
                let (volumes, filesystems) = self.subtree(&short);
                volumes
                    .iter()
                    .map(|volume| &volume.usage)
                    .chain(
                        filesystems
                            .iter()
                            .filter(|other| !Rc::ptr_eq(other, &fs))
                            .map(|other| &other.usage),
                    )
                    .map(|estimate| estimate.last().map_or(0, |(used, _)| used))
                    .sum()
            } else {
                0
            };
            count(limits, &fs.usage, below);
        }
        self.reserved_unused.set(total);
    }

    /// Computes `owner`'s figures again: what its tree refers to, what its
    /// snapshots alone hold, and what is held in memory for it. A
    /// filesystem's caller holds its lock shared.
    async fn compute_usage(self: &Rc<Self>, owner: Owner<'_>) -> Result<(), PoolError> {
        let estimate = usage_of(owner);
        let _one = estimate.computing.acquire(1).await;
        let short = owner_short(owner).to_string();
        // What is in flight and held first, then the tree: a block linked
        // in between counts twice (an upper bound), never not at all. The
        // writes admitted so far leave `since` only if this succeeds.
        let pending_metadata: u64 = {
            let durable = self.txg.durable();
            let mut metadata = estimate.metadata.borrow_mut();
            metadata.retain(|txg, _| *txg > durable);
            metadata.values().sum()
        };
        let held = self
            .held_bytes(owner)
            .saturating_add(estimate.in_flight.get())
            .saturating_add(pending_metadata);
        let since_at_start = estimate.usage.get().since;
        let referenced = match owner {
            Owner::Volume(volume) => volume.object.dnode().used_bytes,
            Owner::Filesystem(fs) => fs.referenced_locked(self).await?.0,
        };
        // A clone refers to its origin's blocks, which are the origin
        // snapshot's and not its own: its `used` counts only what was born
        // after the origin (as OpenZFS's does), found by a walk of its
        // tree. A clone with limits pays that walk at a limit and after a
        // txg; a dataset that is no clone pays nothing.
        let head = self.head_object(&short)?;
        let own = if head.dnode().origin_txg == 0 {
            referenced
        } else {
            let fs = match owner {
                Owner::Filesystem(fs) => Some(fs),
                Owner::Volume(_) => None,
            };
            self.written_walked(&head, fs).await?.1
        };
        let snapshots = self.snapshots_alone(&short).await?;
        let mut usage = estimate.usage.get();
        let snapshots = snapshots.unwrap_or(usage.snapshots);
        usage.known = true;
        usage.snapshots = snapshots;
        usage.referenced = referenced.saturating_add(held);
        usage.used = own.saturating_add(held).saturating_add(snapshots);
        usage.since = usage.since.saturating_sub(since_at_start);
        estimate.usage.set(usage);
        if owner_limits(owner).has_reservation() {
            self.recount_reservations();
        }
        Ok(())
    }

    /// Computes the figures of every open dataset with a reservation (so
    /// that what the others may write follows what it uses) or a quota
    /// (so that `df` follows it), after each txg, at import and when a
    /// property is set. One refresh runs at a time.
    pub(crate) fn refresh_reservations(self: &Rc<Self>) {
        self.recount_reservations();
        let any = self
            .datasets
            .volumes
            .any(|volume| volume.settings().limits.is_limited())
            || self
                .datasets
                .filesystems
                .any(|fs| fs.settings().limits.is_limited());
        if !any || self.txg.is_stopping() || self.reservations_refreshing.replace(true) {
            return;
        }
        let pool = self.clone();
        crate::rt::spawn(async move {
            pool.refresh_reservations_now().await;
            pool.reservations_refreshing.set(false);
        });
    }

    /// [`Pool::refresh_reservations`], awaited. A dataset whose figures
    /// cannot be computed (a read failed) keeps its last ones; the others
    /// are computed still.
    pub(crate) async fn refresh_reservations_now(self: &Rc<Self>) {
        for (short, volume) in self.datasets.volumes.named() {
            if volume.settings().limits.is_limited() || self.has_limited_ancestor(&short) {
                if let Err(error) = self.compute_usage(Owner::Volume(&volume)).await {
                    eprintln!("ironpool: {}: space figures: {error}", volume.name());
                }
            }
        }
        for (short, fs) in self.datasets.filesystems.named() {
            if !fs.settings().limits.is_limited() && !self.has_limited_ancestor(&short) {
                continue;
            }
            let _shared = fs.shared().await;
            if fs.is_retired() {
                continue;
            }
            if let Err(error) = self.compute_usage(Owner::Filesystem(&fs)).await {
                eprintln!("ironpool: {}: space figures: {error}", fs.name());
            }
        }
    }

    /// `statfs`'s figures for `owner` (a filesystem), given the pool's
    /// `(total, available)`: the space other datasets reserved is not
    /// available, and under a quota `df` shows the quota's size and what
    /// is left of it (by the figures as last computed, with the writes
    /// admitted since), as OpenZFS's `df` does.
    pub(crate) fn limited_space(&self, owner: Owner<'_>, total: u64, available: u64) -> (u64, u64) {
        let limits = owner_limits(owner);
        let mut available = available.saturating_sub(self.reserved_elsewhere(owner));
        if let Some(room) = self.ancestor_quota_room(owner) {
            available = available.min(room);
        }
        if !limits.has_quota() {
            return (total, available);
        }
        let (_, referenced) = usage_of(owner).bound();
        let used = self.subtree_used(&owner_short(owner)).0;
        let mut bounded = (total, available);
        for (limit, figure) in [(limits.quota, used), (limits.refquota, referenced)] {
            let room = limit.saturating_sub(figure);
            if limit != 0 && room < bounded.1 {
                bounded = (figure.min(limit).saturating_add(room), room);
            }
        }
        bounded
    }

    /// [`Pool::dataset_available`] of the volume or filesystem named
    /// `dataset` (`POOL/NAME` or `NAME`).
    pub async fn available_bytes(self: &Rc<Self>, dataset: &str) -> Result<u64, PoolError> {
        let short = dataset
            .strip_prefix(&format!("{}/", self.name))
            .unwrap_or(dataset);
        if let Some(fs) = self.datasets.filesystems.get(short) {
            let _shared = fs.shared().await;
            return self.dataset_available(Owner::Filesystem(&fs)).await;
        }
        let volume = self.volume(short)?;
        self.dataset_available(Owner::Volume(&volume)).await
    }

    /// The space `owner` may still write: the pool's, less what other
    /// datasets reserved and do not use, bounded by its quotas (`available`, as OpenZFS shows it).
    /// A filesystem's caller holds its lock shared.
    pub(crate) async fn dataset_available(
        self: &Rc<Self>,
        owner: Owner<'_>,
    ) -> Result<u64, PoolError> {
        let limits = owner_limits(owner);
        self.compute_usage(owner).await?;
        let (_, referenced) = usage_of(owner).bound();
        let used = self.subtree_used(&owner_short(owner)).0;
        let mut available = self
            .data_available_bytes()
            .saturating_sub(self.reserved_elsewhere(owner));
        if limits.quota != 0 {
            available = available.min(limits.quota.saturating_sub(used));
        }
        if limits.refquota != 0 {
            available = available.min(limits.refquota.saturating_sub(referenced));
        }
        if let Some(room) = self.ancestor_quota_room(owner) {
            available = available.min(room);
        }
        Ok(available)
    }

    /// Checks the limits `properties` give a dataset being made (it uses
    /// nothing yet): a reservation past its quota, or more than the pool
    /// can set aside once the others' reservations are, is refused.
    pub(crate) fn check_new_limits(
        &self,
        name: &str,
        properties: &std::collections::BTreeMap<String, String>,
    ) -> Result<(), PoolError> {
        let limits = crate::pool::dataset::props::space_limits(properties);
        if limits.quota != 0 && limits.reservation > limits.quota {
            return Err(PoolError::InvalidArgument(format!(
                "{name}: reservation {} is more than its quota {}",
                limits.reservation, limits.quota
            )));
        }
        let wanted = limits.unused_reservation(0, 0);
        let room = self
            .data_available_bytes()
            .saturating_sub(self.reserved_unused.get());
        if wanted > room {
            return Err(PoolError::InvalidArgument(format!(
                "{name}: cannot reserve {wanted} bytes: {room} are free once other reservations are set aside"
            )));
        }
        Ok(())
    }

    /// Checks the limits `owner` is to have (set now), as OpenZFS does: a
    /// quota under what the dataset uses, a refquota under what it refers
    /// to, a reservation past its quota are refused, and the part of a
    /// reservation it does not use must fit in what is left once the other
    /// datasets' reservations are set aside. A filesystem's caller holds
    /// its lock shared.
    pub(crate) async fn check_space_limits(
        self: &Rc<Self>,
        owner: Owner<'_>,
        limits: SpaceLimits,
    ) -> Result<(), PoolError> {
        let short = owner_short(owner);
        self.compute_subtree(&short, owner).await?;
        let (_, referenced) = usage_of(owner).bound();
        // A quota and a reservation cover the datasets below it too.
        let used = self.subtree_used(&short).0;
        let name = owner.name();
        let refuse = |why: String| Err(PoolError::InvalidArgument(format!("{name}: {why}")));
        if limits.quota != 0 && limits.quota < used {
            return refuse(format!(
                "quota {} is less than the {used} bytes it uses",
                limits.quota
            ));
        }
        if limits.refquota != 0 && limits.refquota < referenced {
            return refuse(format!(
                "refquota {} is less than the {referenced} bytes it refers to",
                limits.refquota
            ));
        }
        if limits.quota != 0 && limits.reservation > limits.quota {
            return refuse(format!(
                "reservation {} is more than its quota {}",
                limits.reservation, limits.quota
            ));
        }
        let wanted = limits.unused_reservation(used, referenced);
        let had = owner_limits(owner).unused_reservation(used, referenced);
        let room = self
            .data_available_bytes()
            .saturating_sub(self.reserved_elsewhere(owner));
        if wanted > had && wanted > room {
            return Err(PoolError::InvalidArgument(format!(
                "{}: cannot reserve {} bytes more: {room} are free once other reservations are set aside",
                owner.name(),
                wanted - had
            )));
        }
        Ok(())
    }
}

/// The limits `owner`'s properties set.
fn owner_limits(owner: Owner<'_>) -> SpaceLimits {
    match owner {
        Owner::Volume(volume) => volume.settings().limits,
        Owner::Filesystem(fs) => fs.settings().limits,
    }
}

/// The figures `owner` keeps.
fn usage_of<'a>(owner: Owner<'a>) -> &'a UsageEstimate {
    match owner {
        Owner::Volume(volume) => &volume.usage,
        Owner::Filesystem(fs) => &fs.usage,
    }
}

/// `owner`'s name in the pool directory.
fn owner_short(owner: Owner<'_>) -> String {
    match owner {
        Owner::Volume(volume) => volume.short_name(),
        Owner::Filesystem(fs) => fs.short_name(),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::dev::sim::SimDevice;
    use crate::format::label::TopVdevKind;
    use crate::format::znode::S_IFREG;
    use crate::pool::filesystem::{FsError, NewObject};
    use crate::pool::test_pool::{named, sim_pool, unhurried};
    use crate::rt::Runtime;

    const MIB: usize = 1 << 20;

    /// Writes a new file `name` of `bytes` bytes in the root of `fs`.
    async fn write_file(
        pool: &Rc<Pool>,
        fs: &Filesystem,
        name: &[u8],
        bytes: usize,
    ) -> Result<(), FsError> {
        let mode = NewObject::owned(S_IFREG | 0o644, 0, 0);
        let file = fs.create(pool, fs.root(), name, &mode).await?;
        fs.write(pool, file.ino, 0, &vec![7u8; bytes]).await?;
        Ok(())
    }

    /// A filesystem imported a moment ago has no figures until the refresh
    /// after import computes them, under its lock. While another holds
    /// that lock, a write beside it under their parent's quota counted it
    /// as nothing, and passed the quota by what it holds.
    #[test]
    fn a_busy_sibling_not_yet_computed_still_counts_at_the_parents_quota() {
        let disks = [SimDevice::new("d0", 256 << 20, 61)];
        Runtime::new_sim(61).block_on({
            let disks = disks.clone();
            async move {
                let pool = sim_pool(&disks, TopVdevKind::Disk, unhurried()).await;
                let quota = BTreeMap::from([("quota".to_string(), "8M".to_string())]);
                pool.create_filesystem("tank/p", quota).await.unwrap();
                for child in ["tank/p/a", "tank/p/b"] {
                    pool.create_filesystem(child, BTreeMap::new())
                        .await
                        .unwrap();
                }
                let b = pool.filesystem("tank/p/b").unwrap();
                write_file(&pool, &b, b"held", 6 * MIB).await.unwrap();
                pool.export().await.unwrap();
            }
        });
        Runtime::new_sim(62).block_on(async move {
            let pool = Pool::import_from_devices("tank", named(&disks), unhurried())
                .await
                .unwrap();
            let b = pool.filesystem("tank/p/b").unwrap();
            // Taken before the refresh after import reaches it (as a
            // rollback or a receive of it would).
            let busy = b.exclusive().await;
            assert!(b.usage.last().is_none(), "b not computed yet");
            let a = pool.filesystem("tank/p/a").unwrap();
            let refused = write_file(&pool, &a, b"past", 4 * MIB).await;
            assert!(
                matches!(&refused, Err(error) if error.errno() == libc::EDQUOT),
                "6 MiB in b and 4 MiB more in a under a quota of 8 MiB: {refused:?}"
            );
            // What fits beside b's data is written.
            write_file(&pool, &a, b"fits", MIB).await.unwrap();
            drop(busy);
            pool.refresh_reservations_now().await;
            let (b_used, _) = b.usage.last().expect("b computed once its lock is free");
            assert!(b_used >= 6 * MIB as u64, "b uses {b_used}");
            pool.export().await.unwrap();
        });
    }
}
