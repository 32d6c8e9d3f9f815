"""Spatial ops of the NumPy backend: pools at ranks 1-3, MaxUnpool, Resize, Col2Im, GridSample and windows,
boxes (docs/spatial-ops.md)."""
