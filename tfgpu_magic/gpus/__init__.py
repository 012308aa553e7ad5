"""The machine's GPUs and who holds them: NVML (real or simulated), CUDA's numbering, process
owners, attribution of memory, and the claims kernels leave in a shared directory.  Nothing
here imports a framework, IPython or Jupyter."""
