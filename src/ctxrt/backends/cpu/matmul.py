"""matmul kernels."""

KERNELS: dict = {}
