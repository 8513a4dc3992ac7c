//! Target `replication_package`: a `send -R` package as `receive` reads it
//! (`format::package`): the magic, the manifest, then one stream after
//! another, split at each END, on an arbitrary byte string.

use ironpool::format::package::{copy_one_stream, read_manifest, PACKAGE_MAGIC};

pub fn check(data: &[u8]) {
    let Some(mut input) = data.strip_prefix(&PACKAGE_MAGIC[..]) else { return };
    let Ok(manifest) = read_manifest(&mut input) else { return };
    // A manifest that reads names only datasets a receiver can put below
    // its target: no absolute, empty-part, `..` or snapshot-like path.
    for dataset in &manifest.datasets {
        assert!(
            dataset.name.is_empty() || dataset.name.split('/').all(ironpool::format::valid_name),
            "accepted dataset name {:?}",
            dataset.name
        );
        assert!(!dataset.snapshots.is_empty());
        assert!(dataset.snapshots.iter().all(|name| ironpool::format::valid_name(name)));
    }
    // Each stream copied is exactly the bytes it took from the input, and
    // nothing past its END.
    loop {
        let before = input;
        let mut copied = Vec::new();
        match copy_one_stream(&mut input, &mut copied) {
            Ok(bytes) => {
                assert_eq!(bytes as usize, copied.len());
                assert_eq!(before.len() - input.len(), copied.len());
                assert!(before[..copied.len()] == copied[..]);
                if input.is_empty() {
                    break;
                }
            }
            Err(_) => break,
        }
    }
}
