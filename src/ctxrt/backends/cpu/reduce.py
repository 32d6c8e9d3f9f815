"""reduce kernels."""

KERNELS: dict = {}
