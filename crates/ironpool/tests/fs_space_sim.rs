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

/// A pool of a mirror of `disks` that commits when asked, with filesystem
/// `tank/fs`, committed and settled.
async fn settled_filesystem(
    disks: &[Rc<ironpool::dev::sim::SimDevice>],
) -> (Rc<Pool>, Rc<Filesystem>) {
    let pool = manual_mirror(disks).await;
    let fs = pool
        .create_filesystem("tank/fs", BTreeMap::new())
        .await
        .unwrap();
    settle(&pool).await;
    (pool, fs)
}

/// `check`'s walk of every block finds no problem with space accounting.
async fn assert_space_checks_clean(pool: &Rc<Pool>) {
    let report = pool.check_space().await.unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
}

/// Creates `count` empty files in a new directory `name` of the root, then
/// removes them and the directory.
async fn churn(pool: &Rc<Pool>, fs: &Filesystem, name: &[u8], count: u32) {
    let dir = fs
        .create(
            pool,
            fs.root(),
            name,
            &NewObject::owned(S_IFDIR | 0o755, 0, 0),
        )
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
        let (pool, fs) = settled_filesystem(&disks).await;
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
        assert_space_checks_clean(&pool).await;
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
        let (pool, fs) = settled_filesystem(&disks).await;
        let start = used_bytes(&pool);
        let (fs_start, _, _) = fs.referenced_walked().await.unwrap();
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
            if made.is_multiple_of(64) {
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
            if index.is_multiple_of(64) {
                pool.commit().await.unwrap();
            }
        }
        settle(&pool).await;
        assert_eq!(pool.health(), "ONLINE");
        // The filesystem's space came back but the root directory's
        // leaves: it held thousands of names and keeps the leaves they
        // split into (as a fat ZAP does), empty now. The pool's own space
        // maps grew with the history of a pool filled and emptied.
        let (fs_used, _, _) = fs.referenced_walked().await.unwrap();
        let root_leaves = fs
            .objects
            .peek_dnode(fs.root())
            .await
            .unwrap()
            .unwrap()
            .used_bytes;
        assert!(
            fs_used <= fs_start + root_leaves + (64 << 10),
            "{fs_used} bytes referenced after the removal, {fs_start} before, {root_leaves} in the root's leaves"
        );
        let used = used_bytes(&pool);
        assert!(
            used <= start + root_leaves + (2 << 20),
            "{used} bytes used after the removal, {start} before"
        );
        fs.create(&pool, fs.root(), b"again", &dir).await.unwrap();
        assert_space_checks_clean(&pool).await;
        pool.export().await.unwrap();
    });
}

/// An empty directory costs about what OpenZFS's micro-ZAP costs: its root
/// leaf is one small block, block 0, with no indirect block above it (two
/// metadata copies of 4 KiB, and its dnode's share of the table). It cost
/// 96 KiB: a 16 KiB leaf at block 1 under a 32 KiB indirect block, each
/// twice. A directory that fills its small leaf grows it, then splits.
#[test]
fn an_empty_directory_costs_one_small_block_per_copy() {
    let disks = devices(2, 256 << 20, 93);
    Runtime::new_sim(93).block_on(async move {
        let (pool, fs) = settled_filesystem(&disks).await;
        let start = used_bytes(&pool);
        let dir = NewObject::owned(S_IFDIR | 0o755, 0, 0);
        let count = 512u64;
        for index in 0..count {
            fs.create(&pool, fs.root(), format!("d{index}").as_bytes(), &dir)
                .await
                .unwrap();
        }
        settle(&pool).await;
        // The root directory's own leaves grew by 512 names too.
        let per_directory = (used_bytes(&pool) - start) / count;
        assert!(
            per_directory <= 12 << 10,
            "{per_directory} bytes per empty directory"
        );
        // One of them fills its small leaf, grows it and splits it.
        let file = NewObject::owned(S_IFREG | 0o644, 0, 0);
        let full = fs.lookup(fs.root(), b"d7").await.unwrap().ino;
        for index in 0..2000u32 {
            fs.create(
                &pool,
                full,
                format!("a-longer-name-{index:05}").as_bytes(),
                &file,
            )
            .await
            .unwrap();
            if index.is_multiple_of(500) {
                pool.commit().await.unwrap();
            }
        }
        for index in (0..2000).step_by(7) {
            let name = format!("a-longer-name-{index:05}");
            fs.lookup(full, name.as_bytes()).await.unwrap();
        }
        let mut listed = 0;
        let mut offset = 0;
        loop {
            let page = fs.readdir(full, offset, 100).await.unwrap();
            let Some((next, _)) = page.last() else { break };
            offset = *next;
            listed += page.len();
        }
        assert_eq!(listed, 2002, "every name, . and ..");
        settle(&pool).await;
        assert_space_checks_clean(&pool).await;
        pool.export().await.unwrap();
    });
}

/// Two mount sessions of one filesystem at once (a mount moved, or
/// unmounted and mounted again, while files stay open on the old one), in
/// random order: files opened through either, removed, closed, and one
/// session ended and a new one begun now and then. A file lives while it
/// has a name or any live session holds it, and goes when neither is left:
/// the end of one session freed the other's open files.
#[test]
fn files_held_by_two_mount_sessions_live_until_the_last_hold_goes() {
    use ironpool::rt::sim::Rng;
    use std::collections::{BTreeSet, HashMap};
    let disks = devices(2, 256 << 20, 94);
    Runtime::new_sim(94).block_on(async move {
        let (pool, fs) = settled_filesystem(&disks).await;
        let mut rng = Rng::new(94);
        let mut sessions = [fs.begin_session(), fs.begin_session()];
        // Per file: its name (if it has one) and the handles each session
        // holds on it.
        let mut named: BTreeSet<u64> = BTreeSet::new();
        let mut handles: HashMap<u64, Vec<usize>> = HashMap::new();
        let mut inos = Vec::new();
        let file = NewObject::owned(S_IFREG | 0o644, 0, 0);
        for step in 0..3000u32 {
            // Opens and removals go to the newest files, so that files are
            // held, removed and released around the sessions' ends.
            let recent = |rng: &mut Rng, inos: &Vec<(u64, String)>| {
                let window = inos.len().min(16) as u64;
                inos.len() - 1 - rng.below(window) as usize
            };
            match rng.below(8) {
                0 => {
                    let name = format!("f{step}");
                    let ino = fs
                        .create(&pool, fs.root(), name.as_bytes(), &file)
                        .await
                        .unwrap()
                        .ino;
                    fs.write(&pool, ino, 0, name.as_bytes()).await.unwrap();
                    named.insert(ino);
                    inos.push((ino, name));
                }
                1 | 2 if !inos.is_empty() => {
                    let (ino, _) = &inos[recent(&mut rng, &inos)];
                    if named.contains(ino) || handles.get(ino).is_some_and(|h| !h.is_empty()) {
                        let which = rng.below(2) as usize;
                        fs.opened(sessions[which], *ino);
                        handles.entry(*ino).or_default().push(which);
                    }
                }
                3 if !inos.is_empty() => {
                    let (ino, name) = inos[recent(&mut rng, &inos)].clone();
                    if named.remove(&ino) {
                        fs.remove(&pool, fs.root(), name.as_bytes(), false)
                            .await
                            .unwrap();
                    }
                }
                4 => {
                    let held: Vec<u64> = handles
                        .iter()
                        .filter(|(_, list)| !list.is_empty())
                        .map(|(ino, _)| *ino)
                        .collect();
                    if let Some(ino) = held.get(rng.below(held.len().max(1) as u64) as usize) {
                        let list = handles.get_mut(ino).unwrap();
                        let which = list.remove(rng.below(list.len() as u64) as usize);
                        fs.release(&pool, sessions[which], *ino).await.unwrap();
                    }
                }
                5 if rng.chance(1, 3) => {
                    // One session ends (its kernel let go of everything) and
                    // a new one takes its place.
                    let which = rng.below(2) as usize;
                    fs.session_ended(&pool, sessions[which]).await.unwrap();
                    for list in handles.values_mut() {
                        list.retain(|holder| *holder != which);
                    }
                    sessions[which] = fs.begin_session();
                }
                _ => {}
            }
            if step.is_multiple_of(200) {
                pool.commit().await.unwrap();
            }
            // Every file with a name or a handle reads back; the others are
            // gone, and the filesystem counts exactly the live ones.
            if step.is_multiple_of(10) {
                let mut live = 1; // the root
                for (ino, name) in &inos {
                    let held = handles.get(ino).is_some_and(|list| !list.is_empty());
                    let read = fs.read(&pool, *ino, 0, 64, false).await;
                    if named.contains(ino) || held {
                        live += 1;
                        assert_eq!(read.unwrap(), name.as_bytes(), "step {step}: {name}");
                    } else {
                        assert!(read.is_err(), "step {step}: {name} outlived its holds");
                    }
                }
                assert_eq!(fs.stats(&pool).objects, live, "step {step}");
            }
        }
        for session in sessions {
            fs.session_ended(&pool, session).await.unwrap();
        }
        assert_eq!(fs.stats(&pool).objects, 1 + named.len() as u64);
        pool.commit().await.unwrap();
        assert_space_checks_clean(&pool).await;
    });
}
