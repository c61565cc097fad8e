# Loopback ports for the scripts that start peers (source it; bash).

# free_port: a TCP port on 127.0.0.1 that nothing uses now, below the kernel's ephemeral range, so
# that no connecting socket can be given it before the peer binds it (iscsi_test_peers::free_port).
# TEST_PORT_RANGE=LOW-HIGH draws from those ports only: scripts/linux-vm-tests gives each of the
# lanes it runs side by side a range of its own, so that two jobs never pick the same port.
free_port() {
    python3 -c '
import os, random, socket
low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
first, last = 10000, max(low, 11000) - 1
if os.environ.get("TEST_PORT_RANGE"):
    first, last = (int(p) for p in os.environ["TEST_PORT_RANGE"].split("-"))
for port in random.sample(range(first, last + 1), min(200, last + 1 - first)):
    try:
        socket.socket().bind(("127.0.0.1", port))
    except OSError:
        continue
    print(port)
    break
else:
    raise SystemExit("no free loopback port")'
}
