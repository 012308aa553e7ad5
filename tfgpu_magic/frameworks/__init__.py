"""The framework adapters: the only code that touches TensorFlow (PyTorch, JAX).  An adapter
never imports its framework: it is handed the module once the user's import has finished."""
