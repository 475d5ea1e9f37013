"""The public API: coopmat.matmul and linear, device arrays, quantized weights."""
