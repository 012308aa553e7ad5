"""The Jupyter server extension and the per-kernel inventory it serves
(``GET tfgpu/api/status``).  Imports nothing of the kernel side."""
