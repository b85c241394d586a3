"""onceflow: exactly-once trigger processing on Kafka.

This package root is the core: plain Python shared by every runner (replay, the Faust
worker, the Spark pipeline).  It imports none of them.
"""

from .calls import DUPLICATE, IN_DOUBT, NEW, CallContext
from .errors import ConfigError, OnceflowError, ScenarioError, TransientError
from .joins import JoinDocument

__all__ = [
    "DUPLICATE",
    "IN_DOUBT",
    "NEW",
    "CallContext",
    "ConfigError",
    "JoinDocument",
    "OnceflowError",
    "ScenarioError",
    "TransientError",
]

__version__ = "0.1.0"
