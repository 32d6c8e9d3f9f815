"""Point-wise ops of the NumPy backend beside elementwise.py: activations, Relu/Clip, logic and
comparisons, Where/Trilu/CumSum (docs/spatial-ops.md)."""
