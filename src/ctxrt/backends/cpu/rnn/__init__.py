"""Recurrent ops of the NumPy backend: LSTM, GRU and RNN cells, their activations, the native and oneDNN
fused kernels (docs/operators-sequence.md, docs/cpu.md)."""
