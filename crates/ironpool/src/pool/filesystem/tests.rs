use super::*;
use crate::dev::sim::SimDevice;
use crate::format::label::TopVdevKind;
use crate::format::znode::S_IFREG;
use crate::pool::test_pool::{named, sim_pool, unhurried};
use crate::pool::PoolTunables;
use crate::rt::Runtime;

async fn mirror_pool(disks: &[Rc<SimDevice>], tunables: PoolTunables) -> Rc<Pool> {
    sim_pool(disks, TopVdevKind::Mirror, tunables).await
}

/// The blocks a truncate freed ahead are passed a run at a time when
/// its exclusive step walks them again: a run of hole pointers in one
/// indirect node is one span, up to the node's end or to a block that
/// holds data. (Passed a block at a time, a 3 GiB file of 16K records
/// held its filesystem for 30 ms.)
#[test]
fn a_run_of_holes_in_an_indirect_node_is_one_span() {
    let disks: Vec<Rc<SimDevice>> = (0..2)
        .map(|index| SimDevice::new(&format!("d{index}"), 256 << 20, 42 + index))
        .collect();
    Runtime::new_sim(42).block_on(async move {
        let pool = mirror_pool(&disks, PoolTunables::default()).await;
        let properties = BTreeMap::from([("recordsize".to_string(), "4K".to_string())]);
        let fs = pool.create_filesystem("tank/fs", properties).await.unwrap();
        let mode = NewObject::owned(S_IFREG | 0o644, 0, 0);
        let file = fs.create(&pool, fs.root(), b"f", &mode).await.unwrap();
        let (object, _) = fs.load(file.ino).await.unwrap();
        let per_node = 1u64 << object.dnode().pointers_per_indirect_shift();
        let blocks = per_node * 2 + 52;
        fs.write(&pool, file.ino, 0, &vec![5; blocks as usize * 4096])
            .await
            .unwrap();
        pool.commit().await.unwrap();
        let span = |blkid| {
            let (fs, object) = (fs.clone(), object.clone());
            async move { fs.objects.hole_span(&object, blkid).await.unwrap() }
        };
        assert_eq!(span(0).await, 0, "written");

        // Freed in the open txg: the indirect nodes are in memory, full
        // of holes, and still linked above.
        fs.punch_range(&pool, &object, 0, blocks).await.unwrap();
        assert_eq!(span(0).await, per_node, "the first node's run");
        assert_eq!(span(per_node - 10).await, 10, "the rest of the run");
        assert_eq!(span(per_node).await, per_node, "the second node's run");

        // A block written since ends the run before it.
        let written = per_node + 100;
        fs.write(&pool, file.ino, written * 4096, &[6; 4096])
            .await
            .unwrap();
        pool.commit().await.unwrap();
        assert_eq!(span(per_node).await, 100, "up to the written block");
        assert_eq!(span(written).await, 0, "the written block");
        assert_eq!(span(written + 1).await, per_node - 101, "after it");
        assert!(span(0).await >= per_node, "committed holes");
        let read = fs.read(&pool, file.ino, written * 4096, 4096, false);
        assert_eq!(read.await.unwrap(), vec![6; 4096]);
    });
}

/// A filesystem whose header predates the space sums (version 1) is
/// walked once at import, and from then on keeps sums equal to a walk
/// (which the space check compares), written as a version 2 header.
#[test]
fn a_header_without_space_sums_gets_them_at_import() {
    let disks: Vec<Rc<SimDevice>> = (0..2)
        .map(|index| SimDevice::new(&format!("d{index}"), 256 << 20, 40 + index))
        .collect();
    let tunables = unhurried;
    let walked = Runtime::new_sim(40).block_on({
        let disks = disks.clone();
        async move {
            let pool = mirror_pool(&disks, tunables()).await;
            let fs = pool
                .create_filesystem("tank/fs", BTreeMap::new())
                .await
                .unwrap();
            for index in 0..40u32 {
                let name = format!("f{index}");
                let attr = fs
                    .create(
                        &pool,
                        fs.root(),
                        name.as_bytes(),
                        &NewObject::owned(S_IFREG | 0o644, 0, 0),
                    )
                    .await
                    .unwrap();
                let data = vec![index as u8; 1000 * index as usize + 1];
                fs.write(&pool, attr.ino, 0, &data).await.unwrap();
            }
            pool.commit().await.unwrap();
            // As a header of an older ironpool left it.
            fs.write_header(FsHeader {
                space: None,
                ..fs.header.get()
            });
            pool.commit().await.unwrap();
            assert_eq!(fs.table.dnode().bonus.0[0], 1, "a version 1 header");
            let walked = fs.referenced_walked().await.unwrap();
            assert_eq!(fs.referenced_locked(&pool).await.unwrap(), walked);
            pool.export().await.unwrap();
            walked
        }
    });
    Runtime::new_sim(41).block_on(async move {
        let pool = Pool::import_from_devices("tank", named(&disks), tunables())
            .await
            .unwrap();
        let fs = pool.filesystem("tank/fs").unwrap();
        let space = fs.header.get().space.expect("sums taken at import");
        assert_eq!(
            (
                fs.table.dnode().used_bytes + space.used,
                fs.table.dnode().logical_bytes + space.logical,
                fs.table.dnode().physical_bytes + space.physical
            ),
            walked
        );
        // Kept from now on: a file removed, one grown.
        fs.remove(&pool, fs.root(), b"f3", false).await.unwrap();
        let grown = fs.lookup(fs.root(), b"f7").await.unwrap();
        fs.write(&pool, grown.ino, 0, &vec![9u8; 300_000])
            .await
            .unwrap();
        // Before a txg writes them, the figures count the changes too.
        assert_eq!(
            fs.referenced_locked(&pool).await.unwrap(),
            fs.referenced_walked().await.unwrap()
        );
        assert!(fs.referenced_locked(&pool).await.unwrap().0 > walked.0);
        let report = pool.check_space().await.unwrap();
        assert!(report.problems.is_empty(), "{:?}", report.problems);
        assert_eq!(fs.table.dnode().bonus.0[0], 2, "a version 2 header");
        assert_eq!(
            fs.referenced_locked(&pool).await.unwrap(),
            fs.referenced_walked().await.unwrap()
        );
    });
}

/// A filesystem made encrypted before attributes were sealed (no header
/// flag) holds them in the clear on the devices; power fails after an
/// `fsync` through its log. The import, without the key, claims the log
/// and commits; loading the key replays it (the object's attributes in the
/// clear are kept so, as they were), the file reads as the `fsync` left it,
/// and its next change seals its attributes.
#[test]
fn a_filesystem_encrypted_before_sealing_replays_with_its_key() {
    use crate::format::sealed_bonus::is_sealed;
    let disks: Vec<Rc<SimDevice>> = (0..2)
        .map(|index| SimDevice::new(&format!("d{index}"), 256 << 20, 60 + index))
        .collect();
    let key = || zeroize::Zeroizing::new(vec![0x3c; 32]);
    let ino = Runtime::new_sim(60).block_on({
        let disks = disks.clone();
        async move {
            let pool = mirror_pool(&disks, unhurried()).await;
            let properties = [
                ("encryption", "on"),
                ("keyformat", "raw"),
                ("recordsize", "16K"),
            ]
            .iter()
            .map(|(name, value)| (name.to_string(), value.to_string()))
            .collect();
            let fs = pool
                .create_filesystem_keyed("tank/fs", properties, Some(key()))
                .await
                .unwrap();
            let ino = fs
                .create(
                    &pool,
                    fs.root(),
                    b"f",
                    &NewObject::owned(S_IFREG | 0o644, 7, 8),
                )
                .await
                .unwrap()
                .ino;
            fs.write(&pool, ino, 0, &vec![1u8; 32 << 10]).await.unwrap();
            pool.commit().await.unwrap();
            // As an older build left it: no flag, the file's attributes in
            // the clear in the table.
            fs.write_header(FsHeader {
                sealed_bonuses: false,
                ..fs.header.get()
            });
            let mut dnode = fs.objects.open(ino).await.unwrap().dnode();
            assert!(!is_sealed(&dnode.bonus), "opened in memory");
            let mut bytes = [0u8; DNODE_BYTES];
            dnode.encode(&mut bytes);
            fs.objects
                .write_bytes_cached(&fs.table, ino * DNODE_BYTES as u64, &bytes)
                .unwrap();
            pool.commit().await.unwrap();
            let stored = fs
                .objects
                .read_bytes(&fs.table, ino * DNODE_BYTES as u64, DNODE_BYTES)
                .await
                .unwrap();
            dnode = crate::format::Dnode::decode(&stored).unwrap();
            assert!(!is_sealed(&dnode.bonus), "the attributes in the clear");
            // The chain starts through a txg; the next `fsync` is logged.
            pool.fs_log_commit(&fs).await.unwrap();
            fs.write(&pool, ino, 32 << 10, &vec![2u8; 16 << 10])
                .await
                .unwrap();
            pool.fs_log_commit(&fs).await.unwrap();
            assert_eq!(fs.log_stats().commits, 1);
            ino
        }
    });
    let mut rng = crate::rt::sim::Rng::new(61);
    for disk in &disks {
        disk.crash(&mut rng);
    }
    Runtime::new_sim(62).block_on(async move {
        let pool = Pool::import_from_devices("tank", named(&disks), unhurried())
            .await
            .unwrap();
        let replayed = |pool: &Pool| {
            pool.notes()
                .iter()
                .any(|note| note.contains("intent log: replayed"))
        };
        assert!(!replayed(&pool), "{:?}", pool.notes());
        pool.commit().await.unwrap();
        let fs = pool.filesystem("tank/fs").unwrap();
        assert!(fs.log_claimed(), "{:?}", pool.notes());
        pool.load_key("tank/fs", Some(key())).await.unwrap();
        assert!(replayed(&pool), "{:?}", pool.notes());
        let attr = fs.getattr(ino).await.unwrap();
        assert_eq!(
            (attr.size, attr.znode.uid, attr.znode.gid),
            (48 << 10, 7, 8)
        );
        assert_eq!(
            fs.read(&pool, ino, 32 << 10, 16 << 10, false)
                .await
                .unwrap(),
            vec![2u8; 16 << 10]
        );
        // Changed with the key: sealed from then on.
        fs.write(&pool, ino, 0, &[3u8; 512]).await.unwrap();
        pool.commit().await.unwrap();
        let stored = fs
            .objects
            .read_bytes(&fs.table, ino * DNODE_BYTES as u64, DNODE_BYTES)
            .await
            .unwrap();
        assert!(is_sealed(
            &crate::format::Dnode::decode(&stored).unwrap().bonus
        ));
        pool.export().await.unwrap();
    });
}
