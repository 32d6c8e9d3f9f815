"""Every subcommand and option of `ctxrt` given hostile values: wrong types, out-of-range numbers, missing,
unreadable, wrong-kind and directory paths. Each case must fail with exactly one line on stderr that names
what the user gave, exit status 2, no traceback, and no file written or left behind (issue 13).

`test_every_option_has_a_hostile_case` keeps the table complete: an option added to the parser without a
case here fails it.
"""

from __future__ import annotations

import pytest
from cli_helpers import assert_one_line_error, cli, listing

from ctxrt.cli import build_parser

# (target: "SUBCOMMAND OPTION" or "SUBCOMMAND POSITIONAL", argv, substrings the error line must contain)
CASES: list[tuple[str, list[str], list[str]]] = [
    # -- the cases of issue 13 -----------------------------------------------------------------------
    ("run --inputs", ["run", "m.ctx", "--inputs", "plain.npy"], ["--inputs plain.npy", ".npy", ".npz"]),
    ("compile -o", ["compile", "m.onnx", "-o", "dir.ctx"], ["-o dir.ctx", "is a directory"]),
    ("compile -o", ["compile", "m.onnx", "-o", "adir"], ["-o adir", ".ctx"]),
    ("compile -o", ["compile", "m.onnx", "-o", "nodir/x.ctx"], ["-o nodir/x.ctx", "nodir", "does not exist"]),
    ("run --inputs", ["run", "m.ctx", "--inputs", "m.ctx"], ["--inputs m.ctx", "context binary", ".npz"]),
    ("run --shape", ["run", "m.onnx", "--shape", "x=99999999999999x8"], ["x", "99999999999999x8", "limit"]),
    ("compile --shape", ["compile", "m.onnx", "-o", "o.ctx", "--shape", "x=99999999999999x8"],
     ["99999999999999x8", "limit"]),
    ("inspect FILE", ["inspect", "m.onnx"], ["m.onnx", "compile it first"]),
    ("run --shape", ["run", "m.ctx", "--shape", "x=4x8"], ["--shape x=4x8", "m.ctx", "fixed shapes"]),
    ("run --shape", ["run", "m_ctx.onnx", "--shape", "x=4x8"], ["--shape x=4x8", "m_ctx.onnx", "fixed shapes"]),
    ("run --repeat", ["run", "m.ctx", "--repeat", "0"], ["--repeat", "'0'", ">= 1"]),
    ("run --repeat", ["run", "m.ctx", "--repeat", "-3"], ["--repeat", "'-3'", ">= 1"]),
    ("compile --split", ["compile", "m.onnx", "--split", "0", "-o", "sdir"], ["--split", "'0'", ">= 1"]),
    ("compile --embed", ["compile", "m.onnx", "-o", "o.ctx", "--embed"], ["--embed", "--epcontext"]),
    ("inspect --memory", ["inspect", "w_flipped.ctx", "--memory"], ["w_flipped.ctx", "checksum"]),
    # -- compile -------------------------------------------------------------------------------------
    ("compile MODEL", ["compile", "nothere.onnx", "-o", "o.ctx"], ["nothere.onnx", "no such file"]),
    ("compile MODEL", ["compile", "adir", "-o", "o.ctx"], ["adir", "directory"]),
    ("compile MODEL", ["compile", "m.ctx", "-o", "o.ctx"], ["m.ctx", "already compiled"]),
    ("compile MODEL", ["compile", "m_ctx.onnx", "-o", "o.ctx"], ["m_ctx.onnx", "EPContext", "already compiled"]),
    ("compile MODEL", ["compile", "plain.npy", "-o", "o.ctx"], ["plain.npy", "NumPy"]),
    ("compile MODEL", ["compile", "garbage.onnx", "-o", "o.ctx"], ["garbage.onnx"]),
    ("compile MODEL", ["compile", "empty.onnx", "-o", "o.ctx"], ["empty.onnx", "empty file"]),
    ("compile MODEL", ["compile", "notes.txt", "-o", "o.ctx"], ["notes.txt", ".onnx"]),
    ("compile MODEL", ["compile", "m.onnx/x.onnx", "-o", "o.ctx"], ["m.onnx/x.onnx"]),
    ("compile MODEL", ["compile", "unreadable.onnx", "-o", "o.ctx"], ["unreadable.onnx", "Permission denied"]),
    ("compile MODEL", ["compile", "fifo.ctx", "-o", "o.ctx"], ["fifo.ctx", "not a regular file"]),
    ("compile -o", ["compile", "m.onnx"], ["-o"]),
    ("compile -o", ["compile", "m.onnx", "-o", "m.onnx"], ["-o m.onnx", ".ctx"]),
    ("compile -o", ["compile", "m.onnx", "-o", "fifo.ctx"], ["-o fifo.ctx", "not a regular file"]),
    ("compile -o", ["compile", "m.onnx", "-o", "m.onnx/x.ctx"], ["-o m.onnx/x.ctx", "not a folder"]),
    ("compile -o", ["compile", "m.onnx", "--split", "2", "-o", "m.ctx"], ["-o m.ctx", "must be a directory"]),
    ("compile -o", ["compile", "m.onnx", "--split", "2", "-o", "nodir/parts"], ["-o nodir/parts", "does not exist"]),
    ("compile --backend", ["compile", "m.onnx", "-o", "o.ctx", "--backend", "nope"], ["'nope'"]),
    ("compile --backend", ["compile", "m.onnx", "-o", "o.ctx", "--backend", ""], ["''"]),
    ("compile --io-mem-type", ["compile", "m.onnx", "-o", "o.ctx", "--io-mem-type", "shared"],
     ["--io-mem-type", "'shared'"]),
    ("compile --shape", ["compile", "m.onnx", "-o", "o.ctx", "--shape", "x=banana"], ["--shape", "x=banana"]),
    ("compile --shape", ["compile", "m.onnx", "-o", "o.ctx", "--shape", "=1x8"], ["--shape", "=1x8"]),
    ("compile --shape", ["compile", "m.onnx", "-o", "o.ctx", "--shape", "x="], ["--shape", "x="]),
    ("compile --shape", ["compile", "m.onnx", "-o", "o.ctx", "--shape", "x=-1x8"], ["--shape x=-1x8", ">= 0"]),
    ("compile --shape", ["compile", "m.onnx", "-o", "o.ctx", "--shape", "x=2x-8"], ["--shape x=2x-8", ">= 0"]),
    ("compile --shape", ["compile", "m.onnx", "-o", "o.ctx", "--shape", "zz=1x8"], ["zz", "unknown"]),
    ("compile --shape", ["compile", "m.onnx", "-o", "o.ctx", "--shape", "x=1x8x3"], ["x", "rank"]),
    ("compile --shape", ["compile", "m.onnx", "-o", "o.ctx", "--shape", "x=1x9"], ["x", "9"]),
    ("compile --shape", ["compile", "m.onnx", "-o", "o.ctx", "--shape", "5:x=1x8"], ["--shape 5:x=1x8", "1 model"]),
    ("compile --shape", ["compile", "m.onnx", "-o", "o.ctx", "--shape", "x=1x8", "--shape", "x=2x8"],
     ["--shape x=2x8", "1x8"]),
    ("compile --value", ["compile", "m.onnx", "-o", "o.ctx", "--value", "x=banana"], ["--value", "x=banana"]),
    ("compile --value", ["compile", "m.onnx", "-o", "o.ctx", "--value", "zz=1"], ["zz", "unknown"]),
    ("compile --value", ["compile", "m.onnx", "-o", "o.ctx", "--value", "5:x=1"], ["--value 5:x=1", "1 model"]),
    ("compile --value", ["compile", "m.onnx", "-o", "o.ctx", "--value", "x=1", "--value", "x=2"],
     ["--value x=2", "[1]"]),
    ("compile --value", ["compile", "m.onnx", "-o", "o.ctx", "--value", "x=0.5"], ["x", "elements"]),
    ("inspect --at", ["inspect", "m.ctx", "--memory", "--at", "N"], ["--at", "NAME=N"]),
    ("inspect --at", ["inspect", "m.ctx", "--memory", "--at", "N=-1"], ["--at", "NAME=N"]),
    ("inspect --at", ["inspect", "m.ctx", "--memory", "--at", "N=4"], ["--at", "fixed shapes"]),
    ("compile --dim", ["compile", "m.onnx", "-o", "o.ctx", "--dim", "N=8:1"], ["--dim", "N=8:1", "MIN <= MAX"]),
    ("compile --dim", ["compile", "m.onnx", "-o", "o.ctx", "--dim", "N=1-8"], ["--dim", "NAME=MIN:MAX"]),
    ("compile --dim", ["compile", "m.onnx", "-o", "o.ctx", "--dim", "N=1:x"], ["--dim", "N=1:x"]),
    ("compile --dim", ["compile", "m.onnx", "-o", "o.ctx", "--dim", "zz=1:8"], ["'zz'", "not dims"]),
    ("compile --dim", ["compile", "m.onnx", "-o", "o.ctx", "--dim", "N=4:4"], ["'N'", "one value"]),
    ("compile --dim", ["compile", "m.onnx", "-o", "o.ctx", "--dim", "N=1:8", "--dim", "N=1:4"],
     ["--dim N=1:4", "1:8"]),
    ("compile --dim", ["compile", "m.onnx", "-o", "o.ctx", "--dim", "x:5=1:8"], ["x:5", "axis"]),
    ("compile --dim", ["compile", "m.onnx", "-o", "o.ctx", "--dim", "N=1:99999999999999"], ["limit"]),
    ("compile --split", ["compile", "m.onnx", "--split", "abc", "-o", "sdir"], ["--split", "'abc'"]),
    ("compile --split", ["compile", "m.onnx", "--split", "-2", "-o", "sdir"], ["--split", "'-2'"]),
    ("compile --split", ["compile", "m.onnx", "--split", "1.5", "-o", "sdir"], ["--split", "'1.5'"]),
    ("compile --split", ["compile", "m.onnx", "--split", "100000", "-o", "sdir"], ["100000 parts"]),
    ("compile --split", ["compile", "m.onnx", "m.onnx", "--split", "2", "-o", "sdir"], ["--split", "one model"]),
    ("compile --config", ["compile", "m.onnx", "-o", "o.ctx", "--config", "nothere.json"], ["--config"]),
    ("compile --config", ["compile", "m.onnx", "-o", "o.ctx", "--config", "adir"], ["--config adir", "directory"]),
    ("compile --config", ["compile", "m.onnx", "-o", "o.ctx", "--config", "unreadable.ctx"],
     ["--config unreadable.ctx", "Permission denied"]),
    ("compile --config", ["compile", "m.onnx", "-o", "o.ctx", "--config", "tune_bad.json"],
     ["--config tune_bad.json", "not valid JSON", "line 1"]),
    ("compile --config", ["compile", "m.onnx", "-o", "o.ctx", "--config", "plain.npy"], ["--config plain.npy"]),
    ("compile --config", ["compile", "m.onnx", "-o", "o.ctx", "--config", "tune_unknown.json"],
     ["--config tune_unknown.json", "unknown key 'cache_dir'"]),
    ("compile --config", ["compile", "m.onnx", "-o", "o.ctx", "--config", "tune_nomode.json"],
     ["performance_cache_dir needs", "tuning_mode"]),
    ("compile --config", ["compile", "m.onnx", "-o", "o.ctx", "--config", "tune_types.json"],
     ["tuning_mode must be true or false", "tuning_budget_candidates must be"]),
    ("compile --config", ["compile", "m.onnx", "-o", "o.ctx", "--config", "tune.json"],
     ["--config tune.json", "OpenCL", "--backend opencl"]),
    ("compile --config", ["compile", "m.onnx", "-o", "o.ctx", "--config", "tune.json", "--backend", "opencl:99"],
     ["OpenCL"]),
    ("compile --epcontext", ["compile", "m.onnx", "-o", "o.ctx", "--epcontext=yes"], ["--epcontext", "yes"]),
    ("compile --epcontext", ["compile", "m.onnx", "-o", "adir", "--epcontext"], ["-o adir"]),
    ("compile --epcontext", ["compile", "q_ctx.onnx", "-o", "q.ctx", "--epcontext"], ["q_ctx.onnx", "overwrite"]),
    ("compile --shape", ["compile", "a.onnx", "b.onnx", "-o", "o.ctx", "--shape", "x=1x9"], ["a.onnx", "9"]),
    ("compile --quiet", ["compile", "m.onnx", "-o", "o.ctx", "--quiet=1"], ["--quiet", "1"]),
    ("compile --prefer", ["compile", "m.onnx", "-o", "o.ctx", "--prefer", "fast"], ["--prefer", "'fast'"]),
    ("compile --prefer", ["compile", "m.onnx", "-o", "o.ctx", "--prefer"], ["--prefer"]),
    # -- inspect -------------------------------------------------------------------------------------
    ("inspect FILE", ["inspect"], ["FILE"]),
    ("inspect FILE", ["inspect", "nothere.ctx"], ["nothere.ctx", "no such file"]),
    ("inspect FILE", ["inspect", "adir"], ["adir", "directory"]),
    ("inspect FILE", ["inspect", "garbage.ctx"], ["garbage.ctx", "not a ctxrt context binary"]),
    ("inspect FILE", ["inspect", "garbage.onnx"], ["garbage.onnx"]),
    ("inspect FILE", ["inspect", "truncated.ctx"], ["truncated.ctx"]),
    ("inspect FILE", ["inspect", "plain.npy"], ["plain.npy", "NumPy"]),
    ("inspect FILE", ["inspect", "in.npz"], ["in.npz", "NumPy"]),
    ("inspect FILE", ["inspect", "unreadable.ctx"], ["unreadable.ctx", "Permission denied"]),
    ("inspect --memory", ["inspect", "truncated.ctx", "--memory"], ["truncated.ctx"]),
    ("inspect --plot", ["inspect", "m.ctx", "--plot", "dir.png"], ["--plot dir.png", "directory"]),
    ("inspect --plot", ["inspect", "m.ctx", "--plot", "nodir/a.png"], ["--plot nodir/a.png", "does not exist"]),
    ("inspect --plot", ["inspect", "m.ctx", "--plot", "arena.svg"], ["--plot arena.svg", ".png"]),
    ("inspect --plot", ["inspect", "w_flipped.ctx", "--plot", "a.png"], ["w_flipped.ctx", "checksum"]),
    ("inspect --plot", ["inspect", "binary.png", "--plot", "binary.png"], ["--plot binary.png", "overwrite"]),
    ("inspect --json", ["inspect", "m.ctx", "--json=1"], ["--json", "1"]),
    ("inspect --kernels", ["inspect", "m.ctx", "--kernels=1"], ["--kernels", "1"]),
    ("inspect --kernels", ["inspect", "w_flipped.ctx", "--kernels"], ["w_flipped.ctx", "checksum"]),
    ("inspect --tuning", ["inspect", "m.ctx", "--tuning=1"], ["--tuning", "1"]),
    ("inspect --tuning", ["inspect", "truncated.ctx", "--tuning"], ["truncated.ctx"]),
    # -- tune-report ---------------------------------------------------------------------------------
    ("tune-report FILE", ["tune-report"], ["FILE"]),
    ("tune-report FILE", ["tune-report", "nothere.ctx"], ["nothere.ctx", "no such file"]),
    ("tune-report FILE", ["tune-report", "adir"], ["adir", "directory"]),
    ("tune-report FILE", ["tune-report", "garbage.ctx"], ["garbage.ctx", "not a ctxrt context binary"]),
    ("tune-report FILE", ["tune-report", "truncated.ctx"], ["truncated.ctx"]),
    ("tune-report FILE", ["tune-report", "m.onnx"], ["m.onnx", "compile it first"]),
    ("tune-report FILE", ["tune-report", "unreadable.ctx"], ["unreadable.ctx", "Permission denied"]),
    ("tune-report --plot", ["tune-report", "m.ctx", "--plot", "dir.png"], ["--plot dir.png", "directory"]),
    ("tune-report --plot", ["tune-report", "m.ctx", "--plot", "arena.svg"], ["--plot arena.svg", ".png"]),
    ("tune-report --plot", ["tune-report", "m.ctx", "--plot", "nodir/t.png"], ["--plot nodir/t.png", "does not"]),
    ("tune-report --plot", ["tune-report", "m.ctx", "--plot", "t.png"], ["m.ctx", "was not tuned"]),
    ("tune-report --plot", ["tune-report", "binary.png", "--plot", "binary.png"], ["--plot binary.png", "overwrite"]),
    ("tune-report --json", ["tune-report", "m.ctx", "--json=yes"], ["--json", "yes"]),
    # -- serve (every case fails before the server listens) ------------------------------------------
    ("serve --host", ["serve", "--host", "not a host!", "--port", "22598"], ["cannot listen on not a host!:22598"]),
    ("serve --host", ["serve", "--host", "256.1.1.1"], ["cannot listen on 256.1.1.1"]),
    ("serve --port", ["serve", "--port", "abc"], ["--port", "'abc'", "1..65535"]),
    ("serve --port", ["serve", "--port", "70000"], ["--port", "'70000'"]),
    ("serve --port", ["serve", "--port", "0"], ["--port", "'0'"]),
    ("serve --port", ["serve", "--port", "-5"], ["--port", "'-5'"]),
    ("serve --token", ["serve", "--token", ""], ["--token", "empty"]),
    ("serve --token", ["serve", "--token", "   "], ["--token", "empty"]),
    ("serve --token", ["serve", "--token"], ["--token"]),
    ("serve --job-timeout", ["serve", "--job-timeout", "0"], ["--job-timeout", "'0'", "> 0"]),
    ("serve --job-memory", ["serve", "--job-memory", "-1"], ["--job-memory", "'-1'"]),
    ("serve --job-memory", ["serve", "--job-memory", "lots"], ["--job-memory", "'lots'"]),
    ("serve --job-timeout", ["serve", "--job-timeout", "soon"], ["--job-timeout", "'soon'"]),
    ("serve --job-timeout", ["serve", "--job-timeout", "nan"], ["--job-timeout", "'nan'"]),
    # -- run -----------------------------------------------------------------------------------------
    ("run MODEL", ["run"], ["MODEL"]),
    ("run MODEL", ["run", "nothere.onnx"], ["nothere.onnx", "no such file"]),
    ("run MODEL", ["run", "adir"], ["adir", "directory"]),
    ("run MODEL", ["run", "plain.npy"], ["plain.npy", "NumPy"]),
    ("run MODEL", ["run", "notes.txt"], ["notes.txt"]),
    ("run MODEL", ["run", "garbage.ctx"], ["garbage.ctx", "not a ctxrt context binary"]),
    ("run MODEL", ["run", "truncated.ctx"], ["truncated.ctx"]),
    ("run MODEL", ["run", "garbage.onnx"], ["garbage.onnx"]),
    ("run MODEL", ["run", "w_flipped.ctx"], ["w_flipped.ctx", "checksum"]),
    ("run MODEL", ["run", "unreadable.ctx"], ["unreadable.ctx", "Permission denied"]),
    ("run MODEL", ["run", "m.ctx", "unreadable.onnx"], ["unreadable.onnx", "Permission denied"]),
    ("run MODEL", ["run", "m.ctx", "split/m_ctx.onnx"], ["split/m_ctx.onnx", "run it alone"]),
    ("run --inputs", ["run", "m.ctx", "--inputs", "nothere.npz"], ["--inputs nothere.npz", "no such file"]),
    ("run --inputs", ["run", "m.ctx", "--inputs", "dir.npz"], ["--inputs dir.npz", "directory"]),
    ("run --inputs", ["run", "m.ctx", "--inputs", "notes.txt"], ["--inputs notes.txt", ".npz"]),
    ("run --inputs", ["run", "m.ctx", "--inputs", "in_names.npz"], ["--inputs in_names.npz", "'z'", "x"]),
    ("run --inputs", ["run", "m.ctx", "--inputs", "in_dtype.npz"], ["--inputs in_dtype.npz", "float64", "float32"]),
    ("run --inputs", ["run", "m.ctx", "--inputs", "in_shape.npz"], ["--inputs in_shape.npz", "[2, 8]", "[1, 8]"]),
    ("run --inputs", ["run", "m.ctx", "--inputs", "in_object.npz"], ["--inputs in_object.npz"]),
    ("run --inputs", ["run", "m.ctx", "--inputs", "unreadable.npz"], ["--inputs unreadable.npz", "Permission"]),
    ("run --inputs", ["run", "m.ctx", "m.ctx", "--inputs", "in.npz"], ["--inputs", "single model"]),
    ("run --inputs", ["run", "split/m_ctx.onnx", "--inputs", "in_dtype.npz"], ["--inputs in_dtype.npz"]),
    ("run --output", ["run", "m.ctx", "--output", "dir.npz"], ["--output dir.npz", "directory"]),
    ("run --output", ["run", "m.ctx", "--output", "nodir/o.npz"], ["--output nodir/o.npz", "does not exist"]),
    ("run --output", ["run", "m.ctx", "--output", "out.npy"], ["--output out.npy", ".npz"]),
    ("run --output", ["run", "m.ctx", "--output", "m.onnx/o.npz"], ["--output m.onnx/o.npz", "not a folder"]),
    ("run --output", ["run", "m.ctx", "--inputs", "in.npz", "--output", "in.npz"], ["--output in.npz", "overwrite"]),
    ("run --repeat", ["run", "m.ctx", "--repeat", "abc"], ["--repeat", "'abc'"]),
    ("run --repeat", ["run", "m.ctx", "--repeat", "2.5"], ["--repeat", "'2.5'"]),
    ("run --shape", ["run", "m.onnx", "--shape", "x=banana"], ["--shape", "x=banana"]),
    ("run --shape", ["run", "m.onnx", "--shape", "zz=1x8"], ["zz", "unknown"]),
    ("run --shape", ["run", "m.onnx", "--shape", "1:x=1x8"], ["--shape 1:x=1x8", "1 model"]),
    ("run --shape", ["run", "m.onnx", "m.ctx", "--shape", "1:x=2x8"], ["--shape 1:x=2x8", "m.ctx", "fixed"]),
    ("run --backend", ["run", "m.ctx", "--backend", "nope"], ["'nope'"]),
    ("run --backend", ["run", "m.ctx", "--backend", "cpu:1"], ["'cpu:1'"]),
    ("run --backend", ["run", "m.ctx", "--backend", "opencl:x"], ["opencl:x", "index"]),
    ("run --backend", ["run", "m.ctx", "--backend", "opencl:99"], ["OpenCL"]),  # no such device (or none at all)
    ("run --graph", ["run", "m.ctx", "--graph", "nope"], ["m.ctx", "'nope'"]),
    ("run --graph", ["run", "ab_ctx.onnx", "--graph", "nope"], ["ab_ctx.onnx", "'nope'"]),
    ("run --graph", ["run", "split/m_ctx.onnx", "--graph", "part1"], ["split/m_ctx.onnx", "'part1'", "whole"]),
    ("run --graph", ["run", "m.ctx", "m.ctx", "--graph", "m"], ["--graph", "single model"]),
    ("run --share-spillfill", ["run", "m.ctx", "--share-spillfill=1"], ["--share-spillfill", "1"]),
    ("run --json", ["run", "m.ctx", "--json=yes"], ["--json", "yes"]),
    ("run --quiet", ["run", "m.ctx", "--quiet=1"], ["--quiet", "1"]),
    ("run --threads", ["run", "m.ctx", "--threads", "-1"], ["--threads", "'-1'", ">= 0"]),
    ("run --threads", ["run", "m.ctx", "--threads", "two"], ["--threads", "'two'"]),
    ("run --threads", ["run", "m.ctx", "--threads", "1.5"], ["--threads", "'1.5'"]),
    # -- generate (a relu model is no decoder; each argument is checked before that is found) -----------
    ("generate MODEL", ["generate", "nothere.onnx", "--prompt-ids", "1"], ["nothere.onnx", "no such file"]),
    ("generate MODEL", ["generate", "fifo.ctx", "--prompt-ids", "1"], ["fifo.ctx", "not a regular file"]),
    ("generate MODEL", ["generate", "plain.npy", "--prompt-ids", "1"], ["plain.npy", "NumPy"]),
    ("generate MODEL", ["generate", "unreadable.onnx", "--prompt-ids", "1"], ["unreadable.onnx", "Permission"]),
    ("generate MODEL", ["generate", "adir", "--prompt-ids", "1"], ["adir", "no genai_config.json"]),
    ("generate MODEL", ["generate", "m.onnx", "--prompt-ids", "1"], ["m.onnx", "not a decoder", "input_ids"]),
    ("generate MODEL", ["generate", "m.ctx", "--prompt-ids", "1"], ["m.ctx", "not a decoder"]),
    ("generate --prompt-ids", ["generate", "m.onnx"], ["at least one prompt"]),
    ("generate --prompt-ids", ["generate", "m.onnx", "--prompt-ids", "1,,2"], ["--prompt-ids", "'1,,2'"]),
    ("generate --prompt-ids", ["generate", "m.onnx", "--prompt-ids", "-1"], ["--prompt-ids", ">= 0"]),
    ("generate --prompt", ["generate", "m.onnx", "--prompt", ""], ["--prompt", "empty"]),
    ("generate --prompt", ["generate", "m.onnx", "--prompt", "a", "--prompt-ids", "1"], ["not both"]),
    ("generate --max-new-tokens", ["generate", "m.onnx", "--prompt-ids", "1", "--max-new-tokens", "0"],
     ["--max-new-tokens", "'0'", ">= 1"]),
    ("generate --temperature", ["generate", "m.onnx", "--prompt-ids", "1", "--temperature", "nan"],
     ["--temperature", "'nan'"]),
    ("generate --temperature", ["generate", "m.onnx", "--prompt-ids", "1", "--temperature", "-0.5"],
     ["--temperature", "'-0.5'"]),
    ("generate --top-k", ["generate", "m.onnx", "--prompt-ids", "1", "--top-k", "-1"], ["--top-k", "'-1'"]),
    ("generate --top-p", ["generate", "m.onnx", "--prompt-ids", "1", "--top-p", "1.5"], ["--top-p", "'1.5'"]),
    ("generate --seed", ["generate", "m.onnx", "--prompt-ids", "1", "--seed", "x"], ["--seed", "'x'"]),
    ("generate --stop-id", ["generate", "m.onnx", "--prompt-ids", "1", "--stop-id", "eos"], ["--stop-id", "'eos'"]),
    ("generate --ignore-eos", ["generate", "m.onnx", "--prompt-ids", "1", "--ignore-eos=1"], ["--ignore-eos"]),
    ("generate --context-length", ["generate", "m.onnx", "--prompt-ids", "1", "--context-length", "0"],
     ["--context-length", "'0'"]),
    ("generate --backend", ["generate", "m.onnx", "--prompt-ids", "1", "--backend", "nope"], ["'nope'"]),
    ("generate --threads", ["generate", "m.onnx", "--prompt-ids", "1", "--threads", "-1"], ["--threads", "'-1'"]),
    ("generate --json", ["generate", "m.onnx", "--prompt-ids", "1", "--json=1"], ["--json", "1"]),
    # -- devices -------------------------------------------------------------------------------------
    ("devices --json", ["devices", "--json=1"], ["--json", "1"]),
    ("devices --json", ["devices", "gpu"], ["gpu"]),
    # -- the command itself --------------------------------------------------------------------------
    ("ctxrt COMMAND", [], ["command"]),
    ("ctxrt COMMAND", ["frobnicate"], ["'frobnicate'"]),
    ("ctxrt --version", ["--version=2"], ["--version", "2"]),
    ("ctxrt COMMAND", ["run", "m.ctx", "--frob"], ["--frob"]),
    ("ctxrt COMMAND", ["compile", "m.onnx", "-o", "o.ctx", "--frob=1"], ["--frob=1"]),
]


@pytest.mark.parametrize("target, argv, needles", CASES, ids=[" ".join(a) or "(none)" for _, a, _ in CASES])
def test_hostile_argument_is_one_line_exit_2_and_writes_nothing(capsys, in_workspace, target, argv,
                                                                 needles) -> None:
    before = listing(in_workspace)
    assert_one_line_error(*cli(capsys, *argv), *needles)
    assert listing(in_workspace) == before


def _options() -> set[str]:
    """Every "SUBCOMMAND OPTION" and "SUBCOMMAND POSITIONAL" the parser declares (help excepted)."""
    parser = build_parser()
    found = {f"ctxrt {max(a.option_strings, key=len)}" for a in parser._actions
             if a.option_strings and a.dest != "help"}
    found.add("ctxrt COMMAND")
    (sub,) = [a for a in parser._actions if a.choices and a.dest == "command"]
    for name, p in sub.choices.items():
        for a in p._actions:
            if a.dest == "help":
                continue
            label = max(a.option_strings, key=len) if a.option_strings else (a.metavar or a.dest).split(".")[0]
            found.add(f"{name} {label.split('|')[0]}")
    return found


def test_every_option_has_a_hostile_case() -> None:
    covered = {target.replace(" -o", " --output") for target, _, _ in CASES}
    missing = _options() - covered
    assert not missing, f"options without a hostile case in tests/cli/test_cli_hostile.py: {sorted(missing)}"
