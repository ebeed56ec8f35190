//! zstd compression of a push's v2 chunks, at most one chunk per core at a time.
//!
//! A profile of the v2 push (4 MiB chunks, 8 transfers) found each chunk compressed with a fresh zstd
//! context (about 3 MiB at level 3) into a fresh `compressBound`-sized buffer, on as many blocking
//! threads as chunks were in flight: more contexts than cores, allocated and freed 256 times per GiB,
//! and every compressed chunk kept its whole bound-sized allocation while it waited for its upload
//! (`Bytes::from(Vec)` keeps the capacity), beyond what the budget counted. Here a push keeps one
//! context and one output buffer per core for its whole length, and hands each chunk over as an
//! exact-size copy.

use bytes::Bytes;
use std::sync::{Arc, Mutex};
use tokio::sync::Semaphore;

/// The compressors of one push; dropped (with their contexts) when the push ends.
pub(crate) struct ChunkCompressor {
    level: i32,
    /// One permit per chunk that may compress at once.
    slots: Arc<Semaphore>,
    idle: Arc<Mutex<Vec<Worker>>>,
}

/// A zstd context and the buffer it compresses into, reused chunk after chunk.
struct Worker {
    context: zstd::bulk::Compressor<'static>,
    out: Vec<u8>,
}

impl ChunkCompressor {
    /// Compresses at `level`, at most `parallel` chunks at once (the cores the transfer may use).
    pub fn new(level: i32, parallel: usize) -> ChunkCompressor {
        ChunkCompressor {
            level,
            slots: Arc::new(Semaphore::new(parallel.max(1))),
            idle: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// The cores of this machine, at most `concurrency`: compressing more chunks at once than there
    /// are cores only holds more contexts.
    pub fn parallelism(concurrency: usize) -> usize {
        std::thread::available_parallelism()
            .map_or(1, usize::from)
            .min(concurrency.max(1))
    }

    /// `data` compressed (one zstd frame) and the SHA-256 digest of the result, on the blocking pool.
    pub async fn compress(&self, data: Bytes) -> std::io::Result<(Bytes, String)> {
        let _slot = self
            .slots
            .clone()
            .acquire_owned()
            .await
            .map_err(std::io::Error::other)?;
        let idle = self.idle.clone();
        let level = self.level;
        tokio::task::spawn_blocking(move || {
            let taken = idle.lock().expect("idle compressors").pop();
            let mut worker = match taken {
                Some(w) => w,
                None => Worker {
                    context: zstd::bulk::Compressor::new(level)?,
                    out: Vec::new(),
                },
            };
            let result = worker.compress(&data);
            // A context that failed is not trusted again.
            if result.is_ok() {
                idle.lock().expect("idle compressors").push(worker);
            }
            result
        })
        .await
        .map_err(std::io::Error::other)?
    }
}

impl Worker {
    fn compress(&mut self, data: &[u8]) -> std::io::Result<(Bytes, String)> {
        self.out.clear();
        self.out.reserve(zstd::zstd_safe::compress_bound(data.len()));
        self.context.compress_to_buffer(data, &mut self.out)?;
        let digest = super::manifest::sha256_digest(&self.out);
        Ok((Bytes::copy_from_slice(&self.out), digest))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guest_like(len: usize) -> Vec<u8> {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        (0..len)
            .map(|i| {
                if (i / 4096) % 2 == 0 {
                    return 0;
                }
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x % 26) as u8 + b'a'
            })
            .collect()
    }

    #[tokio::test]
    async fn chunks_round_trip_with_the_digest_of_their_compressed_bytes() {
        let pool = ChunkCompressor::new(3, 2);
        let chunks: Vec<Vec<u8>> = (0..6).map(|i| guest_like((1 << 20) + i * 4097)).collect();
        let packed = futures::future::join_all(chunks.iter().map(|c| pool.compress(Bytes::from(c.clone())))).await;
        for (raw, packed) in chunks.iter().zip(packed) {
            let (stored, digest) = packed.unwrap();
            assert!(
                stored.len() < raw.len() / 2,
                "compressed {} of {}",
                stored.len(),
                raw.len()
            );
            assert_eq!(digest, super::super::manifest::sha256_digest(&stored));
            assert_eq!(&zstd::decode_all(&stored[..]).unwrap(), raw);
        }
        // Contexts are kept for the next chunk, never more than may run at once.
        let idle = pool.idle.lock().unwrap().len();
        assert!((1..=2).contains(&idle), "{idle} idle compressors");
    }

    #[tokio::test]
    async fn an_empty_chunk_is_a_valid_frame() {
        let pool = ChunkCompressor::new(1, 1);
        let (stored, _) = pool.compress(Bytes::new()).await.unwrap();
        assert!(zstd::decode_all(&stored[..]).unwrap().is_empty());
    }
}
