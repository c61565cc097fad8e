//! The TCP datamover's socket settings on a real loopback connection:
//! the send buffer asked for is the one the kernel applies (doubled for
//! its bookkeeping, capped by `net.core.wmem_max`).

use iscsi_datamover::Datamover;
use tokio::net::{TcpListener, TcpStream};

/// `net.core.wmem_max`: the most SO_SNDBUF may ask for without privilege.
fn wmem_max() -> usize {
    std::fs::read_to_string("/proc/sys/net/core/wmem_max")
        .expect("a Linux /proc")
        .trim()
        .parse()
        .unwrap()
}

async fn connected() -> (Datamover, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (client, accepted) = tokio::join!(TcpStream::connect(address), listener.accept());
    (
        Datamover::tcp(accepted.unwrap().0).unwrap(),
        client.unwrap(),
    )
}

#[tokio::test]
async fn the_send_buffer_asked_for_is_set() {
    let asked = 1 << 20;
    let (mut datamover, _client) = connected().await;
    let set = datamover.set_send_buffer(asked).unwrap();
    assert_eq!(set, 2 * asked.min(wmem_max()));
    let (mut other, _client) = connected().await;
    let larger = other.set_send_buffer(4 * asked).unwrap();
    assert_eq!(larger, 2 * (4 * asked).min(wmem_max()));
    assert!(larger >= set);
}
