"""Exceptions raised by mrkit.

Every backend (the real CUDA driver and the simulator) raises the same classes, so code and
tests written against one behave identically on the other.
"""
from __future__ import annotations

__all__ = [
    "MrkitError",
    "CUDAError",
    "CUDAUnavailableError",
    "OutOfMemoryError",
    "StreamOrderViolation",
    "SimulatorFallbackWarning",
]


class MrkitError(Exception):
    """Base class of mrkit's own exceptions."""


class CUDAError(MrkitError):
    """A CUDA driver call failed.

    Attributes
    ----------
    name: the driver's error name, e.g. ``"CUDA_ERROR_INVALID_VALUE"``.
    code: the numeric ``CUresult`` (``None`` when the driver could not be loaded at all).
    call: the driver call that failed, e.g. ``"cuMemMap"``.
    explanation: the driver's (or simulator's) human description of the error.
    """

    def __init__(self, name: str, code: int | None, call: str, explanation: str = "") -> None:
        self.name = name
        self.code = code
        self.call = call
        self.explanation = explanation
        msg = f"{call} failed: {name}"
        if code is not None:
            msg += f" ({code})"
        if explanation:
            msg += f": {explanation}"
        super().__init__(msg)

    def __reduce__(self):
        return (type(self), (self.name, self.code, self.call, self.explanation))


class CUDAUnavailableError(CUDAError):
    """No usable CUDA driver or device on this machine (raised on first driver use, never on import)."""


class OutOfMemoryError(MemoryError, MrkitError):
    """An allocation could not be satisfied.

    The message names the request, the resource and what it holds; ``nbytes`` and ``resource``
    are kept as attributes.
    """

    def __init__(self, message: str, nbytes: int = 0, resource: object = None) -> None:
        super().__init__(message)
        self.nbytes = nbytes
        self.resource = resource


class StreamOrderViolation(MrkitError):
    """The simulator's shadow checker found an access not ordered after the work it conflicts with
    (use-after-free, use-before-allocation, an unordered cross-stream access, or access to memory
    that is unmapped or not accessible). The message carries a readable history of the ops involved.
    """

    def __init__(self, message: str, kind: str = "race", ops: tuple = ()) -> None:
        super().__init__(message)
        self.kind = kind
        self.ops = ops


class SimulatorFallbackWarning(UserWarning):
    """Issued once per process when ``MRKIT_BACKEND`` is unset and no usable GPU is found, so mrkit
    runs on the simulated CUDA device (as the ``mrkit`` command does). ``MRKIT_BACKEND=sim`` chooses
    the simulator without the warning; ``MRKIT_BACKEND=cuda`` refuses to fall back."""
