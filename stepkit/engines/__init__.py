"""Generation engines. One small interface (:class:`stepkit.engines.base.Engine`), several backends.

``make_engine(name, model, **options)`` imports the backend lazily, so importing this package never
imports torch or vLLM.
"""

from stepkit.engines.base import Completion, Engine, Request, SamplingConfig, make_engine

__all__ = ["Completion", "Engine", "Request", "SamplingConfig", "make_engine"]
