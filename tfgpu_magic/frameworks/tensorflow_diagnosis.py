"""Why TensorFlow found no GPU on a machine whose driver lists some, and the line that fixes it.

The commonest TensorFlow GPU question ("TensorFlow sees no GPU, nvidia-smi shows four") has
three usual answers, each told apart by facts that cannot change while the process lives:

- a CPU-only build (``tensorflow-cpu``, or any build whose ``tf.sysconfig.get_build_info()``
  says ``is_cuda_build: False``): no setting helps, only another install;
- a CUDA build newer than the driver: the CUDA major version TensorFlow was built for is above
  the one the driver supports (``nvmlSystemGetCudaDriverVersion``);
- a CUDA build without CUDA's libraries: ``pip install tensorflow`` on Linux is a CUDA build, but
  CUDA and cuDNN come only with ``tensorflow[and-cuda]`` (the ``nvidia-*-cu12`` packages) or a
  system install, and TensorFlow then quietly lists no GPU.

:func:`diagnose` is pure: the session gathers the facts once, after TensorFlow listed its
devices, and keeps the result (see :meth:`tfgpu_magic.kernel.session.Session.no_gpu_diagnosis`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["INSTALL", "NoGpuDiagnosis", "cuda_wheels", "diagnose"]

INSTALL = 'pip install "tensorflow[and-cuda]"'
# The CUDA and cuDNN pip packages `tensorflow[and-cuda]` installs; the two that, when missing,
# leave TensorFlow without a GPU ({major} is the CUDA major version TensorFlow was built for).
_KEY_WHEELS = ("nvidia-cuda-runtime-cu{major}", "nvidia-cudnn-cu{major}")


@dataclass(frozen=True)
class NoGpuDiagnosis:
    """What is known about one TensorFlow that found no GPU, and what it means."""

    driver_gpus: int  # how many GPUs CUDA was shown (the driver lists them, nothing hid them)
    cuda_build: bool | None  # get_build_info()["is_cuda_build"]; None: unreadable
    built_cuda: str | None  # the CUDA version TensorFlow was built for ("12.5.1")
    built_cudnn: str | None  # the cuDNN version it was built for ("9")
    driver_cuda: str | None  # the newest CUDA the driver supports ("12.8"); None: unknown
    distribution: str | None  # the pip distribution that installed it: tensorflow, tensorflow-cpu
    missing_wheels: tuple[str, ...]  # CUDA's pip packages TensorFlow needs and lacks

    @property
    def cause(self) -> str:
        """One of ``cpu_build``, ``driver_too_old``, ``cuda_libraries_missing``, ``unknown``."""
        if self.cuda_build is False:
            return "cpu_build"
        built, driver = _major(self.built_cuda), _major(self.driver_cuda)
        if self.cuda_build and built and driver and built > driver:
            return "driver_too_old"
        if self.cuda_build and self.missing_wheels:
            return "cuda_libraries_missing"
        return "unknown"

    @property
    def why(self) -> str:
        seen = (
            f"the driver lists {self.driver_gpus} GPU{'' if self.driver_gpus == 1 else 's'} for this kernel"
        )
        built = self._built_for()
        driver = (
            f"the driver supports CUDA {self.driver_cuda}"
            if self.driver_cuda
            else "the driver's CUDA version is unknown"
        )
        if self.cause == "cpu_build":
            which = f" ({self.distribution})" if self.distribution else ""
            return f"this TensorFlow{which} is a CPU-only build (tf.sysconfig.get_build_info(): is_cuda_build False); {seen}"
        if self.cause == "driver_too_old":
            return f"this TensorFlow is a CUDA build {built}, newer than the driver: {driver}; {seen}"
        if self.cause == "cuda_libraries_missing":
            return (
                f"this TensorFlow is a CUDA build {built}, but the CUDA libraries `tensorflow[and-cuda]` brings "
                f"are not installed ({', '.join(self.missing_wheels)} missing) and no other CUDA install was "
                f"usable; {driver}; {seen}"
            )
        if self.cuda_build is None:
            return f"TensorFlow's build information could not be read; {driver}; {seen}"
        return (
            f"this TensorFlow is a CUDA build {built} and {driver}, yet CUDA listed no GPU to it "
            f"(TensorFlow's own log lines at start-up say which library failed); {seen}"
        )

    @property
    def fix(self) -> str:
        """The line to run (then restart the kernel)."""
        if self.cause == "cpu_build" and self.distribution == "tensorflow-cpu":
            return f"pip uninstall -y tensorflow-cpu && {INSTALL}, then restart the kernel"
        if self.cause == "driver_too_old":
            return (
                f"install an NVIDIA driver that supports CUDA {_major_minor(self.built_cuda)} (see `nvidia-smi`), "
                f"or a TensorFlow built for CUDA {self.driver_cuda or 'your driver supports'}, then restart the kernel"
            )
        if self.cause == "unknown" and self.cuda_build:
            return (
                'pip install --force-reinstall "tensorflow[and-cuda]", then restart the kernel; '
                "`python -c \"import tensorflow as tf; print(tf.config.list_physical_devices('GPU'))\"` "
                "in a terminal prints TensorFlow's reasons"
            )
        return f"{INSTALL}, then restart the kernel"

    def line(self) -> str:
        return f"TensorFlow found no GPU: {self.why}. Fix: {self.fix}"

    def as_json(self) -> dict[str, Any]:
        return {
            "cause": self.cause,
            "why": self.why,
            "fix": self.fix,
            "driver_gpus": self.driver_gpus,
            "is_cuda_build": self.cuda_build,
            "built_for_cuda": self.built_cuda,
            "built_for_cudnn": self.built_cudnn,
            "driver_cuda": self.driver_cuda,
            "distribution": self.distribution,
            "missing_packages": list(self.missing_wheels),
        }

    def _built_for(self) -> str:
        parts = [
            f"CUDA {self.built_cuda}" if self.built_cuda else None,
            f"cuDNN {self.built_cudnn}" if self.built_cudnn else None,
        ]
        shown = " and ".join(p for p in parts if p)
        return f"(built for {shown})" if shown else "(its CUDA version unknown)"


def diagnose(
    *,
    driver_gpus: int,
    build_info: Mapping[str, Any] | None,
    driver_cuda: str | None,
    installed: Callable[[str], bool],
) -> NoGpuDiagnosis:
    """Put the facts together; ``installed(name)`` says whether a pip distribution is installed."""
    info = build_info or {}
    cuda_build = info.get("is_cuda_build") if build_info is not None else None
    built_cuda = _text(info.get("cuda_version"))
    distribution = next((d for d in ("tensorflow", "tensorflow-cpu") if installed(d)), None)
    return NoGpuDiagnosis(
        driver_gpus=driver_gpus,
        cuda_build=None if cuda_build is None else bool(cuda_build),
        built_cuda=built_cuda,
        built_cudnn=_text(info.get("cudnn_version")),
        driver_cuda=driver_cuda,
        distribution=distribution,
        missing_wheels=cuda_wheels(built_cuda, installed) if cuda_build else (),
    )


def cuda_wheels(built_cuda: str | None, installed: Callable[[str], bool]) -> tuple[str, ...]:
    """The CUDA pip packages a CUDA build needs and lacks (none known without its CUDA version)."""
    major = _major(built_cuda)
    if major is None:
        return ()
    return tuple(name for name in (w.format(major=major) for w in _KEY_WHEELS) if not installed(name))


def _text(value: Any) -> str | None:
    return None if value in (None, "") else str(value)[:40]


def _major(version: str | None) -> int | None:
    head = (version or "").split(".")[0]
    return int(head) if head.isdigit() and len(head) < 4 else None


def _major_minor(version: str | None) -> str:
    return ".".join((version or "?").split(".")[:2])
