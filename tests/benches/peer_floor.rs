//! The floor of a peer restore on this machine: the CPU no peer tier can avoid spending on one
//! snapshot while it keeps its trust rules (mutual TLS on the wire, every byte checked against
//! the registry's digests), measured in the same run as the tiers, piece by piece, on the
//! snapshot's own data bytes:
//!
//! * AES-256-GCM sealing on the sender and opening on the receiver, in TLS-sized records (the
//!   cipher suite the nodes negotiate; this kernel has no kernel TLS to hand it to);
//! * SHA-256 on the receiver (every byte is checked against the registry's digests);
//! * the bytes through a loopback TCP socket, both ends' copies (no TLS, no framing).
//!
//! Everything else a real transfer does is left out: reading the files on the sender, writing
//! them on the receiver, HTTP, the async runtime, the plan. So the sum is a lower bound on the
//! CPU of any such transfer here, not a design: a peer tier that spent only this would be a
//! perfect one.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Duration;

use ring::aead::{AES_256_GCM, Aad, LessSafeKey, Nonce, Tag, UnboundKey};
use sha2::{Digest, Sha256};
use vk_cocoon::peer::extents::data_extents;
use vk_test_support::bench::cpu_time;

/// What the unavoidable work of moving one snapshot cost.
#[derive(Debug, Clone, Copy)]
pub struct Floor {
    /// Data bytes of the snapshot (what the floor moved and hashed).
    pub bytes: u64,
    /// AES-256-GCM seal of every byte (the sender's share).
    pub seal: Duration,
    /// AES-256-GCM open of every byte (the receiver's).
    pub open: Duration,
    /// SHA-256 of every byte (the receiver's).
    pub hash: Duration,
    /// SHA-256 of the largest file alone: one digest is one sequential chain, so no number of
    /// cores brings a transfer below it.
    pub longest_hash: Duration,
    /// The bytes through a loopback socket, both ends.
    pub socket: Duration,
}

impl Floor {
    /// All of it, on any core.
    pub fn cpu(&self) -> Duration {
        self.seal + self.open + self.hash + self.socket
    }

    /// The least time the transfer can take on `cores` cores: its CPU spread over all of them,
    /// or the longest single hash, whichever is longer.
    pub fn bound(&self, cores: usize) -> Duration {
        (self.cpu() / cores as u32).max(self.longest_hash)
    }
}

/// Chunk of one file read.
const CHUNK: usize = 1 << 20;
/// The largest TLS record's plaintext.
const RECORD: usize = 16 << 10;

/// The nonce of record `sequence`, as TLS 1.3 forms it from the record's sequence number.
fn nonce(sequence: u64) -> Nonce {
    let mut n = [0u8; 12];
    n[4..].copy_from_slice(&sequence.to_be_bytes());
    Nonce::assume_unique_for_key(n)
}

/// Measures the floor on the data bytes of every regular file of `dir`.
pub fn measure(dir: &Path) -> Floor {
    let key = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &[7; 32]).unwrap());
    let mut buf = vec![0u8; CHUNK];
    let mut floor = Floor {
        bytes: 0,
        seal: Duration::ZERO,
        open: Duration::ZERO,
        hash: Duration::ZERO,
        longest_hash: Duration::ZERO,
        socket: Duration::ZERO,
    };
    let mut sequence = 0u64;
    for path in files(dir) {
        let file = File::open(&path).unwrap();
        let extents = data_extents(&file, file.metadata().unwrap().len()).unwrap();
        let (mut hasher, mut hashing) = (Sha256::new(), Duration::ZERO);
        for (offset, length) in extents {
            let mut done = 0;
            while done < length {
                let n = (length - done).min(CHUNK as u64) as usize;
                file.read_exact_at(&mut buf[..n], offset + done).unwrap();
                // Sealed and opened again in place, a chunk's records at a time (the clock is
                // read per chunk, not per 16 KiB).
                let first = sequence;
                let t = cpu_time(libc::RUSAGE_THREAD);
                let tags: Vec<Tag> = buf[..n]
                    .chunks_mut(RECORD)
                    .map(|record| {
                        sequence += 1;
                        key.seal_in_place_separate_tag(nonce(sequence), Aad::empty(), record)
                            .unwrap()
                    })
                    .collect();
                floor.seal += cpu_time(libc::RUSAGE_THREAD) - t;
                let t = cpu_time(libc::RUSAGE_THREAD);
                for ((record, tag), at) in buf[..n].chunks_mut(RECORD).zip(tags).zip(first + 1..) {
                    key.open_in_place_separate_tag(nonce(at), Aad::empty(), tag, record, 0..)
                        .expect("a record sealed above opens");
                }
                floor.open += cpu_time(libc::RUSAGE_THREAD) - t;
                let t = cpu_time(libc::RUSAGE_THREAD);
                hasher.update(&buf[..n]);
                hashing += cpu_time(libc::RUSAGE_THREAD) - t;
                done += n as u64;
            }
            floor.bytes += length;
        }
        std::hint::black_box(hasher.finalize());
        floor.hash += hashing;
        floor.longest_hash = floor.longest_hash.max(hashing);
    }
    floor.socket = through_a_socket(floor.bytes);
    floor
}

/// CPU of both ends of a loopback TCP connection that carries `bytes`.
fn through_a_socket(bytes: u64) -> Duration {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let receiver = std::thread::spawn(move || {
        let cpu = cpu_time(libc::RUSAGE_THREAD);
        let (mut socket, _) = listener.accept().unwrap();
        let (mut buf, mut got) = (vec![0u8; CHUNK], 0u64);
        while got < bytes {
            let n = socket.read(&mut buf).unwrap();
            assert!(n > 0, "the sender closed after {got} of {bytes} bytes");
            got += n as u64;
        }
        cpu_time(libc::RUSAGE_THREAD) - cpu
    });
    let cpu = cpu_time(libc::RUSAGE_THREAD);
    let mut socket = TcpStream::connect(addr).unwrap();
    let (buf, mut sent) = (vec![1u8; CHUNK], 0u64);
    while sent < bytes {
        let n = (bytes - sent).min(CHUNK as u64) as usize;
        socket.write_all(&buf[..n]).unwrap();
        sent += n as u64;
    }
    let sending = cpu_time(libc::RUSAGE_THREAD) - cpu;
    sending + receiver.join().unwrap()
}

/// The regular files of `dir`, in name order.
fn files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|entry| entry.file_type().is_ok_and(|t| t.is_file()))
        .map(|entry| entry.path())
        .collect();
    files.sort();
    files
}
