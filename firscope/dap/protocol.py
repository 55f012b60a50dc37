"""The Debug Adapter Protocol's wire format: ``Content-Length`` framed JSON messages.

A message is a header block (``Content-Length: N``, other headers ignored,
each line ended by CRLF, the block by an empty line) followed by N bytes of
UTF-8 JSON. A peer that sends garbage gets a :class:`ProtocolError` naming
what was wrong; the server answers what it can and never dies of it.
"""
from __future__ import annotations

import json
import threading
from typing import BinaryIO

# A request is small (the largest is setBreakpoints for a long file); this bounds what a
# broken or hostile peer can make the adapter buffer.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
MAX_HEADER_BYTES = 8 * 1024


class ProtocolError(Exception):
    """The byte stream is not DAP framing (a bad header, an over-long or non-JSON body)."""


def read_message(stream: BinaryIO) -> dict | None:
    """The next message, or None at the end of the stream."""
    length = None
    header_bytes = 0
    while True:
        line = stream.readline(MAX_HEADER_BYTES + 1)
        if not line:
            if header_bytes:
                raise ProtocolError("the stream ended inside a message header")
            return None
        header_bytes += len(line)
        if header_bytes > MAX_HEADER_BYTES:
            raise ProtocolError("message header is too long")
        text = line.decode("ascii", "replace").strip()
        if not text:
            if length is None:
                if header_bytes <= 2:  # a stray empty line between messages
                    header_bytes = 0
                    continue
                raise ProtocolError("message header has no Content-Length")
            break
        name, sep, value = text.partition(":")
        if not sep:
            raise ProtocolError(f"bad header line {text[:80]!r}")
        if name.strip().lower() == "content-length":
            value = value.strip()
            if not value.isascii() or not value.isdigit() or len(value) > 12:
                raise ProtocolError(f"bad Content-Length {value[:20]!r}")
            length = int(value)
            if length > MAX_MESSAGE_BYTES:
                raise ProtocolError(f"message of {length} bytes is over the "
                                    f"{MAX_MESSAGE_BYTES}-byte limit")
    body = b""
    while len(body) < length:
        chunk = stream.read(length - len(body))
        if not chunk:
            raise ProtocolError("the stream ended inside a message body")
        body += chunk
    try:
        message = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ProtocolError(f"message body is not JSON: {e}") from None
    if not isinstance(message, dict):
        raise ProtocolError("message body is not a JSON object")
    return message


def encode_message(message: dict) -> bytes:
    # allow_nan=False: a NaN register value must be sent as text, never as bare NaN,
    # which is not JSON and which clients reject.
    body = json.dumps(message, separators=(",", ":"), allow_nan=False).encode("utf-8")
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


class Writer:
    """Sends messages from any thread, one whole message at a time, numbering them."""

    def __init__(self, stream: BinaryIO):
        self._stream = stream
        self._lock = threading.Lock()
        self._seq = 0
        self.closed = False

    def send(self, message: dict) -> None:
        with self._lock:
            if self.closed:
                return
            self._seq += 1
            data = encode_message({"seq": self._seq, **message})
            try:
                self._stream.write(data)
                self._stream.flush()
            except (OSError, ValueError):  # the client went away: nothing left to tell
                self.closed = True

    def response(self, request: dict, body: dict | None = None) -> None:
        self.send({"type": "response", "request_seq": request.get("seq", 0), "success": True,
                   "command": request.get("command", ""), "body": body or {}})

    def error(self, request: dict, message: str, *, show_user: bool = False) -> None:
        """A failed response; ``show_user`` makes VS Code show it in a dialog (it shows no
        error whose ``showUser`` is false)."""
        self.send({"type": "response", "request_seq": request.get("seq", 0), "success": False,
                   "command": request.get("command", ""), "message": message,
                   "body": {"error": {"id": 1, "format": message, "showUser": show_user}}})

    def event(self, name: str, body: dict | None = None) -> None:
        self.send({"type": "event", "event": name, **({"body": body} if body else {})})
