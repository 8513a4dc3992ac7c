//! A filesystem's space in the simulator: what create and delete churn
//! leaves behind, metadata growth up to a full pool, and the holds of two
//! mount sessions alive at once.

mod sim_support;

use std::collections::BTreeMap;
use std::rc::Rc;

use ironpool::format::znode::{S_IFDIR, S_IFREG};
use ironpool::pool::filesystem::{Filesystem, NewObject};
use ironpool::pool::Pool;
use ironpool::rt::Runtime;
use sim_support::{devices, manual_mirror};

/// Pool bytes allocated now.
fn used_bytes(pool: &Pool) -> u64 {
    let (size, free) = pool.space();
    size - free
}

/// Commits until the frees of the last commits are allocatable again (they
/// wait out the defer depth), so that what is used is what is kept.
async fn settle(pool: &Rc<Pool>) {
    for _ in 0..=ironpool::alloc::DEFER_TXGS + 1 {
        pool.commit().await.unwrap();
    }
}

/// Creates `count` empty files in a new directory `name` of the root, then
/// removes them and the directory.
async fn churn(pool: &Rc<Pool>, fs: &Filesystem, name: &[u8], count: u32) {
    let dir = fs
        .create(pool, fs.root(), name, &NewObject::owned(S_IFDIR | 0o755, 0, 0))
        .await
        .unwrap()
        .ino;
    let file = NewObject::owned(S_IFREG | 0o644, 0, 0);
    for index in 0..count {
        fs.create(pool, dir, format!("file{index}").as_bytes(), &file)
            .await
            .unwrap();
    }
    // A commit in between, as a long run of creates has.
    pool.commit().await.unwrap();
    for index in 0..count {
        fs.remove(pool, dir, format!("file{index}").as_bytes(), false)
            .await
            .unwrap();
    }
    fs.remove(pool, fs.root(), name, true).await.unwrap();
}

/// Files created and deleted with their directory, round after round, give
/// their metadata space back: the pool's used space comes back to where it
/// started (it grew by about 1 KiB per file ever created, as dnode table
/// blocks whose objects were all freed were kept).
#[test]
fn create_and_delete_churn_gives_the_space_back() {
    let disks = devices(2, 512 << 20, 91);
    Runtime::new_sim(91).block_on(async move {
        let pool = manual_mirror(&disks).await;
        let fs = pool
            .create_filesystem("tank/fs", BTreeMap::new())
            .await
            .unwrap();
        settle(&pool).await;
        let start = used_bytes(&pool);
        let mut after = Vec::new();
        for round in 0..3u8 {
            churn(&pool, &fs, format!("round{round}").as_bytes(), 5000).await;
            settle(&pool).await;
            after.push(used_bytes(&pool));
        }
        for (round, used) in after.iter().enumerate() {
            // A few blocks of the table and the root directory may differ.
            assert!(
                *used <= start + (256 << 10),
                "round {round}: {used} bytes used, {start} at the start ({after:?})"
            );
        }
        let report = pool.check_space().await.unwrap();
        assert!(report.problems.is_empty(), "{:?}", report.problems);
        // Still a working filesystem.
        let file = NewObject::owned(S_IFREG | 0o644, 0, 0);
        let made = fs.create(&pool, fs.root(), b"after", &file).await.unwrap();
        fs.write(&pool, made.ino, 0, b"data").await.unwrap();
        pool.export().await.unwrap();
    });
}

/// Directories made until the pool is full meet ENOSPC, as data does,
/// and the pool stays writable: commits go on, removing them works, and
/// their space comes back. Metadata growth claimed no space, so a loop of
/// `mkdir` filled the slop too and the next txg build found no room: the
/// pool was suspended and every change failed.
#[test]
fn directories_made_until_the_pool_is_full_meet_enospc_and_the_pool_stays_writable() {
    let disks = devices(2, 96 << 20, 92);
    Runtime::new_sim(92).block_on(async move {
        let pool = manual_mirror(&disks).await;
        let fs = pool
            .create_filesystem("tank/fs", BTreeMap::new())
            .await
            .unwrap();
        settle(&pool).await;
        let start = used_bytes(&pool);
        let dir = NewObject::owned(S_IFDIR | 0o755, 0, 0);
        let mut made = 0u32;
        let refused = loop {
            match fs
                .create(&pool, fs.root(), format!("d{made}").as_bytes(), &dir)
                .await
            {
                Ok(_) => made += 1,
                Err(error) => break error,
            }
            // The txg timer's work, now and then.
            if made % 64 == 0 {
                pool.commit().await.unwrap();
            }
            assert!(made < 100_000, "never refused");
        };
        assert_eq!(refused.errno(), libc::ENOSPC, "{refused:?} after {made}");
        assert!(made > 100, "refused after {made} directories");
        assert_eq!(pool.health(), "ONLINE");
        pool.commit().await.expect("a commit of a full pool");
        // Other growth is refused too; what frees space works.
        let file = NewObject::owned(S_IFREG | 0o644, 0, 0);
        let mut files = 0u32;
        let refused = loop {
            match fs
                .create(&pool, fs.root(), format!("f{files}").as_bytes(), &file)
                .await
            {
                Ok(_) => files += 1,
                Err(error) => break error,
            }
            assert!(files < 10_000, "files never refused");
        };
        assert_eq!(refused.errno(), libc::ENOSPC, "{refused:?} after {files} files");
        pool.commit().await.expect("a commit of a full pool");
        for index in 0..files {
            fs.remove(&pool, fs.root(), format!("f{index}").as_bytes(), false)
                .await
                .unwrap();
        }
        for index in 0..made {
            fs.remove(&pool, fs.root(), format!("d{index}").as_bytes(), true)
                .await
                .unwrap();
            if index % 64 == 0 {
                pool.commit().await.unwrap();
            }
        }
        settle(&pool).await;
        assert_eq!(pool.health(), "ONLINE");
        let used = used_bytes(&pool);
        assert!(
            used <= start + (512 << 10),
            "{used} bytes used after the removal, {start} before"
        );
        fs.create(&pool, fs.root(), b"again", &dir).await.unwrap();
        let report = pool.check_space().await.unwrap();
        assert!(report.problems.is_empty(), "{:?}", report.problems);
        pool.export().await.unwrap();
    });
}
