"""The optional native kernels (csrc/, the extension ctxrt._native): built where a C compiler is there; where
it is not, or the build fails, ctxrt installs without them and runs its NumPy kernels instead. Everything
else about the package is in pyproject.toml."""

import sys

from setuptools import Extension, setup

# `omp simd` only (the loops' vectorization): the threads are ctxrt's own (csrc/pool.c), no OpenMP runtime linked
native = Extension("ctxrt._native", ["csrc/nbits.c", "csrc/genai.c", "csrc/gemv.c", "csrc/pool.c",
                                       "csrc/qelem.c", "csrc/strided.c", "csrc/dwconv.c"],
                   depends=["csrc/nbits.h", "csrc/nbits_kernel.h", "csrc/gqa.h", "csrc/gqa_kernel.h", "csrc/norms.h",
                            "csrc/norms_kernel.h", "csrc/gemv.h", "csrc/gemv_kernel.h", "csrc/pool.h",
                            "csrc/hsum.h", "csrc/qelem.h", "csrc/qelem_kernel.h", "csrc/act.h", "csrc/act_kernel.h",
                            "csrc/lstm.h", "csrc/lstm_kernel.h", "csrc/vmath.h", "csrc/strided.h",
                            "csrc/strided_kernel.h", "csrc/dwconv.h", "csrc/act_param.h"],
                   extra_compile_args=["-O3", "-std=c11", "-fopenmp-simd"],
                   libraries=[] if sys.platform == "win32" else ["m"], optional=True)
setup(ext_modules=[native])
