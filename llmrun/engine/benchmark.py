"""llama-bench style measurements of a loaded model (the backend, not the renderer).

pp: the prompt evaluated in batches, tokens per second; the first token's time
(prefill plus reading the logits and choosing) is the time to first token.
tg: tokens decoded one at a time, tokens per second. Each repetition starts from
an empty KV cache, after one untimed warm-up.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from llmrun.backends.base import Evaluates, LoadedModel, Speculates, evaluating, with_logits
from llmrun.decoding.events import Done

TEXT = (
    "The history of the printing press begins in the fifteenth century, when movable type changed how "
    "books were made, how ideas travelled and who could read them. "
)


@dataclass(frozen=True, slots=True)
class Spread:
    median: float
    stdev: float

    @staticmethod
    def of(values: Sequence[float]) -> Spread:
        return Spread(statistics.median(values), statistics.stdev(values) if len(values) > 1 else 0.0)


@dataclass(frozen=True, slots=True)
class BenchResult:
    n_prompt: int
    n_gen: int
    repetitions: int
    pp_tps: Spread
    tg_tps: Spread
    ttft_s: Spread
    rss_bytes: int  # largest resident memory seen while the model ran
    speculative: Speculative | None = None  # with a draft: greedy generation with and without it


@dataclass(frozen=True, slots=True)
class Speculative:
    """Greedy generation through the model's stream, drafting off and on in alternation, on the same prompt."""

    draft: str  # as --draft spells it
    plain_tps: Spread
    draft_tps: Spread
    drafted: int  # over the timed repetitions
    accepted: int
    same_output: bool  # every drafted run produced the plain run's tokens

    @property
    def speedup(self) -> float:
        return self.draft_tps.median / self.plain_tps.median if self.plain_tps.median else 0.0

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None


def prompt_tokens(model: LoadedModel, n: int) -> list[int]:
    """``n`` tokens of ordinary English (BOS first when the model uses one)."""
    ids = model.tokenize(TEXT * (n // 20 + 2), add_bos=model.adds_bos)
    return ids[:n]


def run(
    model: LoadedModel,
    n_prompt: int,
    n_gen: int,
    repetitions: int,
    memory: Callable[[], int],
    progress: Callable[[int], None] | None = None,
) -> BenchResult:
    prompt = prompt_tokens(model, n_prompt)
    scorer = with_logits(model, "report prefill speed (it has no raw logits)")
    stepper = evaluating(model, "report decode speed (it has no bare forward pass)")
    pp, tg, ttft = [], [], []
    peak = 0
    for index in range(repetitions + 1):  # the first is the warm-up
        start = time.perf_counter()
        logits = scorer.logits(prompt)
        first = int(logits.argmax())
        prefill = time.perf_counter() - start
        start = time.perf_counter()
        for _ in range(n_gen):
            stepper.eval([first])
        decode = time.perf_counter() - start
        peak = max(peak, memory())
        if index:
            pp.append(len(prompt) / prefill)
            tg.append(n_gen / decode)
            ttft.append(prefill)
        if progress:
            progress(index)
    stepper.reset()
    speculative = None
    if isinstance(model, Speculates) and model.draft.on:
        speculative = _speculative(model, model, stepper, prompt, n_gen, repetitions)
    return BenchResult(
        len(prompt), n_gen, repetitions, Spread.of(pp), Spread.of(tg), Spread.of(ttft), peak, speculative
    )


def _speculative(
    model: LoadedModel, drafts: Speculates, stepper: Evaluates, prompt: list[int], n_gen: int, repetitions: int
) -> Speculative:
    """The model's draft against none: ``n_gen`` greedy tokens after ``prompt``, alternating, medians
    (``drafts`` and ``stepper``: the same model, as it drafts and as it evaluates)."""
    from llmrun.decoding.sampling import SamplingParams
    from llmrun.decoding.speculative import Draft

    draft = drafts.draft
    params = SamplingParams(temperature=0.0, max_tokens=n_gen)
    plain: list[float] = []
    drafted: list[float] = []
    drafted_n = accepted_n = 0
    same = True
    try:
        for index in range(repetitions + 1):
            outputs = []
            for setting in (Draft(), draft):
                drafts.use_draft(setting)
                stepper.reset()
                done = next(e for e in model.stream(prompt, params) if isinstance(e, Done))
                outputs.append(done.text)
                if index:
                    (drafted if setting.on else plain).append(done.stats.generation_tps)
                    drafted_n += done.stats.drafted
                    accepted_n += done.stats.accepted
            same = same and outputs[0] == outputs[1]
    finally:
        drafts.use_draft(draft)
    return Speculative(draft.value, Spread.of(plain), Spread.of(drafted), drafted_n, accepted_n, same)
