"""Generators and oracles for the fuzz categories of issue 23: dump containers (npz
members and metadata, safetensors headers, files rewritten while open), output-path
combinations (two outputs of one run), and DAP-over-TCP framing.

Used by benchmarks/fuzz.py (thousands of cases) and tests/test_fuzz.py (a few, under
hypothesis). Each ``*_case`` returns (outcome, detail) with the outcomes of fuzzing.py.
"""
from __future__ import annotations

import io
import json
import os
import socket
import struct
import threading
import time
import zipfile
from pathlib import Path

import numpy as np

from fuzzing import DECODED, ESCAPE, FIRERROR, run_cli_case

# -- dump containers -------------------------------------------------------------------------
DUMP_KINDS = ("flag_bits", "method", "npy_header", "truncate_member", "metadata", "flip",
              "truncate_file", "duplicate", "deflate_garbage", "st_header", "st_truncate",
              "st_flip", "rewrite_open")
_DESCRS = ("<f4", "<f2", ">f8", "<i8", "|O", "<U1", "|b1", "<c8", "V8", "<f16", "garbage")
_SHAPES = ((), (0,), (3,), (10 ** 13,), (2 ** 62, 4), (-1,), (1, 1, 1, 1, 1, 1, 1, 1, 1, 1))


def base_dumps(folder: Path) -> dict[str, bytes]:
    """A small valid dump of each kind (two steps, two keys, metadata), as bytes."""
    from firscope.dump import DumpWriter
    out = {}
    for suffix in (".npz", ".safetensors"):
        path = folder / f"base{suffix}"
        with DumpWriter(path, tokens=[1, 2], producer="fuzz", model="0" * 64) as w:
            for step in range(2):
                w.add(step, "attention@0", "attn", np.arange(8, dtype=np.float32) + step)
                w.add(step, "ln_f", "out", np.ones((2, 3), np.float16))
        out[suffix] = path.read_bytes()
        path.unlink()
    return out


def _npy(shape, descr: str, payload: bytes = b"", fortran: bool = False) -> bytes:
    header = repr({"descr": descr, "fortran_order": fortran, "shape": shape}).encode()
    header += b" " * (-(10 + len(header) + 1) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + payload


def _rezip(data: bytes, edit) -> bytes:
    """The zip rebuilt member by member; ``edit(name, bytes)`` returns a list of
    (name, bytes, compression) to write in its place."""
    import warnings
    src = zipfile.ZipFile(io.BytesIO(data))
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Duplicate name": written on purpose
        with zipfile.ZipFile(buf, "w") as dst:
            for info in src.infolist():
                for name, body, comp in edit(info.filename, src.read(info.filename)):
                    dst.writestr(zipfile.ZipInfo(name), body, compress_type=comp)
    return buf.getvalue()


def _patch_all_headers(data: bytes, pick, field: str) -> bytes:
    """Set flag bits or the compression method of a random member's headers."""
    out = bytearray(data)
    for sig, flag_at, method_at in ((b"PK\x03\x04", 6, 8), (b"PK\x01\x02", 8, 10)):
        starts = [i for i in range(len(out) - 4) if out[i: i + 4] == sig]
        if not starts:
            continue
        at = starts[pick(len(starts))] if pick(2) else None
        for s in ([at] if at is not None else starts):
            if field == "flags":
                bits = int.from_bytes(out[s + flag_at: s + flag_at + 2], "little")
                bits |= (1, 0x40, 0x2000, 0xFFFF)[pick(4)]
                out[s + flag_at: s + flag_at + 2] = bits.to_bytes(2, "little")
            else:
                m = (1, 6, 9, 12, 14, 97, 99, 0xFFFF)[pick(8)]
                out[s + method_at: s + method_at + 2] = m.to_bytes(2, "little")
    return bytes(out)


def damage_dump(kind: str, npz: bytes, st: bytes, pick) -> tuple[str, bytes]:
    """(suffix, bytes) of a damaged dump."""
    if kind == "flag_bits":
        return ".npz", _patch_all_headers(npz, pick, "flags")
    if kind == "method":
        return ".npz", _patch_all_headers(npz, pick, "method")
    if kind in ("npy_header", "truncate_member", "metadata", "duplicate", "deflate_garbage"):
        return ".npz", _rezip(npz, lambda n, b: _edit_member(kind, n, b, pick))
    if kind == "flip":
        return ".npz", _flip(npz, pick)
    if kind == "truncate_file":
        return ".npz", npz[: pick(len(npz))]
    if kind == "st_header":
        return ".safetensors", _st_header(st, pick)
    if kind == "st_truncate":
        return ".safetensors", st[: pick(len(st))]
    return ".safetensors", _flip(st, pick)


def _edit_member(kind: str, name: str, body: bytes, pick):
    is_meta = name.startswith("__metadata__")
    stored = zipfile.ZIP_STORED
    if kind == "metadata" and is_meta:
        choice = pick(6)
        if choice == 0:
            return [(name, _npy(_SHAPES[pick(len(_SHAPES))], _DESCRS[pick(len(_DESCRS))],
                                b"x" * pick(200)), stored)]
        if choice == 1:  # a JSON value that is not an object of strings
            value = ("[]", "1", '{"tokens": 5}', '{"tokens": "1,x"}', '"' + "a" * 5000 + '"',
                     "{" * 3000)[pick(6)]
            return [(name, _npy_bytes(np.array(value)), stored)]
        if choice == 2:
            return [(name, body[: pick(len(body) + 1)], stored)]
        if choice == 3:
            return []  # no metadata at all
        if choice == 4:
            return [(name, body, stored), (name, body, stored)]
        return [(name, _npy_bytes(np.array(json.dumps({"tokens": ",".join(
            str(pick(10 ** 15)) for _ in range(pick(5)))}))), stored)]
    if is_meta or pick(2):
        return [(name, body, stored)]
    if kind == "npy_header":
        return [(name, _npy(_SHAPES[pick(len(_SHAPES))], _DESCRS[pick(len(_DESCRS))],
                            body[-pick(64) or len(body):], fortran=bool(pick(2))), stored)]
    if kind == "truncate_member":
        return [(name, body[: pick(len(body) + 1)], stored)]
    if kind == "duplicate":
        return [(name, body, stored), (name, body[: pick(len(body) + 1)], stored)]
    # deflate_garbage: compressed, then bytes of the compressed stream changed
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(name, body)
    raw = zipfile.ZipFile(io.BytesIO(buf.getvalue())).read(name)
    return [(name, raw, zipfile.ZIP_DEFLATED)]


def _npy_bytes(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, a, allow_pickle=False)
    return buf.getvalue()


def _flip(data: bytes, pick) -> bytes:
    out = bytearray(data)
    for _ in range(1 + pick(8)):
        out[pick(len(out))] = pick(256)
    return bytes(out)


def _st_header(st: bytes, pick) -> bytes:
    n = struct.unpack("<Q", st[:8])[0]
    head = json.loads(st[8: 8 + n])
    key = sorted(k for k in head if k != "__metadata__")[pick(2)]
    choice = pick(5)
    if choice == 0:
        head[key]["data_offsets"] = [pick(10 ** 6), pick(10 ** 18)]
    elif choice == 1:
        head[key]["shape"] = list(_SHAPES[pick(len(_SHAPES))])
    elif choice == 2:
        head[key]["dtype"] = ("F32", "BF16", "I64", "U8", "X", 5)[pick(6)]
    elif choice == 3:
        head["__metadata__"] = ({"tokens": "9" * 40}, [], {"model": 3}, "x")[pick(4)]
    else:
        return struct.pack("<Q", (10 ** 13, n + 5, 3)[pick(3)]) + st[8:]
    body = json.dumps(head).encode()
    return struct.pack("<Q", len(body)) + body + st[8 + n:]


def read_everything(path: Path) -> None:
    """What a diff does with a dump: open it, read its metadata and every tensor."""
    from firscope.compare.dumpfile import Dump
    d = Dump(path)
    try:
        d.tokens  # noqa: B018 - parsed here: an error must be a FirError
        for key, entry in d.entries.items():
            if entry.is_float:
                d.read(key)
    finally:
        d.close()


def dump_case(kind: str, base: dict[str, bytes], folder: Path, pick):
    """One damaged dump read as a diff reads it; "rewrite_open" rewrites a valid dump
    while it is open (the process must not die of SIGBUS)."""
    from firscope.errors import FirError
    folder.mkdir(parents=True, exist_ok=True)
    if kind == "rewrite_open":
        return _rewrite_open_case(base, folder, pick)
    suffix, data = damage_dump(kind, base[".npz"], base[".safetensors"], pick)
    path = folder / f"case{suffix}"
    path.write_bytes(data)
    try:
        read_everything(path)
    except FirError as e:
        if path.name not in str(e):
            return ESCAPE, AssertionError(f"a FirError that does not name the file: {e}")
        return FIRERROR, None
    except BaseException as e:  # noqa: BLE001 - everything else is a finding
        return ESCAPE, e
    return DECODED, None


def _rewrite_open_case(base, folder: Path, pick):
    from firscope.compare.dumpfile import Dump
    from firscope.errors import FirError
    suffix = (".npz", ".safetensors")[pick(2)]
    path = folder / f"open{suffix}"
    path.write_bytes(base[suffix])
    d = Dump(path)
    keys = sorted(d.entries)
    held = d.read(keys[0])
    before = held.copy()
    with open(path, "r+b" if pick(2) else "wb") as f:  # in place: truncated or overwritten
        f.truncate(pick(len(base[suffix])))
        if pick(2):
            f.write(bytes(pick(256) for _ in range(pick(100))))
    try:
        for key in keys:
            d.read(key)
    except FirError as e:
        if "changed on disk" not in str(e):
            return ESCAPE, AssertionError(f"not reported as a changed dump: {e}")
    except BaseException as e:  # noqa: BLE001
        return ESCAPE, e
    else:
        return ESCAPE, AssertionError("a dump rewritten while open read without complaint")
    if not np.array_equal(held, before):
        return ESCAPE, AssertionError("a value read before the rewrite changed")
    return FIRERROR, None


# -- output-path combinations ----------------------------------------------------------------
PAIR_KINDS = ("new_a", "new_b", "same", "dot_dot_same", "link_to_folder_same", "hard_link",
              "victim_link", "device_link", "dev_null", "long_name", "too_long", "folder",
              "existing_dump", "existing_other")


def pair_path(kind: str, folder: Path, other: str | None) -> str:
    """An output path for the second (or first) output of a run, ``other`` the first."""
    sub = folder / "sub"
    table = {
        "new_a": folder / "a.npz", "new_b": folder / "out.npy",
        "same": Path(other) if other else folder / "a.npz",
        "dot_dot_same": (sub / ".." / Path(other).name) if other else folder / "a.npz",
        "link_to_folder_same": (folder / "here" / Path(other).name) if other
        else folder / "a.npz",
        "hard_link": folder / "hard", "victim_link": folder / "link",
        "device_link": folder / "devlink", "dev_null": Path("/dev/null"),
        "long_name": folder / ("n" * 248 + ".npz"), "too_long": folder / ("n" * 300),
        "folder": sub, "existing_dump": folder / "old.npz", "existing_other": folder / "a_file",
    }
    return str(table[kind])


def prepare_pair_folder(folder: Path, old_dump: bytes) -> None:
    from fuzzing import prepare_output_folder
    prepare_output_folder(folder)
    for name in ("a.npz", "out.npy", "n" * 248 + ".npz"):
        (folder / name).unlink(missing_ok=True)
    (folder / "old.npz").write_bytes(old_dump)
    if not os.path.lexists(folder / "here"):
        os.symlink(folder, folder / "here")
    if not os.path.lexists(folder / "devlink"):
        os.symlink("/dev/null", folder / "devlink")
    (folder / "hard").unlink(missing_ok=True)
    os.link(folder / "a_file", folder / "hard")


def outputs_case(model: str, folder: Path, old_dump: bytes, pick):
    """``run --dump P --logits-out Q`` for a pair of hostile paths: refused (exit 1/2) when
    they name one file or either is a link, device or folder; never a traceback, never a
    write through a link or over a non-dump."""
    prepare_pair_folder(folder, old_dump)
    first = pair_path(PAIR_KINDS[pick(len(PAIR_KINDS))], folder, None)
    second = pair_path(PAIR_KINDS[pick(len(PAIR_KINDS))], folder, first)
    order = [("--dump", first), ("--logits-out", second)]
    if pick(2):
        order = [("--dump", second), ("--logits-out", first)]
    argv = ["run", model, "--engine", "interp", "--tokens", "1", "-n", "1"]
    for flag, p in order:
        argv += [flag, p]
    same = os.path.realpath(first) == os.path.realpath(second) or _same(first, second)
    dump_at = dict(order)["--dump"]
    outcome, detail = run_cli_case(argv, folder)
    problems = []
    if outcome == DECODED and same:
        problems.append("two outputs naming one file were accepted")
    # --logits-out replaces only a .npy (issue 39.4), --dump only a dump
    for name in ("a_file", "hard"):  # plain text: neither output may replace it
        if (folder / name).exists() and (folder / name).read_bytes() != b"a file":
            problems.append(f"an output replaced {name}, which is not a dump or a .npy")
    if not os.path.islink(folder / "devlink") or not os.path.exists("/dev/null") \
            or os.path.isfile("/dev/null"):
        problems.append("a link or device was replaced")
    if outcome != ESCAPE and problems:
        return ESCAPE, AssertionError(f"{'; '.join(problems)}: {argv[-4:]}")
    return outcome, detail


def _same(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


# -- DAP over TCP ----------------------------------------------------------------------------
FRAME_KINDS = ("valid", "http_post", "http_get", "bad_length", "no_length", "huge_length",
               "short_body", "not_json", "garbage", "empty_lines", "split_bytes",
               "garbage_after_valid", "nul", "lowercase", "two_valid")


def _msg(seq: int, command: str, **args) -> bytes:
    body = json.dumps({"seq": seq, "type": "request", "command": command,
                       "arguments": args}).encode()
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


def frame_bytes(kind: str, pick) -> tuple[bytes, bool]:
    """(bytes a client sends, whether they start with a DAP header)."""
    init = _msg(1, "initialize", adapterID="fuzz")
    launch = json.dumps({"seq": 1, "type": "request", "command": "launch",
                         "arguments": {"model": "/nonexistent.fir"}}).encode()
    table = {
        "valid": (init + _msg(2, "disconnect"), True),
        "http_post": (b"POST http://127.0.0.1:1/ HTTP/1.1\r\nHost: x\r\nContent-Length: "
                      + str(len(launch)).encode() + b"\r\n\r\n" + launch, False),
        "http_get": (b"GET /ws HTTP/1.1\r\nUpgrade: websocket\r\n\r\n", False),
        "bad_length": (b"Content-Length: 1x\r\n\r\n{}", True),
        "no_length": (b"Content-Type: json\r\n\r\n{}", False),
        "huge_length": (b"Content-Length: 99999999999\r\n\r\n", True),
        "short_body": (b"Content-Length: 50\r\n\r\n{\"seq\": 1}", True),
        "not_json": (b"Content-Length: 3\r\n\r\n{x}", True),
        "garbage": (bytes(pick(256) for _ in range(1 + pick(300))), False),
        "empty_lines": (b"\r\n" * (1 + pick(5)) + init, False),
        "split_bytes": (init, True),
        "garbage_after_valid": (init + b"no colon\r\n" + _msg(2, "threads"), True),
        "nul": (b"Content-Length: 2\r\n\x00\r\n\r\n{}", True),
        "lowercase": (b"content-length: 2\r\n\r\n{}", True),
        "two_valid": (init + _msg(2, "threads") + _msg(3, "disconnect"), True),
    }
    data, dap = table[kind]
    if kind == "garbage":
        dap = data[:15].lower() == b"content-length:"[: len(data[:15])] and len(data) >= 15
    return data, dap


class TcpServer:
    """One ``serve_tcp`` on a loopback port in a thread of this process, for every case."""

    def __init__(self, idle: float = 0.5):
        import secrets
        from firscope.dap.server import serve_tcp
        self.port = None
        self.token = secrets.token_urlsafe(24)  # what a client must show (fuzzing_trust)
        ready = threading.Event()

        def run():
            serve_tcp(0, ready=lambda p: (setattr(self, "port", p), ready.set()),
                      idle_timeout=idle, token=self.token)
        threading.Thread(target=run, name="fuzz-dap-tcp", daemon=True).start()
        if not ready.wait(30):
            raise RuntimeError("the DAP server did not start")


def _exchange(port: int, data: bytes, split: bool, half_close: bool, limit: float) -> bytes:
    s = socket.create_connection(("127.0.0.1", port), timeout=limit)
    got = b""
    try:
        try:
            if split:
                for i in range(len(data)):
                    s.sendall(data[i: i + 1])
            else:
                s.sendall(data)
            if half_close:
                s.shutdown(socket.SHUT_WR)
        except OSError:  # the server closed a stream that is not DAP before it was all sent
            pass
        end = time.monotonic() + limit
        while time.monotonic() < end:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                return got
            got += chunk
        raise TimeoutError(f"the server kept the connection open {limit} s: {got[:200]!r}")
    finally:
        s.close()


def _responses(data: bytes) -> list[dict]:
    from firscope.dap.protocol import read_message
    stream, out = io.BytesIO(data), []
    while (m := read_message(stream)) is not None:
        out.append(m)
    return out


def dap_tcp_case(server: TcpServer, kind: str, pick):
    """Bytes of ``kind`` sent to the server: a stream not starting with a DAP header gets
    nothing back; the server closes every connection by itself (after the client's end,
    or the idle timeout); a clean client is served right after."""
    data, dap = frame_bytes(kind, pick)
    half_close = not (kind in ("garbage", "http_get", "http_post") and pick(2))
    try:
        got = _exchange(server.port, data, kind == "split_bytes", half_close, 20)
        if not dap and got:
            return ESCAPE, AssertionError(f"answered a stream that is not DAP: {got[:200]!r}")
        answered = [m for m in _responses(got) if m.get("type") == "response"]
        if kind in ("garbage_after_valid",) and any(m["command"] == "threads"
                                                    for m in answered):
            return ESCAPE, AssertionError("a request after a malformed header was executed")
        if any("busy" in m.get("message", "") for m in answered):
            return ESCAPE, AssertionError("busy although the previous client had left")
        clean = _responses(_exchange(server.port, _msg(1, "initialize", adapterID="f")
                                     + _msg(2, "disconnect"), False, False, 20))
        if [m.get("command") for m in clean if m["type"] == "response"] != \
                ["initialize", "disconnect"]:
            return ESCAPE, AssertionError(f"a clean client after it was not served: {clean}")
    except BaseException as e:  # noqa: BLE001
        return ESCAPE, e
    return (DECODED if answered else FIRERROR), None
