"""A protocol fuzzer driven by the protocol's schema: seeded requests built from each method's fields, each
field then mutated (wrong type, out of range, dropped, a lie about an output), sent to one server. Every reply
must be a valid frame that answers its request, and the server and its device process must stay up."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
from server_helpers import TOKEN, Raw

from ctxrt.backends import get_backend
from ctxrt.backends.kernel import NodeSpec, TensorSpec
from ctxrt.tuning import protocol as p
from ctxrt.tuning.server import Server

REQUESTS = 400
CODES = {"malformed", "bad_request", "unknown_method", "too_large", "unsupported", "build_failed", "job_timeout",
         "job_memory", "device_error", "internal"}
F32 = np.dtype(np.float32)


def _templates(rng: np.random.Generator) -> list[NodeSpec]:
    """Valid specs of a few op families at random sizes: the fuzzer's starting points."""
    m, n, k = (int(x) for x in rng.integers(1, 9, 3))
    t = lambda *s, dt=F32: TensorSpec(tuple(s), np.dtype(dt))  # noqa: E731
    return [NodeSpec("Add", "add", {}, [t(m, n), t(n)], [t(m, n)]),
            NodeSpec("Softmax", "sm", {"axis": -1}, [t(m, n)], [t(m, n)], opset=13),
            NodeSpec("MatMul", "mm", {}, [t(m, k), t(k, n)], [t(m, n)]),
            NodeSpec("Concat", "cat", {"axis": 1}, [t(m, n), t(m, k)], [t(m, n + k)]),
            NodeSpec("Gather", "g", {"axis": 0}, [t(m, n), t(k, dt=np.int64)], [t(k, n)]),
            NodeSpec("ReduceSum", "rs", {"axes": [1], "keepdims": 1}, [t(m, n)], [t(m, 1)], opset=13),
            NodeSpec("Transpose", "tr", {"perm": [1, 0]}, [t(m, n)], [t(n, m)]),
            NodeSpec("Relu", "relu", {}, [t(m, n, k)], [t(m, n, k)])]


def _junk(rng: np.random.Generator) -> Any:
    return [None, True, -1, 1 << 62, 3.5, float("nan"), "x" * int(rng.integers(0, 300)), b"\x00\xff", [], {}, [1, [2]],
            {"a": 1}, np.zeros(int(rng.integers(0, 5)), np.float32)][int(rng.integers(0, 13))]


def _mutate_spec(wire: dict[str, Any], rng: np.random.Generator) -> None:
    choice = int(rng.integers(0, 7))
    if choice == 0 and wire["outputs"]:  # a lie about an output's shape
        shape = wire["outputs"][0][0]
        wire["outputs"][0][0] = [int(rng.integers(0, 1 << int(rng.integers(1, 24)))) for _ in shape or [1]]
    elif choice == 1 and wire["inputs"]:  # an input's shape or dtype changed
        wire["inputs"][0] = [[int(rng.integers(0, 9)) for _ in range(int(rng.integers(0, 5)))],
                             ["<f4", "<i8", "|b1", "<f2", "|u1", "zz"][int(rng.integers(0, 6))]]
    elif choice == 2:  # an attribute added, changed or of the wrong type
        key = ["axis", "perm", "axes", "keepdims", "kernel", "weight_shape", "residual", "bias", "transB", "zz"][
            int(rng.integers(0, 10))]
        wire["attrs"][key] = _junk(rng) if rng.random() < 0.5 else int(rng.integers(-3, 4))
    elif choice == 3:
        wire["opset"] = int(rng.integers(-5, 30))
    elif choice == 4:
        wire["op"] = ["Add", "Conv", "Loop", "zz", "MatMul", "Split"][int(rng.integers(0, 6))]
    elif choice == 5:  # a field of the wrong type or missing
        key = list(wire)[int(rng.integers(0, len(wire)))]
        if rng.random() < 0.5:
            del wire[key]
        else:
            wire[key] = _junk(rng)
    # choice 6: the spec as it is


def _request(rng: np.random.Generator, rid: int) -> tuple[dict[str, Any] | bytes, int | None]:
    backend = get_backend("opencl")
    method = ["device_info", "compile", "profile", "execute", "nope"][int(rng.integers(0, 5))]
    params: dict[str, Any] = {}
    if method == "compile":
        params = {"name": "k.cl", "source": ["kernel void k() {}", "kernel void k( {", _junk(rng)][
            int(rng.integers(0, 3))], "options": ["", "-DX=1", "-I/tmp", _junk(rng)][int(rng.integers(0, 4))]}
    elif method in ("profile", "execute"):
        templates = _templates(rng)
        spec = templates[int(rng.integers(0, len(templates)))]
        kernel = backend.kernels[spec.op](spec)
        wire = copy.deepcopy(p.spec_to_wire(spec))
        _mutate_spec(wire, rng)
        params = {"spec": wire, "kernel": type(kernel).__name__, "source_hash": kernel.programs[0].source_hash}
        if method == "profile":
            params |= {"default": kernel.params, "candidates": [kernel.params] * int(rng.integers(0, 3)),
                       "settings": {"min_runs": 1, "max_runs": 2, "min_total_s": 0}}
        else:
            params |= {"params": kernel.params,
                       "inputs": [np.zeros(t.shape, t.dtype) for t in spec.inputs if t is not None]}
    request: dict[str, Any] = {"id": rid, "method": method, "params": params}
    if rng.random() < 0.1:  # a mutation of the request itself
        key = ["id", "method", "params"][int(rng.integers(0, 3))]
        request[key] = _junk(rng)
    if rng.random() < 0.05:
        return bytes(rng.integers(0, 256, int(rng.integers(1, 64)), dtype=np.uint8)), None
    sent = request["id"]
    return request, sent if type(sent) is int and 0 <= sent < 1 << 63 else None


def _valid_reply(answer: Any, rid: int | None) -> str | None:
    """None when `answer` is a well-formed answer to request `rid`, else what is wrong with it."""
    if not isinstance(answer, dict) or "id" not in answer:
        return f"not an answer frame: {answer!r:.200}"
    if "result" in answer:
        return None if answer["id"] == rid and "error" not in answer else f"a result for the wrong id: {answer!r:.200}"
    err = answer.get("error")
    if not (isinstance(err, dict) and err.get("code") in CODES and isinstance(err.get("message"), str)):
        return f"not a valid error frame: {answer!r:.200}"
    return None if answer["id"] in (rid, None) else f"an error for the wrong id: {answer!r:.200}"


def test_seeded_schema_fuzzer_gets_a_valid_frame_for_every_request(opencl: str) -> None:
    srv = Server("127.0.0.1", 0, TOKEN, job_timeout=60.0).start()
    try:
        rng = np.random.default_rng(2026)
        raw = Raw(srv.address)
        seen: dict[str, int] = {}
        for rid in range(REQUESTS):
            request, want = _request(rng, rid)
            body = request if isinstance(request, bytes) else p.codec.encode(request)
            answer = raw.ask(body)
            why = _valid_reply(answer, want)
            assert why is None, (request if isinstance(request, bytes) else request.get("method"), why)
            key = "result" if "result" in answer else answer["error"]["code"]
            seen[key] = seen.get(key, 0) + 1
        assert raw.ask(p.codec.encode({"id": 1, "method": "device_info", "params": {}}))["result"]["protocol"] == 1
        assert srv.worker.restarts == 0 and srv.worker.proc.poll() is None, seen
        assert seen.get("result", 0) > 40 and seen.get("bad_request", 0) > 100, seen  # both paths were exercised
        raw.close()
    finally:
        srv.close()
