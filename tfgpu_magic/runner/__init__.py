"""Running a notebook headless with its saved GPU settings: ``tfgpu run`` and papermill's ``tfgpu`` engine.

The runner reads the notebook's ``tfgpu`` metadata key (:mod:`tfgpu_magic.command.saved`),
waits for and claims GPUs that meet its requirements in its own process, starts the kernel with
the settings in its environment (where :mod:`tfgpu_magic.kernel.notebook_settings` applies them
as the extension loads, before the first cell), and writes what the run observed into the output
notebook.  Nothing in the package imports this layer: ``tfgpu_magic.__main__`` dispatches
``tfgpu run`` to it, and papermill finds the engine by its entry point.
"""
