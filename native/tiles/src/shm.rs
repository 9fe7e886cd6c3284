//! The `shm` transport: a byte stream between two processes of one host over two ring buffers in
//! shared memory, one per direction, each bound (mbind) to the NUMA node of the process that reads
//! it -- the receiving tile's node -- before any of its pages is touched. The crate's gRPC runs over
//! it unchanged (tonic takes any AsyncRead + AsyncWrite), so the same plans swap transports.
//!
//! Set-up: the client connects to the worker's shm socket (a Unix socket beside its gRPC one),
//! makes the two rings (memfd: anonymous, nothing in /dev/shm, gone with both processes; each named
//! by its reader's pid, `tilewise-tiles-ring-r<PID>`, the worker's from SO_PEERCRED) and four
//! eventfds (data and space, each way), binds the ring it reads, and passes them with SCM_RIGHTS;
//! the worker binds the ring it reads and answers one byte, and only then may the client write: no
//! page of a ring is touched before its reader bound it. The Unix socket stays open for the
//! connection's life: its hang-up is how a side learns that the other died (a ring cannot say).
//!
//! A ring is bounded (RING_BYTES per direction: memory grows with the connections made, never with
//! an N x N mesh); a full ring makes the writer wait (back-pressure). Each byte is copied once into
//! the ring by the writer and once out by the reader (tonic's buffers).
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::task::{Context, Poll};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

pub const RING_BYTES: usize = 4 << 20;
const HEADER: usize = 4096;

#[repr(C)]
struct Header {
    head: AtomicU64, // bytes written
    _p0: [u8; 56],
    tail: AtomicU64, // bytes read
    _p1: [u8; 56],
    closed: AtomicU32, // the writer shut down
}

struct Ring {
    base: *mut u8,
    cap: usize,
}

unsafe impl Send for Ring {}
unsafe impl Sync for Ring {}

impl Ring {
    fn map(fd: RawFd, cap: usize, bind_here: bool) -> io::Result<Ring> {
        let len = HEADER + cap;
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0)
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = p as *mut u8;
        if bind_here {
            bind_to_my_node(base, len)?; // the header too: its tail is written by the reader
        }
        Ok(Ring { base, cap })
    }
    fn h(&self) -> &Header {
        unsafe { &*(self.base as *const Header) }
    }
    fn data(&self) -> *mut u8 {
        unsafe { self.base.add(HEADER) }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        unsafe { libc::munmap(self.base as *mut libc::c_void, HEADER + self.cap) };
    }
}

/// mbind(MPOL_BIND) the range to the NUMA node this thread runs on (its tile's node: tiles are bound).
pub(crate) fn bind_to_my_node(addr: *mut u8, len: usize) -> io::Result<()> {
    let (mut cpu, mut node): (libc::c_uint, libc::c_uint) = (0, 0);
    if unsafe { libc::syscall(libc::SYS_getcpu, &mut cpu, &mut node, std::ptr::null_mut::<libc::c_void>()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut mask = [0u64; 16];
    mask[(node / 64) as usize] |= 1u64 << (node % 64);
    const MPOL_BIND: libc::c_long = 2;
    let r = unsafe {
        libc::syscall(libc::SYS_mbind, addr, len, MPOL_BIND, mask.as_ptr(), (mask.len() * 64) as libc::c_ulong, 0)
    };
    // a kernel without NUMA refuses mbind: the ring then lives where the kernel puts it
    if r != 0 && io::Error::last_os_error().raw_os_error() != Some(libc::ENOSYS) {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A ring's memory: named by the pid of the process that reads it (`tilewise-tiles-ring-r<PID>`), so
/// that /proc shows whose node its pages must be on.
fn memfd(cap: usize, reader: i32) -> io::Result<OwnedFd> {
    named_memfd(&format!("tilewise-tiles-ring-r{reader}"), HEADER + cap)
}

/// An anonymous shared-memory file of `len` bytes (no page is allocated before it is touched).
pub(crate) fn named_memfd(name: &str, len: usize) -> io::Result<OwnedFd> {
    let name = std::ffi::CString::new(name).expect("no NUL");
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

fn eventfd() -> io::Result<OwnedFd> {
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn signal(fd: &OwnedFd) {
    let one: u64 = 1;
    unsafe { libc::write(fd.as_raw_fd(), &one as *const u64 as *const libc::c_void, 8) };
}

fn drain(fd: RawFd) {
    let mut v: u64 = 0;
    unsafe { libc::read(fd, &mut v as *mut u64 as *mut libc::c_void, 8) };
}

/// The pid of the process at the other end of a connected Unix socket.
pub(crate) fn peer_pid(sock: RawFd) -> io::Result<i32> {
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    let r = unsafe {
        libc::getsockopt(sock, libc::SOL_SOCKET, libc::SO_PEERCRED, &mut cred as *mut _ as *mut libc::c_void, &mut len)
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cred.pid)
}

pub(crate) fn send_ack(sock: RawFd) -> io::Result<()> {
    let b = [1u8; 1];
    if unsafe { libc::send(sock, b.as_ptr() as *const libc::c_void, 1, libc::MSG_NOSIGNAL) } != 1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Wait (blocking) for the worker's one byte: it has bound the ring it reads.
pub(crate) fn recv_ack(sock: RawFd) -> io::Result<()> {
    let mut b = [0u8; 1];
    match unsafe { libc::recv(sock, b.as_mut_ptr() as *mut libc::c_void, 1, 0) } {
        1 => Ok(()),
        0 => Err(io::Error::new(io::ErrorKind::BrokenPipe, "the worker closed the shm socket while setting up")),
        _ => Err(io::Error::last_os_error()),
    }
}

// ---- fd passing (SCM_RIGHTS) ---------------------------------------------------------------------

/// What a connection to a worker's shm socket is for: the first byte of its set-up message.
pub(crate) const KIND_RINGS: u8 = 1; // the crate's gRPC over two rings (this file)
pub(crate) const KIND_DATA: u8 = 2; // execute_task's batches, one copy per hop (exchange.rs)

pub(crate) fn send_fds(sock: RawFd, kind: u8, fds: &[RawFd]) -> io::Result<()> {
    let mut byte = [kind; 1];
    let mut iov = libc::iovec { iov_base: byte.as_mut_ptr() as *mut libc::c_void, iov_len: 1 };
    let space = unsafe { libc::CMSG_SPACE((fds.len() * std::mem::size_of::<RawFd>()) as u32) } as usize;
    let mut cbuf = vec![0u8; space];
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
    msg.msg_controllen = space as _;
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN((fds.len() * std::mem::size_of::<RawFd>()) as u32) as _;
        std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(c) as *mut RawFd, fds.len());
        if libc::sendmsg(sock, &msg, 0) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The set-up message: its kind byte and the descriptors it passed (at most `max`).
pub(crate) fn recv_fds(sock: RawFd, max: usize) -> io::Result<(u8, Vec<OwnedFd>)> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec { iov_base: byte.as_mut_ptr() as *mut libc::c_void, iov_len: 1 };
    let space = unsafe { libc::CMSG_SPACE((max * std::mem::size_of::<RawFd>()) as u32) } as usize;
    let mut cbuf = vec![0u8; space];
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
    msg.msg_controllen = space as _;
    let r = unsafe { libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if r <= 0 {
        return Err(if r == 0 { io::Error::from(io::ErrorKind::UnexpectedEof) } else { io::Error::last_os_error() });
    }
    let mut out = Vec::new();
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        if c.is_null() || (*c).cmsg_type != libc::SCM_RIGHTS {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "no descriptors passed"));
        }
        let n = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / std::mem::size_of::<RawFd>();
        let p = libc::CMSG_DATA(c) as *const RawFd;
        for i in 0..n.min(max) {
            out.push(OwnedFd::from_raw_fd(*p.add(i)));
        }
    }
    Ok((byte[0], out))
}

/// Register a descriptor this stream owns with tokio's reactor.
fn async_fd<T: AsRawFd>(x: T) -> io::Result<AsyncFd<T>> {
    // SAFETY: the AsyncFd owns x, so the descriptor stays open for as long as it is registered
    unsafe { Ok(AsyncFd::register(x)?) }
}

// ---- the stream ------------------------------------------------------------------------------------

pub struct ShmStream {
    tx: Ring,
    rx: Ring,
    tx_data: OwnedFd,          // signalled after we write (the peer waits on it)
    tx_space: AsyncFd<OwnedFd>, // we wait on it when our ring is full
    rx_data: AsyncFd<OwnedFd>,  // we wait on it for data
    rx_space: OwnedFd,          // signalled after we read
    control: AsyncFd<std::os::unix::net::UnixStream>, // its hang-up: the peer is gone
}

impl ShmStream {
    /// The client's end: make the rings and events, pass them over the worker's shm socket.
    pub async fn connect(path: &str) -> io::Result<ShmStream> {
        let sock = tokio::net::UnixStream::connect(path).await?.into_std()?;
        sock.set_nonblocking(false)?;
        let server = peer_pid(sock.as_raw_fd())?;
        let (c2s, s2c) = (memfd(RING_BYTES, server)?, memfd(RING_BYTES, std::process::id() as i32)?);
        let (c2s_data, c2s_space, s2c_data, s2c_space) = (eventfd()?, eventfd()?, eventfd()?, eventfd()?);
        // we read s2c: bound to our node before the worker can touch it; the worker binds c2s to its
        // own and says so (one byte) before we may write into it
        let rx = Ring::map(s2c.as_raw_fd(), RING_BYTES, true)?;
        let fds = [&c2s, &s2c, &c2s_data, &c2s_space, &s2c_data, &s2c_space].map(|f| f.as_raw_fd());
        let fd = sock.as_raw_fd();
        tokio::task::spawn_blocking(move || send_fds(fd, KIND_RINGS, &fds).and_then(|()| recv_ack(fd)))
            .await
            .map_err(io::Error::other)??;
        let tx = Ring::map(c2s.as_raw_fd(), RING_BYTES, false)?;
        Self::assemble(tx, rx, c2s_data, c2s_space, s2c_data, s2c_space, sock)
    }

    /// The worker's end of one accepted shm socket whose set-up message passed the rings (6 fds).
    fn accept(sock: std::os::unix::net::UnixStream, fds: Vec<OwnedFd>) -> io::Result<ShmStream> {
        if fds.len() != 6 {
            return Err(io::Error::new(io::ErrorKind::InvalidData, format!("{} descriptors passed, 6 expected", fds.len())));
        }
        let mut f = fds.into_iter();
        let (c2s, s2c) = (f.next().unwrap(), f.next().unwrap());
        let (c2s_data, c2s_space, s2c_data, s2c_space) =
            (f.next().unwrap(), f.next().unwrap(), f.next().unwrap(), f.next().unwrap());
        let rx = Ring::map(c2s.as_raw_fd(), RING_BYTES, true)?;
        let tx = Ring::map(s2c.as_raw_fd(), RING_BYTES, false)?;
        send_ack(sock.as_raw_fd())?; // c2s is bound to our node: the client may write
        Self::assemble(tx, rx, s2c_data, s2c_space, c2s_data, c2s_space, sock)
    }

    fn assemble(tx: Ring, rx: Ring, tx_data: OwnedFd, tx_space: OwnedFd, rx_data: OwnedFd, rx_space: OwnedFd,
                sock: std::os::unix::net::UnixStream) -> io::Result<ShmStream> {
        sock.set_nonblocking(true)?;
        Ok(ShmStream {
            tx,
            rx,
            tx_data,
            tx_space: async_fd(tx_space)?,
            rx_data: async_fd(rx_data)?,
            rx_space,
            control: async_fd(sock)?,
        })
    }

    /// Ready(error) when the peer's end of the control socket has hung up.
    fn peer_gone(&self, cx: &mut Context<'_>) -> Poll<io::Error> {
        match self.control.poll_read_ready(cx) {
            Poll::Ready(Ok(mut g)) => {
                let mut b = [0u8; 1];
                let r = unsafe { libc::recv(self.control.as_raw_fd(), b.as_mut_ptr() as *mut libc::c_void, 1, libc::MSG_PEEK) };
                if r == 0 {
                    return Poll::Ready(io::Error::new(io::ErrorKind::BrokenPipe, "the peer tile is gone"));
                }
                g.clear_ready();
                Poll::Pending
            }
            Poll::Ready(Err(e)) => Poll::Ready(e),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncRead for ShmStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        loop {
            let h = me.rx.h();
            let tail = h.tail.load(Ordering::Relaxed);
            let avail = h.head.load(Ordering::Acquire) - tail;
            if avail > 0 {
                let pos = (tail % me.rx.cap as u64) as usize;
                let n = (avail as usize).min(buf.remaining()).min(me.rx.cap - pos);
                let src = unsafe { std::slice::from_raw_parts(me.rx.data().add(pos), n) };
                buf.put_slice(src);
                h.tail.store(tail + n as u64, Ordering::Release);
                signal(&me.rx_space);
                return Poll::Ready(Ok(()));
            }
            if h.closed.load(Ordering::Acquire) != 0 {
                return Poll::Ready(Ok(())); // end of stream
            }
            match me.rx_data.poll_read_ready(cx) {
                Poll::Ready(Ok(mut g)) => {
                    drain(me.rx_data.as_raw_fd());
                    g.clear_ready();
                    continue; // look again: the writer signals after it moves head
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => {
                    if let Poll::Ready(e) = me.peer_gone(cx) {
                        return Poll::Ready(Err(e));
                    }
                    // data may have come between the check and the registration
                    if me.rx.h().head.load(Ordering::Acquire) != tail {
                        continue;
                    }
                    return Poll::Pending;
                }
            }
        }
    }
}

impl AsyncWrite for ShmStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let me = self.get_mut();
        loop {
            let h = me.tx.h();
            let head = h.head.load(Ordering::Relaxed);
            let free = me.tx.cap as u64 - (head - h.tail.load(Ordering::Acquire));
            if free > 0 {
                let pos = (head % me.tx.cap as u64) as usize;
                let n = data.len().min(free as usize).min(me.tx.cap - pos);
                unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), me.tx.data().add(pos), n) };
                h.head.store(head + n as u64, Ordering::Release);
                signal(&me.tx_data);
                return Poll::Ready(Ok(n));
            }
            match me.tx_space.poll_read_ready(cx) {
                Poll::Ready(Ok(mut g)) => {
                    drain(me.tx_space.as_raw_fd());
                    g.clear_ready();
                    continue;
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => {
                    if let Poll::Ready(e) = me.peer_gone(cx) {
                        return Poll::Ready(Err(e));
                    }
                    let h = me.tx.h();
                    if me.tx.cap as u64 - (h.head.load(Ordering::Relaxed) - h.tail.load(Ordering::Acquire)) > 0 {
                        continue;
                    }
                    return Poll::Pending;
                }
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        me.tx.h().closed.store(1, Ordering::Release);
        signal(&me.tx_data);
        Poll::Ready(Ok(()))
    }
}

impl Drop for ShmStream {
    fn drop(&mut self) {
        self.tx.h().closed.store(1, Ordering::Release);
        signal(&self.tx_data);
    }
}

/// What a worker does with a data connection (exchange.rs): the socket and the arena it passed.
pub type OnData = std::sync::Arc<dyn Fn(std::os::unix::net::UnixStream, Vec<OwnedFd>) + Send + Sync>;

/// The worker's shm listener as a stream of ring connections for tonic's `serve_with_incoming`; a
/// data connection (KIND_DATA) goes to `on_data` instead.
pub fn incoming(path: &str, on_data: OnData) -> io::Result<impl futures::Stream<Item = io::Result<ShmStream>>> {
    let _ = std::fs::remove_file(path);
    let listener = tokio::net::UnixListener::bind(path)?;
    Ok(futures::stream::unfold((listener, on_data), |(l, on_data)| async move {
        loop {
            let sock = match l.accept().await.and_then(|(s, _)| s.into_std()) {
                Ok(s) => s,
                Err(e) => return Some((Err(e), (l, on_data))),
            };
            let set_up = tokio::task::spawn_blocking(move || -> io::Result<_> {
                sock.set_nonblocking(false)?;
                let (kind, fds) = recv_fds(sock.as_raw_fd(), 6)?;
                Ok((sock, kind, fds))
            });
            let r = match set_up.await.map_err(io::Error::other).and_then(|x| x) {
                Ok((sock, KIND_DATA, fds)) => {
                    on_data(sock, fds);
                    continue; // not tonic's: the next connection
                }
                Ok((sock, _, fds)) => tokio::task::spawn_blocking(move || ShmStream::accept(sock, fds))
                    .await
                    .map_err(io::Error::other)
                    .and_then(|x| x),
                Err(e) => Err(e),
            };
            return Some((r, (l, on_data)));
        }
    }))
}

impl tonic::transport::server::Connected for ShmStream {
    type ConnectInfo = ();
    fn connect_info(&self) -> Self::ConnectInfo {}
}
