"""How an InferenceSession compiles the shape variants of its ONNX model: in memory, or through its `cache_dir`.

Every context compiled for the model shares its weights through one `WeightStore` (each distinct content held
once, however many variants read it). With `cache_dir`, a variant's context binary is kept under a key of
everything its compile depends on: the model's bytes and every external-data file it references (contents),
the compile options, the backend and its configuration, ctxrt's version, the shapes and the values of value
inputs. Its weights of at least 4 KiB are written once per content into `cache_dir/weights/` and only named
in the binary (format version 2, docs/format.md), so N variants do not write N copies of the weights.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

import ctxrt
from ctxrt.backends import Backend
from ctxrt.compiler import compile_options
from ctxrt.errors import FormatError
from ctxrt.format import layout
from ctxrt.format.atomic import atomic_write
from ctxrt.frontend.carriers import Spec
from ctxrt.runtime import heap
from ctxrt.runtime.context import Context
from ctxrt.runtime.weightstore import WeightStore

_CHUNK = 1 << 20
Stamp = tuple[int, int, int, int, int]  # size, mtime_ns, inode, device, ctime_ns (set by any write or utime)
# The folder's memo of model and external-data digests by file stamp: a warm cache's session hashed its 13 MB
# GPT-2 (~12 ms) in every new process before. A file modified less than RACY_NS before it was hashed is not kept
# (its stamp could survive a change within the file system's clock resolution).
DIGESTS = "digests.json"
DIGESTS_KEPT = 256
RACY_NS = 2_000_000_000


class VariantCompiler:
    """Compiles one ONNX model (a path or its bytes) for the shapes and value-input values a session meets."""

    def __init__(self, source: Path | bytes, backend: Backend, cache_dir: str | os.PathLike | None,
                 counters: Counter[str]) -> None:
        self.source = source
        self.backend = backend
        self.counters = counters
        self.folder = None if cache_dir is None else Path(cache_dir)
        self.store = WeightStore(backend, None if self.folder is None else self.folder / "weights")
        self._digests: dict[Path, tuple[Stamp, str]] = {}  # file -> (its stamp when hashed, SHA-256 of its bytes)
        self._memo: dict[str, Any] | None = None  # the folder's DIGESTS, read on first need
        self._external: tuple[Stamp, list[Path]] | None = None  # the model's external-data files, by its stamp
        # what every compile of this model sees (a session may set kv_shared); with a cache folder the programs are
        # binaries, whose weights are stored in the layout their kernels read
        self.options = compile_options(in_memory=self.folder is None)
        self._carriers: tuple[Spec, Any] = ((), None)  # (carried inputs, the model rewritten)
        self._shape_only: frozenset[str] | None = None

    def compile(self, shapes: Mapping[str, Any] | None, feeds: Mapping[str, Any] | None,
                dims: Mapping[str, tuple[int, int]] | None = None, prior: Any = None, carried: Spec = ()) -> Context:
        """Online prepare with memhandle IO (the session binds every IO tensor); value inputs are taken from
        `feeds`; `dims`: the ranges of a range program (`prior`: the Ranges of a narrower one, whose fit is
        checked first); `carried`: value inputs made of the lengths of inputs (frontend/carriers.py), ranged in
        `dims` under their dims' names. Through the cache folder when there is one."""
        from ctxrt.compiler import compile_graphs
        from ctxrt.runtime.loader import compile_to_context
        from ctxrt.runtime.variant import array_of

        shapes = {k: tuple(int(d) for d in v) for k, v in (shapes or {}).items()}
        feeds = {k: array_of(v) for k, v in (feeds or {}).items() if k not in dict(carried)}
        dims = {k: v if isinstance(v, str) else tuple(int(x) for x in v) for k, v in (dims or {}).items()}
        source = self._carried(carried)
        try:
            if self.folder is None:
                graphs, weights = compile_graphs([(source, shapes, "main")], self.backend, "memhandle", feeds,
                                                 self.options, dims=dims, prior=prior)
                return compile_to_context(graphs, weights, self.backend, store=self.store)
            return self._cached(source, shapes, feeds, dims, prior, carried)
        finally:
            graphs = weights = None
            heap.trim()  # what the compile freed (probe programs, IR): not kept at the compile's peak

    def shape_only_inputs(self) -> frozenset[str]:
        """The model's inputs whose values decide shapes and no branch or trip count (frontend/values.py): those a
        session may range as lengths (an input that picks a branch is better compiled per value, the branch
        inlined). Read once (kept in the cache folder, as the declared IO is: `remembered`)."""
        if self._shape_only is None:
            def compute() -> list[str]:
                from ctxrt.frontend.onnx import load_model
                from ctxrt.frontend.values import trace

                graph = load_model(self.source).graph
                shape, branch = trace(graph.node)
                return sorted(i.name for i in graph.input if i.name in shape and i.name not in branch)

            def decode(v: Any) -> list[str]:
                if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
                    raise TypeError("a list of input names")
                return v
            self._shape_only = frozenset(self.remembered("shape_only", compute, decode=decode))
        return self._shape_only

    def _carried(self, carried: Spec) -> Any:
        """The model to compile: the source, or its copy whose `carried` inputs are lengths (made once a spec)."""
        if not carried:
            return self.source
        if self._carriers[0] != carried:
            from ctxrt.frontend.carriers import carried_model
            from ctxrt.frontend.onnx import load_model

            self._carriers = (carried, carried_model(load_model(self.source), carried))
        return self._carriers[1]

    def _cached(self, source: Any, shapes: dict[str, tuple[int, ...]], feeds: dict[str, Any],
                dims: dict[str, tuple[int, int]], prior: Any = None, carried: Spec = ()) -> Context:
        """The context binary for this compile from the folder, or compiled and kept there. The names of the
        model's value inputs are learned at its first compile and kept beside the binaries."""
        from ctxrt.compiler import compile_graphs, save_context
        from ctxrt.runtime.loader import context_from_binary

        folder, counters = self.folder, self.counters
        assert folder is not None
        folder.mkdir(parents=True, exist_ok=True)
        model = self.model_key()
        key = (model + "\0" + self.options_key(shapes, dims, carried)).encode()
        # the same for every shape: one file a model (and set of carried inputs)
        names_of = (model + "\0" + self.options_key({}, None, carried)).encode()
        names_file = folder / f"{hashlib.sha256(names_of).hexdigest()[:32]}.value_inputs.json"

        def path_for(names: list[str]) -> Path:
            digest = hashlib.sha256(key)
            for n in sorted(names):
                v = np.asarray(feeds[n])
                digest.update(f"\0{n}\0{v.dtype.str}{v.shape}".encode() + v.tobytes())
            return folder / f"{digest.hexdigest()[:32]}.ctx"

        names = _read_names(names_file)
        if names is not None and all(n in feeds for n in names):
            cached = path_for(names)
            if cached.is_file():
                try:
                    ctx = context_from_binary(cached, self.backend, store=self.store)
                    counters["compile_cache_hits"] += 1
                    return ctx
                except FormatError:  # a damaged entry (or one of its weights): compile again and replace it
                    counters["compile_cache_damaged"] += 1
        counters["compile_cache_misses"] += 1
        graphs, weights = compile_graphs([(source, shapes, "main")], self.backend, "memhandle", feeds,
                                         self.options, dims=dims, prior=prior)
        names = sorted(graphs[0].value_inputs)
        names_file.write_text(json.dumps(names))
        cached = path_for(names)
        inside, outside = self.store.save(weights)
        del weights  # the compile's own copies go now: the context maps the saved ones
        label = "<bytes>" if isinstance(self.source, bytes) else self.source
        save_context(cached, graphs, inside, self.backend, [label], outside)
        return context_from_binary(cached, self.backend, store=self.store)

    # -- the key ------------------------------------------------------------------------------------
    def model_key(self) -> str:
        """SHA-256 over the model's bytes and, for a model file, every external-data file it references (its
        location relative to the model and its contents): a changed weights file gives another key. A file is
        hashed again only when its size, mtime, ctime, inode or device changed since it was last hashed, by this
        compiler or by an earlier process (the folder's DIGESTS)."""
        if isinstance(self.source, bytes):
            return hashlib.sha256(b"onnx-bytes\0" + self.source).hexdigest()
        h = hashlib.sha256(b"onnx\0" + self._digest(self.source).encode())
        for path in self._external_files():
            rel = os.path.relpath(path, self.source.resolve().parent)
            h.update(f"\0{rel}\0{self._digest(path)}".encode())
        return h.hexdigest()

    def options_key(self, shapes: Mapping[str, tuple[int, ...]], dims: Mapping[str, tuple[int, int]] | None = None,
                    carried: Spec = ()) -> str:
        """Everything besides the model and the values of value inputs that a compiled binary depends on."""
        be = self.backend
        return json.dumps({
            **({"carried": [[n, list(e)] for n, e in carried]} if carried else {}),  # (earlier keys unchanged)
            "shapes": sorted((k, list(v)) for k, v in shapes.items()), "io_mem_type": "memhandle",
            "dims": sorted((k, v if isinstance(v, str) else list(v)) for k, v in (dims or {}).items()),
            "options": self.options, "device": be.device_id(), "ctxrt": ctxrt.__version__,
            "formats": list(layout.SUPPORTED_VERSIONS), "cpus": os.cpu_count(),
            "backend": {"onednn": getattr(be, "onednn", None), "layout": getattr(getattr(be, "layout", None), "name",
                                                                                 None)},
        }, sort_keys=True, default=str)

    def _external_files(self) -> list[Path]:
        from ctxrt.frontend.external import external_data_files

        assert isinstance(self.source, Path)
        stamp = _stamp(self.source)
        if self._external is None or self._external[0] != stamp:
            self._external = (stamp, external_data_files(self.source))
        return self._external[1]

    def _digest(self, path: Path) -> str:
        try:
            stamp = _stamp(path)
        except OSError:
            return "missing"  # the compile reports it
        known = self._digests.get(path)
        if known is None:  # another process hashed it, unchanged since (the folder's memo)
            known = self._remembered().get(str(path.resolve()))
            if known is not None:
                known = self._digests[path] = (tuple(known[0]), known[1])
        if known is not None and known[0] == stamp:
            return known[1]
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
        self._digests[path] = (stamp, h.hexdigest())
        self.counters["compile_cache_bytes_hashed"] += stamp[0]
        self._remember(path, stamp, h.hexdigest())
        return h.hexdigest()

    def remembered(self, kind: str, compute: Callable[[], Any], encode: Callable[[Any], Any] = lambda v: v,
                   decode: Callable[[Any], Any] = lambda v: v) -> Any:
        """What `compute()` reads of the model (its declared IO, whether it holds EPContext nodes), kept in the
        cache folder under the model's key as JSON (`encode`; read back by `decode`, which raises ValueError,
        TypeError, KeyError or IndexError on a value it does not accept: then computed again): a warm cache's
        new session does not parse the model (~5 ms of protobuf walking and shape inference for a 13 MB
        decoder). Computed, not kept, without a folder."""
        if self.folder is None:
            return compute()
        path = self.folder / f"{self.model_key()[:32]}.{kind}.json"
        with contextlib.suppress(OSError, ValueError, TypeError, KeyError, IndexError, RecursionError):
            return decode(json.loads(path.read_text())["value"])  # (RecursionError: JSON nested too deep)
        value = compute()
        with contextlib.suppress(OSError, TypeError, ValueError):
            self.folder.mkdir(parents=True, exist_ok=True)
            data = json.dumps({"value": encode(value)}).encode()
            with atomic_write(path) as f:
                f.write(data)
        return value

    # -- the folder's memo of digests: a model hashed once, not once per process ------------------------------
    def _remembered(self) -> dict[str, Any]:
        """{resolved path: [stamp, SHA-256]} of the files hashed by earlier processes (`DIGESTS` in the folder),
        read once; {} where there is none or it is unreadable."""
        if self._memo is None:
            self._memo = {}
            if self.folder is not None:
                try:
                    got = json.loads((self.folder / DIGESTS).read_text())
                except (OSError, ValueError, RecursionError):  # unreadable, not JSON, or nested too deep
                    got = None
                if isinstance(got, dict):
                    self._memo = {k: v for k, v in got.items() if isinstance(k, str) and isinstance(v, list)
                                  and len(v) == 2 and isinstance(v[0], list) and len(v[0]) == 5
                                  and all(isinstance(x, int) for x in v[0]) and isinstance(v[1], str)}
        return self._memo

    def _remember(self, path: Path, stamp: Stamp, digest: str) -> None:
        """Keep a file's digest for later processes, unless it was written so recently that a change within the
        clock's resolution could keep its stamp (git's "racily clean" rule): such a file is hashed again."""
        if self.folder is None or time.time_ns() - max(stamp[1], stamp[4]) < RACY_NS:
            return
        memo = self._remembered()
        memo[str(path.resolve())] = [list(stamp), digest]
        while len(memo) > DIGESTS_KEPT:
            memo.pop(next(iter(memo)))
        with contextlib.suppress(OSError):
            self.folder.mkdir(parents=True, exist_ok=True)
            with atomic_write(self.folder / DIGESTS) as f:
                f.write(json.dumps(memo).encode())


def _stamp(path: Path) -> Stamp:
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev, st.st_ctime_ns


def _read_names(path: Path) -> list[str] | None:
    try:
        names = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):
        return None
    return names if isinstance(names, list) and all(isinstance(n, str) for n in names) else None


__all__ = ["VariantCompiler"]
