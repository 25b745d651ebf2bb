"""Adaptors: resources that wrap an upstream and add one behaviour each."""
from ._base import Adaptor
from ._logging import LogEvent, LoggingAdaptor, ReplayReport, read_log, replay
from ._others import LimitingAdaptor, RetryAdaptor, TrackingAdaptor
from ._statistics import Statistics, StatisticsAdaptor

__all__ = [
    "Adaptor", "StatisticsAdaptor", "Statistics", "LoggingAdaptor", "LogEvent", "read_log", "replay",
    "ReplayReport", "LimitingAdaptor", "TrackingAdaptor", "RetryAdaptor",
]
