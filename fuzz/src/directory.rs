//! Target `directory`: `pool::dataset::directory::Directory::decode` on the pool
//! directory object's bytes (a JSON document).

use ironpool::pool::dataset::directory::Directory;

pub fn check(data: &[u8]) {
    if let Ok(directory) = Directory::decode(data) {
        let bytes = directory.encode();
        let again = Directory::decode(&bytes).unwrap_or_else(|error| panic!("re-encoded directory does not decode: {error}: {directory:?}"));
        assert_eq!(again, directory, "directory does not round trip");
        assert_eq!(again.encode(), bytes, "directory encoding is not stable");
    }
}
