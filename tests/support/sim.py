"""What the `start_sim` and `sim` fixtures (tests/conftest.py) take: a simulator config in any of the forms
the tests write it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from tokwatch.sim.config import SimConfig, load_sim_config_text
from tokwatch.sim.testing import RunningSim

SimSource = str | SimConfig | dict[str, Any]
StartSim = Callable[..., Awaitable[RunningSim]]


def to_sim_config(config: tuple[SimSource, ...]) -> SimConfig:
    """YAML text or a SimConfig as it is; else one dict per simulated server."""
    if len(config) == 1 and isinstance(config[0], str):
        return load_sim_config_text(config[0])
    if len(config) == 1 and isinstance(config[0], SimConfig):
        return config[0]
    return SimConfig.model_validate({"servers": list(config)})
