"""Real-model fixtures: onnx's light model zoo with seeded random weights, and small exported BERTs.

Every builder returns a path to a cached `.onnx` file. Files are keyed by their parameters and a version
salt, and written atomically, so parallel or aborted runs never leave a half-written model behind.
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import math
import os
import tempfile
import warnings
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

REPO = Path(__file__).resolve().parents[2]
# Bump when a builder changes what it writes, so stale cached files are not reused.
SALT = "v1"

LIGHT = ["bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet",
         "squeezenet", "vgg19", "zfnet512"]

# Ops that only re-view a weight on its way to the op that uses it (Inception-v1 reshapes its classifier
# weight, DenseNet and Inception-v2 unsqueeze their per-channel scale and shift).
_PASS_THROUGH = {"Reshape", "Unsqueeze"}


def cache_dir() -> Path:
    return Path(os.environ.get("CTXRT_MODEL_CACHE", REPO / ".cache" / "models"))


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600; the cache may be shared
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _cached(path: Path, build: Callable[[], onnx.ModelProto]) -> Path:
    if not path.exists():
        _write_atomic(path, build().SerializeToString())
    return path


# ---- light models ---------------------------------------------------------------------------------

def light_source(name: str) -> Path:
    """The original light model shipped with the onnx package (weights are ConstantOfShape nodes)."""
    if name not in LIGHT:
        raise ValueError(f"unknown light model {name!r}; expected one of {LIGHT}")
    return Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / f"light_{name}.onnx"


def light_model(name: str, seed: int = 0) -> Path:
    """`light_<name>` with every weight a seeded random initializer scaled like a real init.

    Conv/Gemm weights are fan-in scaled with a per-layer gain (see `_gains`) that keeps activations
    O(1) and the logits' std near 2.5; biases and BN shifts U(-0.1, 0.1), BN scales and variances
    U(0.5, 1.5).
    """
    src = light_source(name)
    path = cache_dir() / f"light_{name}_s{seed}_{SALT}.onnx"
    return _cached(path, lambda: randomize_light(onnx.load(src), seed))


Sampler = Callable[[np.random.Generator, tuple[int, ...], float], np.ndarray]


def _uniform(lo: float, hi: float) -> Sampler:
    def sample(rng: np.random.Generator, shape: tuple[int, ...], std: float) -> np.ndarray:
        a = rng.random(size=shape, dtype=np.float32)
        a *= np.float32(hi - lo)
        a += np.float32(lo)
        return a
    return sample


def _fan_in_scaled(rng: np.random.Generator, shape: tuple[int, ...], std: float) -> np.ndarray:
    # Uniform with the requested std (as torch's default init is): for VGG-19's 143M weights it is
    # several times faster than a normal draw, and the variance is all that keeps activations O(1).
    a = rng.random(size=shape, dtype=np.float32)
    a -= np.float32(0.5)
    a *= np.float32(std * np.sqrt(12.0))
    return a


_SMALL = _uniform(-0.1, 0.1)
_NEAR_ONE = _uniform(0.5, 1.5)
_SAMPLERS: dict[tuple[str, int], Sampler] = {  # (consumer op, input position) -> sampler
    ("Conv", 1): _fan_in_scaled, ("Conv", 2): _SMALL,
    ("Gemm", 1): _fan_in_scaled, ("Gemm", 2): _SMALL,
    ("BatchNormalization", 1): _NEAR_ONE, ("BatchNormalization", 2): _SMALL,
    ("BatchNormalization", 3): _SMALL, ("BatchNormalization", 4): _NEAR_ONE,
    # BN emulated as BatchNormalization(scale 1, bias 0) then Mul by a scale and Add of a shift.
    ("Mul", 0): _NEAR_ONE, ("Mul", 1): _NEAR_ONE, ("Add", 0): _SMALL, ("Add", 1): _SMALL,
}

_LINEAR = ("Conv", "Gemm")
_FLOATS = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16)
# Mean square wanted at each linear op's output; at the classifier, logits with std ~2.5 give a softmax
# that is neither flat (where a 1e-5 tolerance hides most errors) nor one-hot.
_TARGET, _LOGITS = 1.0, 6.0


class _Index:
    def __init__(self, graph: onnx.GraphProto) -> None:
        self.consumers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
        for node in graph.node:
            for pos, name in enumerate(node.input):
                self.consumers.setdefault(name, []).append((node, pos))
        self.inits = {t.name: t for t in graph.initializer}

    def use(self, name: str, shape: tuple[int, ...]) -> tuple[onnx.NodeProto, int, tuple[int, ...]] | None:
        """The op that finally uses weight `name`, its input position, and the weight's shape there."""
        uses = self.consumers.get(name)
        if not uses:
            return None
        node, pos = uses[0]
        if node.op_type not in _PASS_THROUGH or pos != 0:
            return node, pos, shape
        if node.op_type == "Reshape":
            target = numpy_helper.to_array(self.inits[node.input[1]]).tolist()
            dims = [shape[i] if d == 0 else d for i, d in enumerate(target)]
            if -1 in dims:
                dims[dims.index(-1)] = int(np.prod(shape)) // -int(np.prod(dims))
            shape = tuple(dims)
        return self.use(node.output[0], shape)


Moment = tuple[float, float]  # (mean, mean square) of all elements of an activation


def _relu(m: float, q: float) -> Moment:
    # Moments of relu(x) for x ~ N(m, q - m^2): exact for Gaussians, and for any symmetric input it
    # halves q. Residual sums are not symmetric (a Relu output plus a branch), so the mean matters.
    sd = math.sqrt(max(q - m * m, 1e-12))
    z = m / sd
    cdf, pdf = 0.5 * (1 + math.erf(z / math.sqrt(2))), math.exp(-z * z / 2) / math.sqrt(2 * math.pi)
    return m * cdf + sd * pdf, q * cdf + m * sd * pdf


def _sum(moments: list[Moment]) -> Moment:
    m = sum(a for a, _ in moments)
    return m, sum(b - a * a for a, b in moments) + m * m  # independent terms: variances add


@functools.cache
def _max_gain(k: int) -> Moment:
    """How much relu(max of k iid N(0, 1)) exceeds relu(one of them), in mean and in mean square."""
    x = np.linspace(-8.0, 8.0, 4001)
    cdf = 0.5 * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))
    density = k * np.exp(-x * x / 2) / math.sqrt(2 * math.pi) * cdf ** (k - 1)
    r, dx = np.maximum(x, 0.0), x[1] - x[0]
    return float((r * density).sum() * dx * math.sqrt(2 * math.pi)), float((r * r * density).sum() * dx * 2)


def _window(node: onnx.NodeProto) -> int:
    return math.prod(next((a.ints for a in node.attribute if a.name == "kernel_shape"), [1]))


def _pool(node: onnx.NodeProto, m: float, q: float) -> Moment:
    if node.op_type == "MaxPool":
        # Neighbours are correlated: a k-window acts like about sqrt(k) independent values (fitted
        # on these nets; k makes the logits of VGG-19 and ZFNet 5x too small).
        gm, gq = _max_gain(round(math.sqrt(_window(node))))
        return gm * m, gq * q
    # an average keeps the mean and shrinks the variance, less so for correlated neighbours
    k = _window(node) if node.op_type == "AveragePool" else 49
    return m, m * m + (q - m * m) / math.sqrt(k)


def _lrn(node: onnx.NodeProto, m: float, q: float) -> Moment:
    # For O(1) inputs the squared-sum term is tiny: LRN divides by bias ** beta (ZFNet's bias is 2).
    attrs = {a.name: a.f for a in node.attribute}
    div = attrs.get("bias", 1.0) ** attrs.get("beta", 0.75)
    return m / div, q / (div * div)


# How ops other than Sum, Concat and linear ops change (mean, mean square). A BN with s, v ~ U(0.5, 1.5)
# scales by s/sqrt(v): E = 1.05, E[^2] = 1.19.
_MOMENT: dict[str, Callable[[onnx.NodeProto, float, float], Moment]] = {
    "Relu": lambda node, m, q: _relu(m, q),
    "BatchNormalization": lambda node, m, q: (1.05 * m, 1.19 * q),
    "Mul": lambda node, m, q: (m, 13 / 12 * q),
    "MaxPool": _pool, "AveragePool": _pool, "GlobalAveragePool": _pool,
    "LRN": _lrn,
}


def _gains(graph: onnx.GraphProto, inputs: list[str]) -> tuple[dict[str, float], dict[str, Moment]]:
    """Per linear op (keyed by its output), the gain that brings its output's mean square to target.

    A data-free version of layer-sequential unit-variance init: propagate an estimate of each
    activation's moments through the graph. Plain 1/sqrt(fan_in) weights shrink VGG-19's logits to
    ~0.05 (a flat softmax) while residual sums grow ResNet's; per-layer gains keep both O(1).
    """
    producers = {o: n for n in graph.node for o in n.output}
    final, stack = set(), [o.name for o in graph.output]
    while stack:  # linear ops that reach an output through no other linear op: the classifiers
        node = producers.get(stack.pop())
        if node is None:
            continue
        if node.op_type in _LINEAR:
            final.add(node.output[0])
        else:
            stack.extend(node.input)
    moments: dict[str, Moment] = dict.fromkeys(inputs, (0.0, 1.0))
    gains = {}
    for node in graph.node:
        data = [moments[i] for i in node.input if i in moments]
        if not data:
            continue  # an op on weights only (ConstantOfShape, Unsqueeze of a scale)
        if node.op_type in _LINEAR:
            out = (0.0, _LOGITS if node.output[0] in final else _TARGET)  # zero-mean weights
            gains[node.output[0]] = math.sqrt(out[1] / data[0][1])
        elif node.op_type in ("Sum", "Add"):
            out = _sum(data)
        elif node.op_type == "Concat":
            out = (sum(a for a, _ in data) / len(data), sum(b for _, b in data) / len(data))
        else:
            out = _MOMENT.get(node.op_type, lambda node, m, q: (m, q))(node, *data[0])
        for o in node.output:
            moments[o] = out
    return gains, moments


def _fan_in(node: onnx.NodeProto, shape: tuple[int, ...]) -> int:
    if node.op_type == "Gemm":
        trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
        return shape[1] if trans_b else shape[0]
    return int(np.prod(shape[1:]))  # Conv weight (M, C/group, kh, kw)


def _sample(index: _Index, gains: dict[str, float], name: str, shape: tuple[int, ...], dtype: np.dtype,
            seed: int) -> np.ndarray | None:
    use = index.use(name, shape)
    if use is None:
        return None
    node, pos, used_shape = use
    sampler = _SAMPLERS.get((node.op_type, pos))
    if sampler is None:
        raise ValueError(f"weight {name!r} {shape} feeds {node.op_type} input {pos}: no sampler for it")
    std = 1.0
    if node.op_type in _LINEAR and pos == 1:
        std = gains[node.output[0]] / np.sqrt(_fan_in(node, used_shape))
    # Seeded by name so a weight's values do not depend on the order the graph lists it in.
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    return sampler(rng, shape, std).astype(dtype, copy=False)


def _fill(tensor: onnx.TensorProto, name: str, array: np.ndarray) -> None:
    # In place: building a TensorProto and then copying it into the graph doubles the cost for VGG-19.
    tensor.Clear()
    tensor.name = name
    tensor.data_type = helper.np_dtype_to_tensor_dtype(array.dtype)
    tensor.dims.extend(array.shape)
    tensor.raw_data = array.tobytes()


def randomize_light(model: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """Turn each ConstantOfShape-made weight into a random initializer; re-draw stored float weights.

    The graph keeps its ops, names, opset and IR version. IR 3 requires every initializer to be a
    graph input too, so a new weight takes the graph-input slot of the shape tensor it replaces.
    """
    graph = model.graph
    index = _Index(graph)
    gains, _ = _gains(graph, [vi.name for vi in data_inputs(model)])
    made: dict[str, tuple[str, np.ndarray]] = {}  # shape tensor name -> (weight name, values)
    for node in graph.node:
        if node.op_type != "ConstantOfShape" or node.input[0] not in index.inits:
            continue
        shape = tuple(numpy_helper.to_array(index.inits[node.input[0]]).tolist())
        value = next((a.t for a in node.attribute if a.name == "value"), None)
        dtype = helper.tensor_dtype_to_np_dtype(value.data_type) if value is not None else np.float32
        array = _sample(index, gains, node.output[0], shape, dtype, seed)
        if array is None:
            raise ValueError(f"ConstantOfShape output {node.output[0]!r} is not used")
        made[node.input[0]] = (node.output[0], array)
    # Stored per-channel vectors (real BN statistics, biases) would not match random conv weights: a
    # stored running variance of 4000 or 1e-14 next to a unit-scale conv blows activations up or down.
    redrawn: dict[str, np.ndarray] = {}
    for tensor in graph.initializer:
        if tensor.name not in made and tensor.data_type in _FLOATS:
            old = numpy_helper.to_array(tensor)
            new = _sample(index, gains, tensor.name, old.shape, old.dtype, seed)
            if new is not None:  # unused ones (ResNet-50's and ZFNet's (1, 1) queue blob) stay
                redrawn[tensor.name] = new

    nodes = [n for n in graph.node if not (n.op_type == "ConstantOfShape" and n.input[0] in made)]
    del graph.node[:]
    graph.node.extend(nodes)
    kept = [t for t in graph.initializer if t.name not in made]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    for tensor in graph.initializer:
        if tensor.name in redrawn:
            _fill(tensor, tensor.name, redrawn[tensor.name])
    for name, array in made.values():
        _fill(graph.initializer.add(), name, array)
    for vi in graph.input:
        if vi.name in made:
            name, array = made[vi.name]
            vi.CopyFrom(helper.make_tensor_value_info(
                name, helper.np_dtype_to_tensor_dtype(array.dtype), array.shape))
    return model


def data_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """Graph inputs that are not initializers (IR 3 lists every initializer as an input)."""
    inits = {t.name for t in model.graph.initializer}
    return [vi for vi in model.graph.input if vi.name not in inits]


def light_feeds(name_or_path: str | os.PathLike[str], seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded N(0, 1) data for each real (non-initializer) input of a light model."""
    path = Path(name_or_path)
    if str(name_or_path) in LIGHT:
        path = light_source(str(name_or_path))
    model = onnx.load(path, load_external_data=False)
    rng = np.random.default_rng(seed)
    feeds = {}
    for vi in data_inputs(model):
        tt = vi.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else 1 for d in tt.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(tt.elem_type)
        feeds[vi.name] = rng.standard_normal(size=shape).astype(dtype)
    return feeds


# ---- BERT -----------------------------------------------------------------------------------------

@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence the exporters' warnings, log lines and prints."""
    loggers = [logging.getLogger(n) for n in ("torch", "torch.onnx", "onnxscript", "transformers")]
    levels = [lg.level for lg in loggers]
    try:
        for lg in loggers:
            lg.setLevel(logging.ERROR)
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def bert_model(layers: int = 2, hidden: int = 64, heads: int = 4, intermediate: int | None = None,
               seq: int = 16, vocab: int = 1000, exporter: str = "dynamo", seed: int = 0) -> Path:
    """A randomly initialised `transformers.BertModel` exported at opset 17.

    Inputs `input_ids` and `attention_mask` (int64, dynamic batch and seq); outputs
    `last_hidden_state` and `pooler_output`. `exporter` is "dynamo" (onnxscript) or "legacy" (TorchScript).
    """
    if exporter not in ("dynamo", "legacy"):
        raise ValueError(f"exporter must be 'dynamo' or 'legacy', not {exporter!r}")
    intermediate = intermediate or 4 * hidden
    path = cache_dir() / (f"bert_L{layers}_H{hidden}_A{heads}_I{intermediate}_S{seq}_V{vocab}"
                          f"_{exporter}_s{seed}_{SALT}.onnx")
    return _cached(path, lambda: _export_bert(layers, hidden, heads, intermediate, seq, vocab, exporter,
                                              seed))


def _export_bert(layers: int, hidden: int, heads: int, intermediate: int, seq: int, vocab: int,
                 exporter: str, seed: int) -> onnx.ModelProto:
    import torch
    import transformers

    class Wrapper(torch.nn.Module):
        # transformers 5's BertModel.forward takes keyword arguments only.
        def __init__(self, bert: torch.nn.Module) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            out = self.bert(input_ids=ids, attention_mask=mask)
            return out.last_hidden_state, out.pooler_output

    config = transformers.BertConfig(
        vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        intermediate_size=intermediate, max_position_embeddings=max(512, seq))
    torch.manual_seed(seed)
    model = Wrapper(transformers.BertModel(config)).eval()
    # batch 2 and some padding: the dynamo exporter specializes a dimension traced at size 1
    feeds = bert_feeds(seq, batch=2, vocab=vocab, seed=seed)
    args = (torch.from_numpy(feeds["input_ids"]), torch.from_numpy(feeds["attention_mask"]))
    names = {"input_names": ["input_ids", "attention_mask"],
             "output_names": ["last_hidden_state", "pooler_output"]}
    axes = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"},
            "last_hidden_state": {0: "batch", 1: "seq"}, "pooler_output": {0: "batch"}}
    with _quiet(), torch.no_grad():
        if exporter == "legacy":
            buf = io.BytesIO()
            torch.onnx.export(model, args, buf, opset_version=17, dynamo=False, dynamic_axes=axes, **names)
            return onnx.load_from_string(buf.getvalue())
        program = torch.onnx.export(model, args, opset_version=17, dynamo=True, dynamic_axes=axes, **names)
        return program.model_proto


def bert_feeds(seq: int, batch: int = 1, vocab: int = 1000, pad: int = 4,
               seed: int = 0) -> dict[str, np.ndarray]:
    """Random token ids and an attention mask whose last `pad` positions are 0."""
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, seq), dtype=np.int64)
    mask[:, max(seq - pad, 0):] = 0
    return {"input_ids": rng.integers(0, vocab, size=(batch, seq), dtype=np.int64), "attention_mask": mask}


# ---- small decoders (Qwen2 / Llama style) -----------------------------------------------------------

def decoder_model(kind: str = "qwen2", layers: int = 4, hidden: int = 128, heads: int = 4, kv_heads: int = 2,
                  vocab: int = 1000, seq: int = 8, seed: int = 0) -> Path:
    """A randomly initialised transformers Qwen2/Llama causal LM (no KV cache), legacy export at opset 17: a
    graph of hundreds of tiny ops. Inputs `input_ids`, `attention_mask` (int64 [1, seq]); output `logits`."""
    if kind not in ("qwen2", "llama"):
        raise ValueError(f"kind must be 'qwen2' or 'llama', not {kind!r}")
    path = cache_dir() / f"{kind}_L{layers}_H{hidden}_A{heads}_K{kv_heads}_V{vocab}_S{seq}_s{seed}_{SALT}.onnx"
    return _cached(path, lambda: _export_decoder(kind, layers, hidden, heads, kv_heads, vocab, seq, seed))


def _export_decoder(kind: str, layers: int, hidden: int, heads: int, kv_heads: int, vocab: int, seq: int,
                    seed: int) -> onnx.ModelProto:
    import torch
    import transformers

    make = {"qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
            "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM)}[kind]
    config = make[0](vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 11 // 4,
                     num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                     max_position_embeddings=max(256, seq))
    torch.manual_seed(seed)
    lm = make[1](config).eval()

    class Wrapper(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lm = lm

        def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            return self.lm(input_ids=ids, attention_mask=mask, use_cache=False).logits

    feeds = decoder_feeds(seq, vocab, seed)
    args = (torch.from_numpy(feeds["input_ids"]), torch.from_numpy(feeds["attention_mask"]))
    with _quiet(), torch.no_grad():
        buf = io.BytesIO()
        torch.onnx.export(Wrapper(), args, buf, opset_version=17, dynamo=False,
                          input_names=["input_ids", "attention_mask"], output_names=["logits"])
        return onnx.load_from_string(buf.getvalue())


def decoder_feeds(seq: int = 8, vocab: int = 1000, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"input_ids": rng.integers(0, vocab, size=(1, seq), dtype=np.int64),
            "attention_mask": np.ones((1, seq), dtype=np.int64)}
