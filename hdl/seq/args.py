"""Constructor checks shared by the sequencer's sub-components."""

from __future__ import annotations

from firmware.config import NPUConfig


def _refuse(component, error: Exception):
    component._MustUse__silence = True  # never elaborated: no warning about it
    raise error


def require_config(component, config) -> None:
    """Raise ``TypeError`` naming ``config`` unless it is an :class:`NPUConfig`."""
    if not isinstance(config, NPUConfig):
        _refuse(component, TypeError(f"config={config!r}: must be an NPUConfig"))


def require_positive(component, **values) -> None:
    """Raise ``ValueError`` naming the first of ``values`` that is not a positive int."""
    for name, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            _refuse(component, ValueError(f"{name}={value!r}: must be a positive integer"))
