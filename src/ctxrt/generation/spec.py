"""What a decoder takes and gives, read from the model's inputs and outputs (a torch export) or from the
`genai_config.json` beside it (a folder of onnxruntime-genai's model builder).

The families share one description (`DecoderSpec`); they differ only in where the names come from, how the
KV cache's axes are found, and how a batch of prompts of different lengths is padded:

- a torch export (`past_key_values.N.key` or `past_key_values.N` inputs, `present.*` outputs) is padded on the
  left, its `attention_mask` zero over the padding and `position_ids` counting the real tokens (as transformers
  does); without both inputs padding would change its outputs, so prompts run one at a time;
- a builder model computes positions from the attention mask's row sums inside GroupQueryAttention, which takes
  a first prompt padded on the right; with `position_ids` among its inputs (another attention op) it runs one
  prompt at a time.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ctxrt.errors import GenerationError, ModelError

GENAI_CONFIG = "genai_config.json"
TOKENIZER = "tokenizer.json"
_TYPES = {"float": np.float32, "float16": np.float16, "double": np.float64, "int64": np.int64, "int32": np.int32}
_MAX_CONFIG_BYTES = 1 << 20
_PRESENT = (("past_key_values", "present"), ("past_key_value", "present"), ("past", "present"))


@dataclass(frozen=True)
class KVSlot:
    """One past input fed back from its present output; `shape` has None at the batch and sequence axes."""

    past: str
    present: str
    dtype: np.dtype
    shape: tuple[int | None, ...]
    batch_axis: int
    seq_axis: int

    def empty(self, batch: int) -> np.ndarray:
        shape = [0 if a == self.seq_axis else batch if a == self.batch_axis else d for a, d in enumerate(self.shape)]
        return np.zeros(shape, self.dtype)


@dataclass(frozen=True)
class DecoderSpec:
    family: str  # "torch" or "genai"
    input_ids: str
    attention_mask: str | None
    position_ids: str | None
    logits: str
    kv: tuple[KVSlot, ...]
    padding: str  # "left", "right" or "none" (one prompt at a time)
    dtypes: Mapping[str, np.dtype]  # of input_ids, attention_mask, position_ids
    eos_ids: tuple[int, ...] = ()
    pad_id: int = 0
    context_length: int | None = None
    vocab_size: int | None = None
    # past and present one buffer of the context's length, written in place (genai_config's
    # search.past_present_share_buffer: GroupQueryAttention's shared buffer)
    share_buffer: bool = False

    @property
    def batching(self) -> str:
        return {"left": "batch, left padding", "right": "batch, right padding"}.get(self.padding, "one at a time")


@dataclass(frozen=True)
class ModelFiles:
    """The model file to run and what lies beside it."""

    model: Path
    genai_config: dict[str, Any] | None
    tokenizer: Path | None


def locate(path: str | os.PathLike) -> ModelFiles:
    """MODEL as given: a folder (onnxruntime-genai's, or one holding a single model), an .onnx or a .ctx file."""
    p = Path(path)
    if p.is_dir():
        folder = p
        config = _read_config(folder / GENAI_CONFIG) if (folder / GENAI_CONFIG).is_file() else None
        if config is not None:
            model = folder / _get(config, "model.decoder.filename", str)
            for compiled in (model.with_suffix(".ctx"), model.with_name(f"{model.stem}_ctx.onnx")):
                if not model.is_file() and compiled.is_file():  # `ctxrt compile --generate [--split K]`'s
                    model = compiled
        else:
            found = sorted(f for f in folder.iterdir() if f.suffix in (".onnx", ".ctx") and f.is_file())
            named = [f for f in found if f.stem == "model"]
            if len(found) != 1 and len(named) != 1:
                raise GenerationError(f"{p}: no {GENAI_CONFIG}, and {len(found)} .onnx/.ctx files instead of one "
                                      "(name the model file)")
            model = found[0] if len(found) == 1 else named[0]
        if not model.is_file():
            raise GenerationError(f"{p}: the model file {model.name} named by {GENAI_CONFIG} is missing")
    elif p.is_file():
        model, folder = p, p.parent
        config = _read_config(folder / GENAI_CONFIG) if (folder / GENAI_CONFIG).is_file() else None
        if config is not None and Path(_get(config, "model.decoder.filename", str)).stem not in (
                p.stem, p.stem.removesuffix("_ctx")):  # (the EPContext model of a split compile of it)
            config = None  # the folder's config describes another file
    else:
        raise GenerationError(f"{p}: no such file or folder")
    tokenizer = folder / TOKENIZER
    return ModelFiles(model, config, tokenizer if tokenizer.is_file() else None)


def describe(files: ModelFiles, inputs: Sequence[Any], outputs: Sequence[Any],
             context_length: int | None = None) -> DecoderSpec:
    """The spec of a model from its session's `get_inputs()`/`get_outputs()` (NodeArgs)."""
    ins = {a.name: a for a in inputs}
    outs = {a.name: a for a in outputs}
    if files.genai_config is not None:
        spec = _genai(files.genai_config, ins, outs)
    else:
        spec = _torch(ins, outs, _hf_context(files.model.parent))
    if context_length is not None:
        spec = replace(spec, context_length=context_length)
    return spec


# -- torch exports ----------------------------------------------------------------------------------
def _torch(ins: Mapping[str, Any], outs: Mapping[str, Any], context_length: int | None) -> DecoderSpec:
    if "input_ids" not in ins:
        raise ModelError(f"not a decoder: no input 'input_ids' (inputs: {list(ins)})")
    pasts = [n for n in ins if n.startswith("past")]
    if not pasts:
        raise ModelError(f"not a decoder with a KV cache: no past_key_values.* input (inputs: {list(ins)})")
    mask = "attention_mask" if "attention_mask" in ins else None
    pos = "position_ids" if "position_ids" in ins else None
    other = set(ins) - {"input_ids", *pasts, mask, pos}
    if other:
        raise ModelError(f"inputs {sorted(other)} are not ones a decoder loop can feed (input_ids, attention_mask, "
                         "position_ids, past_key_values.*)")
    batch = _dims(ins["input_ids"])[0] if _dims(ins["input_ids"]) else None
    kv = tuple(_slot(ins[n], outs, _present(n, outs), batch) for n in pasts)
    presents = {s.present for s in kv}
    logits = "logits" if "logits" in outs else next((n for n in outs if n not in presents), None)
    if logits is None:
        raise ModelError(f"no logits output among {list(outs)}")
    return DecoderSpec("torch", "input_ids", mask, pos, logits, kv, "left" if mask and pos else "none",
                       _int_types(ins, ("input_ids", mask, pos)), context_length=context_length,
                       vocab_size=_last_dim(outs[logits]))


def _present(past: str, outs: Mapping[str, Any]) -> str:
    for old, new in _PRESENT:
        if past.startswith(old) and new + past[len(old):] in outs:
            return new + past[len(old):]
    raise ModelError(f"input {past!r} has no present output to feed it back from (outputs: {list(outs)})")


def _slot(arg: Any, outs: Mapping[str, Any], present: str, batch: Any) -> KVSlot:
    """The batch axis is the one named as input_ids' first; the sequence axis the other named one (the one whose
    name says past or seq where several are)."""
    dims = _dims(arg)
    if dims is None:
        raise ModelError(f"input {arg.name!r} declares no shape: its batch and sequence axes are unknown")
    free = [a for a, d in enumerate(dims) if not isinstance(d, int)]
    batch_axis = next((a for a in free if batch is not None and dims[a] == batch), 0)
    rest = [a for a in free if a != batch_axis]
    if len(rest) > 1:
        rest = [a for a in rest if re.search("past|seq|len", str(dims[a]), re.IGNORECASE)]
    if len(rest) != 1:
        _grows(arg, -1)
        raise ModelError(f"input {arg.name!r} of shape {dims}: cannot tell its sequence axis")
    seq_axis = rest[0]
    fixed = tuple(None if a in (batch_axis, seq_axis) else d for a, d in enumerate(dims))
    if any(d is None for a, d in enumerate(fixed) if a not in (batch_axis, seq_axis)):
        raise ModelError(f"input {arg.name!r} of shape {dims}: axes other than batch and sequence must be sizes")
    return KVSlot(arg.name, present, _dtype(arg), fixed, batch_axis, seq_axis)


def _grows(arg: Any, seq_axis: int) -> None:
    """A past whose sequence axis is a fixed size (every axis, when it is not known) cannot grow by a token."""
    dims = _dims(arg)
    if dims is not None and (all(isinstance(d, int) for d in dims) if seq_axis < 0 else
                             len(dims) > seq_axis and isinstance(dims[seq_axis], int)):
        raise ModelError(f"input {arg.name!r} has the fixed shape {dims}: its KV cache cannot grow by a token "
                         "(compile the context binary with --dim ranges of its batch, sequence and past dims, or "
                         "generate from the .onnx model)")


def _hf_context(folder: Path) -> int | None:
    """The context length a Hugging Face config.json beside an export gives (max_position_embeddings)."""
    path = folder / "config.json"
    if not path.is_file():
        return None
    config = _read_json(path)
    for key in ("max_position_embeddings", "n_positions"):
        value = config.get(key) if isinstance(config, dict) else None
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


# -- onnxruntime-genai's builder -------------------------------------------------------------------
def _genai(config: dict[str, Any], ins: Mapping[str, Any], outs: Mapping[str, Any]) -> DecoderSpec:
    names = _get(config, "model.decoder.inputs", dict)
    out_names = _get(config, "model.decoder.outputs", dict)
    layers = _get(config, "model.decoder.num_hidden_layers", int)
    heads = _get(config, "model.decoder.num_key_value_heads", int)
    head_size = _get(config, "model.decoder.head_size", int)
    for key, value in (("num_hidden_layers", layers), ("num_key_value_heads", heads), ("head_size", head_size)):
        if not 0 < value <= 1 << 16:
            raise ModelError(f"{GENAI_CONFIG}: model.decoder.{key} = {value} is out of range")
    input_ids, logits = names.get("input_ids", "input_ids"), out_names.get("logits", "logits")
    mask = names.get("attention_mask") if names.get("attention_mask") in ins else None
    pos = names.get("position_ids") if names.get("position_ids") in ins else None
    search = config.get("search") if isinstance(config.get("search"), dict) else {}
    share = search.get("past_present_share_buffer") is True
    kv, rows = [], set()  # rows: a shared buffer's fixed length (a binary compiled with `--generate`)
    for pattern, out_pattern in (("past_key_names", "present_key_names"), ("past_value_names", "present_value_names")):
        for i in range(layers):
            past, present = _nth(names, pattern, i), _nth(out_names, out_pattern, i)
            if past not in ins or present not in outs:
                raise ModelError(f"{GENAI_CONFIG} names {past!r} and {present!r}, which the model lacks")
            dims = _dims(ins[past])
            if share and dims is not None and len(dims) == 4 and isinstance(dims[2], int) and \
                    _dims(outs[present]) == dims:
                rows.add(dims[2])  # past and present one buffer of a fixed length
            else:
                _grows(ins[past], 2)
            kv.append(KVSlot(past, present, _dtype(ins[past]), (None, heads, None, head_size), 0, 2))
    for name in (input_ids, logits):
        if name not in ins and name not in outs:
            raise ModelError(f"{GENAI_CONFIG} names {name!r}, which the model lacks")
    other = set(ins) - {input_ids, mask, pos, *(s.past for s in kv)}
    if other:
        raise ModelError(f"inputs {sorted(other)} are not named in {GENAI_CONFIG}")
    eos = _get(config, "model.eos_token_id", (int, list))
    eos_ids = tuple(eos) if isinstance(eos, list) else (eos,)
    if not all(isinstance(e, int) for e in eos_ids):
        raise ModelError(f"{GENAI_CONFIG}: model.eos_token_id must be an int or a list of ints")
    model = config["model"]
    pad = model.get("pad_token_id", eos_ids[0] if eos_ids else 0)
    limits = [_get(config, "model.context_length", int), search.get("max_length"), *rows]
    context = min(n for n in limits if isinstance(n, int) and not isinstance(n, bool))
    vocab = model.get("vocab_size")
    vocab = vocab if isinstance(vocab, int) and vocab > 0 else _last_dim(outs[logits])
    pad = pad if isinstance(pad, int) else 0
    if vocab and not 0 <= pad < vocab:  # (a builder writes pad_token_id = vocab_size where the model has none): a
        # padded or stopped row is fed a token of the vocabulary, never looked up past the embedding table
        pad = next((e for e in eos_ids if 0 <= e < vocab), 0)
    return DecoderSpec("genai", input_ids, mask, pos, logits, tuple(kv), "right" if mask and not pos else "none",
                       _int_types(ins, (input_ids, mask, pos)), eos_ids, pad, context if context > 0 else None,
                       vocab, share and bool(kv) and context > 0)


def _nth(names: Mapping[str, Any], key: str, i: int) -> str:
    pattern = names.get(key)
    if not isinstance(pattern, str) or pattern.count("%d") != 1:
        raise ModelError(f"{GENAI_CONFIG}: {key} must be a name with one %d, got {pattern!r}")
    return pattern.replace("%d", str(i))


def _read_config(path: Path) -> dict[str, Any]:
    config = _read_json(path)
    if not isinstance(config, dict) or not isinstance(config.get("model"), dict):
        raise ModelError(f"{path}: expected a JSON object with a 'model' object")
    return config


def _read_json(path: Path) -> Any:
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_CONFIG_BYTES + 1)
        if len(data) > _MAX_CONFIG_BYTES:
            raise ModelError(f"{path}: larger than {_MAX_CONFIG_BYTES} bytes")
        return json.loads(data)
    except (OSError, ValueError) as e:
        raise ModelError(f"{path}: cannot read it as JSON ({e})") from None


def _get(config: dict[str, Any], dotted: str, kind: type | tuple[type, ...]) -> Any:
    value: Any = config
    for key in dotted.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ModelError(f"{GENAI_CONFIG}: {dotted} is missing or not a {getattr(kind, '__name__', kind)}")
    return value


# -- NodeArgs ---------------------------------------------------------------------------------------
def _dims(arg: Any) -> list[int | str | None] | None:
    return None if arg.shape is None else list(arg.shape)


def _last_dim(arg: Any) -> int | None:
    dims = _dims(arg)
    return dims[-1] if dims and isinstance(dims[-1], int) and dims[-1] > 0 else None


def _dtype(arg: Any) -> np.dtype:
    name = arg.type.removeprefix("tensor(").removesuffix(")")
    if name not in _TYPES:
        raise ModelError(f"input {arg.name!r} is {arg.type}: a decoder loop feeds {sorted(_TYPES)}")
    return np.dtype(_TYPES[name])


def _int_types(ins: Mapping[str, Any], names: Sequence[str | None]) -> dict[str, np.dtype]:
    types = {}
    for n in names:
        if n is not None:
            dt = _dtype(ins[n])
            if dt.kind != "i":
                raise ModelError(f"input {n!r} is {ins[n].type}, not integers")
            types[n] = dt
    return types



# ops through which an attention mask may reach GroupQueryAttention's seqlens_k / total_sequence_length (what the
# model builder writes: ReduceSum - 1 and Shape[1], cast to int32)
_MASK_ARITHMETIC = {"Cast", "ReduceSum", "Sub", "Add", "Shape", "Gather", "Squeeze", "Unsqueeze", "Reshape",
                    "Identity"}


def compiled_generation(model: Path) -> dict[str, Any]:
    """META `generation` of a context binary compiled with `ctxrt compile --generate` (of the first part of a split
    one's EPContext model); {} for anything else."""
    from ctxrt.format import read_metadata

    try:
        if model.suffix == ".onnx":
            from ctxrt.frontend.epcontext import is_epcontext, read_epcontext

            if not is_epcontext(model):
                return {}
            model = next(n.cache_path for n in read_epcontext(model) if n.cache_path is not None)
        found = read_metadata(model).get("generation", {})
    except Exception:  # noqa: BLE001 -- the session reports an unreadable model
        return {}
    return found if isinstance(found, dict) else {}


def mask_only_counts(files: ModelFiles, mask: str) -> bool:
    """Whether the model's attention mask only decides GroupQueryAttention's seqlens_k and total_sequence_length
    (inputs 5 and 6), as onnxruntime-genai's builder writes it: then a token step may be fed the mask padded with
    zeros to the context length (the row sums, the positions, are the same; total_sequence_length is the shared
    buffer's length, as for a captured graph), and every token runs at the same shapes. Read from the ONNX model
    beside the file run (a .ctx compiled from a folder has it there); False where there is none."""
    found = compiled_generation(files.model).get("mask_only_counts")
    if found is not None:  # what `ctxrt compile --generate` found in the ONNX model
        return bool(found)
    onnx_file = files.model if files.model.suffix == ".onnx" else None
    if onnx_file is None and files.genai_config is not None:
        named = files.model.parent / _get(files.genai_config, "model.decoder.filename", str)
        onnx_file = named if named.suffix == ".onnx" and named.is_file() else None
    if onnx_file is None:
        return False
    import onnx

    try:
        from ctxrt.frontend.external import structure

        graph = structure(onnx_file).graph
    except Exception:  # noqa: BLE001 -- an unreadable model: the mask grows as the past does
        return False
    users: dict[str, list[tuple[Any, int]]] = {}
    for node in graph.node:
        if any(a.type == onnx.AttributeProto.GRAPH for a in node.attribute):
            return False  # a subgraph could read the mask by name
        for i, name in enumerate(node.input):
            users.setdefault(name, []).append((node, i))
    outputs = {o.name for o in graph.output}
    todo, seen, reached = [mask], {mask}, False
    while todo:
        name = todo.pop()
        if name in outputs:
            return False
        for node, i in users.get(name, []):
            if node.op_type == "GroupQueryAttention" and node.domain == "com.microsoft" and i in (5, 6):
                reached = True
            elif node.op_type in _MASK_ARITHMETIC and node.domain in ("", "ai.onnx"):
                for out in node.output:
                    if out and out not in seen:
                        seen.add(out)
                        todo.append(out)
            else:
                return False
    return reached
