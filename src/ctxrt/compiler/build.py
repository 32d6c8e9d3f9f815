"""IR graph -> CompiledGraph: choose kernels, decide aliases and in-place reuse, plan the arena."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ctxrt import dtypes, progress
from ctxrt.backends import Backend, select_kernel
from ctxrt.backends.kernel import Kernel, NodeSpec, TensorSpec
from ctxrt.compiler.program import ARENA, CONST, INPUT, OUTPUT, Body, CompiledGraph, Interval, Ref, Step, TensorInfo
from ctxrt.errors import UnsupportedOpError
from ctxrt.ir.dynamic import PASS_THROUGH, bounded_outputs
from ctxrt.ir.graph import Graph, Node, Value
from ctxrt.planner import arena

if TYPE_CHECKING:
    from ctxrt.tuning.tuner import Tuner

# Ops whose output is input 0 with another shape: a zero-copy view when possible.
ALIAS_OPS = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"}
# Ops whose kernels stay correct when output 0 is the same memory as one of these inputs.
_UNARY = {"Relu", "LeakyRelu", "Sigmoid", "HardSigmoid", "Softplus", "Tanh", "Erf", "Gelu", "Sqrt", "Exp", "Log",
          "Neg", "Abs", "Reciprocal", "Floor", "Ceil", "Round", "Sign", "Sin", "Cos", "Tan", "Asin", "Acos",
          "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "Clip", "Softmax",
          "LogSoftmax", "BatchNormalization", "LayerNormalization", "InstanceNormalization",
          "GroupNormalization", "Not", "HardSwish", "Elu", "Selu", "Celu", "Mish", "Softsign", "ThresholdedRelu",
          "Shrink", "Swish", "PRelu"}
_BINARY = {"Add", "Sub", "Mul", "Div", "Mod", "Pow", "Max", "Min", "Sum", "Mean"}
INPLACE: dict[str, tuple[int, ...]] = {**{op: (0,) for op in _UNARY}, **{op: (0, 1) for op in _BINARY},
                                       "Where": (1, 2), "Trilu": (0,), "ScatterND": (0,), "ScatterElements": (0,)}


def node_spec(graph: Graph, node: Node, options: Mapping[str, Any] | None = None) -> NodeSpec:
    ins = [graph.values[n] if n else None for n in node.inputs]
    return NodeSpec(
        node.op, node.name, node.attrs,
        [TensorSpec(v.shape, np.dtype(v.dtype)) if v else None for v in ins],
        [TensorSpec(graph.values[o].shape, np.dtype(graph.values[o].dtype)) for o in node.outputs if o],
        [dtypes.stored(v.const) if v else None for v in ins],  # 4-bit constants packed, as stored
        graph.opset, dict(options or {}))


def choose_kernel(graph: Graph, node: Node, backend: Backend, options: Mapping[str, Any] | None = None
                  ) -> tuple[Kernel, str]:
    """(the node's kernel built with the compile options, the backend that runs it). A kernel that made a choice
    the loader must repeat, or constants of its own (transformed weights), gets them recorded: its choice in the
    node's attributes, its constants as new constant values in place of the inputs they replace (`prepacked`
    lists [input index, bytes of the original]). The kernel is then built again from the node as recorded, on
    the same backend, as the loader will."""
    kernel, placement = select_kernel(backend, node_spec(graph, node, options))
    if not kernel.attrs and not kernel.constants:
        return kernel, placement
    attrs = {**node.attrs, **kernel.attrs}
    packed = []
    for i, array in sorted(kernel.constants.items()):
        original = node.inputs[i]
        packed.append([i, graph.values[original].nbytes if original else 0])
        if array is None:
            node.inputs[i] = ""
            continue
        name, k = f"{original or node.name}#{attrs.get('kernel', 'packed')}", 1
        while name in graph.values:  # e.g. one weight prepacked differently for two nodes
            name, k = f"{original or node.name}#{attrs.get('kernel', 'packed')}{k}", k + 1
        graph.values[name] = Value(name, array.dtype, tuple(array.shape), array)
        node.inputs[i] = name
    if packed:
        attrs["prepacked"] = packed
    node.attrs = attrs
    if (options or {}).get("probe_arena") and not packed:  # a range compile's probe, only compared (no loader
        return kernel, placement  # builds it again): its choices recorded, the kernel as first built
    return select_kernel(backend, node_spec(graph, node), placement)


class _Storage:
    """Union of values that share memory (aliases and in-place results), keyed by root value."""

    def __init__(self) -> None:
        self.root: dict[str, str] = {}

    def find(self, name: str) -> str:
        while self.root.get(name, name) != name:
            name = self.root[name]
        return name

    def join(self, child: str, parent: str) -> None:
        self.root[child] = self.find(parent)


def compile_graph(graph: Graph, backend: Backend, options: Mapping[str, Any] | None = None,
                  tuner: Tuner | None = None) -> CompiledGraph:
    """Kernels (chosen with the compile `options`, on the backend's device, else on its fallback: the step
    records which), tuned on the device in tuning mode, storage and the arena plan of one graph. Every node whose
    kernel cannot be built (op, attribute value, rank, ...) is reported in one UnsupportedOpError, before anything
    is planned or tuned. Bodies of control nodes get no options: their kernels make no compile-time choices."""
    alignment = backend.alignment
    errors = _compile_bodies(graph, backend)
    inputs, outputs = set(graph.inputs), set(graph.outputs)
    last_use = {name: -1 for name in graph.values}
    for step, node in enumerate(graph.nodes):
        for n in node.inputs:
            if n:
                last_use[n] = step
    bounded = _bounded(graph)
    for name in outputs & bounded.keys():  # the real size is read after the last step
        last_use[bounded[name][0]] = len(graph.nodes)

    store = _Storage()
    kernel_of: dict[int, Kernel] = {}
    placement: dict[int, str] = {}
    aliased: set[int] = set()
    empty: set[int] = set()

    def home(name: str) -> str:
        """Where a value's bytes live: 'input', 'output', 'const' or 'arena'."""
        root = store.find(name)
        if root in inputs:
            return INPUT
        if root in outputs:
            return OUTPUT
        return CONST if graph.values[root].is_const else ARENA

    root_last = dict(last_use)  # per storage root: the last step reading any value stored there

    def share(child: str, parent: str) -> None:
        root = store.find(parent)
        store.join(child, root)
        root_last[root] = max(root_last[root], last_use[child])

    progress.stage("kernels", len(graph.nodes), "node")
    for step, node in enumerate(graph.nodes):
        progress.advance()
        out0 = node.outputs[0]
        if node.op in ALIAS_OPS and out0 not in outputs and home(node.inputs[0]) != CONST:
            share(out0, node.inputs[0])
            aliased.add(step)
            continue
        if any(isinstance(v, Graph) for v in node.attrs.values()):
            continue  # its body did not compile: reported with the rest
        if all(graph.values[o].nbytes == 0 for o in node.outputs if o):
            empty.add(step)  # zero-size outputs: nothing to compute, no kernel (nor a launch over no elements)
            continue
        try:
            kernel_of[step], placement[step] = choose_kernel(graph, node, backend, options)
        except UnsupportedOpError as e:
            errors.append(str(e))
            continue
        if out0 in outputs:
            continue
        for i in INPLACE.get(node.op, ()):
            src = node.inputs[i] if i < len(node.inputs) else ""
            if (src and home(src) == ARENA and root_last[store.find(src)] == step
                    and graph.values[src].nbytes == graph.values[out0].nbytes
                    and graph.values[src].dtype == graph.values[out0].dtype
                    and node.inputs.count(src) == 1):
                share(out0, src)
                break

    if errors:
        raise UnsupportedOpError(errors[0] if len(errors) == 1 else
                                 f"{len(errors)} nodes cannot be compiled: " + "; ".join(errors))

    params: dict[int, dict[str, Any]] = {}
    tuning: list[dict[str, Any]] = []
    if tuner is not None:  # before planning: a tuned kernel may need other scratch
        on_device = {k: kernel for k, kernel in kernel_of.items() if placement[k] == backend.name}
        tuned, tuning = tuner.tune(graph.name, on_device, {k: graph.nodes[k].name for k in on_device})
        for k, (kernel, p) in tuned.items():
            kernel_of[k], params[k] = kernel, p

    # Lifetimes of arena roots (aliases and in-place results extend them) and scratch.
    requests: list[arena.Request] = []
    first: dict[str, int] = {}
    for step, node in enumerate(graph.nodes):
        for o in node.outputs:
            if o and home(o) == ARENA:
                first.setdefault(store.find(o), step)
    lasts: dict[str, int] = {}
    for name in graph.values:
        if home(name) == ARENA:
            root = store.find(name)
            lasts[root] = max(lasts.get(root, -1), last_use[name], first.get(root, 0))
    for root, f in first.items():
        size = arena.align(graph.values[root].nbytes, alignment)
        requests.append(arena.Request(root, size, f, lasts[root]))
    for step, kernel in kernel_of.items():
        for j, nbytes in enumerate(kernel.scratch):
            requests.append(arena.Request(f"{graph.nodes[step].name}#scratch{j}",
                                          arena.align(int(nbytes), alignment), step, step))
    progress.stage("planning memory")
    # a range compile's probes other than the upper bound are compared, never run: one greedy order is enough
    plan = arena.plan(requests, quick=bool((options or {}).get("probe_arena")))
    arena.check(plan, alignment)

    def ref(name: str) -> Ref:
        v = graph.values[name]
        root = store.find(name)
        space = home(name)
        offset = plan.allocations[root].offset if space == ARENA else 0
        return Ref(space, root, offset, tuple(v.shape), dtypes.name(v.dtype))

    steps = []
    for step, node in enumerate(graph.nodes):
        if step in aliased or step in empty:
            continue
        kernel = kernel_of[step]
        scratch = []
        for j in range(len(kernel.scratch)):
            a = plan.allocations[f"{node.name}#scratch{j}"]
            scratch.append(Ref(ARENA, a.key, a.offset, (a.size,), "|u1"))
        steps.append(Step(node.op, node.name, node.attrs, [ref(n) if n else None for n in node.inputs],
                          [ref(o) for o in node.outputs if o], scratch, kernel.algorithm, placement[step],
                          params.get(step, {})))
    _check_outputs_written(graph, steps)
    const_names = sorted({r.key for s in steps for r in s.inputs if r is not None and r.space == CONST})
    programs: dict[Any, None] = {}  # ordered, unique
    for kernel in kernel_of.values():
        programs.update(dict.fromkeys(kernel.programs))
    return CompiledGraph(
        graph.name, graph.opset,
        [TensorInfo(n, graph.values[n].shape, dtypes.name(graph.values[n].dtype)) for n in graph.inputs],
        [TensorInfo(n, graph.values[n].shape, dtypes.name(graph.values[n].dtype)) for n in graph.outputs],
        steps, plan.size, plan.lower_bound, alignment, plan.strategy,
        [Interval(a.key, a.offset, a.size, a.first, a.last) for a in plan.allocations.values()],
        const_names, {n: v for n, v in graph.value_inputs.items() if n in inputs},
        {n: (axis, ref(extent)) for n, (extent, axis) in bounded.items() if n in outputs}, list(programs), tuning)


def _compile_bodies(graph: Graph, backend: Backend) -> list[str]:
    """Compile the IR bodies of control nodes into Body programs (their errors are returned, to be reported
    with the graph's), for the backend that runs the control node (its kernel runs the body: on OpenCL, If
    and Loop run in CPU partitions, their bodies on the cpu backend). The weights a body reads become inputs of
    its node, named in `captures`, so they are stored with the graph's and its kernels see them as constants."""
    errors = []
    for node in graph.nodes:
        for key, sub in list(node.attrs.items()):
            if not isinstance(sub, Graph):
                continue
            runs_it = _runner(backend, node.op)
            try:
                compiled = compile_graph(sub, runs_it)
            except UnsupportedOpError as e:
                errors.append(f"in {node.op} node {node.name!r} {key}: {e}")
                continue
            node.attrs[key] = Body(compiled.inputs, compiled.outputs, compiled.steps, compiled.spillfill_size,
                                   runs_it.alignment)
            for name in compiled.const_names:
                v = sub.values[name]
                graph.values.setdefault(name, Value(name, v.dtype, v.shape, v.const))
                if name not in node.attrs["captures"]:
                    node.attrs["captures"].append(name)
                    node.inputs.append(name)
    return errors


def _runner(backend: Backend, op: str) -> Backend:
    """The first backend of the fallback chain with a kernel for `op` (the one that will run the node)."""
    be: Backend | None = backend
    while be is not None:
        if op in be.kernels:
            return be
        be = be.fallback
    return backend  # none: the node's own error reports it


def _bounded(graph: Graph) -> dict[str, tuple[str, int]]:
    """Values whose size along one axis is an upper bound: name -> (the value holding the real size, axis)."""
    out: dict[str, tuple[str, int]] = {}
    for node in graph.nodes:
        for pos, axis in bounded_outputs(node).items():
            out[node.outputs[pos]] = (node.outputs[-1], axis)
        src = node.inputs[0] if node.inputs else ""
        if node.op in PASS_THROUGH and src in out:
            extent, axis = out[src]
            out[node.outputs[0]] = (extent, PASS_THROUGH[node.op](node.attrs, axis, len(graph.values[src].shape)))
    return out


def _check_outputs_written(graph: Graph, steps: list[Step]) -> None:
    written = {r.key for s in steps for r in s.outputs if r.space == OUTPUT}
    for name in graph.outputs:
        if name not in written and (graph.values[name].nbytes or graph.values[name].is_const):
            raise UnsupportedOpError(f"graph output {name!r} is a graph input or a constant; "
                                     "ctxrt needs it to be computed")
