"""shape kernels."""

KERNELS: dict = {}
