"""A conversation as the model reads it: rendered through its chat template and tokenized so that
user text never becomes special tokens."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from llmrun.decoding.tokens import Vocabulary
from llmrun.prompt.template import Context, Message, attribute, contains, mark, render_text, special_pattern

PromptFormat = Literal["chat template", "plain"]


@dataclass(frozen=True, slots=True)
class Prompt:
    """A conversation as the model reads it: the text the template rendered (transformers' rendering,
    byte for byte) and its tokens, in which only the template's own special tokens are special."""

    text: str
    ids: list[int]
    images: tuple[int, ...] = ()  # where each image sits: the number of tokens of ``ids`` before it


def split_at_images(text: str, marker: str | None) -> list[str]:
    """``text`` in the pieces between images (one piece when there is no ``marker``): each marker is
    where an image goes (the marker is chosen per request at random, so user text cannot forge one)."""
    return text.split(marker) if marker else [text]


def _with_images(pieces: list[list[int]]) -> tuple[list[int], tuple[int, ...]]:
    ids: list[int] = []
    at: list[int] = []
    for number, piece in enumerate(pieces):
        if number:
            at.append(len(ids))
        ids += piece
    return ids, tuple(at)


_MARKUP = re.compile(r"[<\[\u25c1][^\s]+[>\]\u25b7]")  # <think>, <tool_call>, [TOOL_CALLS], \u25c1think\u25b7


def render_prompt(
    model: Vocabulary,
    template: str,
    messages: Sequence[Message],
    *,
    add_generation_prompt: bool = True,
    continue_final: bool = False,
    tools: Sequence[dict[str, Any]] | None = None,
    variables: Mapping[str, Any] | None = None,
    image_marker: str | None = None,
) -> Prompt:
    """A conversation rendered through ``template`` (with ``tools`` for templates that describe them,
    ``variables`` such as ``enable_thinking``; ``continue_final``: the prompt ends inside the last message,
    transformers' ``continue_final_message``) and tokenized so that user text never becomes special
    tokens: the special-token strings inside user-supplied values are marked in a second rendering,
    found in the real one by aligning the two (``template.attribute``), and tokenized as plain text.
    ``image_marker``: where it appears in the rendering, an image goes (``Prompt.images``); the text on
    either side is tokenized apart, as libmtmd does."""
    bos, eos = model.bos_id, model.eos_id
    context = Context(
        bos_token=model.detokenize([bos], special=True) if bos is not None else "",
        eos_token=model.detokenize([eos], special=True) if eos is not None else "",
        add_generation_prompt=add_generation_prompt and not continue_final,
        continue_final_message=continue_final,
        tools=tuple(tools) if tools else None,
        variables=dict(variables or {}),
    )
    text = render_text(template, messages, context)
    ids = model.tokenize(text, special=True, add_bos=False)
    guarded = _guarded_tokens(model, template, ids)
    pattern = special_pattern(guarded.values())
    segments: list[tuple[str, bool]] = [(text, True)]
    if pattern is not None and contains(list(context.user_values(messages).values()), pattern):
        found = pattern
        marked = render_text(template, messages, context, transform=lambda v: mark(v, found))
        segments = [(segment.text, segment.special) for segment in attribute(text, marked, pattern)]
    if len(segments) > 1 or image_marker:
        pieces: list[list[int]] = [[]]
        for segment_text, special in segments:
            for number, part in enumerate(split_at_images(segment_text, image_marker)):
                if number:
                    pieces.append([])
                if special:
                    pieces[-1] += model.tokenize(part, special=True, add_bos=False)
                else:
                    pieces[-1] += _plain_ids(model, part, set(guarded))
        ids, images = _with_images(pieces)
    else:
        images = ()
    if model.adds_bos and bos is not None and ids[:1] != [bos]:
        ids.insert(0, bos)
        images = tuple(at + 1 for at in images)
    return Prompt(text, ids, images)


def _special(model: Vocabulary, token_id: int) -> tuple[str, bool] | None:
    """A special token's text, and whether it is a control token; None for any other token. Special:
    control tokens, and the tokenizer's added tokens that read as markup (``<think>``, ``<tool_call>``)."""
    kind = model.token_kind(token_id)
    if kind == "normal":
        return None
    text = model.detokenize([token_id], special=True)
    return (text, kind == "control") if kind == "control" or _MARKUP.fullmatch(text) else None


def _guarded_tokens(model: Vocabulary, template: str, ids: Sequence[int]) -> dict[int, str]:
    """The special tokens in a rendered prompt that user text must not produce, by id: control tokens,
    and the markup tokens the template itself writes."""
    guarded: dict[int, str] = {}
    for token_id in set(ids):
        special = _special(model, token_id)
        if special is not None and (special[1] or special[0] in template):
            guarded[token_id] = special[0]
    return guarded


def prompt_spans(model: Vocabulary, ids: Sequence[int]) -> list[tuple[str, bool]]:
    """A prompt's tokens as text spans, each special token (control tokens and added markup tokens
    such as ``<think>``) its own span marked True, the text between them marked False."""
    spans: list[tuple[str, bool]] = []
    run: list[int] = []
    for token_id in ids:
        special = _special(model, token_id)
        if special is not None:
            if run:
                spans.append((model.detokenize(run, special=True), False))
                run = []
            spans.append((special[0], True))
        else:
            run.append(token_id)
    if run:
        spans.append((model.detokenize(run, special=True), False))
    return spans


def _plain_ids(model: Vocabulary, text: str, guarded: set[int]) -> list[int]:
    """``text`` as plain-text tokens, never one of the ``guarded`` tokens (llama.cpp matches the
    tokenizer's added tokens even in plain text: such a string is split before its first character)."""
    ids = model.tokenize(text, special=False, add_bos=False)
    if not guarded.intersection(ids) or len(text) < 2:
        return ids
    return model.tokenize(text[:1], special=False, add_bos=False) + _plain_ids(model, text[1:], guarded)


def prompt_ids(
    model: Vocabulary,
    template: str | None,
    prompt: str,
    system: str | None,
    raw: bool,
    variables: Mapping[str, Any] | None = None,
    image_marker: str | None = None,
) -> tuple[Prompt, PromptFormat]:
    """The prompt as the model reads it; user text is never read as special tokens."""
    if raw or template is None:
        text = f"{system}\n\n{prompt}" if system else prompt
        if not image_marker:
            return Prompt(text, model.tokenize(text, special=False, add_bos=model.adds_bos)), "plain"
        pieces = [model.tokenize(part, special=False, add_bos=False) for part in split_at_images(text, image_marker)]
        ids, images = _with_images(pieces)
        if model.adds_bos and model.bos_id is not None:
            ids, images = [model.bos_id, *ids], tuple(at + 1 for at in images)
        return Prompt(text, ids, images), "plain"
    messages = ([Message("system", system)] if system else []) + [Message("user", prompt)]
    return render_prompt(model, template, messages, variables=variables, image_marker=image_marker), "chat template"
