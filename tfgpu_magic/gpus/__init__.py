"""The machine's GPUs and who holds them: NVML (real or simulated), CUDA's numbering, process
owners, attribution of memory, and the claims kernels leave in a shared directory.  Nothing
here imports a framework, IPython or Jupyter."""

# Which simulated server a process reads instead of the driver (simulated.from_environment); here,
# so that a process without it never imports the simulated servers' module.
SIMULATED_SOURCE_ENV = "TFGPU_MAGIC_SIMULATED_SOURCE"
