"""GET /metrics: the server's counters in Prometheus' text format (prometheus_client)."""
from typing import Callable, List, Optional

from prometheus_client import (
    CONTENT_TYPE_LATEST,  # noqa: F401 - the response's media type
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

disable_created_metrics()  # no *_created series: a timestamp per series that no one graphs

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


class Metrics:
    """One registry per server (tests run several servers in one process)."""

    def __init__(self, queue_length: Callable[[], float],
                 model_memory: Optional[Callable[[], float]] = None):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("onmt_lite_requests", "HTTP requests answered",
                                ["endpoint", "status"], registry=r)
        self.latency = Histogram("onmt_lite_request_duration_seconds",
                                 "time from a request's arrival to its answer", ["endpoint"],
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.sentence_count = Counter("onmt_lite_sentences", "sentences translated", ["model"],
                                      registry=r)
        self.batch_size = Histogram("onmt_lite_batch_size", "sentences per decoded batch",
                                    ["model"], buckets=BATCH_BUCKETS, registry=r)
        self.queue_wait = Histogram("onmt_lite_queue_wait_seconds",
                                    "time a sentence waited for a lane", ["model"],
                                    buckets=LATENCY_BUCKETS, registry=r)
        self.lane_restarts = Counter("onmt_lite_lane_restarts",
                                     "lane processes that ended unasked and were replaced (counted under "
                                     "each model the lane served)",
                                     ["model"], registry=r)
        self.models_dropped = Counter("onmt_lite_models_dropped",
                                      "models unloaded to make room for another (-max_memory)",
                                      ["model"], registry=r)
        self.compiled = Gauge("onmt_lite_model_compiled", "1 once a -compile model decodes "
                              "through its compiled programs, 0 while they are built beside "
                              "it (it answers uncompiled meanwhile) or could not be",
                              ["model"], registry=r)
        queue = Gauge("onmt_lite_queue_length", "sentences waiting for a lane", registry=r)
        queue.set_function(queue_length)
        if model_memory is not None:
            memory = Gauge("onmt_lite_model_memory_bytes", "the memory the models loaded hold, "
                           "as -max_memory counts it", registry=r)
            memory.set_function(model_memory)

    def request(self, endpoint: str, status: int, seconds: float) -> None:
        self.requests.labels(endpoint, str(status)).inc()
        self.latency.labels(endpoint).observe(seconds)

    def sentences(self, model: int, count: int) -> None:
        self.sentence_count.labels(str(model)).inc(count)

    def batch(self, model: int, size: int, waits: List[float]) -> None:
        self.batch_size.labels(str(model)).observe(size)
        for wait in waits:
            self.queue_wait.labels(str(model)).observe(wait)

    def text(self) -> bytes:
        return generate_latest(self.registry)
