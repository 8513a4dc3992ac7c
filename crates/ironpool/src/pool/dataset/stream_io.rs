//! The byte ends of `send` and `receive`: a descriptor (the pipe, file or
//! socket the CLI passes to the server) or memory.
//!
//! Why memory: the simulator runs on simulated devices and a simulated clock,
//! with no descriptors; it sends a snapshot into memory and receives it back
//! while clients write, so receive's races with writes, destroys and crashes are
//! searched for the way the other operations' are. The stream's format and its
//! checks are the same whichever end carries it.

use std::cell::{Cell, RefCell};
use std::io;
use std::os::fd::RawFd;

use futures_util::future::LocalBoxFuture;

use crate::rt::buf::{AlignedBuf, BufSlice};
use crate::rt::{self, uring};

/// Where `receive` reads a stream from.
pub trait StreamSource {
    /// Fills `buffer` from the stream and gives it back with the bytes read:
    /// fewer than its length only at the end of the stream.
    fn read_exact(&self, buffer: AlignedBuf)
        -> LocalBoxFuture<'_, (io::Result<usize>, AlignedBuf)>;
}

/// Where `send` writes a stream to.
pub trait StreamSink {
    /// Writes all of `slices`, in order.
    fn write_all(&self, slices: Vec<BufSlice>) -> LocalBoxFuture<'_, io::Result<()>>;
}

/// A stream descriptor: a pipe, a file at its current position, a socket. The
/// caller keeps it open while the stream runs.
pub struct FdStream(pub RawFd);

impl StreamSource for FdStream {
    fn read_exact(
        &self,
        buffer: AlignedBuf,
    ) -> LocalBoxFuture<'_, (io::Result<usize>, AlignedBuf)> {
        Box::pin(uring::read_stream_exact(self.0, buffer))
    }
}

impl StreamSink for FdStream {
    fn write_all(&self, slices: Vec<BufSlice>) -> LocalBoxFuture<'_, io::Result<()>> {
        Box::pin(uring::write_stream_all(self.0, slices))
    }
}

/// A stream held in memory: written by `send`, read from the start by
/// `receive`. Each read and write yields to the other tasks first, as a pipe
/// would, so a stream in memory interleaves with the pool's other work.
#[derive(Default)]
pub struct MemoryStream {
    bytes: RefCell<Vec<u8>>,
    read_position: Cell<usize>,
}

impl MemoryStream {
    /// An empty stream, to send into.
    pub fn new() -> MemoryStream {
        MemoryStream::default()
    }

    /// A stream of `bytes`, to receive from its start.
    pub fn from_bytes(bytes: Vec<u8>) -> MemoryStream {
        MemoryStream {
            bytes: RefCell::new(bytes),
            read_position: Cell::new(0),
        }
    }

    /// The bytes written so far.
    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes.into_inner()
    }
}

impl StreamSource for MemoryStream {
    fn read_exact(
        &self,
        mut buffer: AlignedBuf,
    ) -> LocalBoxFuture<'_, (io::Result<usize>, AlignedBuf)> {
        Box::pin(async move {
            rt::yield_now().await;
            let bytes = self.bytes.borrow();
            let start = self.read_position.get().min(bytes.len());
            let count = buffer.len().min(bytes.len() - start);
            buffer[..count].copy_from_slice(&bytes[start..start + count]);
            self.read_position.set(start + count);
            (Ok(count), buffer)
        })
    }
}

impl StreamSink for MemoryStream {
    fn write_all(&self, slices: Vec<BufSlice>) -> LocalBoxFuture<'_, io::Result<()>> {
        Box::pin(async move {
            rt::yield_now().await;
            let mut bytes = self.bytes.borrow_mut();
            for slice in &slices {
                bytes.extend_from_slice(slice);
            }
            Ok(())
        })
    }
}

/// Whether an error came from the stream (the sender's side: a partial receive
/// may be kept) or from this pool.
pub(in crate::pool) enum Failure {
    Stream(String),
    Pool(crate::pool::PoolError),
}

impl From<crate::pool::PoolError> for Failure {
    fn from(error: crate::pool::PoolError) -> Failure {
        Failure::Pool(error)
    }
}

impl From<crate::object::ObjectError> for Failure {
    fn from(error: crate::object::ObjectError) -> Failure {
        Failure::Pool(error.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rt::Runtime;

    #[test]
    fn a_memory_stream_reads_back_what_was_written_and_ends_short() {
        Runtime::new_sim(1).block_on(async {
            let stream = MemoryStream::new();
            let mut first = AlignedBuf::zeroed(3);
            first.copy_from_slice(b"abc");
            let mut second = AlignedBuf::zeroed(2);
            second.copy_from_slice(b"de");
            stream
                .write_all(vec![
                    BufSlice::whole(first.into_shared()),
                    BufSlice::whole(second.into_shared()),
                ])
                .await
                .unwrap();
            let stream = MemoryStream::from_bytes(stream.into_bytes());
            let (read, buffer) = stream.read_exact(AlignedBuf::zeroed(4)).await;
            assert_eq!((read.unwrap(), &buffer[..]), (4, &b"abcd"[..]));
            let (read, buffer) = stream.read_exact(AlignedBuf::zeroed(4)).await;
            assert_eq!((read.unwrap(), &buffer[..1]), (1, &b"e"[..]));
            let (read, _) = stream.read_exact(AlignedBuf::zeroed(4)).await;
            assert_eq!(read.unwrap(), 0, "the end of the stream");
        });
    }
}
