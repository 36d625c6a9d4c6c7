//! A loopback TCP proxy in front of a service (S3, PostgreSQL, Kafka), which a
//! test tells to cut every open connection, refuse new ones, or stall the
//! bytes in flight: the network failing mid-request, as a client meets it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What the proxy does with the bytes it is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Forwards them.
    Pass,
    /// Holds them (a connection that hangs), until another mode is set.
    Stall,
    /// Closes each new connection as soon as it is accepted; open ones
    /// were cut when it was set.
    Down,
}

#[derive(Debug)]
struct Shared {
    mode: watch::Sender<Mode>,
    /// Bumped by each cut: connections opened before it end.
    cuts: watch::Sender<u64>,
    connections: AtomicU64,
    /// Connections a cut closed while they were open.
    severed: AtomicU64,
}

/// A proxy listening on 127.0.0.1, forwarding to one address; it stops
/// when dropped.
#[derive(Debug)]
pub struct TcpProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: tokio::task::JoinHandle<()>,
    chaos: Option<tokio::task::JoinHandle<()>>,
}

impl TcpProxy {
    /// Starts a proxy to `upstream` on a free loopback port.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<TcpProxy> {
        Self::start_on("127.0.0.1:0".parse().expect("an address"), upstream).await
    }

    /// Starts a proxy to `upstream` listening on `listen`: a port a
    /// service advertises to its clients (a Kafka broker's listener), so
    /// they come back through the proxy.
    pub async fn start_on(listen: SocketAddr, upstream: SocketAddr) -> std::io::Result<TcpProxy> {
        let listener = TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            mode: watch::channel(Mode::Pass).0,
            cuts: watch::channel(0).0,
            connections: AtomicU64::new(0),
            severed: AtomicU64::new(0),
        });
        let accepting = shared.clone();
        let accept = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    // Out of descriptors, say: the next accept may pass.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                // Subscribed before the mode is read: a cut from here on
                // reaches this connection.
                let mut cuts = accepting.cuts.subscribe();
                cuts.borrow_and_update();
                if *accepting.mode.borrow() == Mode::Down {
                    drop(client);
                    continue;
                }
                accepting.connections.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(forward(client, upstream, cuts, accepting.clone()));
            }
        });
        Ok(TcpProxy {
            addr,
            shared,
            accept,
            chaos: None,
        })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`, for an HTTP service.
    pub fn http(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Cuts every open connection now; new ones pass.
    pub fn cut(&self) {
        self.shared.cuts.send_modify(|n| *n += 1);
    }

    /// Sets what the proxy does from now on ([`Mode::Down`] cuts the open
    /// connections too).
    pub fn set(&self, mode: Mode) {
        self.shared.mode.send_replace(mode);
        if mode == Mode::Down {
            self.cut();
        }
    }

    /// Cuts every open connection at random moments, one on average every
    /// `every`, drawn from `seed`, until [`TcpProxy::calm`].
    pub fn cut_at_random(&mut self, every: Duration, seed: u64) {
        self.calm();
        let shared = self.shared.clone();
        let mut state = seed | 1;
        self.chaos = Some(tokio::spawn(async move {
            loop {
                // xorshift64: the gap is uniform in 0..2 * every.
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let gap = every.mul_f64((state % 2_000) as f64 / 1_000.0);
                tokio::time::sleep(gap).await;
                shared.cuts.send_modify(|n| *n += 1);
            }
        }));
    }

    /// Stops the random cuts.
    pub fn calm(&mut self) {
        if let Some(chaos) = self.chaos.take() {
            chaos.abort();
        }
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.shared.connections.load(Ordering::Relaxed)
    }

    /// Cuts so far, whether or not a connection was open.
    pub fn cuts(&self) -> u64 {
        *self.shared.cuts.borrow()
    }

    /// Connections a cut closed while they were open.
    pub fn severed(&self) -> u64 {
        self.shared.severed.load(Ordering::Relaxed)
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.calm();
        self.accept.abort();
        self.cut();
    }
}

/// Forwards one connection both ways until either side closes or a cut.
async fn forward(client: TcpStream, upstream: SocketAddr, mut cuts: watch::Receiver<u64>, shared: Arc<Shared>) {
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let both = async {
        tokio::join!(
            pump(client_read, server_write, shared.mode.subscribe()),
            pump(server_read, client_write, shared.mode.subscribe()),
        )
    };
    tokio::select! {
        _ = both => {}
        // Dropping both halves closes the sockets mid-request.
        _ = cuts.changed() => {
            shared.severed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Copies bytes from `from` to `to`, holding them while the proxy stalls.
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, mut mode: watch::Receiver<Mode>) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => {
                let _ = to.shutdown().await;
                return;
            }
            Ok(n) => n,
        };
        if mode.wait_for(|m| *m != Mode::Stall).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
