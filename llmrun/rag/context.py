"""Putting retrieved chunks into a prompt, within the model's context budget (pure functions)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from llmrun.errors import ContextFull
from llmrun.rag.store import Hit

INSTRUCTION = (
    "Answer the question using only the numbered passages below. "
    "If they do not contain the answer, say that you do not know. "
    "Cite the passages you use by their numbers, like [1]."
)
MIN_PASSAGE_TOKENS = 24  # a cut passage shorter than this is dropped instead
TEMPLATE_ALLOWANCE = 64  # chat-template markup around the message, BOS, a system prompt's framing


def estimated_tokens(text: str) -> int:
    """A token count where the model's tokenizer is elsewhere (a remote engine): a token per three UTF-8
    bytes, rounded up — more than BPE vocabularies make of prose (about four characters a token) or
    code, so passages sized by it fit; the engine itself refuses a prompt that would not."""
    return -(-len(text.encode("utf-8")) // 3)


@dataclass(frozen=True, slots=True)
class Context:
    prompt: str  # the user message: instruction, passages, question
    used: tuple[Hit, ...]  # the passages in the prompt (the last may be cut)
    retrieved: int  # how many were retrieved
    cut: bool  # the last used passage was shortened
    budget: int  # tokens available for passages

    @property
    def trimmed(self) -> bool:
        return self.cut or len(self.used) < self.retrieved

    def note(self) -> str:
        """What trimming did, in one line ('' when nothing was trimmed)."""
        if not self.trimmed:
            return ""
        cut = f" (passage {len(self.used)} shortened)" if self.cut else ""
        return (
            f"retrieved text trimmed to fit the context: {len(self.used)} of {self.retrieved} passages used{cut}, "
            f"{self.budget} tokens for passages; raise `n_ctx` or lower `k` to keep more"
        )


def passage(number: int, hit: Hit, text: str | None = None) -> str:
    return f"[{number}] {hit.source}\n{hit.text if text is None else text}"


def compose(instruction: str, passages: Sequence[str], question: str) -> str:
    return f"{instruction}\n\n" + "\n\n".join(passages) + f"\n\nQuestion: {question}"


def _cut(text: str, count: Callable[[str], int], budget: int) -> str:
    """The longest prefix of whole words of ``text`` within ``budget`` tokens (binary search)."""
    words = text.split(" ")
    low, high = 0, len(words)
    while low < high:
        middle = (low + high + 1) // 2
        if count(" ".join(words[:middle]) + " …") <= budget:
            low = middle
        else:
            high = middle - 1
    return " ".join(words[:low]) + " …" if low else ""


def build(
    question: str,
    hits: Sequence[Hit],
    count: Callable[[str], int],
    n_ctx: int,
    answer_tokens: int,
    extra_tokens: int = 0,
) -> Context:
    """The prompt for ``question`` with as many of ``hits`` (best first) as fit in ``n_ctx`` less
    ``answer_tokens`` for the answer and ``extra_tokens`` (a system prompt, earlier chat turns)."""
    fixed = count(compose(INSTRUCTION, [], question)) + TEMPLATE_ALLOWANCE + extra_tokens
    budget = max(0, n_ctx - answer_tokens - fixed)
    passages: list[str] = []
    used: list[Hit] = []
    left = budget
    cut = False
    for hit in hits:
        number = len(used) + 1
        whole = passage(number, hit)
        size = count(whole) + 2  # the blank line between passages
        if size <= left:
            passages.append(whole)
            used.append(hit)
            left -= size
            continue
        header = count(passage(number, hit, "")) + 2
        if left - header >= MIN_PASSAGE_TOKENS:
            shortened = _cut(hit.text, count, left - header)
            if shortened:
                passages.append(passage(number, hit, shortened))
                used.append(hit)
                cut = True
        break
    return Context(compose(INSTRUCTION, passages, question), tuple(used), len(hits), cut, budget)


def ground(
    question: str,
    hits: Sequence[Hit],
    count: Callable[[str], int],
    n_ctx: int,
    max_tokens: int,
    extra_tokens: int = 0,
) -> Context:
    """:func:`build` with room kept for the answer (``max_tokens``, see :func:`answer_budget`);
    refused when passages were retrieved but not one of them fits."""
    context = build(question, hits, count, n_ctx, answer_budget(max_tokens, n_ctx), extra_tokens)
    if hits and not context.used:
        raise ContextFull(
            f"the context ({n_ctx} tokens) leaves no room for the retrieved text after the question and the answer",
            "raise `n_ctx`, or lower `max_tokens`",
        )
    return context


def answer_budget(max_tokens: int, n_ctx: int) -> int:
    """Tokens kept free for the answer: --max-tokens, or a quarter of the context when unlimited."""
    return max_tokens if max_tokens > 0 else n_ctx // 4
