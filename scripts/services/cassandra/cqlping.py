#!/usr/bin/env python3
"""Tiny dependency-free CQL client (native protocol v4) for scripts/services/cassandra.sh.

  cqlping.py [OPTIONS] ping
      STARTUP + `SELECT release_version FROM system.local`; prints the version.
  cqlping.py [OPTIONS] [--header] [--quorum] cql STATEMENT...
      Runs each statement in order on one connection (consistency ONE, or
      QUORUM, no paging) and prints result rows tab-separated (null -> "null").

OPTIONS: --host H, --port P, --timeout S; --ca FILE: TLS, the server verified
against FILE, as --sni NAME (default: the host); --user NAME: log in (SASL
PLAIN) with the password in $CQLPING_PASSWORD (kept off the command line).
Exit status: 0 ok, 1 server error / protocol problem, 2 cannot connect (TCP/TLS),
3 login refused.
"""
import argparse
import ipaddress
import json
import os
import socket
import ssl
import struct
import sys
import uuid

OP_ERROR, OP_STARTUP, OP_READY, OP_AUTHENTICATE, OP_QUERY, OP_RESULT = 0x00, 0x01, 0x02, 0x03, 0x07, 0x08
OP_AUTH_RESPONSE, OP_AUTH_SUCCESS = 0x0F, 0x10


class CqlError(Exception):
    pass


class Buf:
    def __init__(self, data):
        self.d, self.i = data, 0

    def take(self, n):
        if self.i + n > len(self.d):
            raise CqlError("truncated frame")
        b = self.d[self.i:self.i + n]
        self.i += n
        return b

    def int(self):
        return struct.unpack(">i", self.take(4))[0]

    def short(self):
        return struct.unpack(">H", self.take(2))[0]

    def string(self):
        return self.take(self.short()).decode("utf-8")

    def bytes(self):
        n = self.int()
        return None if n < 0 else self.take(n)

    def option(self):
        t = self.short()
        if t == 0x0000:
            return (t, self.string())
        if t in (0x0020, 0x0022):  # list, set
            return (t, self.option())
        if t == 0x0021:  # map
            return (t, self.option(), self.option())
        if t == 0x0030:  # udt
            ks, name = self.string(), self.string()
            return (t, [(self.string(), self.option()) for _ in range(self.short())])
        if t == 0x0031:  # tuple
            return (t, [self.option() for _ in range(self.short())])
        return (t,)


def decode(opt, b):
    if b is None:
        return None
    t = opt[0]
    if t in (0x0001, 0x000D):  # ascii, varchar/text
        return b.decode("utf-8", "replace")
    if t in (0x0002, 0x0005, 0x000B):  # bigint, counter, timestamp (ms)
        return struct.unpack(">q", b)[0]
    if t == 0x0009:
        return struct.unpack(">i", b)[0]
    if t == 0x0013:
        return struct.unpack(">h", b)[0]
    if t == 0x0014:
        return struct.unpack(">b", b)[0]
    if t == 0x000E:  # varint
        return int.from_bytes(b, "big", signed=True)
    if t == 0x0004:
        return b != b"\x00"
    if t == 0x0007:
        return struct.unpack(">d", b)[0]
    if t == 0x0008:
        return struct.unpack(">f", b)[0]
    if t in (0x000C, 0x000F):
        return str(uuid.UUID(bytes=b))
    if t == 0x0010:
        return str(ipaddress.ip_address(b))
    if t in (0x0020, 0x0022, 0x0021):
        r = Buf(b)
        n = r.int()
        if t == 0x0021:
            return {_key(decode(opt[1], r.bytes())): decode(opt[2], r.bytes()) for _ in range(n)}
        items = [decode(opt[1], r.bytes()) for _ in range(n)]
        return items if t == 0x0020 else set(map(_key, items))
    if t == 0x0031:
        r = Buf(b)
        return tuple(decode(o, r.bytes()) if r.i < len(b) else None for o in opt[1])
    if t == 0x0030:
        r = Buf(b)
        return {name: (decode(o, r.bytes()) if r.i < len(b) else None) for name, o in opt[1]}
    return "0x" + b.hex()  # blob, decimal, date, time, duration, custom...


def _key(v):
    return tuple(v) if isinstance(v, list) else v


class Conn:
    def __init__(self, host, port, timeout, ca=None, sni=None, user=None, password=""):
        try:
            self.s = socket.create_connection((host, port), timeout=timeout)
            if ca:
                self.s = ssl.create_default_context(cafile=ca).wrap_socket(self.s, server_hostname=sni or host)
        except OSError as e:  # ssl.SSLError included
            raise ConnectionError(f"cannot connect to {host}:{port}{' over TLS' if ca else ''}: {e}") from e
        self.stream = 0
        body = struct.pack(">H", 1) + _str("CQL_VERSION") + _str("3.0.0")
        op, _ = self.request(OP_STARTUP, body)
        if op == OP_AUTHENTICATE:
            if user is None:
                raise CqlError("server requires authentication (give --user)")
            tok = b"\0" + user.encode() + b"\0" + password.encode()
            try:
                op, _ = self.request(OP_AUTH_RESPONSE, struct.pack(">i", len(tok)) + tok)
            except CqlError as e:
                raise PermissionError(str(e)) from e
            if op != OP_AUTH_SUCCESS:
                raise CqlError(f"unexpected opcode {op:#x} after AUTH_RESPONSE")
        elif op != OP_READY:
            raise CqlError(f"unexpected opcode {op:#x} after STARTUP")

    def _recv(self, n):
        out = b""
        while len(out) < n:
            chunk = self.s.recv(n - len(out))
            if not chunk:
                raise CqlError("connection closed by server")
            out += chunk
        return out

    def request(self, opcode, body):
        self.stream = (self.stream + 1) % 32768
        self.s.sendall(struct.pack(">BBhBi", 0x04, 0, self.stream, opcode, len(body)) + body)
        while True:
            ver, flags, stream, op, length = struct.unpack(">BBhBi", self._recv(9))
            data = self._recv(length)
            if stream != self.stream:  # e.g. server events (stream -1): ignore
                continue
            if flags & 0x01:
                raise CqlError("compressed frame (not supported)")
            b = Buf(data)
            if flags & 0x02:  # tracing id
                b.take(16)
            if flags & 0x08:  # warnings
                for _ in range(b.short()):
                    print("warning: " + b.string(), file=sys.stderr)
            if flags & 0x04:  # custom payload
                for _ in range(b.short()):
                    b.string()
                    b.bytes()
            if op == OP_ERROR:
                code = b.int()
                raise CqlError(f"server error {code:#06x}: {b.string()}")
            return op, b

    def query(self, cql, consistency=0x0001):
        body = struct.pack(">i", len(cql.encode())) + cql.encode() + struct.pack(">HB", consistency, 0)
        op, b = self.request(OP_QUERY, body)
        if op != OP_RESULT:
            raise CqlError(f"unexpected opcode {op:#x} for QUERY")
        kind = b.int()
        if kind != 0x0002:  # void, set_keyspace, prepared, schema_change
            return None, None
        flags, ncols = b.int(), b.int()
        if flags & 0x0002:
            b.bytes()  # paging state
        cols = []
        if not flags & 0x0004:  # no_metadata
            glob = flags & 0x0001
            if glob:
                b.string(), b.string()
            for _ in range(ncols):
                if not glob:
                    b.string(), b.string()
                cols.append((b.string(), b.option()))
        rows = [[decode(opt, b.bytes()) for _, opt in cols] for _ in range(b.int())]
        return [c for c, _ in cols], rows


def _str(s):
    e = s.encode()
    return struct.pack(">H", len(e)) + e


def _fmt(v):
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, tuple, set, dict)):
        return json.dumps(_jsonable(v), sort_keys=True)
    return str(v)


def _jsonable(v):
    if isinstance(v, (set, frozenset)):
        return sorted((_jsonable(x) for x in v), key=repr)
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    return v


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=9042)
    ap.add_argument("--timeout", type=float, default=10.0)
    ap.add_argument("--ca", help="TLS, verifying the server against this CA file")
    ap.add_argument("--sni", help="server name to verify (default: --host)")
    ap.add_argument("--user", help="login name; password in $CQLPING_PASSWORD")
    ap.add_argument("--header", action="store_true", help="print column names first")
    ap.add_argument("--quorum", action="store_true", help="run statements at consistency QUORUM")
    ap.add_argument("cmd", choices=["ping", "cql"])
    ap.add_argument("statements", nargs="*")
    a = ap.parse_args()
    try:
        c = Conn(a.host, a.port, a.timeout, a.ca, a.sni, a.user, os.environ.get("CQLPING_PASSWORD", ""))
        if a.cmd == "ping":
            _, rows = c.query("SELECT release_version FROM system.local")
            if not rows:
                raise CqlError("system.local returned no rows")
            print(rows[0][0])
            return 0
        for stmt in a.statements:
            cols, rows = c.query(stmt, consistency=0x0004 if a.quorum else 0x0001)
            if cols is None:
                continue
            if a.header:
                print("\t".join(cols))
            for r in rows:
                print("\t".join(_fmt(v) for v in r))
        return 0
    except ConnectionError as e:
        print(f"cqlping: {e}", file=sys.stderr)
        return 2
    except PermissionError as e:  # before OSError, whose subclass it is
        print(f"cqlping: login refused: {e}", file=sys.stderr)
        return 3
    except (CqlError, OSError, struct.error) as e:
        print(f"cqlping: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
