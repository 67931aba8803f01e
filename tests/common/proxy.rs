//! A TCP proxy on loopback that holds every chunk it forwards, in either direction, for a fixed delay: a slow
//! link to a store (or any server), for backpressure and timeout tests. It keeps a copy of what clients sent
//! (`sent`), to check what reached the server. Stopped when dropped.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub struct SlowProxy {
    pub port: u16,
    stop: Arc<AtomicBool>,
    /// Bytes forwarded so far (both directions).
    pub forwarded: Arc<AtomicU64>,
    /// Every byte clients sent through it, in arrival order.
    pub sent: Arc<Mutex<Vec<u8>>>,
}

impl SlowProxy {
    /// Forwards 127.0.0.1:`port` (returned) to 127.0.0.1:`upstream`, each chunk after `delay`.
    pub fn start(upstream: u16, delay: Duration) -> SlowProxy {
        Self::start_with_stalls(upstream, delay, Duration::from_secs(3600), Duration::ZERO)
    }

    /// Like `start`, and the link stalls: in every `period`, traffic is held for its first `stall` (longer than a
    /// client's timeout, the calls in flight then fail and are retried); and every `STALL_EVERY`th chunk is held
    /// for a whole `stall` whenever it comes, so timeouts happen however sparse (or slow, on a loaded machine) the
    /// traffic is.
    pub fn start_with_stalls(upstream: u16, delay: Duration, period: Duration, stall: Duration) -> SlowProxy {
        let started = Instant::now();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let forwarded = Arc::new(AtomicU64::new(0));
        let sent = Arc::new(Mutex::new(Vec::new()));
        let chunks = Arc::new(AtomicU64::new(0));
        let (stop2, forwarded2, sent2) = (Arc::clone(&stop), Arc::clone(&forwarded), Arc::clone(&sent));
        std::thread::spawn(move || {
            while !stop2.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((client, _)) => {
                        let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else { continue };
                        client.set_nonblocking(false).unwrap();
                        for (i, (from, to)) in [(&client, &server), (&server, &client)].into_iter().enumerate() {
                            let (from, to) = (from.try_clone().unwrap(), to.try_clone().unwrap());
                            let (stop, forwarded) = (Arc::clone(&stop2), Arc::clone(&forwarded2));
                            let copy = (i == 0).then(|| Arc::clone(&sent2));
                            let timing = Timing { started, delay, period, stall, chunks: Arc::clone(&chunks) };
                            std::thread::spawn(move || pump(from, to, timing, &stop, &forwarded, copy));
                        }
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        SlowProxy { port, stop, forwarded, sent }
    }
}

/// Every this many chunks (over all connections and directions), one is held for a whole stall.
const STALL_EVERY: u64 = 40;

#[derive(Clone)]
struct Timing {
    started: Instant,
    delay: Duration,
    period: Duration,
    stall: Duration,
    chunks: Arc<AtomicU64>,
}

impl Timing {
    /// How long a chunk read now waits: the delay, plus the rest of a stall window it falls into (or a whole
    /// stall for every `STALL_EVERY`th chunk).
    fn wait(&self) -> Duration {
        let n = self.chunks.fetch_add(1, Ordering::SeqCst);
        if !self.stall.is_zero() && n % STALL_EVERY == STALL_EVERY - 1 {
            return self.delay + self.stall;
        }
        let into = Duration::from_nanos((self.started.elapsed().as_nanos() % self.period.as_nanos()) as u64);
        self.delay + self.stall.saturating_sub(into)
    }
}

fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    timing: Timing,
    stop: &AtomicBool,
    forwarded: &AtomicU64,
    copy: Option<Arc<Mutex<Vec<u8>>>>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if let Some(c) = &copy {
            c.lock().unwrap().extend_from_slice(&buf[..n]);
        }
        std::thread::sleep(timing.wait());
        if stop.load(Ordering::SeqCst) || to.write_all(&buf[..n]).is_err() {
            break;
        }
        forwarded.fetch_add(n as u64, Ordering::SeqCst);
    }
    let _ = to.shutdown(Shutdown::Write);
}

impl Drop for SlowProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}
