//! sha256 of the outputs: which implementation runs, and the threads that hash while the
//! extractor writes.

use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::JoinHandle;

/// The sha256 implementation in use: `sha2` picks the x86 SHA extensions (SHA-NI) at run
/// time when the CPU has them (with SSE2, SSSE3 and SSE4.1, as it asks), else its portable
/// code (elsewhere always the portable one); said here so that a figure can be read against it.
pub fn hash_backend() -> &'static str {
    #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
    {
        if std::arch::is_x86_feature_detected!("sha")
            && std::arch::is_x86_feature_detected!("sse2")
            && std::arch::is_x86_feature_detected!("ssse3")
            && std::arch::is_x86_feature_detected!("sse4.1")
        {
            return "sha2 (SHA-NI)";
        }
    }
    "sha2 (soft)"
}

/// Hashes the outputs' contents off the thread that extracts them: the extractor writes a
/// chunk and hands that very buffer over (no copy), so writing and hashing overlap, and with
/// many files several are hashed at once. Each file's chunks go to one thread, in order (a
/// digest is a sequence); which thread follows from the file's number, and digests are
/// returned by number, so the result never depends on the timing.
///
/// Memory is bounded by the buffers: [`Pool::buffer`] waits for one to come back. Threads
/// and buffers are made when first needed: outputs with no file cost nothing.
#[derive(Debug)]
pub(crate) struct Pool {
    to: Vec<SyncSender<Msg>>,
    free: Receiver<Vec<u8>>,
    give_back: SyncSender<Vec<u8>>,
    threads: Vec<JoinHandle<Digests>>,
    next: u64,
    want_threads: usize,
    buffers: usize,
    made: usize,
    len: usize,
}

/// The digests (`sha256:<hex>`) of the files ended, by number.
pub(crate) type Digests = HashMap<u64, String>;

#[derive(Debug)]
enum Msg {
    /// Bytes of a file: the buffer's first `len`.
    Data(u64, Vec<u8>, usize),
    /// The file is whole.
    End(u64),
}

/// One file being hashed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Job(u64);

impl Job {
    /// Its number, by which [`Pool::finish`] returns its digest.
    pub fn number(self) -> u64 {
        self.0
    }
}

impl Pool {
    /// Up to `threads` hashing threads (at least one) and `buffers` buffers (at least one)
    /// of `len` bytes.
    pub fn new(threads: usize, buffers: usize, len: usize) -> Pool {
        let buffers = buffers.max(1);
        let (give_back, free) = sync_channel(buffers);
        Pool {
            to: Vec::new(),
            free,
            give_back,
            threads: Vec::new(),
            next: 0,
            want_threads: threads.max(1),
            buffers,
            made: 0,
            len,
        }
    }

    /// A file to hash.
    pub fn begin(&mut self) -> std::io::Result<Job> {
        if self.to.is_empty() {
            for i in 0..self.want_threads {
                // Bounded by the buffers in flight, plus room for the ends of small files.
                let (tx, rx) = sync_channel(self.buffers + 64);
                let give_back = self.give_back.clone();
                match std::thread::Builder::new().name(format!("stevedore-hash-{i}")).spawn(move || hash(rx, give_back))
                {
                    Ok(t) => {
                        self.to.push(tx);
                        self.threads.push(t);
                    }
                    // One thread hashes it all when no second can be had (a pids limit);
                    // with none, the file cannot be hashed and is refused.
                    Err(e) if self.to.is_empty() => return Err(e),
                    Err(_) => break,
                }
            }
        }
        self.next += 1;
        Ok(Job(self.next - 1))
    }

    /// A buffer to fill, once one is free.
    pub fn buffer(&mut self) -> Vec<u8> {
        if let Ok(buf) = self.free.try_recv() {
            return buf;
        }
        if self.made < self.buffers {
            self.made += 1;
            return vec![0u8; self.len];
        }
        // Each buffer taken comes back (fed and hashed, or given back); the pool holds a
        // sender itself, so this never sees the channel closed.
        self.free.recv().expect("the pool holds a sender")
    }

    /// A buffer taken and not fed: every one taken must come back, by either way.
    pub fn give_back(&self, buf: Vec<u8>) {
        let _ = self.give_back.try_send(buf);
    }

    /// The next `len` bytes of `job`: the first `len` of `buf`, which goes back to the free
    /// ones once hashed.
    pub fn feed(&self, job: Job, buf: Vec<u8>, len: usize) {
        self.send(job, Msg::Data(job.0, buf, len));
    }

    /// `job` is whole: its digest is due. A job never ended is left out of the digests.
    pub fn end(&self, job: Job) {
        self.send(job, Msg::End(job.0));
    }

    fn send(&self, job: Job, msg: Msg) {
        let to = &self.to[(job.0 % self.to.len() as u64) as usize];
        // A thread that is gone panicked: `finish` says so.
        let _ = to.send(msg);
    }

    /// Waits for everything fed to be hashed; the digests of the jobs ended.
    pub fn finish(self) -> std::io::Result<Digests> {
        drop(self.to);
        let mut all = Digests::new();
        for t in self.threads {
            let got = t.join().map_err(|_| std::io::Error::other("a hashing thread panicked"))?;
            all.extend(got);
        }
        Ok(all)
    }
}

fn hash(rx: Receiver<Msg>, give_back: SyncSender<Vec<u8>>) -> Digests {
    let mut open: HashMap<u64, Sha256> = HashMap::new();
    let mut done = Digests::new();
    for msg in rx {
        match msg {
            Msg::Data(job, buf, len) => {
                open.entry(job).or_default().update(&buf[..len]);
                // The pool may be gone (an extraction that ended early): nothing to give to.
                let _ = give_back.try_send(buf);
            }
            Msg::End(job) => {
                let digest = open.remove(&job).unwrap_or_default().finalize();
                done.insert(job, format!("sha256:{digest:x}"));
            }
        }
    }
    done
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Contents of many sizes (empty, a chunk and a byte, several chunks), fed in chunks of
    /// varying length, interleaved across files as an extractor never does but might.
    fn contents() -> Vec<Vec<u8>> {
        (0..40u32)
            .map(|i| {
                let len = match i % 5 {
                    0 => 0,
                    1 => 1,
                    2 => 4096 + 1,
                    3 => 3 * 4096 + 17,
                    _ => (i as usize) * 997,
                };
                (0..len).map(|j| (j as u32).wrapping_mul(31).wrapping_add(i) as u8).collect()
            })
            .collect()
    }

    fn serial(data: &[u8]) -> String {
        format!("sha256:{:x}", Sha256::digest(data))
    }

    #[test]
    fn the_digests_are_the_serial_ones_by_number_whatever_the_threads() {
        let files = contents();
        for threads in [1, 2, 3, 8] {
            for buffers in [1, 2, 8] {
                let mut pool = Pool::new(threads, buffers, 4096);
                let jobs: Vec<Job> = files.iter().map(|_| pool.begin().unwrap()).collect();
                // Round robin over the files, one chunk of each at a time.
                let mut at = vec![0usize; files.len()];
                let mut left = files.len();
                let mut ended = vec![false; files.len()];
                while left > 0 {
                    for (i, f) in files.iter().enumerate() {
                        if ended[i] {
                            continue;
                        }
                        let len = (f.len() - at[i]).min(1 + (i * 577) % 4096);
                        if len == 0 {
                            pool.end(jobs[i]);
                            ended[i] = true;
                            left -= 1;
                            continue;
                        }
                        let mut buf = pool.buffer();
                        buf[..len].copy_from_slice(&f[at[i]..at[i] + len]);
                        pool.feed(jobs[i], buf, len);
                        at[i] += len;
                    }
                }
                let got = pool.finish().unwrap();
                let want: Digests = files.iter().enumerate().map(|(i, f)| (jobs[i].number(), serial(f))).collect();
                assert_eq!(got, want, "{threads} threads, {buffers} buffers");
            }
        }
    }

    #[test]
    fn outputs_without_files_start_no_thread_and_hold_no_buffer() {
        let pool = Pool::new(2, 8, 1 << 20);
        assert!(pool.threads.is_empty() && pool.made == 0);
        assert!(pool.finish().unwrap().is_empty());
    }

    #[test]
    fn a_job_never_ended_has_no_digest_and_the_rest_stand() {
        let mut pool = Pool::new(2, 2, 16);
        let (a, cut, b) = (pool.begin().unwrap(), pool.begin().unwrap(), pool.begin().unwrap());
        for (job, data) in [(a, &b"abc"[..]), (cut, b"partial"), (b, b"")] {
            let mut buf = pool.buffer();
            buf[..data.len()].copy_from_slice(data);
            pool.feed(job, buf, data.len());
        }
        pool.end(a);
        pool.end(b);
        let got = pool.finish().unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[&a.number()], "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        assert_eq!(got[&b.number()], "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    }
}
