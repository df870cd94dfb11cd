"""`--rpc` workers: the list as given, which hosts need `--rpc-allow-remote`, and the probe that turns
what llama.cpp's RPC client would abort on into one line (workers scripted on 127.0.0.1 here; the
real ggml-rpc-server is in tests/rpc)."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Callable, Iterator

import pytest

from llmrun.backends import rpc
from llmrun.backends.base import LoadParams
from llmrun.errors import BackendError, InvalidParameter, UsageError
from tests.support.helpers import invoke


def test_workers_are_comma_separated_repeatable_and_kept_in_order_once() -> None:
    got = rpc.parse_workers(["127.0.0.1:50052, 127.0.0.1:50053", "localhost:1,127.0.0.1:50052"], allow_remote=False)
    assert got == ("127.0.0.1:50052", "127.0.0.1:50053", "localhost:1")
    with pytest.raises(UsageError, match="not IPv6"):  # llama.cpp's client cannot take it
        rpc.parse_workers(["[::1]:50052"], allow_remote=False)


@pytest.mark.parametrize("host", ["192.168.1.10", "10.0.0.5", "gpu-box", "0.0.0.0"])
def test_a_worker_off_this_machine_needs_the_allow_remote_flag(host: str) -> None:
    with pytest.raises(UsageError, match="no authentication") as caught:
        rpc.parse_workers([f"{host}:50052"], allow_remote=False)
    assert "rpc_allow_remote" in caught.value.hint
    assert rpc.parse_workers([f"{host}:50052"], allow_remote=True) == (f"{host}:50052",)


@pytest.mark.parametrize(
    "value", ["host", "host:", ":50052", "host:0", "host:65536", "host:5x", "a b:1", "u@h:1", "::1:50052", "[::1]:1"]
)
def test_a_malformed_worker_is_named(value: str) -> None:
    with pytest.raises(UsageError, match="rpc"):
        rpc.parse_workers([value], allow_remote=True)


def test_an_empty_list_and_too_many_workers_are_refused() -> None:
    with pytest.raises(UsageError, match="names no worker"):
        rpc.parse_workers([" , "], allow_remote=False)
    with pytest.raises(UsageError, match="at most 16"):
        rpc.parse_workers([",".join(f"127.0.0.1:{port}" for port in range(1000, 1017))], allow_remote=False)


def test_load_params_carry_the_workers() -> None:
    assert LoadParams(512, 1, -1, rpc=("127.0.0.1:1",)).rpc == ("127.0.0.1:1",)
    with pytest.raises(InvalidParameter, match="rpc"):
        LoadParams(512, 1, -1, rpc="127.0.0.1:1")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--rpc", "10.1.2.3:50052"], "error: --rpc worker 10.1.2.3:50052 is not on this machine"),
        (["--rpc-allow-remote"], "error: --rpc-allow-remote needs --rpc"),
        (
            ["--rpc", "127.0.0.1:1", "--endpoint", "http://127.0.0.1:9/v1"],
            "error: --rpc workers hold the layers of a model run here",
        ),
    ],
)
def test_the_cli_refuses_before_loading_anything(args: list[str], expected: str) -> None:
    code, _, err = invoke(["run", "Hello", *args])
    assert code == 2 and err.startswith(expected), err
    assert len(err.strip().splitlines()) == 1


Handler = Callable[[socket.socket], None]


@pytest.fixture
def scripted() -> Iterator[Callable[[Handler], str]]:
    """A one-connection TCP server on 127.0.0.1 that runs ``handler`` on the connection it accepts."""
    servers: list[socket.socket] = []

    def start(handler: Handler) -> str:
        server = socket.create_server(("127.0.0.1", 0))
        servers.append(server)

        def serve() -> None:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                handler(conn)

        threading.Thread(target=serve, daemon=True).start()
        return f"127.0.0.1:{server.getsockname()[1]}"

    yield start
    for server in servers:
        server.close()


def _request(conn: socket.socket) -> tuple[int, bytes]:
    head = b""
    while len(head) < 9:
        head += conn.recv(9 - len(head))
    (size,) = struct.unpack("<Q", head[1:])
    body = b""
    while len(body) < size:
        body += conn.recv(size - len(body))
    return head[0], body


def _reply(conn: socket.socket, payload: bytes) -> None:
    conn.sendall(struct.pack("<Q", len(payload)) + payload)


def _worker(major: int, memory: list[tuple[int, int]]) -> Handler:
    """Answers as ggml-rpc-server's protocol 7 does: HELLO, DEVICE_COUNT, GET_DEVICE_MEMORY."""

    def handle(conn: socket.socket) -> None:
        while True:
            try:
                cmd, body = _request(conn)
            except (OSError, struct.error):
                return
            if cmd == rpc.CMD_HELLO:
                assert body == bytes(rpc.CONN_CAPS_SIZE)
                _reply(conn, bytes([major, 0, 0, 0]) + bytes(rpc.CONN_CAPS_SIZE))
            elif cmd == rpc.CMD_DEVICE_COUNT:
                _reply(conn, struct.pack("<I", len(memory)))
            elif cmd == rpc.CMD_GET_DEVICE_MEMORY:
                (index,) = struct.unpack("<I", body)
                _reply(conn, struct.pack("<QQ", *memory[index]))

    return handle


def test_a_worker_reports_its_version_devices_and_free_memory(scripted: Callable[[Handler], str]) -> None:
    endpoint = scripted(_worker(7, [(3 << 30, 4 << 30), (1 << 30, 2 << 30)]))
    worker = rpc.probe(endpoint)
    assert worker.version == (7, 0, 0) and worker.free == 4 << 30
    assert [d.total for d in worker.devices] == [4 << 30, 2 << 30]


def test_a_worker_of_another_protocol_version_is_one_line(scripted: Callable[[Handler], str]) -> None:
    endpoint = scripted(_worker(3, [(1, 1)]))
    with pytest.raises(BackendError, match=r"does not speak llama.cpp's RPC protocol 7 \(it speaks version 3.0.0\)"):
        rpc.probe(endpoint)


def test_something_else_on_the_port_is_not_a_worker(scripted: Callable[[Handler], str]) -> None:
    endpoint = scripted(lambda conn: conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n"))
    with pytest.raises(BackendError, match=r"does not speak llama\.cpp's RPC protocol") as caught:
        rpc.probe(endpoint)
    assert "same llama.cpp" in caught.value.hint


def test_a_busy_worker_is_named_instead_of_hanging(scripted: Callable[[Handler], str]) -> None:
    release = threading.Event()
    endpoint = scripted(lambda conn: release.wait(5))  # accepts, never answers: another client holds it
    try:
        with pytest.raises(BackendError, match=r"did not answer in 0\.3 s") as caught:
            rpc.probe(endpoint, timeout=0.3)
        assert "one client at a time" in caught.value.hint
    finally:
        release.set()


def test_a_worker_that_is_not_there_is_one_line() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: refused
        with pytest.raises(BackendError, match=f"cannot reach the RPC worker at 127.0.0.1:{port}") as caught:
            rpc.probe(f"127.0.0.1:{port}")
    assert caught.value.hint.startswith(f"start it there: ggml-rpc-server --host 127.0.0.1 --port {port}")


def test_a_build_with_the_rpc_backend_is_not_taken_for_one_with_a_gpu() -> None:
    """llama.cpp's llama_supports_gpu_offload says yes for the RPC backend alone; llmrun's default
    `n_gpu_layers` asks for a GPU device, so a CPU machine keeps its layers unless workers are named."""
    import llama_cpp

    from llmrun.backends.ggml_rpc import available, has_gpu
    from llmrun.engine.load import load_defaults

    info = llama_cpp.llama_print_system_info().decode()
    if any(name in info for name in ("CUDA", "METAL", "Metal", "VULKAN", "Vulkan", "HIP", "SYCL", "OpenCL")):
        pytest.skip("this llama.cpp has a GPU backend")
    assert available() is bool(llama_cpp.llama_supports_rpc())
    assert has_gpu() is False and load_defaults()["n_gpu_layers"] == 0
    if available():
        assert llama_cpp.llama_supports_gpu_offload()  # what llmrun does not go by
