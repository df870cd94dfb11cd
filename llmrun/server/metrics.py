"""Prometheus metrics of one server (its own registry, exposed at /metrics)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "llmrun_requests", "HTTP requests by endpoint and status", ["endpoint", "status"], registry=self.registry
        )
        self.prompt_tokens = Counter("llmrun_prompt_tokens", "Prompt tokens evaluated", registry=self.registry)
        self.generated_tokens = Counter("llmrun_generated_tokens", "Tokens generated", registry=self.registry)
        self.cached_prompt_tokens = Counter(
            "llmrun_cached_prompt_tokens", "Prompt tokens read from the prefix cache", registry=self.registry
        )
        self.time_to_first_token = Histogram(
            "llmrun_time_to_first_token_seconds",
            "From the request to its first token",
            buckets=(0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=self.registry,
        )
        self.latency = Histogram(
            "llmrun_request_seconds",
            "From the request to its last token",
            buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
            registry=self.registry,
        )
        self.queue_depth = Gauge("llmrun_queue_depth", "Requests waiting for a slot", registry=self.registry)
        self.busy_slots = Gauge("llmrun_busy_slots", "Sequences being decoded", registry=self.registry)
        self.slots = Gauge("llmrun_slots", "Sequences decoded at once (all models)", registry=self.registry)
        self.loads = Counter("llmrun_model_loads", "Models loaded", registry=self.registry)
        self.timed_out = Counter(
            "llmrun_requests_timed_out", "Answers ended by the time limit (--request-timeout)", registry=self.registry
        )
