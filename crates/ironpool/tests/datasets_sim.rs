//! Snapshots, clones, rollback and promote on simulated devices, with space
//! accounting checked against a full walk.

use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

use ironpool::dev::sim::SimDevice;
use ironpool::dev::Device;
use ironpool::format::label::TopVdevKind;
use ironpool::format::ObjectType;
use ironpool::pool::datasets::snapshot::SnapshotInfo;
use ironpool::pool::volume::ReadPiece;
use ironpool::pool::{NewDevice, NewTopVdev, Pool, PoolTunables};
use ironpool::rt::buf::{AlignedBuf, BufSlice};
use ironpool::rt::sim::Rng;
use ironpool::rt::Runtime;

const DEVICE_BYTES: u64 = 256 << 20;
const VOLUME_BYTES: u64 = 16 << 20;
const BLOCK: u64 = 16384;

fn layout(devices: &[Rc<SimDevice>]) -> Vec<NewTopVdev> {
    vec![NewTopVdev {
        log: false,
        kind: TopVdevKind::Mirror,
        devices: devices
            .iter()
            .enumerate()
            .map(|(index, device)| NewDevice {
                path: format!("sim:d{index}"),
                device: device.clone() as Rc<dyn Device>,
            })
            .collect(),
    }]
}

/// The two devices of a mirror, their faults seeded from `seed` on.
fn sim_devices(seed: u64) -> Vec<Rc<SimDevice>> {
    (0..2)
        .map(|index| SimDevice::new(&format!("d{index}"), DEVICE_BYTES, seed + index))
        .collect()
}

/// Pool "tank", a mirror of `devices`.
async fn create_pool(devices: &[Rc<SimDevice>]) -> Rc<Pool> {
    create_pool_with(devices, tunables()).await
}

async fn create_pool_with(devices: &[Rc<SimDevice>], tunables: PoolTunables) -> Rc<Pool> {
    Pool::create_on_devices("tank", layout(devices), false, tunables)
        .await
        .unwrap()
}

async fn import_pool(devices: &[Rc<SimDevice>], tunables: PoolTunables) -> Rc<Pool> {
    let runtime_devices: Vec<(String, Rc<dyn Device>)> = devices
        .iter()
        .enumerate()
        .map(|(index, device)| (format!("sim:d{index}"), device.clone() as Rc<dyn Device>))
        .collect();
    Pool::import_from_devices("tank", runtime_devices, tunables)
        .await
        .unwrap()
}

fn tunables() -> PoolTunables {
    PoolTunables {
        txg_timeout: Duration::from_millis(50),
        ..PoolTunables::default()
    }
}

/// [`tunables`] with a cache of one byte: every load evicts every clean,
/// durable node that may go (a volume's, a dead list's data blocks but its
/// last), so what is read after is read from the devices.
fn tiny_cache_tunables() -> PoolTunables {
    PoolTunables {
        cache_budget_bytes: 1,
        ..tunables()
    }
}

fn filled(length: usize, value: u8) -> BufSlice {
    let mut buffer = AlignedBuf::zeroed(length);
    buffer.fill(value);
    BufSlice::whole(buffer.into_shared())
}

async fn read_all(pool: &Rc<Pool>, name: &str) -> Vec<u8> {
    let volume = if name.contains('@') {
        pool.snapshot_volume(name).await.unwrap()
    } else {
        pool.volume(name).unwrap()
    };
    ReadPiece::concat(pool.read(&volume, 0, VOLUME_BYTES).await.unwrap())
}

async fn checked(pool: &Rc<Pool>) {
    let report = pool.check_space().await.unwrap();
    assert!(report.problems.is_empty(), "{:#?}", report.problems);
}

/// Volume "tank/vol" of `bytes` in 4 KiB blocks, written whole with
/// `values[0]`, snapshot @a, with `values[1]`, snapshot @b, then with
/// `values[2]` and committed: each snapshot alone holds one copy, on a
/// dead list of a pointer per block.
async fn volume_overwritten_under_two_snapshots(pool: &Rc<Pool>, bytes: u64, values: [u8; 3]) {
    let volume = pool
        .create_volume("tank/vol", bytes, 4096, BTreeMap::new())
        .await
        .unwrap();
    for (value, snapshot) in [(values[0], "tank/vol@a"), (values[1], "tank/vol@b")] {
        pool.write(&volume, 0, filled(bytes as usize, value), false)
            .await
            .unwrap();
        pool.snapshot(&[snapshot.to_string()]).await.unwrap();
    }
    pool.write(&volume, 0, filled(bytes as usize, values[2]), false)
        .await
        .unwrap();
    pool.commit().await.unwrap();
}

/// A snapshot listing's (name, used, referenced) figures.
fn figures(infos: &[SnapshotInfo]) -> Vec<(String, u64, u64)> {
    infos
        .iter()
        .map(|info| (info.name.clone(), info.used_bytes, info.referenced_bytes))
        .collect()
}

#[test]
fn snapshots_clones_rollback_and_promote_keep_every_view_and_the_space_exact() {
    let devices = sim_devices(40);
    let runtime = Runtime::new_sim(40);
    runtime.block_on(async {
        let pool = create_pool(&devices).await;
        let volume = pool
            .create_volume("tank/vol", VOLUME_BYTES, BLOCK as u32, BTreeMap::new())
            .await
            .unwrap();
        pool.write(&volume, 0, filled(4 << 20, 0xaa), false)
            .await
            .unwrap();
        pool.snapshot(&["tank/vol@one".to_string()]).await.unwrap();
        pool.write(&volume, 1 << 20, filled(1 << 20, 0xbb), false)
            .await
            .unwrap();
        pool.snapshot(&["tank/vol@two".to_string()]).await.unwrap();
        pool.write(&volume, 0, filled(512 << 10, 0xcc), false)
            .await
            .unwrap();
        pool.zero(&volume, 3 << 20, 1 << 20, false, true)
            .await
            .unwrap();
        checked(&pool).await;
        let one = read_all(&pool, "tank/vol@one").await;
        let two = read_all(&pool, "tank/vol@two").await;
        let head = read_all(&pool, "tank/vol").await;
        assert!(
            one[..4 << 20].iter().all(|byte| *byte == 0xaa)
                && one[4 << 20..].iter().all(|byte| *byte == 0)
        );
        assert!(
            two[1 << 20..2 << 20].iter().all(|byte| *byte == 0xbb)
                && two[..1 << 20].iter().all(|byte| *byte == 0xaa)
        );
        assert!(
            head[..512 << 10].iter().all(|byte| *byte == 0xcc)
                && head[3 << 20..4 << 20].iter().all(|byte| *byte == 0)
        );
        let space = pool.volume_space("tank/vol").await.unwrap();
        assert_eq!(
            space.used_bytes,
            space.used_by_dataset_bytes
                + space.used_by_snapshots_bytes
                + space.used_by_refreservation_bytes
        );
        assert!(space.used_by_snapshots_bytes > 0);
        // A clone of @one, written to, then promoted.
        let clone = pool
            .clone_snapshot("tank/vol@one", "tank/copy")
            .await
            .unwrap();
        pool.write(&clone, 2 << 20, filled(256 << 10, 0xdd), false)
            .await
            .unwrap();
        checked(&pool).await;
        let copy = read_all(&pool, "tank/copy").await;
        assert!(
            copy[2 << 20..(2 << 20) + (256 << 10)]
                .iter()
                .all(|byte| *byte == 0xdd)
                && copy[..2 << 20].iter().all(|byte| *byte == 0xaa)
        );
        assert!(
            pool.destroy_snapshot("tank/vol@one").await.is_err(),
            "a snapshot with clones must not go"
        );
        pool.promote("tank/copy").await.unwrap();
        checked(&pool).await;
        assert_eq!(
            read_all(&pool, "tank/copy@one").await,
            one,
            "the promoted clone owns @one"
        );
        assert_eq!(read_all(&pool, "tank/vol@two").await, two);
        assert_eq!(read_all(&pool, "tank/vol").await, head);
        // Rollback of vol to @two.
        pool.rollback("tank/vol@two", false).await.unwrap();
        checked(&pool).await;
        assert_eq!(read_all(&pool, "tank/vol").await, two);
        // Destroy everything; all space comes back.
        pool.destroy_snapshot("tank/vol@two").await.unwrap();
        checked(&pool).await;
        pool.destroy_volume("tank/vol", false).await.unwrap();
        checked(&pool).await;
        pool.destroy_volume("tank/copy", true).await.unwrap();
        checked(&pool).await;
        pool.export().await.unwrap();
    });
    // Everything above survives an import.
    let runtime = Runtime::new_sim(41);
    runtime.block_on(async {
        let pool = Pool::import_from_devices(
            "tank",
            devices
                .iter()
                .enumerate()
                .map(|(index, device)| (format!("sim:d{index}"), device.clone() as Rc<dyn Device>))
                .collect(),
            tunables(),
        )
        .await
        .unwrap();
        assert!(pool.open_volumes().is_empty());
        checked(&pool).await;
        pool.export().await.unwrap();
    });
}

/// The model of what every dataset must contain.
#[derive(Default)]
struct Model {
    /// volume -> content
    volumes: BTreeMap<String, Vec<u8>>,
    /// volume -> snapshots in order (name, content)
    snapshots: BTreeMap<String, Vec<(String, Vec<u8>)>>,
    /// volume -> origin "vol@snap"
    origins: BTreeMap<String, String>,
    next_name: u64,
}

impl Model {
    fn has_clones(&self, volume: &str, snapshot: &str) -> bool {
        let full = format!("{volume}@{snapshot}");
        self.origins.values().any(|origin| *origin == full)
    }
}

/// The space figures a full walk of every tree gives, for one volume.
async fn walked_space(
    pool: &Rc<Pool>,
    volume: &str,
) -> (u64, u64, u64, u64, Vec<(String, u64, u64)>) {
    use ironpool::format::BlockPointer;
    use std::collections::HashMap;
    async fn tree(
        pool: &Rc<Pool>,
        object: &ironpool::object::Object,
    ) -> HashMap<(u32, u64), BlockPointer> {
        let mut pointers = HashMap::new();
        pool.objects()
            .visit_pointers(object, &mut |_, _, pointer| {
                pointers.insert((pointer.dvas[0].vdev, pointer.dvas[0].offset), *pointer);
            })
            .await
            .unwrap();
        pointers
    }
    let record = pool.directory().volumes[volume].clone();
    let head = pool.volume(volume).unwrap();
    let origin_txg = head.object.dnode().origin_txg;
    let head_tree = tree(pool, &head.object).await;
    let mut snapshot_trees = Vec::new();
    for snapshot in &record.lineage.snapshots {
        let object = pool.objects().open(snapshot.object).await.unwrap();
        snapshot_trees.push((
            snapshot.name.clone(),
            snapshot.txg,
            tree(pool, &object).await,
            object.dnode().used_bytes,
        ));
    }
    let referenced: u64 = head_tree.values().map(BlockPointer::allocated_bytes).sum();
    let by_dataset: u64 = head_tree
        .values()
        .filter(|pointer| pointer.birth_txg > origin_txg)
        .map(BlockPointer::allocated_bytes)
        .sum();
    let mut only_snapshots: HashMap<(u32, u64), BlockPointer> = HashMap::new();
    for (_, _, snapshot_tree, _) in &snapshot_trees {
        for (key, pointer) in snapshot_tree {
            if !head_tree.contains_key(key) && pointer.birth_txg > origin_txg {
                only_snapshots.insert(*key, *pointer);
            }
        }
    }
    let by_snapshots: u64 = only_snapshots
        .values()
        .map(BlockPointer::allocated_bytes)
        .sum();
    let latest = record
        .lineage
        .snapshots
        .last()
        .map(|snapshot| snapshot.txg)
        .unwrap_or(origin_txg);
    let written: u64 = head_tree
        .values()
        .filter(|pointer| pointer.birth_txg > latest)
        .map(BlockPointer::allocated_bytes)
        .sum();
    let mut per_snapshot = Vec::new();
    for (index, (name, _, snapshot_tree, referenced)) in snapshot_trees.iter().enumerate() {
        let previous = if index == 0 {
            origin_txg
        } else {
            snapshot_trees[index - 1].1
        };
        let next = snapshot_trees
            .get(index + 1)
            .map(|next| &next.2)
            .unwrap_or(&head_tree);
        let unique: u64 = snapshot_tree
            .iter()
            .filter(|(key, pointer)| pointer.birth_txg > previous && !next.contains_key(*key))
            .map(|(_, pointer)| pointer.allocated_bytes())
            .sum();
        per_snapshot.push((name.clone(), unique, *referenced));
    }
    (referenced, by_dataset, by_snapshots, written, per_snapshot)
}

async fn verify(pool: &Rc<Pool>, model: &Model, rng: &mut Rng, step: usize, seed: u64) {
    for (volume, content) in &model.volumes {
        let name = format!("tank/{volume}");
        assert_eq!(
            &read_all(pool, &name).await,
            content,
            "seed {seed} step {step}: {name} content"
        );
        for (snapshot, snapshot_content) in &model.snapshots[volume] {
            if rng.chance(1, 3) {
                assert_eq!(
                    &read_all(pool, &format!("{name}@{snapshot}")).await,
                    snapshot_content,
                    "seed {seed} step {step}: {name}@{snapshot} content"
                );
            }
        }
        let (referenced, by_dataset, by_snapshots, written, per_snapshot) =
            walked_space(pool, volume).await;
        let space = pool.volume_space(&name).await.unwrap();
        assert_eq!(
            space.referenced_bytes, referenced,
            "seed {seed} step {step}: {name} referenced"
        );
        assert_eq!(
            space.used_by_dataset_bytes, by_dataset,
            "seed {seed} step {step}: {name} usedbydataset"
        );
        assert_eq!(
            space.used_by_snapshots_bytes, by_snapshots,
            "seed {seed} step {step}: {name} usedbysnapshots"
        );
        assert_eq!(
            space.used_bytes,
            by_dataset + by_snapshots,
            "seed {seed} step {step}: {name} used"
        );
        assert_eq!(
            space.written_bytes, written,
            "seed {seed} step {step}: {name} written"
        );
        let listed = pool.snapshots(&name).await.unwrap();
        assert_eq!(listed.len(), per_snapshot.len());
        for (info, (snapshot, unique, snapshot_referenced)) in listed.iter().zip(per_snapshot) {
            assert_eq!(info.name, format!("{name}@{snapshot}"));
            assert_eq!(
                info.used_bytes, unique,
                "seed {seed} step {step}: {} used",
                info.name
            );
            assert_eq!(
                info.referenced_bytes, snapshot_referenced,
                "seed {seed} step {step}: {} referenced",
                info.name
            );
        }
    }
    let report = pool.check_space().await.unwrap();
    assert!(
        report.problems.is_empty(),
        "seed {seed} step {step}: {:#?}",
        report.problems
    );
}

fn random_volume(model: &Model, rng: &mut Rng) -> Option<String> {
    let names: Vec<&String> = model.volumes.keys().collect();
    (!names.is_empty()).then(|| names[rng.below(names.len() as u64) as usize].clone())
}

async fn model_run(seed: u64, steps: usize) {
    let mut rng = Rng::new(seed);
    let devices = sim_devices(seed * 10);
    // Seeds 4 to 7 (of each 8) run with a cache of one byte: the dead
    // lists' blocks are read from the devices each time they are read.
    let tunables = if (seed / 4) % 2 == 1 {
        tiny_cache_tunables()
    } else {
        tunables()
    };
    let pool = create_pool_with(&devices, tunables.clone()).await;
    let mut model = Model::default();
    // Odd seeds compress (the pool's setting, inherited by every volume and
    // clone): accounting must hold with compressed blocks too.
    if seed % 2 == 1 {
        let setting = BTreeMap::from([(
            "compression".to_string(),
            if seed % 4 == 1 { "lz4" } else { "zstd" }.to_string(),
        )]);
        pool.set_properties("tank", &setting).await.unwrap();
    }
    // Seeds 2 and 3 (of each 4) move blocks let go of onto dead lists as
    // soon as three are pending, in the open txg (`Pool::spill_dead`), the
    // others at the txg build: the figures and the snapshots' contents must
    // be the same either way.
    if (seed / 2) % 2 == 1 {
        pool.set_tunable("dead_spill_pointers", "3").unwrap();
    }
    pool.create_volume("tank/v0", VOLUME_BYTES, BLOCK as u32, BTreeMap::new())
        .await
        .unwrap();
    model
        .volumes
        .insert("v0".into(), vec![0u8; VOLUME_BYTES as usize]);
    model.snapshots.insert("v0".into(), Vec::new());
    for step in 0..steps {
        let Some(volume) = random_volume(&model, &mut rng) else {
            break;
        };
        let name = format!("tank/{volume}");
        let choice = rng.below(100);
        if std::env::var_os("IRONPOOL_MODEL_TRACE").is_some() {
            eprintln!(
                "seed {seed} step {step}: op {choice} on {volume}; snapshots {:?}; origins {:?}",
                model
                    .snapshots
                    .iter()
                    .map(|(volume, snapshots)| (
                        volume.clone(),
                        snapshots
                            .iter()
                            .map(|(name, _)| name.clone())
                            .collect::<Vec<_>>()
                    ))
                    .collect::<Vec<_>>(),
                model.origins
            );
        }
        match choice {
            0..=44 => {
                let offset = rng.below(VOLUME_BYTES / 512) * 512;
                let length = (1 + rng.below(64)) * 4096;
                let length = length.min(VOLUME_BYTES - offset);
                let value = rng.below(255) as u8 + 1;
                let handle = pool.volume(&name).unwrap();
                if rng.chance(1, 6) {
                    pool.zero(&handle, offset, length, false, rng.chance(1, 2))
                        .await
                        .unwrap();
                    model.volumes.get_mut(&volume).unwrap()
                        [offset as usize..(offset + length) as usize]
                        .fill(0);
                } else {
                    pool.write(&handle, offset, filled(length as usize, value), false)
                        .await
                        .unwrap();
                    model.volumes.get_mut(&volume).unwrap()
                        [offset as usize..(offset + length) as usize]
                        .fill(value);
                }
            }
            45..=59 => {
                model.next_name += 1;
                let snapshot = format!("s{}", model.next_name);
                pool.snapshot(&[format!("{name}@{snapshot}")])
                    .await
                    .unwrap();
                let content = model.volumes[&volume].clone();
                model
                    .snapshots
                    .get_mut(&volume)
                    .unwrap()
                    .push((snapshot, content));
            }
            60..=69 => {
                let snapshots = model.snapshots[&volume].clone();
                if snapshots.is_empty() {
                    continue;
                }
                let index = rng.below(snapshots.len() as u64) as usize;
                let snapshot = &snapshots[index].0;
                let result = pool.destroy_snapshot(&format!("{name}@{snapshot}")).await;
                if model.has_clones(&volume, snapshot) {
                    assert!(
                        result.is_err(),
                        "seed {seed} step {step}: destroyed a snapshot with clones"
                    );
                } else {
                    result.unwrap();
                    model.snapshots.get_mut(&volume).unwrap().remove(index);
                }
            }
            70..=77 => {
                let snapshots = model.snapshots[&volume].clone();
                if snapshots.is_empty() || model.volumes.len() >= 4 {
                    continue;
                }
                let (snapshot, content) =
                    snapshots[rng.below(snapshots.len() as u64) as usize].clone();
                model.next_name += 1;
                let clone = format!("c{}", model.next_name);
                pool.clone_snapshot(&format!("{name}@{snapshot}"), &format!("tank/{clone}"))
                    .await
                    .unwrap();
                model.volumes.insert(clone.clone(), content);
                model.snapshots.insert(clone.clone(), Vec::new());
                model.origins.insert(clone, format!("{volume}@{snapshot}"));
            }
            78..=85 => {
                let snapshots = model.snapshots[&volume].clone();
                if snapshots.is_empty() {
                    continue;
                }
                let index = rng.below(snapshots.len() as u64) as usize;
                let later_have_clones = snapshots[index + 1..]
                    .iter()
                    .any(|(later, _)| model.has_clones(&volume, later));
                let result = pool
                    .rollback(&format!("{name}@{}", snapshots[index].0), true)
                    .await;
                if later_have_clones {
                    assert!(
                        result.is_err(),
                        "seed {seed} step {step}: rollback destroyed snapshots with clones"
                    );
                } else {
                    result.unwrap();
                    model
                        .snapshots
                        .get_mut(&volume)
                        .unwrap()
                        .truncate(index + 1);
                    model
                        .volumes
                        .insert(volume.clone(), snapshots[index].1.clone());
                }
            }
            86..=92 => {
                let Some(origin) = model.origins.get(&volume).cloned() else {
                    continue;
                };
                pool.promote(&name).await.unwrap();
                let (origin_volume, origin_snapshot) = origin.split_once('@').unwrap();
                let origin_snapshots = model.snapshots.get_mut(origin_volume).unwrap();
                let split = origin_snapshots
                    .iter()
                    .position(|(snapshot, _)| snapshot == origin_snapshot)
                    .unwrap();
                let moved: Vec<(String, Vec<u8>)> = origin_snapshots.drain(..=split).collect();
                let grand_origin = model.origins.remove(origin_volume);
                // Clones of moved snapshots now hang off the promoted volume.
                for (moved_name, _) in &moved {
                    let old = format!("{origin_volume}@{moved_name}");
                    for value in model.origins.values_mut() {
                        if *value == old {
                            *value = format!("{volume}@{moved_name}");
                        }
                    }
                }
                model.origins.remove(&volume);
                if let Some(grand) = grand_origin {
                    model.origins.insert(volume.clone(), grand);
                }
                model.origins.insert(
                    origin_volume.to_string(),
                    format!("{volume}@{origin_snapshot}"),
                );
                let own = std::mem::take(model.snapshots.get_mut(&volume).unwrap());
                let target = model.snapshots.get_mut(&volume).unwrap();
                target.extend(moved);
                target.extend(own);
            }
            _ => {
                if model.volumes.len() <= 1 {
                    continue;
                }
                let blocked = model.snapshots[&volume]
                    .iter()
                    .any(|(snapshot, _)| model.has_clones(&volume, snapshot));
                let result = pool.destroy_volume(&name, true).await;
                if blocked {
                    assert!(
                        result.is_err(),
                        "seed {seed} step {step}: destroyed a volume whose snapshots have clones"
                    );
                } else {
                    result.unwrap();
                    model.volumes.remove(&volume);
                    model.snapshots.remove(&volume);
                    model.origins.remove(&volume);
                }
            }
        }
        verify(&pool, &model, &mut rng, step, seed).await;
    }
    pool.scrub_start().unwrap();
    pool.scrub_wait().await;
    let scrub = pool.scrub_status();
    assert_eq!(
        scrub.errors + scrub.bad_copies,
        0,
        "seed {seed}: {:?}",
        scrub.error_details
    );
    pool.export().await.unwrap();
    // And after an import.
    let pool = import_pool(&devices, tunables).await;
    verify(&pool, &model, &mut rng, steps, seed).await;
    pool.export().await.unwrap();
}

#[test]
fn random_dataset_operations_match_a_model_in_content_and_space() {
    let seeds: u64 = std::env::var("IRONPOOL_MODEL_SEEDS")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(4);
    let first: u64 = std::env::var("IRONPOOL_MODEL_FIRST_SEED")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(1);
    for seed in first..first + seeds {
        eprintln!("model seed {seed}");
        let runtime = Runtime::new_sim(seed);
        runtime.block_on(model_run(seed, 60));
    }
}

/// The space of a dataset's snapshots listed while one of them is
/// destroyed: the destroy drops the dead list the listing is reading (its
/// 8192 pointers take two slices, with a turn of the loop between), and
/// the listing starts again. It never fails on the list that went, and it
/// gives the figures the pool has once the destroy is done.
#[test]
fn snapshots_listed_while_one_is_destroyed_start_again_and_are_exact() {
    let devices = sim_devices(50);
    let runtime = Runtime::new_sim(50);
    runtime.block_on(async {
        let pool = create_pool(&devices).await;
        let bytes: u64 = 32 << 20;
        volume_overwritten_under_two_snapshots(&pool, bytes, [0xa1, 0xa2, 0xa3]).await;
        // Destroying @a drops @b's list, the first the listing reads.
        let ((), listed) = futures_util::future::join(
            async { pool.destroy_snapshot("tank/vol@a").await.unwrap() },
            pool.snapshots("tank/vol"),
        )
        .await;
        let listed = figures(&listed.expect("a listing while a snapshot is destroyed"));
        let after = figures(&pool.snapshots("tank/vol").await.unwrap());
        assert_eq!(listed, after, "the listing started again after the drop");
        // @b alone holds the second overwrite's 32 MiB now (and @a's first).
        assert_eq!(after.len(), 1);
        assert!(after[0].1 >= bytes, "{after:?}");
        checked(&pool).await;
        pool.export().await.unwrap();
    });
}

/// Dead-list bytes of `pool` as (listed, cached): the pointers its dead
/// lists hold and the bytes of their blocks in memory.
fn dead_list_bytes(pool: &Rc<Pool>) -> Vec<(u64, usize)> {
    pool.objects()
        .open_objects()
        .iter()
        .filter(|object| object.dnode().object_type == ObjectType::DeadList)
        .map(|object| (object.dnode().length_bytes, object.cached().1))
        .collect()
}

/// A dead list is not kept whole in memory: only what the txg build
/// changes without I/O (its indirect blocks and its last data block) stays;
/// the rest is read when a space query, a destroy or a check asks, and its
/// figures and the snapshots' contents are what they were, before and
/// after an import. Kept whole, the lists of a volume overwritten under
/// snapshots took 128 bytes of memory per block let go, without bound.
#[test]
fn dead_lists_are_read_when_asked_not_kept_whole_in_memory() {
    // 8192 blocks of 4 KiB: each overwrite lets go of a list of 1 MiB (64
    // data blocks of 16 KiB under one indirect block of 32 KiB).
    const BYTES: u64 = 32 << 20;
    const LIST_BYTES: u64 = (BYTES / 4096) * 128;
    // Its indirect block, its last data block and the one read last
    // (evicted by the next load).
    const KEPT_MAX: usize = 64 << 10;
    let devices = sim_devices(60);
    let runtime = Runtime::new_sim(60);
    runtime.block_on(async {
        let assert_not_whole = |pool: &Rc<Pool>, when: &str| {
            let lists = dead_list_bytes(pool);
            // (The volume's indirect blocks are on the lists too.)
            assert_eq!(
                lists
                    .iter()
                    .filter(|(listed, _)| *listed >= LIST_BYTES)
                    .count(),
                2,
                "{when}: {lists:?}"
            );
            for (listed, cached) in &lists {
                assert!(
                    *cached <= KEPT_MAX,
                    "{when}: a dead list of {listed} bytes keeps {cached} bytes in memory"
                );
            }
        };
        let pool = create_pool_with(&devices, tiny_cache_tunables()).await;
        volume_overwritten_under_two_snapshots(&pool, BYTES, [0xb1, 0xb2, 0xb3]).await;
        pool.commit().await.unwrap();
        // Loads (here of the snapshot's tree, which nothing cached) evict
        // what may go.
        assert!(read_all(&pool, "tank/vol")
            .await
            .iter()
            .all(|byte| *byte == 0xb3));
        assert!(read_all(&pool, "tank/vol@a")
            .await
            .iter()
            .all(|byte| *byte == 0xb1));
        assert_not_whole(&pool, "after the writes and a read");
        let before = figures(&pool.snapshots("tank/vol").await.unwrap());
        // Each snapshot alone holds one overwritten copy.
        assert_eq!(before.len(), 2);
        assert!(
            before.iter().all(|(_, used, _)| *used >= BYTES),
            "{before:?}"
        );
        checked(&pool).await;
        assert_not_whole(&pool, "after a space query and a check");
        pool.export().await.unwrap();

        let pool = import_pool(&devices, tiny_cache_tunables()).await;
        assert_not_whole(&pool, "after the import");
        assert_eq!(figures(&pool.snapshots("tank/vol").await.unwrap()), before);
        assert!(read_all(&pool, "tank/vol@a")
            .await
            .iter()
            .all(|byte| *byte == 0xb1));
        assert!(read_all(&pool, "tank/vol@b")
            .await
            .iter()
            .all(|byte| *byte == 0xb2));
        checked(&pool).await;
        // Destroying @a reads @b's list, frees what only @a held, and
        // appends the rest to @a's list, which becomes @b's.
        pool.destroy_snapshot("tank/vol@a").await.unwrap();
        pool.commit().await.unwrap();
        checked(&pool).await;
        let after = figures(&pool.snapshots("tank/vol").await.unwrap());
        assert_eq!(after.len(), 1);
        assert_eq!(after[0].0, "tank/vol@b");
        assert!(after[0].1 >= BYTES, "{after:?}");
        assert!(read_all(&pool, "tank/vol@b")
            .await
            .iter()
            .all(|byte| *byte == 0xb2));
        for (listed, cached) in dead_list_bytes(&pool) {
            assert!(
                cached <= KEPT_MAX,
                "a dead list of {listed} bytes keeps {cached} bytes"
            );
        }
        pool.export().await.unwrap();
    });
}
