"""CPU-only tuning: OpenBLAS for float32 matmuls, and fused decode-step kernels.
"""
