"""conv kernels."""

KERNELS: dict = {}
