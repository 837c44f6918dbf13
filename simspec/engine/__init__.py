"""The SimPy serving engine: admission, prefill, speculative decode iterations, retirement."""

from simspec.engine.engine import ServingEngine
from simspec.engine.recorder import Recorder

__all__ = ["Recorder", "ServingEngine"]
