"""Convolutions of the NumPy backend: 1-D planar convs, N-D convs, ConvTranspose, depthwise and Winograd
(docs/cpu.md, docs/spatial-ops.md)."""
