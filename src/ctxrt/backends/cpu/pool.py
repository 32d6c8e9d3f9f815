"""pool kernels."""

KERNELS: dict = {}
