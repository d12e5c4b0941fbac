#!/usr/bin/env python3
"""TCP throughput between two test hosts, measured at the receiver.

  tcp_throughput.py serve --bind ADDR [--port P] [--connections N] [--timeout S]
  tcp_throughput.py send  --to ADDR   [--port P] [--seconds S] [--sndbuf BYTES] [--timeout S]

The receiver accepts N connections (default 1), reads each until its sender
closes its side, and answers every sender with one JSON line: the bytes
received on all N connections, the seconds from the first byte on any of them
to the last byte on any, and bits per second (the aggregate rate into this
host). The receiver and every sender print that line. Every blocking step has
a timeout (default 30 s); on failure either side exits 1 with a message naming
the operation and the peer. The sender stops writing after S seconds; what is
still in its socket buffer drains after that (seconds at low rates with the
kernel's autotuned buffer; --sndbuf caps it).
"""
import argparse
import json
import socket
import sys
import threading
import time

CHUNK = 1 << 20      # receive buffer
SEND_CHUNK = 1 << 16  # small, so that the sender stops close to its time


def drain(conn, peer, timeout, seen):
    """Reads `conn` to its end; records (bytes, first, last) in `seen[peer]`."""
    conn.settimeout(timeout)
    buf = bytearray(CHUNK)
    total, first, last = 0, None, None
    try:
        while True:
            n = conn.recv_into(buf)
            if n == 0:
                break
            now = time.monotonic()
            if first is None:
                first = now
            total += n
            last = now
        seen[peer] = (total, first, last)
    except OSError as e:
        seen[peer] = e


def serve(args):
    with socket.create_server((args.bind, args.port)) as srv:
        srv.settimeout(args.timeout)
        conns, seen, readers = [], {}, []
        for _ in range(args.connections):
            try:
                conn, peer = srv.accept()
            except OSError as e:
                raise OSError(f"accept on {args.bind}:{args.port} ({len(conns)} of {args.connections} "
                              f"connected): {e}")
            conns.append(conn)
            readers.append(threading.Thread(target=drain, args=(conn, peer, args.timeout, seen)))
            readers[-1].start()
        for r in readers:
            r.join()
        for peer, got in seen.items():
            if isinstance(got, OSError):
                raise OSError(f"receive from {peer[0]}:{peer[1]}: {got}")
        total = sum(got[0] for got in seen.values())
        firsts = [got[1] for got in seen.values() if got[1] is not None]
        lasts = [got[2] for got in seen.values() if got[2] is not None]
        seconds = (max(lasts) - min(firsts)) if firsts else 0.0
        result = {"bytes": total, "seconds": round(seconds, 6),
                  "bits_per_second": round(8 * total / seconds) if seconds > 0 else 0,
                  "from": sorted(peer[0] for peer in seen)}
        line = json.dumps(result)
        for conn in conns:
            with conn:
                conn.sendall(line.encode() + b"\n")
        print(line, flush=True)


def send(args):
    deadline = time.monotonic() + args.timeout
    while True:  # the receiver may not be listening yet
        try:
            conn = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            if args.sndbuf:
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, args.sndbuf)
            conn.settimeout(args.timeout)
            conn.connect((args.to, args.port))
            break
        except OSError as e:
            conn.close()
            if time.monotonic() > deadline:
                raise OSError(f"connect to {args.to}:{args.port} failed for {args.timeout} s: {e}")
            time.sleep(0.05)
    with conn:
        conn.settimeout(args.timeout)
        payload = b"\0" * SEND_CHUNK
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            conn.sendall(payload)
        conn.shutdown(socket.SHUT_WR)
        answer = b""
        while not answer.endswith(b"\n"):
            part = conn.recv(4096)
            if not part:
                raise OSError(f"receiver {args.to}:{args.port} closed without a result")
            answer += part
        print(answer.decode().strip(), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--bind", required=True)
    s.add_argument("--port", type=int, default=5201)
    s.add_argument("--connections", type=int, default=1)
    s.add_argument("--timeout", type=float, default=30.0)
    c = sub.add_parser("send")
    c.add_argument("--to", required=True)
    c.add_argument("--port", type=int, default=5201)
    c.add_argument("--seconds", type=float, default=3.0)
    c.add_argument("--sndbuf", type=int, default=0)
    c.add_argument("--timeout", type=float, default=30.0)
    args = p.parse_args()
    try:
        serve(args) if args.mode == "serve" else send(args)
    except OSError as e:
        print(f"tcp_throughput {args.mode}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
