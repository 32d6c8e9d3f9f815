"""norm kernels."""

KERNELS: dict = {}
