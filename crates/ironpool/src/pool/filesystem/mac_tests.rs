//! The object-set MAC of an encrypted filesystem (docs/FORMAT.md,
//! "Object-set MAC"): a writer without the key plays the attacker through
//! the engine's own build, which recomputes every checksum and unkeyed
//! digest as such a writer could.

use super::*;
use crate::dev::sim::SimDevice;
use crate::format::label::TopVdevKind;
use crate::format::znode::S_IFREG;
use crate::pool::test_pool::{sim_pool, unhurried};
use crate::rt::Runtime;

fn key() -> zeroize::Zeroizing<Vec<u8>> {
    zeroize::Zeroizing::new(vec![0x5d; 32])
}

fn disks(seed: u64) -> Vec<Rc<SimDevice>> {
    (0..2)
        .map(|index| SimDevice::new(&format!("d{index}"), 256 << 20, seed + index))
        .collect()
}

/// A pool with encrypted filesystem `tank/fs` holding one 32 KiB file,
/// committed; returns the pool, the filesystem and the file's object.
async fn encrypted_with_file(disks: &[Rc<SimDevice>]) -> (Rc<Pool>, Rc<Filesystem>, u64) {
    let pool = sim_pool(disks, TopVdevKind::Mirror, unhurried()).await;
    let properties = [("encryption", "on"), ("keyformat", "raw")]
        .iter()
        .map(|(name, value)| (name.to_string(), value.to_string()))
        .collect();
    let fs = pool
        .create_filesystem_keyed("tank/fs", properties, Some(key()))
        .await
        .unwrap();
    let mode = NewObject::owned(S_IFREG | 0o644, 0, 0);
    let ino = fs.create(&pool, fs.root(), b"f", &mode).await.unwrap().ino;
    fs.write(&pool, ino, 0, &vec![7u8; 32 << 10]).await.unwrap();
    pool.commit().await.unwrap();
    (pool, fs, ino)
}

/// Made by this build, an encrypted filesystem is authenticated and holds
/// a MAC; its key unloads and loads again. A file made longer without the
/// key (every checksum and digest recomputed, as by a writer of the
/// devices) fails the MAC at the next `load-key`, which loads nothing.
#[test]
fn a_change_made_without_the_key_fails_the_mac() {
    let disks = disks(80);
    Runtime::new_sim(80).block_on(async move {
        let (pool, fs, ino) = encrypted_with_file(&disks).await;
        let table = fs.table.dnode();
        assert!(table.is_authenticated());
        assert_ne!(table.mac, [0; crate::format::dnode::DNODE_MAC_BYTES]);
        assert!(table.root.digest.is_some(), "{:?}", table.root);
        pool.unload_key("tank/fs").await.unwrap();
        pool.load_key("tank/fs", Some(key())).await.unwrap();
        pool.unload_key("tank/fs").await.unwrap();

        let object = fs.objects.open(ino).await.unwrap();
        object.dnode.borrow_mut().length_bytes += 4096;
        object.dirty.set(true);
        pool.commit().await.unwrap();
        match pool.load_key("tank/fs", Some(key())).await {
            Err(PoolError::Corrupt(message)) => {
                assert!(message.contains("does not give its MAC"), "{message}")
            }
            other => panic!("a changed object loaded: {other:?}"),
        }
        assert!(fs.data_key().is_err(), "the key was loaded");
    });
}

/// A writer without the key that changes a dnode table block, fixes every
/// checksum, and keeps the old digest in its pointer (so that the MAC at
/// the root still holds) is caught when the block is read: it does not
/// give the digest its pointer holds. (An import that meets such a block
/// while it checks the newest txg rewinds past it.)
#[test]
fn a_block_that_does_not_give_its_digest_is_refused_when_read() {
    let disks = disks(84);
    Runtime::new_sim(84).block_on(async move {
        let (pool, fs, ino) = encrypted_with_file(&disks).await;
        let genuine = fs.table.dnode().root;
        pool.unload_key("tank/fs").await.unwrap();
        let object = fs.objects.open(ino).await.unwrap();
        object.dnode.borrow_mut().length_bytes += 4096;
        object.dirty.set(true);
        drop(object);
        pool.commit().await.unwrap();
        let mut forged = fs.table.dnode().root;
        assert_ne!(forged.digest, genuine.digest);
        forged.digest = genuine.digest;
        fs.table.dnode.borrow_mut().root = forged;
        fs.table.dirty.set(true);
        // A change that makes the txg (the forgery alone does not).
        pool.create_filesystem("tank/other", BTreeMap::new())
            .await
            .unwrap();
        // The root's MAC holds: the forgery is below it.
        pool.load_key("tank/fs", Some(key())).await.unwrap();
        // Read from the devices again.
        fs.objects.forget(ino);
        fs.table.drop_cached_nodes();
        match fs.getattr(ino).await {
            Err(error) => assert!(
                error
                    .to_string()
                    .contains("does not give its pointer's digest"),
                "{error}"
            ),
            Ok(attr) => panic!("a forged table block read: size {}", attr.size),
        }
    });
}
