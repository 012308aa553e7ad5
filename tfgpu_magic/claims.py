"""GPU claims from a script: a documented, stable entry point (tutorial 02 claims a GPU with it).

A claim says "this GPU is mine" to every other kernel and script that chooses with
``%gpu use auto``; it lasts while the claiming process lives.  The functions live in
:mod:`tfgpu_magic.gpus.claims`; these are the same objects, sharing the process's claims.
"""

from .gpus.claims import (
    ENV_DIR,
    ClaimError,
    Holder,
    claim,
    claim_dir,
    held,
    holder,
    holders,
    release,
    release_all,
)

__all__ = [
    "ENV_DIR",
    "ClaimError",
    "Holder",
    "claim",
    "claim_dir",
    "held",
    "holder",
    "holders",
    "release",
    "release_all",
]
