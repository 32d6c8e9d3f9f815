"""What the target server lets reach its OpenCL compiler and its kernels (docs/protocol.md, "Containment").

A `compile` request's source may use the preprocessor only to define and test macros and to enable OpenCL
extensions: no `#include` (nor its spellings through digraphs, trigraphs, line splices or comments), no
`__has_include`, no pragma but `OPENCL` and `unroll`; its options only `-D` macros of plain tokens and the
`-cl-*` switches. A file of the server's machine can then never reach the compiler, so no build log can quote one.
`profile` and `execute` specs are checked against ONNX's shape inference (frontend/node_check.py) before a kernel
is built for them.
"""

from __future__ import annotations

import re

from ctxrt.backends.kernel import NodeSpec
from ctxrt.errors import CtxrtError
from ctxrt.tuning.protocol import ProtocolError

DIRECTIVES = {"", "define", "undef", "if", "ifdef", "ifndef", "elif", "else", "endif", "pragma", "error", "warning"}
PRAGMAS = {"OPENCL", "unroll"}
_OPTION = re.compile(r"-D[A-Za-z_]\w*(=[\w.+\-]*)?|-cl-[a-z0-9-]+(=[A-Za-z0-9.]+)?|-w|-Werror")
_TRIGRAPH = re.compile(r"\?\?[=/'()!<>\-]")
_COMMENT_OR_STRING = re.compile(r'//[^\n]*|/\*.*?(\*/|\Z)|"(\\.|[^"\\\n])*"?|\'(\\.|[^\'\\\n])*\'?', re.DOTALL)
_DIRECTIVE = re.compile(r"^[ \t\f\v]*(#|%:)[ \t\f\v]*(\w*)[ \t\f\v]*(\w*)", re.MULTILINE)
_FORBIDDEN = re.compile(r"\b(__has_include|__has_include_next|__has_embed|__pragma)\b")
_PRAGMA_OP = re.compile(r"\b_Pragma\b(\s*\(\s*\"(\w*))?")


def check_options(options: str) -> None:
    """Refuse build options other than `-DNAME[=VALUE]` and `-cl-*` switches (no -I, -include, -x, -Xclang...)."""
    for token in options.split():
        if not _OPTION.fullmatch(token):
            raise ProtocolError("bad_request", f"compile options: {token[:60]!r} is not allowed (only -DNAME=VALUE "
                                               "of plain tokens and -cl-* switches)")


def check_source(source: str) -> None:
    """Refuse a source whose preprocessing could read anything but itself."""
    if "\0" in source:
        raise ProtocolError("bad_request", "compile source: a NUL character")
    if _TRIGRAPH.search(source):
        raise ProtocolError("bad_request", "compile source: trigraphs are not allowed")
    spliced = re.sub(r"\\[ \t]*\r?\n", "", source)  # line splices first, as the preprocessor does
    code = _COMMENT_OR_STRING.sub(lambda m: " " if m.group(0)[0] == "/" else '""', spliced)
    for m in _PRAGMA_OP.finditer(_COMMENT_OR_STRING.sub(lambda m: " " if m.group(0)[0] == "/" else m.group(0),
                                                        spliced)):
        if m.group(2) not in PRAGMAS:
            raise ProtocolError("bad_request", "compile source: _Pragma is allowed only as _Pragma(\"unroll\") or "
                                               "_Pragma(\"OPENCL ...\")")
    for m in _DIRECTIVE.finditer(code):
        name, arg = m.group(2), m.group(3)
        if name not in DIRECTIVES:
            raise ProtocolError("bad_request", f"compile source: #{name[:40]} is not allowed (no #include: a "
                                               "source must stand alone)")
        if name == "pragma" and arg not in PRAGMAS:
            raise ProtocolError("bad_request", f"compile source: #pragma {arg[:40]} is not allowed")
    bad = _FORBIDDEN.search(code)
    if bad:
        raise ProtocolError("bad_request", f"compile source: {bad.group(1)} is not allowed")


def check_spec(spec: NodeSpec) -> None:
    """A profile or execute spec whose declared outputs are not what its op computes is a bad request."""
    from ctxrt.frontend.node_check import check_node

    try:
        check_node(spec)
    except CtxrtError as e:
        raise ProtocolError("bad_request", str(e)) from None
