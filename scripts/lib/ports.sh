# Loopback ports for the scripts that start peers (source it; bash).

# free_port: a TCP port on 127.0.0.1 that nothing uses now, below the kernel's ephemeral range, so
# that no connecting socket can be given it before the peer binds it (iscsi_test_peers::free_port).
free_port() {
    python3 -c '
import random, socket
low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
for port in random.sample(range(10000, max(low, 11000)), 200):
    try:
        socket.socket().bind(("127.0.0.1", port))
    except OSError:
        continue
    print(port)
    break
else:
    raise SystemExit("no free loopback port")'
}
