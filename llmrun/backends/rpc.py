"""llama.cpp RPC workers: one model's layers on ``ggml-rpc-server`` processes on other machines.

``--rpc HOST:PORT[,HOST:PORT...]`` names the workers. :func:`parse_workers` checks the list (pure);
:func:`probe` speaks the first messages of ggml's RPC protocol (``HELLO``, ``DEVICE_COUNT``,
``GET_DEVICE_MEMORY``) to a worker before llama.cpp does, because llama.cpp's RPC client ends the
process (``GGML_ABORT``) on a worker it cannot reach or talk to; here those are one-line errors.
Registering the workers with llama.cpp is the backend's job (:mod:`llmrun.backends.ggml_rpc`).

The protocol has no authentication or encryption and a worker trusts whatever connects
(llama.cpp: "never run the RPC server on an open network"): workers off this machine need
``--rpc-allow-remote``, and belong on a private network.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from llmrun.errors import BackendError, UsageError
from llmrun.models.endpoint import is_loopback

DEFAULT_PORT = 50052  # ggml-rpc-server's
MAX_WORKERS = 16  # GGML_RPC_MAX_SERVERS
CMD_GET_DEVICE_MEMORY = 11
CMD_HELLO = 14  # "must be always 14" (ggml-rpc.cpp), whatever the protocol version
CMD_DEVICE_COUNT = 15
PROTOCOL_MAJOR = 7  # llama-cpp-python 0.3.3x's llama.cpp; the layout of the messages below is protocol 7's
CONN_CAPS_SIZE = 24  # protocol 7: the HELLO request carries transport capabilities (zero: plain TCP)
TIMEOUT_S = 10.0
ALLOW_REMOTE_FLAG = "rpc_allow_remote"


@dataclass(frozen=True, slots=True)
class Device:
    free: int  # bytes
    total: int


@dataclass(frozen=True, slots=True)
class Worker:
    endpoint: str  # HOST:PORT, as llama.cpp takes it
    version: tuple[int, int, int]  # the worker's RPC protocol version
    devices: tuple[Device, ...]

    @property
    def free(self) -> int:
        return sum(device.free for device in self.devices)


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """HOST and PORT of ``HOST:PORT``; a one-line error otherwise (also for IPv6, which llama.cpp's
    client cannot parse: it splits at the first colon and resolves with ``gethostbyname``)."""
    host, sep, port_text = endpoint.rpartition(":")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise UsageError(
            f"`rpc` worker {endpoint!r} is not HOST:PORT", f"e.g. 192.168.1.10:{DEFAULT_PORT} (ggml-rpc-server's port)"
        )
    if ":" in host or host.startswith("["):
        raise UsageError(
            f"`rpc` worker {endpoint!r}: llama.cpp's RPC client takes an IPv4 address or a host name, not IPv6",
            f"use the worker's IPv4 address or name, e.g. 192.168.1.10:{DEFAULT_PORT}",
        )
    if any(c.isspace() or c in "/?#@[]" for c in host):
        raise UsageError(f"`rpc` worker {endpoint!r} has no valid host", f"e.g. 192.168.1.10:{DEFAULT_PORT}")
    return host, int(port_text)


def parse_workers(values: Sequence[str], *, allow_remote: bool) -> tuple[str, ...]:
    """The workers ``--rpc`` names (comma-separated, repeatable), in order and without repeats.

    A worker off this machine is refused unless ``allow_remote``: the RPC protocol lets anyone who
    can connect run code-sized workloads on the worker and read what it holds."""
    workers: list[str] = []
    for value in values:
        for part in value.split(","):
            endpoint = part.strip()
            if not endpoint:
                continue
            host, _ = split_endpoint(endpoint)
            if not allow_remote and not is_loopback(host):
                raise UsageError(
                    f"`rpc` worker {endpoint} is not on this machine, and llama.cpp's RPC protocol has no "
                    "authentication or encryption",
                    f"run workers on a private network you trust and pass `{ALLOW_REMOTE_FLAG}`",
                )
            if endpoint not in workers:
                workers.append(endpoint)
    if not workers and values:
        raise UsageError("`rpc` names no worker", f"e.g. 127.0.0.1:{DEFAULT_PORT},127.0.0.1:{DEFAULT_PORT + 1}")
    if len(workers) > MAX_WORKERS:
        raise UsageError(f"`rpc` names {len(workers)} workers; llama.cpp takes at most {MAX_WORKERS}", "name fewer")
    return tuple(workers)


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("closed the connection")
        data += chunk
    return data


def _command(sock: socket.socket, cmd: int, payload: bytes, reply_size: int) -> bytes:
    """One request (command byte, 8-byte size, payload) and its reply (8-byte size, payload)."""
    sock.sendall(bytes([cmd]) + struct.pack("<Q", len(payload)) + payload)
    (size,) = struct.unpack("<Q", _recv_exactly(sock, 8))
    if size != reply_size:
        raise ValueError(f"answered command {cmd} with {size} bytes, not {reply_size}")
    return _recv_exactly(sock, size)


def probe(endpoint: str, timeout: float = TIMEOUT_S) -> Worker:
    """Connect to a worker and ask its protocol version, devices and their memory; one line each
    for a worker that is down, busy (it serves one client at a time), or not a compatible
    ggml-rpc-server."""
    host, port = split_endpoint(endpoint)
    hint = f"start it there: ggml-rpc-server --host {host} --port {port} (llama.cpp's tools/rpc)"
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as exc:
        raise BackendError(f"cannot reach the RPC worker at {endpoint}: {exc.strerror or exc}", hint) from exc
    with sock:
        try:
            hello = _command(sock, CMD_HELLO, bytes(CONN_CAPS_SIZE), 4 + CONN_CAPS_SIZE)
            version = (hello[0], hello[1], hello[2])
            if version[0] != PROTOCOL_MAJOR:
                raise ValueError(f"it speaks version {'.'.join(map(str, version))}")
            (count,) = struct.unpack("<I", _command(sock, CMD_DEVICE_COUNT, b"", 4))
            devices = []
            for index in range(count):
                free, total = struct.unpack("<QQ", _command(sock, CMD_GET_DEVICE_MEMORY, struct.pack("<I", index), 16))
                devices.append(Device(free, total))
        except TimeoutError as exc:
            raise BackendError(
                f"the RPC worker at {endpoint} accepted the connection but did not answer in {timeout:g} s",
                "a ggml-rpc-server serves one client at a time: is another llama.cpp process using it?",
            ) from exc
        except (OSError, ValueError) as exc:
            raise BackendError(
                f"{endpoint} does not speak llama.cpp's RPC protocol {PROTOCOL_MAJOR} ({exc})",
                "run a ggml-rpc-server built from the same llama.cpp as llama-cpp-python (see `llmrun doctor`)",
            ) from exc
    if not devices:
        raise BackendError(f"the RPC worker at {endpoint} offers no device", "start ggml-rpc-server with a device")
    return Worker(endpoint, version, tuple(devices))


_known: dict[str, Worker] = {}  # probed by this process: a worker it is connected to would not answer again


def workers(endpoints: Sequence[str]) -> tuple[Worker, ...]:
    """:func:`probe` each worker once per process."""
    for endpoint in endpoints:
        if endpoint not in _known:
            _known[endpoint] = probe(endpoint)
    return tuple(_known[endpoint] for endpoint in endpoints)
