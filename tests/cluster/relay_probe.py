#!/usr/bin/env python3
"""What the path between two namespaces costs: round-trip time of small messages and the rate
of a bulk transfer, for run_cluster.sh --probe (direct, or through ldc_delay_relay).

    relay_probe.py serve PORT              # in the far namespace: echo, then sink
    relay_probe.py probe HOST:PORT [MB]    # prints one JSON line

The client first sends 64-byte messages one at a time and waits for each echo (2,000 round
trips after 100 of warm-up; median and 90th percentile), then sends MB megabytes (default 256)
in 1 MiB writes and waits for the server's 8-byte count: the rate is bytes / time to that
answer. The two phases use separate connections.
"""
import json
import socket
import statistics
import sys
import time


def recv_exact(s, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed after %d of %d bytes" % (len(buf), n))
        buf += chunk
    return bytes(buf)


def serve(port):
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("0.0.0.0", port))
    ls.listen(4)
    # The echo connection.
    s, _ = ls.accept()
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while True:
        try:
            m = recv_exact(s, 64)
        except ConnectionError:
            break
        s.sendall(m)
    s.close()
    # The bulk connection: an 8-byte length, that many bytes, then the count back.
    s, _ = ls.accept()
    total = int.from_bytes(recv_exact(s, 8), "little")
    got = 0
    while got < total:
        chunk = s.recv(min(1 << 20, total - got))
        if not chunk:
            break
        got += len(chunk)
    s.sendall(got.to_bytes(8, "little"))
    s.close()


def connect(host, port, deadline=20.0):
    end = time.monotonic() + deadline
    while True:
        try:
            s = socket.create_connection((host, port), timeout=30)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return s
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.05)


def probe(addr, mb):
    host, port = addr.rsplit(":", 1)
    port = int(port)
    s = connect(host, port)
    msg = b"x" * 64
    rtts = []
    for i in range(2100):
        t = time.perf_counter()
        s.sendall(msg)
        recv_exact(s, 64)
        if i >= 100:
            rtts.append(time.perf_counter() - t)
    s.close()
    time.sleep(0.2)
    s = connect(host, port)
    total = mb << 20
    block = b"\0" * (1 << 20)
    t = time.perf_counter()
    s.sendall(total.to_bytes(8, "little"))
    for _ in range(mb):
        s.sendall(block)
    got = int.from_bytes(recv_exact(s, 8), "little")
    secs = time.perf_counter() - t
    s.close()
    rtts.sort()
    print(json.dumps({
        "rtt_median_us": round(statistics.median(rtts) * 1e6, 1),
        "rtt_p90_us": round(rtts[int(0.9 * len(rtts))] * 1e6, 1),
        "bulk_bytes": got,
        "bulk_gbit_per_s": round(got * 8 / secs / 1e9, 3),
    }))


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "serve":
        serve(int(sys.argv[2]))
    elif len(sys.argv) >= 3 and sys.argv[1] == "probe":
        probe(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 256)
    else:
        sys.exit(__doc__)
