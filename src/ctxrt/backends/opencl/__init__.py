"""The OpenCL backend (PyOpenCL): PoCL runs it on any CPU, any OpenCL GPU runs it for real.

- `device.py`   devices: discovery, limits, normalised names, the one clear error when there is none
- `memory.py`   buffers (one per arena, one for the weights; host-mappable shared buffers) and tensors
                addressed as (buffer, byte offset)
- `program.py`  `.cl` sources shipped in the package, programs built once per (source hash, options) and
                stored in context binaries
- `kernel.py`   the kernel contract: `ClKernel` and its tunable `Space` (docs/opencl.md)
- `backend.py`  `OpenCLBackend`, the Backend protocol over all of the above
- `elementwise.py`, `gemm.py`, ...: the kernels; `registry.py` merges their tables
"""
