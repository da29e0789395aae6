"""The CUDA emitter (``--target cuda``): the shared passes' fused kernels written as CUDA C++ kernels,
launched by a C API that takes device pointers and a stream. See docs/cuda.md."""
