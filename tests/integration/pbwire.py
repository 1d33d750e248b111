"""Just enough protobuf wire format for the hostile-peer and fault tests:
build memtally.v1 Request frames and read Response frames off a raw socket,
without the generated Python module (the tests must not depend on it)."""
import socket
import time

# Request body fields (proto/memtally.proto)
REGISTER, GET_USAGE, LIST_PROCESSES, ADMIT, RELEASE, SET_LIMIT, WATCH = range(3, 10)
# ErrorCode
ERROR_INVALID_REQUEST, ERROR_FRAME_TOO_LARGE, ERROR_UNDECODABLE = 1, 5, 6


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field(num, wt, payload):
    tag = varint(num << 3 | wt)
    if wt == 0:
        return tag + varint(payload)
    return tag + varint(len(payload)) + payload


def frame(body):
    return varint(len(body)) + body


def request(req_id, body_field, body=b""):
    return frame(field(1, 0, req_id) + field(body_field, 2, body))


def get_usage(req_id):
    return request(req_id, GET_USAGE, field(1, 0, 1))


def read_varint(buf, pos):
    shift = val = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        b = buf[pos]
        pos += 1
        val |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return val, pos
        if shift > 63:
            raise ValueError("varint too long")


def parse(buf):
    """Top-level fields of a message: {number: [value, ...]} (bytes for
    length-delimited fields, ints for varints)."""
    out = {}
    pos = 0
    while pos < len(buf):
        tag, pos = read_varint(buf, pos)
        num, wt = tag >> 3, tag & 7
        if wt == 0:
            v, pos = read_varint(buf, pos)
        elif wt == 2:
            n, pos = read_varint(buf, pos)
            v = bytes(buf[pos:pos + n])
            pos += n
        elif wt == 1:
            v = bytes(buf[pos:pos + 8])
            pos += 8
        elif wt == 5:
            v = bytes(buf[pos:pos + 4])
            pos += 4
        else:
            raise ValueError(f"wire type {wt}")
        out.setdefault(num, []).append(v)
    return out


class Reader:
    """Frames off a socket, with a deadline per frame."""

    def __init__(self, sock):
        self.sock = sock
        self.buf = bytearray()
        self.eof = False

    def _fill(self, end):
        left = end - time.monotonic()
        if left <= 0:
            raise TimeoutError("no response")
        self.sock.settimeout(left)
        try:
            data = self.sock.recv(65536)
        except socket.timeout:
            raise TimeoutError("no response") from None
        except ConnectionResetError:
            data = b""
        if not data:
            self.eof = True
        self.buf += data

    def frame(self, timeout):
        """The next Response as parsed fields, or None at EOF."""
        end = time.monotonic() + timeout
        while True:
            try:
                n, pos = read_varint(self.buf, 0)
                if len(self.buf) - pos >= n:
                    body = bytes(self.buf[pos:pos + n])
                    del self.buf[:pos + n]
                    return parse(body)
            except ValueError:
                pass
            if self.eof:
                return None
            self._fill(end)

    def until_eof(self, timeout):
        """Every Response up to EOF (raises TimeoutError if none comes)."""
        frames = []
        while True:
            f = self.frame(timeout)
            if f is None:
                return frames
            frames.append(f)


def error_code(resp):
    """The Error code of a parsed Response, 0 when it carries no error."""
    if 2 not in resp:
        return 0
    err = parse(resp[2][0])
    return err.get(1, [0])[0]
