"""Checked command-line values for `ctxrt` (cli.py): every bad value is one UsageError that names the
option and the value as the user wrote them.

Scalars are checked by argparse through the `type=` callables here (argparse prefixes the option name);
paths are checked before any work starts, so a bad output path never costs a compile.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import stat
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ctxrt.errors import CtxrtError

CTX_MAGIC = b"CTXRTBIN"  # format/layout.py MAGIC, repeated so that checking a path imports no format code
NPY_MAGIC = b"\x93NUMPY"
ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")


class UsageError(CtxrtError):
    """Bad command-line arguments."""


# -- argparse types --------------------------------------------------------------------------------
def checked_number(text: str, cast: Callable[[str], Any], ok: Callable[[Any], bool], what: str) -> Any:
    """`text` read by `cast` (int or float) when `ok` holds of it, else the ArgumentTypeError argparse reports as
    "expected WHAT, got 'TEXT'"."""
    try:
        value = cast(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1 (counts: --repeat, --split)."""
    return checked_number(text, int, lambda v: v >= 1, "a whole number >= 1")


def non_negative_int(text: str) -> int:
    """An integer >= 0 (--threads, where 0 means the default)."""
    return checked_number(text, int, lambda v: v >= 0, "a whole number >= 0")


def non_negative_float(text: str) -> float:
    """A finite number >= 0 (--temperature, where 0 means greedy)."""
    return checked_number(text, float, lambda v: 0 <= v < float("inf"), "a number >= 0")


def fraction(text: str) -> float:
    """A number in (0, 1] (--top-p)."""
    return checked_number(text, float, lambda v: 0 < v <= 1, "a number in (0, 1]")


def token_ids(text: str) -> list[int]:
    """ID,ID,...: token ids, each a whole number >= 0 (--prompt-ids)."""
    try:
        ids = [int(w) for w in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected token ids as ID,ID,... (e.g. 1,2,3), got {text!r}") from None
    if any(i < 0 for i in ids):
        raise argparse.ArgumentTypeError(f"token ids must be >= 0, got {text!r}")
    return ids


def parse_shape(text: str, option: str = "--shape") -> tuple[str, tuple[int, ...]]:
    """NAME=DxDx...xD with every D a whole number >= 0 (0: an empty axis, as a decoder's first past)."""
    name, sep, dims = text.rpartition("=")
    try:
        if not sep or not name:
            raise ValueError
        shape = tuple(int(d) for d in dims.lower().split("x"))
    except ValueError:
        raise UsageError(f"{option} expects NAME=DxDx...D (e.g. data=1x3x224x224), got {text!r}") from None
    if any(d < 0 for d in shape):
        raise UsageError(f"{option} {text}: every dimension must be >= 0")
    return name, shape


def parse_dims(specs: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """--dim NAME=MIN:MAX[:STEP] (NAME a symbolic dim, or INPUT:AXIS) -> {NAME: (MIN, MAX[, STEP])}."""
    out: dict[str, tuple[int, ...]] = {}
    for spec in specs:
        name, sep, text = spec.rpartition("=")
        parts = text.split(":")
        try:
            rng = tuple(int(x) for x in parts)
        except ValueError:
            rng = None
        if not sep or not name or rng is None or len(rng) not in (2, 3) or not 0 <= rng[0] <= rng[1] or \
                len(rng) == 3 and (rng[2] < 1 or rng[0] % rng[2] or rng[1] % rng[2]):
            raise UsageError(f"--dim expects NAME=MIN:MAX with 0 <= MIN <= MAX (e.g. past_sequence=0:2048), or "
                             f"NAME=MIN:MAX:STEP with MIN and MAX multiples of STEP (e.g. x:2=32:1024:32), got "
                             f"{spec!r}")
        if name in out and out[name] != rng:
            raise UsageError(f"--dim {spec}: dim {name!r} already has the range {':'.join(map(str, out[name]))}")
        out[name] = rng
    return out


def parse_value(text: str, option: str = "--value") -> tuple[str, list[bool | int | float]]:
    """NAME=V,V,... (numbers, or true/false): the value a value input is compiled for
    (docs/shapes-and-control-flow.md)."""
    name, sep, items = text.rpartition("=")
    words = {"true": True, "false": False}
    try:
        if not sep or not name:
            raise ValueError
        return name, [words[w.lower()] if w.lower() in words else int(w) if w.strip().lstrip("+-").isdigit()
                      else float(w) for w in items.split(",")]
    except ValueError:
        raise UsageError(f"{option} expects NAME=V,V,... (numbers or true/false, e.g. shape=1,-1), "
                         f"got {text!r}") from None


def shape_targets(spec: str, n_models: int, option: str = "--shape") -> tuple[list[int], str]:
    """The models a --shape (or --value) applies to (K:NAME=... the K-th, 0-based; NAME=... every one) and
    its NAME=... part."""
    head, colon, rest = spec.partition(":")
    if colon and head.isdigit() and "=" in rest:
        k = int(head)
        if k >= n_models:
            raise UsageError(f"{option} {spec}: model index {k}, but there {_are(n_models)}")
        return [k], rest
    return list(range(n_models)), spec


def graph_values(specs: Sequence[str], n_models: int) -> list[dict[str, list[bool | int | float]]]:
    """Per model, the values --value gives its value inputs; one input given two values is an error."""
    per: list[dict[str, list[bool | int | float]]] = [{} for _ in range(n_models)]
    for spec in specs:
        targets, text = shape_targets(spec, n_models, "--value")
        name, value = parse_value(text)
        for k in targets:
            if per[k].get(name, value) != value:
                raise UsageError(f"--value {spec}: input {name!r} already has the value {per[k][name]}")
            per[k][name] = value
    return per


def graph_shapes(specs: Sequence[str], n_models: int) -> list[dict[str, tuple[int, ...]]]:
    """Per model, the shapes --shape gives its inputs. An input given two shapes for one model is an error,
    not a silent override."""
    per: list[dict[str, tuple[int, ...]]] = [{} for _ in range(n_models)]
    for spec in specs:
        targets, text = shape_targets(spec, n_models)
        name, shape = parse_shape(text)
        for k in targets:
            if per[k].get(name, shape) != shape:
                raise UsageError(f"--shape {spec}: input {name!r} already has the shape "
                                 f"{'x'.join(map(str, per[k][name]))}")
            per[k][name] = shape
    return per


def _are(n: int) -> str:
    return "is 1 model" if n == 1 else f"are {n} models"


# -- paths -----------------------------------------------------------------------------------------
def _arg(option: str, path: str) -> str:
    return f"{option} {path}" if option else path


def readable_file(option: str, path: str) -> bytes:
    """`path` (given to `option`; "" for a positional argument) is a readable regular file; returns its
    first 8 bytes (to tell the kind of file)."""
    try:
        st = os.stat(path)
        if stat.S_ISDIR(st.st_mode):
            raise UsageError(f"{_arg(option, path)} is a directory, not a file")
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{_arg(option, path)} is not a regular file")
        with open(path, "rb") as f:
            return f.read(8)
    except FileNotFoundError:
        raise UsageError(f"{_arg(option, path)}: no such file") from None
    except OSError as e:
        raise UsageError(f"{_arg(option, path)}: {e.strerror or e}") from None


def model_kind(option: str, path: str) -> str:
    """'ctx' for a context binary (by its magic), 'onnx' for an .onnx file (a model or an EPContext model)."""
    head = readable_file(option, path)
    if not head:
        raise UsageError(f"{_arg(option, path)} is an empty file")
    if head == CTX_MAGIC:
        return "ctx"
    if head.startswith((NPY_MAGIC, *ZIP_MAGIC)):
        raise UsageError(f"{_arg(option, path)} is a NumPy file, not a model")
    if not path.endswith(".onnx"):
        what = "not" if path.endswith(".ctx") else "neither"
        raise UsageError(f"{_arg(option, path)} is {what} a ctxrt context binary (it does not start with "
                         f"{CTX_MAGIC.decode()}){'' if what == 'not' else ' nor an .onnx model'}")
    return "onnx"


def output_file(option: str, path: str, suffix: str) -> Path:
    """`path` can be written as a new file or over a regular file, in a folder that exists."""
    p = Path(path)
    if p.suffix != suffix:
        raise UsageError(f"{option} {path}: the name must end in {suffix}")
    if p.is_dir():
        raise UsageError(f"{option} {path} is a directory; give a file name ending in {suffix}")
    if p.exists() and not p.is_file():
        raise UsageError(f"{option} {path} exists and is not a regular file")
    _folder_exists(option, path, p.parent)
    return p


def not_an_input(what: str, path: str | Path, inputs: Sequence[str | None]) -> None:
    """Writing `path` (`what` says which option writes it) must not destroy a file the command reads."""
    for given in inputs:
        if given and os.path.exists(given) and os.path.exists(path) and os.path.samefile(given, path):
            raise UsageError(f"{what} would overwrite the input {given}")


def output_dir(option: str, path: str) -> Path:
    """`path` is a folder, or can be made as one in a folder that exists."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise UsageError(f"{option} {path} is a file; several files are written there, so it must be a directory")
    if not p.exists():
        _folder_exists(option, path, p.parent)
    return p


def _folder_exists(option: str, path: str, folder: Path) -> None:
    if not folder.exists():
        raise UsageError(f"{option} {path}: the folder {folder} does not exist")
    if not folder.is_dir():
        raise UsageError(f"{option} {path}: {folder} is not a folder")


@contextlib.contextmanager
def naming(path: str) -> Iterator[None]:
    """Errors raised while reading, compiling or loading `path` name it: a message from deep inside (a bad
    checksum, an allocation too large for this machine) gains the file name as its first word."""
    try:
        yield
    except (CtxrtError, MemoryError) as e:
        if path not in str(e):  # numpy's MemoryError subclass takes other arguments: a plain one will do
            raise (MemoryError if isinstance(e, MemoryError) else type(e))(f"{path}: {e}") from e
        raise


# -- inputs ----------------------------------------------------------------------------------------
def random_feeds(inputs: Sequence[Any], seed: int = 0, values: dict[str, np.ndarray] | None = None
                 ) -> dict[str, np.ndarray]:
    """Seeded inputs: normal floats; integers and booleans in {0, 1} (valid ids and masks); value inputs
    (docs/shapes-and-control-flow.md) the value the graph was compiled for."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for info in inputs:
        if values and info.name in values:
            feeds[info.name] = values[info.name]
            continue
        dt = np.dtype(info.dtype)
        if dt.kind == "f":
            feeds[info.name] = rng.standard_normal(info.shape).astype(dt)
        else:
            feeds[info.name] = rng.integers(0, 2, size=info.shape).astype(dt)
    return feeds


def load_inputs(path: str, inputs: Sequence[Any], feeds: dict[str, np.ndarray] | None = None,
                ranged: bool = False) -> dict[str, np.ndarray]:
    """--inputs: an .npz archive with one array per model input, each of the input's dtype and shape
    (`feeds`: the archive already read by read_inputs). `ranged`: a range program's inputs, whose shapes are
    checked by the run against its ranges (the shapes here are the upper bound's): dtype and rank only."""
    feeds = read_inputs(path) if feeds is None else feeds
    names = [i.name for i in inputs]
    if set(feeds) != set(names):
        raise UsageError(f"--inputs {path} has arrays {sorted(feeds)}; the model's inputs are {names}")
    for info in inputs:
        v, dt = feeds[info.name], np.dtype(info.dtype)
        if v.dtype != dt or (v.ndim != len(info.shape) if ranged else tuple(v.shape) != tuple(info.shape)):
            raise UsageError(f"--inputs {path}: array {info.name!r} is {v.dtype}{list(v.shape)}; the model "
                             f"takes {dt}{list(info.shape)}" + (" (a shape inside its ranges)" if ranged else ""))
    return feeds


def read_inputs(path: str) -> dict[str, np.ndarray]:
    """The arrays of the --inputs .npz archive, unchecked against a model (an .onnx model is compiled for
    their shapes and the values of its value inputs)."""
    head = readable_file("--inputs", path)
    if head.startswith(NPY_MAGIC):
        raise UsageError(f"--inputs {path} is a .npy file (one array); inputs are an .npz keyed by input name, "
                         "e.g. numpy.savez('in.npz', x=array)")
    if not head.startswith(ZIP_MAGIC):
        kind = "a ctxrt context binary" if head == CTX_MAGIC else "not an .npz archive"
        raise UsageError(f"--inputs {path} is {kind}; inputs are an .npz keyed by input name, "
                         "e.g. numpy.savez('in.npz', x=array)")
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except (OSError, ValueError, EOFError) as e:
        raise UsageError(f"--inputs {path}: cannot read it as an .npz archive ({e})") from None
